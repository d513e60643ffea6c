"""The versioned prompt set of the held-out sampler test (:mod:`coevo.sampler_test`).

A prompt set is one JSON file in this folder, ``<version>.json`` (today :data:`PROMPT_SET_VERSION`), written by
:mod:`coevo.sampler_test.build` and committed. Per problem it holds:

* ``settings``: the shipped sampling and evaluation settings, copied from ``configs/ahd/<problem>.yaml`` when the
  set was built (temperature, top-p, top-k, token cap, stop strings, answer format; training instance size and
  count; sandbox limits; EoH's ``parents_m``), so a test of this version does not move when a config changes
  (``tests/test_sampler_test.py`` checks that they still equal the shipped configs');
* ``parents``: the parent heuristics (name, thought, code, where the code came from). None of them starts any
  shipped config's population (the problem's seed heuristic and the configs' ``seed_heuristics``): they are
  textbook rules and variants written for this test (``parents/<problem>/*.py``) and published heuristics no
  config starts from, so the test's prompts are disjoint from every training prompt;
* ``prompts``: ``index``, EoH ``operator`` (i1, e1, e2, m1, m2), the ``parents`` by name, and the batch
  ``seed``: prompts go to the model in fixed batches of ``batch_size`` (8) in index order, batch ``b`` seeded
  with the seed of its first prompt, row ``r`` sampling with ``request_seed(seed, r)``
  (:func:`coevo.backends.base.request_seed`), so answer ``i`` depends on the model, the prompt set and nothing
  else (not on ``--prompts``, nor on a resume);
* ``instance_seed``: the seed of the evaluation instances (training size and count, never a config's
  ``train_seed`` or ``test_seed``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coevo.errors import InputFileError

#: the prompt set ``coevo heuristics sampler-test`` uses by default
PROMPT_SET_VERSION = "sampler-test-v1"
#: prompts per batch (one ``generate`` call; part of the version: the sampling seeds depend on it)
BATCH_SIZE = 8
#: operators of the test, in the order of one batch: i1 once, m1 three times, m2 twice, e1 and e2 once
OPERATOR_CYCLE = ("i1", "m1", "m2", "e1", "m1", "m2", "e2", "m1")
#: problems of the test
PROBLEMS = ("tsp_construct", "kp_construct", "cvrp_construct", "bpp_online")
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class TestParent:
    """A parent heuristic of the test: ``name``, ``thought`` (the idea a prompt shows), ``code``, ``source``
    (``parents/<problem>/<name>.py`` or ``published:<name>``)."""

    name: str
    thought: str
    code: str
    source: str


@dataclass(frozen=True)
class TestPrompt:
    """One prompt: ``index`` (0-based, in the set's order), ``operator``, ``parents`` (names), batch ``seed``."""

    index: int
    operator: str
    parents: tuple[str, ...]
    seed: int


@dataclass(frozen=True)
class ProblemSet:
    """The prompts of one problem: ``settings`` (module docstring), ``parents`` by name, ``prompts`` in order."""

    problem: str
    settings: dict[str, Any]
    parents: dict[str, TestParent]
    prompts: tuple[TestPrompt, ...]


@dataclass(frozen=True)
class PromptSet:
    """A whole prompt set: ``version``, ``instance_seed``, ``batch_size`` and one :class:`ProblemSet` per
    problem (in :data:`PROBLEMS` order)."""

    version: str
    instance_seed: int
    batch_size: int
    problems: dict[str, ProblemSet]


def prompt_set_path(version: str = PROMPT_SET_VERSION) -> Path:
    """The file of prompt set ``version`` (``<this folder>/<version>.json``)."""
    return HERE / f"{version}.json"


def load_prompt_set(version: str = PROMPT_SET_VERSION) -> PromptSet:
    """Read and check prompt set ``version``.

    Raises:
        InputFileError: no such version (the message lists the versions here), or a file that does not hold a
            prompt set (missing keys, a prompt naming an unknown parent).
    """
    path = prompt_set_path(version)
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in HERE.glob("sampler-test-v*.json"))) or "none"
        raise InputFileError(f"no sampler-test prompt set {version!r} (known: {known})")
    try:
        raw = json.loads(path.read_text())
        problems = {}
        for name, p in raw["problems"].items():
            parents = {q["name"]: TestParent(q["name"], q["thought"], q["code"], q["source"]) for q in p["parents"]}
            prompts = tuple(
                TestPrompt(int(q["index"]), q["operator"], tuple(q["parents"]), int(q["seed"])) for q in p["prompts"]
            )
            for q in prompts:
                missing = [n for n in q.parents if n not in parents]
                if missing:
                    raise ValueError(f"prompt {name}/{q.index} names unknown parents {missing}")
            problems[name] = ProblemSet(name, dict(p["settings"]), parents, prompts)
        return PromptSet(raw["version"], int(raw["instance_seed"]), int(raw["batch_size"]), problems)
    except (ValueError, KeyError, TypeError) as exc:
        raise InputFileError(f"{path}: not a sampler-test prompt set ({type(exc).__name__}: {exc})") from None
