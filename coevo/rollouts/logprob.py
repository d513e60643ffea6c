"""A smooth, model-only reward for testing ES mechanics: the log-probability of target completions.

Reward of a member = mean over cases of ``log p(target | prompt) / len(target tokens)`` under the perturbed
policy (nats per token, higher is better). No sampling is involved, so the reward is a deterministic
function of the weights and ES must raise it on any model (used by the tiny-model tests and
``configs/es/tiny.yaml``). One forward pass per case; ``llm_calls`` counts one per case.
"""

from __future__ import annotations

from pydantic import Field

from coevo.rollouts.base import Split, register_rollout
from coevo.rollouts.batched import SingleTurnConfig, SingleTurnRollout
from coevo.types import Step


class LogProbConfig(SingleTurnConfig):
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
class TargetLogProbRollout(SingleTurnRollout):
    """Reward = per-token log-probability of ``target`` after each prompt (needs a policy with ``logprob``).
    Context slots ``system_prompt`` and ``instruction`` (:class:`~coevo.rollouts.batched.SingleTurnRollout`)."""

    Config = LogProbConfig

    def cases(self, split: Split, generation: int, member_index: int = 0) -> list[dict]:
        return [{"prompt": p} for p in (self.config.prompts if split == "train" else self.config.test_prompts)]

    def answer(self, policy, rows, cases, split: Split, generation: int) -> list[tuple[float, int]]:
        return target_logprobs(policy, rows, [self.config.target] * len(rows))

    def case_fields(self, case: dict, output: tuple[float, int], call, index: int) -> dict:
        v, n_tok = output
        r = v / n_tok
        return {
            "task_id": f"{call.split}:{index}",
            "steps": [Step(observation=case["prompt"], model_output=self.config.target, reward=r)],
            "reward": r,
            "llm_calls": 1,
            "prompt_tokens": 0,
            "completion_tokens": n_tok,
            "meta": {"logprob": v},
        }

    def n_cases(self, split: Split = "train") -> int:
        return len(self.config.prompts if split == "train" else self.config.test_prompts)
