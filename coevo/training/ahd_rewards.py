"""Rewards of heuristic answers for training the sampler, and the answers' prompts read back from the store.

Typed rewards (CALM, Huang et al., ICLR 2026, arXiv 2505.12285; rerun in arXiv 2609.39383, docs/field-notes §9): an
answer is rewarded by what it is, relative to its best parent, always ordered
``invalid < copy of an existing heuristic < valid but not better < better than its best parent``:

=========================================  ======================  ===========================================
what the answer is (coevo failure kinds)    reward                  CALM's penalty it stands for
=========================================  ======================  ===========================================
no answer (llm_error, sandbox, other)       -1.00                   no rationale (-1)
no code (parse, no_code)                    -0.95                   no code (-0.95)
no working function (empty_body, syntax,    -0.90                   no function (-0.90)
truncated)
fails while running (import, runtime,       -0.85                   runtime error (-0.85)
timeout, memory)
wrong answer (return_type, infeasible)      -0.75                   randomness (-0.75; the closest kind here)
copy (duplicate, behavioural_duplicate)     -0.60                   copy of a prompt parent (-3/5)
valid, not better than its reference        -0.5 * min(1, -d / s)   in [-0.5, 0]
valid and better                            0.5 + 0.5 * min(1, d/s) in (0.5, 1]
=========================================  ======================  ===========================================

``d = (score - reference) / max(|reference|, 1e-12)`` is the relative improvement in score space (score =
``-objective`` when minimising, so a shorter tour is a positive ``d``), ``s`` = ``improvement_scale`` (default
0.1: a 10 % change saturates). The reference is the answer's best parent (``meta["parent_score"]``); an answer
without parents (``i1``) is compared with ``meta["reference_score"]`` (the searched population's best when it was
asked, set by the sampler-training evolvers), and with neither a valid answer gets 0.5 (any valid heuristic is
progress). coevo counts copies of any recorded heuristic (CALM: of a prompt parent), and its behavioural copies
(same objective on every training instance) as copies.

Prompts: the store keeps each answer's conversation as text (``steps[0].observation``, ``[role]\\ncontent``
blocks, :mod:`coevo.ahd.sampler`); :func:`messages_from_observation` reads it back and checks the round trip.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from coevo.types import Trajectory

#: failure kind -> typed reward (module docstring); kinds not listed get :data:`NO_ANSWER`
NO_ANSWER = -1.0
COPY = -0.6
FAILURE_REWARD = {
    "llm_error": NO_ANSWER,
    "sandbox": NO_ANSWER,
    "other": NO_ANSWER,
    "parse": -0.95,
    "no_code": -0.95,
    "empty_body": -0.90,
    "syntax": -0.90,
    "truncated": -0.90,
    "import": -0.85,
    "runtime": -0.85,
    "timeout": -0.85,
    "memory": -0.85,
    "return_type": -0.75,
    "infeasible": -0.75,
    "duplicate": COPY,
    "behavioural_duplicate": COPY,
}


def typed_reward(t: Trajectory, improvement_scale: float = 0.1) -> float:
    """CALM's typed reward of one recorded heuristic answer (module docstring), in [-1, 1].

    Raises:
        ValueError: ``improvement_scale`` <= 0.
    """
    if not improvement_scale > 0:
        raise ValueError(f"improvement_scale must be > 0, got {improvement_scale}")
    if not t.valid or t.reward is None or not math.isfinite(t.reward):
        return FAILURE_REWARD.get(t.failure or "other", NO_ANSWER)
    ref = t.meta.get("parent_score")
    if ref is None:
        ref = t.meta.get("reference_score")
    if ref is None or not math.isfinite(ref):
        return 0.5
    d = (float(t.reward) - float(ref)) / max(abs(float(ref)), 1e-12)
    if d > 0:
        return 0.5 + 0.5 * min(1.0, d / improvement_scale)
    return -0.5 * min(1.0, -d / improvement_scale)


def reward_kind(t: Trajectory) -> str:
    """A short word for what the answer is: ``better``, ``not better``, ``copy`` or its failure kind."""
    if t.valid and t.reward is not None:
        return "better" if typed_reward(t) > 0.5 else "not better"
    if FAILURE_REWARD.get(t.failure or "") == COPY:
        return "copy"
    return t.failure or "other"


_BLOCK = re.compile(r"\[(system|user|assistant)\]\n")


def messages_from_observation(text: str) -> list[dict[str, str]] | None:
    """The conversation the sampler recorded as ``text`` (``"\\n\\n".join("[role]\\ncontent")``), or None when it
    does not read back exactly (the joined result must equal ``text``)."""
    if not text.startswith("["):
        return None
    starts = [m for m in _BLOCK.finditer(text) if m.start() == 0 or text[m.start() - 2 : m.start()] == "\n\n"]
    if not starts:
        return None
    msgs = []
    for i, m in enumerate(starts):
        end = starts[i + 1].start() - 2 if i + 1 < len(starts) else len(text)
        msgs.append({"role": m.group(1), "content": text[m.end() : end]})
    if "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in msgs) != text:
        return None
    return msgs


def group_spread(rewards: Sequence[float]) -> float:
    """Population standard deviation of one group's rewards (0 for a group of one)."""
    if len(rewards) < 2:
        return 0.0
    mu = sum(rewards) / len(rewards)
    return math.sqrt(sum((r - mu) ** 2 for r in rewards) / len(rewards))
