"""A smooth, model-only reward for testing ES mechanics: the log-probability of target completions.

Reward of a member = mean over cases of ``log p(target | prompt) / len(target tokens)`` under the perturbed
policy (nats per token, higher is better). No sampling is involved, so the reward is a deterministic
function of the weights and ES must raise it on any model (used by the tiny-model tests and
``configs/es/tiny.yaml``). One forward pass per case; ``llm_calls`` counts one per case.
"""

from __future__ import annotations

import time

from pydantic import Field

from coevo.rollouts.base import Rollout, RolloutConfig, Split, register_rollout
from coevo.types import Step


class LogProbConfig(RolloutConfig):
    type: str = "target_logprob"
    prompts: list[str] = Field(
        default_factory=lambda: ["Say hello.", "Greet the user.", "Write a greeting."],
        min_length=1,
        description="user messages (train cases)",
    )
    target: str = Field("Hello, world!", min_length=1, description="completion whose log-probability is the reward")
    test_prompts: list[str] = Field(
        default_factory=lambda: ["Please say hello."], min_length=1, description="held-out user messages"
    )


def target_logprobs(policy, conversations, targets: list[str]) -> list[tuple[float, int]]:
    """``(log p(target | conversation) in nats, number of target tokens >= 1)`` per conversation, from one batched
    forward pass (``policy.logprob``); the per-token reward is their ratio. ``policy`` may also be a low-rank
    ``Population`` with ``(member, conversation)`` rows as ``conversations``."""
    totals = policy.logprob(conversations, targets).tolist()
    return [
        (v, max(1, len(policy.tokenizer(t, add_special_tokens=False)["input_ids"]))) for v, t in zip(totals, targets)
    ]


@register_rollout("target_logprob")
class TargetLogProbRollout(Rollout):
    """Reward = per-token log-probability of ``target`` after each prompt (needs a policy with ``logprob``)."""

    Config = LogProbConfig

    def run(self, policy, *, generation, member, key_prefix, split: Split = "train", evolver="es", round_index=0):
        prompts = self._prompts(split)
        t0 = time.time()
        scored = target_logprobs(
            policy, [[{"role": "user", "content": p}] for p in prompts], [self.config.target] * len(prompts)
        )
        return self._trajectories(
            scored,
            time.time() - t0,
            generation=generation,
            member=member,
            key_prefix=key_prefix,
            split=split,
            evolver=evolver,
            round_index=round_index,
        )

    def run_population(
        self, population, members, *, generation, key_prefixes, split: Split = "train", evolver="es", round_index=0
    ):
        """All members' prompts as rows of one batched forward pass (``population.logprob``)."""
        prompts = self._prompts(split)
        rows = [(m, [{"role": "user", "content": p}]) for m in members for p in prompts]
        t0 = time.time()
        scored = target_logprobs(population, rows, [self.config.target] * len(rows))
        dt = (time.time() - t0) / len(members)
        n = len(prompts)
        return [
            self._trajectories(
                scored[i * n : (i + 1) * n],
                dt,
                generation=generation,
                member=m,
                key_prefix=kp,
                split=split,
                evolver=evolver,
                round_index=round_index,
            )
            for i, (m, kp) in enumerate(zip(members, key_prefixes, strict=True))
        ]

    def _prompts(self, split: Split) -> list[str]:
        return self.config.prompts if split == "train" else self.config.test_prompts

    def _trajectories(self, scored, dt, *, generation, member, key_prefix, split, evolver, round_index):
        prompts = self._prompts(split)
        out = []
        for i, (p, (v, n_tok)) in enumerate(zip(prompts, scored, strict=True)):
            r = v / n_tok
            out.append(
                self.case_trajectory(
                    key_prefix=key_prefix,
                    split=split,
                    index=i,
                    generation=generation,
                    member=member,
                    evolver=evolver,
                    round_index=round_index,
                    task_id=f"{split}:{i}",
                    steps=[Step(observation=p, model_output=self.config.target, reward=r)],
                    reward=r,
                    llm_calls=1,
                    prompt_tokens=0,
                    completion_tokens=n_tok,
                    duration_s=dt / len(prompts),
                    meta={"split": split, "logprob": v},
                )
            )
        return out

    def n_cases(self, split: Split = "train") -> int:
        return len(self.config.prompts if split == "train" else self.config.test_prompts)
