"""GRPO in the heuristic-design loop (``type: grpo_ahd``): online RL on the sampler, as CALM trains it.

CALM (Huang et al., ICLR 2026, arXiv 2505.12285; rerun in arXiv 2609.39383, docs/field-notes §9) updates its
sampler with GRPO (Shao et al. 2024, arXiv 2402.03300) after each group of answers to one prompt, inside the
evolution loop. Here one step (:mod:`coevo.evolvers.sampler_training`) samples ``prompts_per_step`` groups of
``answers_per_prompt`` (G) answers to the searched evolver's prompts, through its sampler (so they are evaluated in
the sandbox and enter its population like ES members' children), rewards every answer with CALM's typed reward
(:func:`coevo.training.ahd_rewards.typed_reward`: invalid < copy < not better < better than its best parent) and
takes **one** GRPO optimizer step on them with TRL's ``GRPOTrainer``, as the Sudoku baseline (:mod:`coevo.rl.grpo`)
uses it: a ``rollout_func`` hands TRL the answers already sampled (prompt tokens: the rendered chat prompt, a
prefilled answer's prefix included; completion tokens: the generated text, re-tokenised from the store, so an
answer reused on resume trains exactly like a fresh one), and the reward function hands back their typed rewards.
TRL computes the group-relative advantages ``A_j = (r_j - mean(r_group)) / (std(r_group) + eps)``, the clipped
surrogate loss (``beta`` > 0 adds the KL to the frozen base: the adapter switched off) and steps AdamW on the LoRA
weights; the optimizer's state carries over from update to update (saved with the adapter).

A group whose answers all score alike has zero advantages; when **every** group does, the update is skipped with
one line (``evolvers.<name>: all N groups scored alike ...``) and the sampler stays as it is: with the frozen model
before any update.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field

from coevo.evolvers.base import register_evolver
from coevo.evolvers.sampler_training import Answer, SamplerTrainingConfig, SamplerTrainingEvolver, UpdateResult, quiet
from coevo.tables import mean
from coevo.training.ahd_rewards import group_spread


class GRPOAHDConfig(SamplerTrainingConfig):
    """Settings of ``grpo_ahd`` (plus :class:`~coevo.evolvers.sampler_training.SamplerTrainingConfig`'s)."""

    beta: float = Field(0.0, ge=0, description="KL coefficient to the base model (0: none, as the Sudoku baseline)")
    epsilon: float = Field(0.2, gt=0, lt=1, description="PPO-style clip range")
    loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = Field("grpo", description="TRL loss aggregation")
    scale_rewards: Literal["group", "batch", "none"] = Field("group", description="advantage scaling")

    def link(self, name: str, run_config: Any) -> list[str]:
        """The base checks, a step with groups, and ``micro_batch`` dividing P x G (one generation batch)."""
        errors = super().link(name, run_config)
        per_step = self.prompts_per_step * self.answers_per_prompt
        if not per_step:
            errors.append(f"evolvers.{name}.prompts_per_step: GRPO learns from the groups it samples; set it >= 1")
        elif self.micro_batch is not None and per_step % self.micro_batch:
            errors.append(
                f"evolvers.{name}.micro_batch: {self.micro_batch} must divide prompts_per_step x answers_per_prompt "
                f"= {per_step}"
            )
        return errors


@register_evolver("grpo_ahd")
class GRPOAHDEvolver(SamplerTrainingEvolver):
    """Online GRPO on the sampler of a heuristic-design evolver (module docstring); one step = one update."""

    Config = GRPOAHDConfig
    method = "grpo"

    def train_update(self, round_index: int, groups: list[list[Answer]]) -> UpdateResult:
        """One GRPO optimizer step on the groups (module docstring); skipped when every group scored alike or a
        group lost answers (the budget or a failed LLM call: TRL needs G answers per prompt)."""
        cfg = self.config
        G = cfg.answers_per_prompt
        spreads = [group_spread([a.reward for a in g]) for g in groups]
        info = {"groups_with_signal": sum(s > 0 for s in spreads)}
        if not groups or any(len(g) != G for g in groups):
            short = sum(len(g) != G for g in groups)
            return UpdateResult(
                skipped=f"{short} of {len(groups)} groups have fewer than {G} answers with text: no GRPO update this "
                "round, the sampler stays as it is",
                info=info,
            )
        if not any(spreads):
            first = groups[0][0].reward
            return UpdateResult(
                skipped=f"all {len(groups)} groups scored alike (every answer in a group: the same typed reward, "
                f"e.g. {first:+.2f}): zero advantages, no GRPO update this round, the sampler stays as it is",
                info=info,
            )
        from coevo.training.meter import measure

        trainer = self._trainer(groups)
        with measure(cuda=self.policy.device.type == "cuda") as usage:
            trainer.train()
        self._optimizer_state = trainer.optimizer.state_dict()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        return UpdateResult(loss=mean(losses) if losses else None, usage=usage.to_dict(), info=info)

    def _trainer(self, groups: list[list[Answer]]):
        """TRL's ``GRPOTrainer`` for one optimizer step over these groups (one generation batch: P x G answers)."""
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        from coevo.training.trl_args import common_trainer_args, grpo_step_args

        cfg = self.config
        G, P = cfg.answers_per_prompt, len(groups)
        micro = cfg.micro_batch or G
        tok = self.tokenizer
        queue: dict[str, list[list[Answer]]] = {}
        for g in groups:
            queue.setdefault(g[0].prompt, []).append(g)

        def rollout_func(prompts: list[str], trainer) -> dict:
            """TRL's rollout: the answers already sampled, in the order of ``prompts`` (each repeated G times)."""
            left = {k: list(v) for k, v in queue.items()}
            rows: list[Answer] = []
            for i in range(0, len(prompts), G):
                rows += left[prompts[i]].pop(0)
            eos = [tok.eos_token_id] if tok.eos_token_id is not None else [tok.pad_token_id]
            return {
                "prompt_ids": [tok(a.prompt, add_special_tokens=False)["input_ids"] for a in rows],
                "completion_ids": [tok(a.completion, add_special_tokens=False)["input_ids"] or eos for a in rows],
                "logprobs": None,
                "typed_reward": [a.reward for a in rows],
            }

        def typed_reward(prompts, completions, typed_reward, **kwargs) -> list[float]:
            return [float(r) for r in typed_reward]

        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        seed = self.ctx.rng(self.name, "trainer", self.updates).getrandbits(31)
        args = GRPOConfig(
            output_dir=str(self.trl_dir()),
            max_steps=1,
            learning_rate=cfg.learning_rate,
            optim=cfg.optim,
            weight_decay=cfg.weight_decay,
            max_grad_norm=cfg.max_grad_norm,
            **grpo_step_args(
                prompts=P,
                group=G,
                micro_batch=micro,
                beta=cfg.beta,
                epsilon=cfg.epsilon,
                loss_type=cfg.loss_type,
                scale_rewards=cfg.scale_rewards,
                gradient_checkpointing=cfg.gradient_checkpointing,
            ),
            **common_trainer_args(device=self.policy.device.type, seed=seed),
        )
        trainer = GRPOTrainer(
            model=self.peft_model,
            reward_funcs=[typed_reward],
            args=args,
            train_dataset=Dataset.from_list([{"prompt": g[0].prompt} for g in groups]),
            processing_class=tok,
            rollout_func=rollout_func,
        )
        quiet(trainer)
        if self._optimizer_state is not None:  # AdamW's moments carry over from the last update
            trainer.create_optimizer()
            trainer.optimizer.load_state_dict(self._optimizer_state)
        return trainer
