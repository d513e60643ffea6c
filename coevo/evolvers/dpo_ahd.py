"""DPO in the heuristic-design loop (``type: dpo_ahd``): preference training on the search's own answers, as
EvoTune trains its sampler.

EvoTune (Surina et al., COLM 2025, arXiv 2504.05108, docs/field-notes §8-§9) alternates search with DPO phases
(Rafailov et al. 2023, arXiv 2305.18290) on the programs the search wrote: pairs of answers **to the same prompt**,
a valid one against a failed one, and the better against the worse half of the valid ones; LoRA, beta 0.4. Here one
step (:mod:`coevo.evolvers.sampler_training`) first samples ``prompts_per_step`` groups of ``answers_per_prompt``
answers to the searched evolver's prompts (EvoTune's K answers per prompt; 0 prompts: pairs from what the run has
already sampled), evaluated and pooled into the search like ES members' children, then builds pairs from the
**whole run's store** (every answer through the search's sampler: its own samples, ES children, these groups),
grouped by their exact prompt, and runs ``epochs`` passes of TRL's ``DPOTrainer`` over them on the LoRA adapter.
The reference model is the sampler as it was before the update (TRL copies the adapter into a frozen ``ref``
adapter; at the first update that is the base model, the adapter being zero); EvoTune instead trains a fresh LoRA on
the base at every phase. The adapter then samples the next rounds.

Pairs (``pairs``):

* ``evotune`` (default): per prompt, every failed or copied answer (invalid, ``duplicate``,
  ``behavioural_duplicate``) against a valid new one (the valid ones in turn), and the valid ones of the better half
  (typed reward, :func:`coevo.training.ahd_rewards.typed_reward`) against those of the worse half;
* ``typed``: every two answers to a prompt whose typed rewards differ (the higher chosen), also two failures of
  different kinds (a runtime error over a syntax error): more pairs from fewer valid answers.

At most ``max_pairs_per_prompt`` pairs per prompt and ``max_pairs`` in all (the newest prompts first). A prompt is
read back from the store's text (:func:`coevo.training.ahd_rewards.messages_from_observation`); an answer is the
text the model generated after it. A store with no usable pair skips the update with one line naming why (the
sampler stays as it is: the frozen model before any update).
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field

from coevo.evolvers.base import register_evolver
from coevo.evolvers.sampler_training import Answer, SamplerTrainingConfig, SamplerTrainingEvolver, UpdateResult, quiet
from coevo.tables import mean
from coevo.training.ahd_rewards import messages_from_observation


class DPOAHDConfig(SamplerTrainingConfig):
    """Settings of ``dpo_ahd`` (plus :class:`~coevo.evolvers.sampler_training.SamplerTrainingConfig`'s)."""

    beta: float = Field(0.4, gt=0, le=10, description="DPO's beta (EvoTune: 0.4)")
    pairs: Literal["evotune", "typed"] = Field("evotune", description="which answers make pairs (module docstring)")
    epochs: int = Field(1, ge=1, le=100, description="passes over the pairs per update")
    max_pairs: int = Field(64, ge=1, description="pairs per update at most (newest prompts first)")
    max_pairs_per_prompt: int = Field(8, ge=1, description="pairs per prompt at most")
    max_length: int = Field(2048, ge=16, description="tokens of prompt + answer kept (DPOConfig.max_length)")


def drop_ref_adapter(peft_model) -> None:
    """Remove the frozen ``ref`` adapter TRL's DPOTrainer adds (a copy of the trained adapter when the trainer is
    built, its reference model), so the next trainer can add it again and no copy is saved or kept in memory."""
    if "ref" in peft_model.peft_config:
        peft_model.delete_adapter("ref")
        peft_model.set_adapter("default")


@register_evolver("dpo_ahd")
class DPOAHDEvolver(SamplerTrainingEvolver):
    """DPO on the sampler of a heuristic-design evolver, pairs from the run's store (module docstring)."""

    Config = DPOAHDConfig
    method = "dpo"

    # ------------------------------------------------------------------ pairs
    def prompt_groups(self) -> list[list[Answer]]:
        """The run's answers through the searched evolver's sampler, grouped by exact prompt (oldest prompt first),
        each as an :class:`~coevo.evolvers.sampler_training.Answer`; reflections and unreadable prompts left out."""
        sampler = self.search.sampler
        by_prompt: dict[str, list] = {}
        for t in self.ctx.store.query(run_id=self.ctx.run_id, task_id=sampler.train_tag, order_by="id"):
            if t.meta.get("sampler") != self.config.evolver or t.meta.get("kind") == "reflection" or not t.steps:
                continue
            by_prompt.setdefault(t.steps[0].observation or "", []).append(t)
        out = []
        for text, ts in by_prompt.items():
            messages = messages_from_observation(text)
            if messages is None or len(ts) < 2:
                continue
            answers = [a for a in (self.answer(t, messages) for t in ts) if a is not None]
            if len(answers) >= 2:
                out.append(answers)
        return out

    def make_pairs(self, groups: list[list[Answer]]) -> list[tuple[Answer, Answer]]:
        """``(chosen, rejected)`` pairs of ``groups`` under the ``pairs`` rule (module docstring), newest prompts
        first, capped by ``max_pairs_per_prompt`` and ``max_pairs``."""
        cfg = self.config
        out: list[tuple[Answer, Answer]] = []
        for answers in reversed(groups):
            if cfg.pairs == "typed":
                ranked = sorted(answers, key=lambda a: -a.reward)
                pairs = [(a, b) for i, a in enumerate(ranked) for b in ranked[i + 1 :] if a.reward > b.reward]
            else:
                valid = [a for a in answers if a.trajectory.valid]
                failed = [a for a in answers if not a.trajectory.valid]
                pairs = [(valid[i % len(valid)], f) for i, f in enumerate(failed)] if valid else []
                ranked = sorted(valid, key=lambda a: -a.reward)
                half = len(ranked) // 2
                pairs += [(a, b) for a, b in zip(ranked[:half], ranked[len(ranked) - half :]) if a.reward > b.reward]
            pairs = [(c, r) for c, r in pairs if c.completion != r.completion]
            out += pairs[: cfg.max_pairs_per_prompt]
            if len(out) >= cfg.max_pairs:
                break
        return out[: cfg.max_pairs]

    def _no_pairs(self, groups: list[list[Answer]]) -> str:
        answers = [a for g in groups for a in g]
        valid = sum(a.trajectory.valid for a in answers)
        need = (
            "a prompt with a valid new answer and a failed or copied one"
            if self.config.pairs == "evotune"
            else "a prompt with two answers of different typed rewards"
        )
        return (
            f"no usable pairs in the store (pairs: {self.config.pairs} needs {need}; {len(groups)} prompts with >= 2 "
            f"answers, {len(answers)} answers, {valid} valid): no DPO update this round, the sampler stays as it is"
        )

    # ------------------------------------------------------------------ the update
    def train_update(self, round_index: int, groups: list[list[Answer]]) -> UpdateResult:
        """``epochs`` DPO passes over the store's pairs (module docstring); skipped without pairs."""
        prompts = self.prompt_groups()
        pairs = self.make_pairs(prompts)
        info: dict[str, Any] = {
            "pairs": len(pairs),
            "prompts_with_pairs": len({c.trajectory.steps[0].observation for c, _ in pairs}),
        }
        if not pairs:
            return UpdateResult(skipped=self._no_pairs(prompts), info=info)
        from coevo.training.meter import measure

        trainer = self._trainer(pairs)
        try:
            with measure(cuda=self.policy.device.type == "cuda") as usage:
                trainer.train()
        finally:
            drop_ref_adapter(self.peft_model)
        self._optimizer_state = trainer.optimizer.state_dict()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        info["mean_reward_margin"] = mean([c.reward - r.reward for c, r in pairs])
        return UpdateResult(loss=mean(losses) if losses else None, usage=usage.to_dict(), info=info)

    def _trainer(self, pairs: list[tuple[Answer, Answer]]):
        """TRL's ``DPOTrainer`` over the pairs (plain-text prompt: the rendered chat prompt; chosen / rejected: the
        generated continuations, TRL appends the EOS token)."""
        from datasets import Dataset
        from datasets.utils.logging import disable_progress_bar
        from trl import DPOConfig, DPOTrainer

        from coevo.training.trl_args import common_trainer_args

        cfg = self.config
        rows = [{"prompt": c.prompt, "chosen": c.completion, "rejected": r.completion} for c, r in pairs]
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        seed = self.ctx.rng(self.name, "trainer", self.updates).getrandbits(31)
        args = DPOConfig(
            output_dir=str(self.trl_dir()),
            num_train_epochs=cfg.epochs,
            learning_rate=cfg.learning_rate,
            optim=cfg.optim,
            weight_decay=cfg.weight_decay,
            max_grad_norm=cfg.max_grad_norm,
            per_device_train_batch_size=cfg.micro_batch or 2,
            gradient_accumulation_steps=1,
            beta=cfg.beta,
            max_length=cfg.max_length,
            gradient_checkpointing=cfg.gradient_checkpointing,
            **common_trainer_args(device=self.policy.device.type, seed=seed),
        )
        disable_progress_bar()  # TRL tokenises the pairs with datasets.map
        drop_ref_adapter(self.peft_model)  # TRL copies the adapter as it is now into "ref": the reference model
        trainer = DPOTrainer(
            model=self.peft_model, args=args, train_dataset=Dataset.from_list(rows), processing_class=self.tokenizer
        )
        quiet(trainer)
        if self._optimizer_state is not None:  # AdamW's moments carry over from the last update
            trainer.create_optimizer()
            trainer.optimizer.load_state_dict(self._optimizer_state)
        return trainer
