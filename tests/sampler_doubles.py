"""Test doubles for the sampler-training evolvers (``grpo_ahd``, ``dpo_ahd``) on the tiny random Qwen2.

The tiny model's answers are all alike (no code: it never writes a function body), so no group would carry a
learning signal and no preference pair would exist. :func:`mix_replies` is a test double for the model's *outputs
only*: the real :class:`~coevo.backends.hf.HFPolicy` generates every row (with the trained adapter: its weights
are what the update changes), then a deterministic share of the rows get a scripted continuation of the prefilled
answer instead (valid TSP heuristics, one worse than nearest neighbour, a syntax error, a runtime error), picked by
a hash of the row's prompt and of what the model generated, so a re-run (resume) picks the same script. Everything
else (prompts, extraction, sandboxed evaluation, the store, EoH, the loop, TRL, PEFT) runs for real.

:class:`MixedGRPO` / :class:`MixedDPO` are the real evolvers with that double installed on the run's policy (for a
``coevo run`` in a child process, by dotted type ``sampler_doubles:MixedGRPO``), and optionally SIGKILL their own
process once in the middle of an update (``kill_at_update``, ``marker``).
"""

from __future__ import annotations

import hashlib
import os
import signal
from dataclasses import replace
from pathlib import Path

from pydantic import Field

from coevo.evolvers.dpo_ahd import DPOAHDConfig, DPOAHDEvolver
from coevo.evolvers.grpo_ahd import GRPOAHDConfig, GRPOAHDEvolver

#: continuations of the prefilled answer "...def select_next_node(...):\n    # idea:"
SCRIPTS = (
    " nearest unvisited node\n    return int(unvisited_nodes[np.argmin(distance_matrix[current_node, unvisited_nodes])])\n",
    (
        " go toward home\n    score = distance_matrix[current_node, unvisited_nodes] - 0.3 * "
        "distance_matrix[destination_node, unvisited_nodes]\n    return int(unvisited_nodes[np.argmin(score)])\n"
    ),
    " farthest node\n    return int(unvisited_nodes[np.argmax(distance_matrix[current_node, unvisited_nodes])])\n",
    " broken\n    return int(unvisited_nodes[np.argmin(distance_matrix[current_node, unvisited_nodes]]\n",
    " crash\n    return int(unvisited_nodes[len(unvisited_nodes) + 5])\n",
)


def mix_replies(policy, share: int = 2):
    """Make ``policy.generate`` replace the text of about ``share - 1`` in ``share`` rows by a scripted
    continuation (module docstring); returns ``policy``. Calls are counted in ``policy.mixed_calls``."""
    real = policy.generate
    policy.mixed_calls = 0

    def generate(conversations, params):
        out = real(conversations, params)
        policy.mixed_calls += 1
        mixed = []
        for conv, comp in zip(conversations, out):
            h = int(hashlib.sha256((repr(conv) + comp.text).encode()).hexdigest(), 16)
            if h % share and conv and conv[-1]["role"] == "assistant":
                comp = replace(comp, text=SCRIPTS[(h // share) % len(SCRIPTS)], finish_reason="stop")
            mixed.append(comp)
        return mixed

    policy.generate = generate
    return policy


class _Mixed:
    """The double installed on the run's policy at setup; an optional one-time SIGKILL inside an update."""

    def setup(self) -> None:
        super().setup()
        factory = self.ctx.policy_factory
        self.ctx.policy_factory = lambda: mix_replies(factory())

    def train_update(self, round_index, groups):
        cfg = self.config
        if cfg.kill_at_update == self.updates and cfg.marker and not Path(cfg.marker).exists():
            Path(cfg.marker).write_text("killed")
            os.kill(os.getpid(), signal.SIGKILL)
        return super().train_update(round_index, groups)


class MixedGRPOConfig(GRPOAHDConfig):
    kill_at_update: int | None = Field(None, description="update whose training is killed (once)")
    marker: str = Field("", description="file written just before the kill")


class MixedGRPO(_Mixed, GRPOAHDEvolver):
    Config = MixedGRPOConfig


class MixedDPOConfig(DPOAHDConfig):
    kill_at_update: int | None = Field(None, description="update whose training is killed (once)")
    marker: str = Field("", description="file written just before the kill")


class MixedDPO(_Mixed, DPOAHDEvolver):
    Config = MixedDPOConfig
