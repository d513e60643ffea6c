"""Agentic GRPO baseline with TRL: multi-turn episodes, one terminal reward per trajectory, group-relative advantages.

GRPO (Shao et al. 2024, "DeepSeekMath", arXiv 2402.03300) in its agentic form, as the Agentic ESOpt paper's RL
baseline (docs/references.md §6): each optimizer step draws ``prompts_per_step`` tasks, plays ``num_generations`` (G)
episodes per task with the current policy, scores each **trajectory** with the environment's terminal reward
``r``, and gives every generated token of every turn of trajectory ``j`` the advantage
``A_j = (r_j - mean(r_group)) / (std(r_group) + eps)``; environment tokens get no loss.

The trainer is TRL's ``GRPOTrainer`` (no trainer of our own): a custom ``rollout_func`` replaces TRL's
single-turn generation and plays the episodes itself (:func:`coevo.rl.tokens.run_token_episodes`), returning
per trajectory ``prompt_ids`` (first turn), ``completion_ids`` (all replies with the environment's tokens
between them), ``env_mask`` (1 on generated tokens) and the episode reward, which the reward function hands
back to TRL. TRL then computes the group-relative advantages, masks the loss with ``env_mask`` and steps the
optimizer (AdamW by default). ``logprobs`` is returned as ``None``: TRL uses rollout log-probabilities only for
the vLLM importance-sampling correction, and here the rollout is sampled from the training model itself (with
``dtype: bfloat16``, from its stochastically rounded bf16 copy: the gap between the copy and the float32 masters
under autocast is not corrected for, as in a colocated inference engine without importance sampling).

What TRL's API imposes: a GRPO sample is **one** token sequence, so a multi-turn trajectory is trained as one
sequence in which each reply is conditioned on the whole episode so far. The agent therefore runs with chat
history (``context: history``); the reference Sudoku agent's no-history protocol (``context: board``: each
turn sees only the current board) would need one sample per turn with a variable number of samples per
trajectory, which ``GRPOTrainer`` cannot express (rewards and advantages are indexed by input rows). So
``context: board`` is refused here; compare ES and GRPO with ``context: history`` on both.

Store: every training trajectory (evolver ``grpo``, generation = optimizer step, ``meta.group``) and every
held-out evaluation (member None, ``meta.split == "test"``, generation = steps done) goes to the
:class:`~coevo.store.TrajectoryStore` given, the same store an ES run writes, so reports compare both.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from pydantic import ConfigDict, Field, field_validator, model_validator

from coevo.envs.multiturn import turns_to_steps
from coevo.es.lowrank import stochastic_round_into
from coevo.rollouts.base import build_rollout, resolve_rollout
from coevo.schema import ConfigModel
from coevo.training.trl_args import common_trainer_args, grpo_step_args
from coevo.types import Trajectory


class GRPOSettings(ConfigModel):
    """Settings of a GRPO baseline run. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")
    run_name: str = Field("grpo", description="run id prefix (trajectory keys, store rows)")
    seed: int = Field(0, description="seed of TRL (data order) and of the episodes' sampling")
    model: str = Field("qwen2.5-coder-0.5b-instruct", description="model name, local HF folder or tiny:<preset>")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="dtype of the rollout / evaluation weights and of the training compute. bfloat16 is mixed "
        "precision: float32 master weights train under bf16 autocast and a bf16 copy, stochastically rounded "
        "from the masters, samples the episodes (see GRPOBaseline)",
    )
    device: str = Field("cpu", description="cpu or cuda")
    batch_size: int = Field(8, ge=1, description="episodes per generate batch")
    rollout: dict[str, Any] = Field(
        description="the environment: a sudoku or react_math rollout spec (its train "
        "pool, held-out split and decoding are used)"
    )
    steps: int = Field(10, ge=1, description="optimizer steps")
    prompts_per_step: int = Field(4, ge=1, description="distinct tasks per step (groups)")
    num_generations: int = Field(4, ge=2, description="G: episodes per task (group size)")
    learning_rate: float = Field(1e-6, gt=0)
    optim: str = Field("adamw_torch", description="transformers optimizer name (the memory comparison uses AdamW)")
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    beta: float = Field(0.0, ge=0, description="KL coefficient to the reference model (0: no reference model)")
    epsilon: float = Field(0.2, gt=0, description="PPO-style clip range")
    loss_type: Literal["grpo", "dapo", "dr_grpo", "bnpo"] = Field("grpo", description="TRL loss aggregation")
    scale_rewards: Literal["group", "batch", "none"] = Field("group", description="advantage scaling")
    micro_batch: int | None = Field(
        None,
        ge=1,
        description="trajectories per forward/backward pass (TRL's per_device_train_batch_size; default G). "
        "A divisor of prompts_per_step x G; smaller lowers peak memory (the loss logits are micro_batch x "
        "sequence x vocabulary) and leaves the step's gradient unchanged (per-sequence losses are averaged)",
    )
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass")
    eval_every: int = Field(0, ge=0, description="held-out evaluation every k steps (0: only at start and end)")
    eval_at_start: bool = Field(True, description="evaluate the base model before training")

    @field_validator("rollout")
    @classmethod
    def _rollout(cls, v: dict[str, Any]) -> dict[str, Any]:
        rcls = resolve_rollout(str(v.get("type", "")))
        if not hasattr(rcls, "pool"):
            raise ValueError(f"rollout type {v.get('type')!r} has no task pool; GRPO supports sudoku and react_math")
        v = rcls.Config.model_validate(v).model_dump()
        if v.get("context", "history") != "history":
            raise ValueError(
                "GRPO needs rollout.context 'history': TRL trains a multi-turn trajectory as one token "
                "sequence, so each reply is conditioned on the episode so far (see coevo.rl.grpo)"
            )
        return v

    @model_validator(mode="after")
    def _micro_batch(self) -> GRPOSettings:
        per_step = self.prompts_per_step * self.num_generations
        if self.micro_batch is not None and per_step % self.micro_batch:
            raise ValueError(
                f"micro_batch {self.micro_batch} must divide prompts_per_step x num_generations = {per_step}"
            )
        return self

    def micro(self) -> int:
        """Trajectories per forward/backward pass (``micro_batch``, default G)."""
        return self.micro_batch or self.num_generations

    def episodes(self) -> int:
        """Training episodes of the run: steps x prompts_per_step x num_generations (the ES-comparable budget)."""
        return self.steps * self.prompts_per_step * self.num_generations


def stop_token_ids(model, tokenizer) -> list[int]:
    """Token ids that end a reply: the generation config's EOS ids, the tokenizer's EOS and pad."""
    ids: set[int] = set()
    eos = model.generation_config.eos_token_id
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    ids.update(i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None)
    return sorted(ids)


class GRPOBaseline:
    """One GRPO run (module docstring): builds the policy, the TRL trainer and the episodes; records to a store.

    Precision. With ``dtype: float32`` one float32 model is trained, sampled and evaluated. With ``dtype:
    bfloat16`` the run is mixed precision, as RL systems with a separate inference engine run it: TRL trains
    float32 **master weights** (``train_model``; AdamW states in float32; forward and backward under bf16
    autocast, TRL's ``bf16=True``), and the episodes and held-out evaluations are sampled by a bf16 copy
    (``policy``) that :meth:`sync` refreshes from the masters before every rollout and evaluation. Pure bf16
    weights cannot train at the paper's learning rate: AdamW's first step moves every weight by ``lr`` = 1e-6,
    and a bf16 weight of magnitude >= 2^-11 = 4.9e-4 (half an ulp > 1e-6, i.e. nearly all of them) rounds back to
    itself. For the same reason the copy is rounded **stochastically** (unbiased, deterministic bits keyed by
    the run seed, the optimizer step and the tensor name: :func:`coevo.es.lowrank.stochastic_round`, the
    rounding low-rank ES applies to its own bf16 updates), not to nearest, which would hide a 1e-6 step
    from the sampled policy. The masters start as the bf16 model's values (the checkpoint rounded to bf16 as ES
    loads it; exact for a bf16 checkpoint such as the embedded model's), and a bf16-representable value rounds
    to itself, so the copy is the very bf16 model ES starts from until a step moves the masters; a step that
    leaves them unchanged (every group's rewards equal) leaves the copy unchanged too.

    Args:
        settings: the run's settings.
        out_dir: TRL's output folder (logs; no checkpoints are saved).
        store: the trajectory store to record into (shared with an ES run for comparison), or None.
        run_id: the run id recorded in the store (default ``settings.run_name``).
    """

    def __init__(self, settings: GRPOSettings, out_dir: str | Path, store=None, run_id: str | None = None) -> None:
        from coevo.backends.hf import HFPolicy
        from coevo.backends.models import load_tokenizer

        self.settings = s = settings
        self.out_dir = Path(out_dir)
        self.store = store
        self.run_id = run_id or s.run_name
        self.rollout = build_rollout(s.rollout, None)
        #: the policy that samples episodes and is evaluated (dtype ``s.dtype``)
        self.policy = HFPolicy(s.model, dtype=s.dtype, device=s.device, batch_size=s.batch_size)
        #: the model TRL trains: the policy's own model in float32, else float32 masters (class docstring)
        self.train_model = self.policy.model
        if self.policy.dtype != torch.float32:
            self.train_model = HFPolicy(s.model, dtype="float32", device=s.device, batch_size=1).model
            with torch.no_grad():  # the masters start from the bf16 weights ES starts from (class docstring)
                masters = dict(self.train_model.named_parameters())
                for name, p in self.policy.model.named_parameters():
                    masters[name].copy_(p)
        self.tokenizer = load_tokenizer(self.policy.path)  # TRL's own copy (the policy's pads on the left)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.stop_ids = stop_token_ids(self.policy.model, self.tokenizer)
        self.pool = self.rollout.pool("train")
        self._by_prompt = {}
        for i, case in enumerate(self.pool):
            self._by_prompt.setdefault(self.rollout.episode(case).observation(), i)
        self.evaluations: list[dict[str, Any]] = []
        self.train_rewards: list[float] = []
        self.trainer = None

    # ------------------------------------------------------------------ TRL wiring
    def dataset(self):
        """One row per train-pool task: ``prompt`` is its first-turn conversation."""
        from datasets import Dataset

        rows = []
        for case in self.pool:
            ep = self.rollout.episode(case)
            rows.append(
                {
                    "prompt": ([{"role": "system", "content": ep.system}] if ep.system else [])
                    + [{"role": "user", "content": ep.observation()}]
                }
            )
        return Dataset.from_list(rows)

    def rollout_func(self, prompts: list[list[dict[str, str]]], trainer) -> dict[str, Any]:
        """TRL ``rollout_func``: play one episode per prompt (prompts arrive already repeated G times)."""
        from coevo.rl.tokens import run_token_episodes

        step = trainer.state.global_step
        episodes = [self.rollout.episode(self.pool[self._by_prompt[p[-1]["content"]]]) for p in prompts]
        t0 = time.time()
        self.sync(step)
        model = self.policy.model
        was_training = model.training
        model.eval()  # sampling only: with gradient checkpointing, train mode would switch the KV cache off
        try:
            trajs = run_token_episodes(
                model,
                self.tokenizer,
                episodes,
                lambda turn: self.rollout.sampling("train", step, turn),
                stop_ids=self.stop_ids,
                batch_size=self.settings.batch_size,
            )
        finally:
            model.train(was_training)
        rewards = [ep.reward() for ep in episodes]
        self.train_rewards.extend(rewards)
        self._record_train(step, episodes, trajs, rewards, time.time() - t0)
        return {
            "prompt_ids": [t.prompt_ids for t in trajs],
            "completion_ids": [t.completion_ids for t in trajs],
            "env_mask": [t.env_mask for t in trajs],
            "logprobs": None,
            "env_reward": rewards,
        }

    @staticmethod
    def reward_func(prompts, completions, env_reward: Sequence[float], **kwargs) -> list[float]:
        """The episode's terminal reward, computed by the environment during the rollout."""
        return [float(r) for r in env_reward]

    def build_trainer(self):
        from trl import GRPOConfig, GRPOTrainer

        s = self.settings
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        cfg = GRPOConfig(
            output_dir=str(self.out_dir),
            max_steps=s.steps,
            learning_rate=s.learning_rate,
            optim=s.optim,
            weight_decay=s.weight_decay,
            max_grad_norm=s.max_grad_norm,
            # one optimizer step = one generation batch of prompts_per_step x G episodes, in micro-batches
            **grpo_step_args(
                prompts=s.prompts_per_step,
                group=s.num_generations,
                micro_batch=s.micro(),
                beta=s.beta,
                epsilon=s.epsilon,
                loss_type=s.loss_type,
                scale_rewards=s.scale_rewards,
                gradient_checkpointing=s.gradient_checkpointing,
            ),
            **common_trainer_args(device=s.device, seed=s.seed, bf16=s.dtype == "bfloat16"),
        )
        self.trainer = GRPOTrainer(
            model=self.train_model,
            reward_funcs=[self.reward_func],
            args=cfg,
            train_dataset=self.dataset(),
            processing_class=self.tokenizer,
            rollout_func=self.rollout_func,
        )
        if s.eval_every:
            self.trainer.add_callback(eval_callback(self, s.eval_every))
        return self.trainer

    # ------------------------------------------------------------------ precision
    @torch.no_grad()
    def sync(self, step: int) -> None:
        """Refresh the sampling policy from the float32 masters (mixed precision only; class docstring).

        Each master tensor is rounded stochastically to the policy's dtype by
        :func:`coevo.es.lowrank.stochastic_round_into` (the row blocks and bits of ES's own bf16 updates) with
        ``seed = blake2b("grpo-sync:{run seed}:{step}")``: the same step gives the same copy. A no-op when the
        policy is the trained model itself (float32).

        Args:
            step: optimizer steps done (keys the rounding).
        """
        if self.train_model is self.policy.model:
            return
        text = f"grpo-sync:{int(self.settings.seed)}:{int(step)}"
        seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") & (2**63 - 1)
        masters = dict(self.train_model.named_parameters())
        for name, p in self.policy.model.named_parameters():
            stochastic_round_into(p.data, masters[name].detach().float(), seed, name)

    # ------------------------------------------------------------------ evaluation and store
    def evaluate(self, step: int) -> float:
        """Held-out success of the current weights with the rollout's own evaluator (the one ES uses)."""
        self.sync(step)
        model = self.policy.model
        was_training = model.training
        model.eval()
        try:
            ts = self.rollout.run(
                self.policy,
                generation=step,
                member=None,
                key_prefix=f"{self.run_id}/grpo/eval/s{step:05d}",
                split="test",
                evolver="grpo",
            )
        finally:
            model.train(was_training)
        for t in ts:
            t.run_id = self.run_id
            t.meta["grpo_step"] = step
        if self.store is not None:
            self.store.add_trajectories(ts)
        value = self.rollout.member_reward(ts)
        self.evaluations.append({"step": step, "test_reward": value, "episodes": len(ts)})
        return value

    def _record_train(self, step: int, episodes, trajs, rewards: list[float], dt: float) -> None:
        if self.store is None:
            return
        g = self.settings.num_generations
        rows = []
        for j, (ep, tr, r) in enumerate(zip(episodes, trajs, rewards)):
            rows.append(
                Trajectory(
                    key=f"{self.run_id}/grpo/s{step:05d}/{j}",
                    run_id=self.run_id,
                    evolver="grpo",
                    space="parameter",
                    generation=step,
                    task_id=self.rollout.task_id(ep),
                    steps=turns_to_steps(tr.turns),
                    reward=r,
                    llm_calls=len(tr.turns),
                    prompt_tokens=sum(t.prompt_tokens for t in tr.turns),
                    completion_tokens=sum(t.completion_tokens for t in tr.turns),
                    duration_s=dt / max(1, len(episodes)),
                    meta={
                        "split": "train",
                        "group": j // g,
                        "context": "history",
                        "sequence_tokens": len(tr.prompt_ids) + len(tr.completion_ids),
                        "generated_tokens": sum(tr.env_mask),
                        **ep.summary(),
                    },
                )
            )
        self.store.add_trajectories(rows)

    def run(self) -> dict[str, Any]:
        """Evaluate (optionally), train ``steps`` GRPO steps, evaluate; returns a summary dict."""
        s = self.settings
        t0 = time.time()
        trainer = self.trainer or self.build_trainer()
        if s.eval_at_start:
            self.evaluate(0)
        train_t0 = time.time()
        trainer.train()
        train_s = time.time() - train_t0
        if not self.evaluations or self.evaluations[-1]["step"] != s.steps:
            self.evaluate(s.steps)
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        return {
            "method": "grpo",
            "run_id": self.run_id,
            "steps": s.steps,
            "episodes": len(self.train_rewards),
            "train_reward": sum(self.train_rewards) / max(1, len(self.train_rewards)),
            "evaluations": self.evaluations,
            "final_test_reward": self.evaluations[-1]["test_reward"],
            "losses": losses,
            "train_s": train_s,
            "wall_s": time.time() - t0,
        }


def eval_callback(baseline: GRPOBaseline, every: int):
    """A ``transformers.TrainerCallback`` running ``baseline``'s held-out evaluation every ``every`` optimizer steps
    (the last step is evaluated by :meth:`GRPOBaseline.run`)."""
    from transformers import TrainerCallback

    class EvalEvery(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % every == 0 and state.global_step < baseline.settings.steps:
                baseline.evaluate(state.global_step)

    return EvalEvery()


def load_settings(path: str | Path, overrides: Sequence[str] = ()) -> GRPOSettings:
    """Settings from a YAML file (its ``grpo:`` mapping, or the whole file) with ``a.b=value`` overrides
    (:func:`coevo.config.apply_overrides`, e.g. ``rollout.horizon=3``).

    Raises:
        coevo.config.ConfigError: a malformed override. pydantic.ValidationError: invalid settings.
    """
    from coevo.config import apply_overrides

    data = yaml.safe_load(Path(path).read_text()) or {}
    return GRPOSettings.model_validate(apply_overrides(dict(data.get("grpo", data)), list(overrides)))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m coevo.rl.grpo CONFIG.yaml --out DIR [--store PATH] [key=value ...]``: one GRPO run; prints
    its summary as one JSON line (also written to DIR/grpo_summary.json)."""
    ap = argparse.ArgumentParser(prog="python -m coevo.rl.grpo", description=main.__doc__)
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*", help="key=value (e.g. steps=4 rollout.horizon=3)")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--store", help="trajectory store to record into (default OUT/store.sqlite)")
    ap.add_argument("--run-id", help="run id in the store (default run_name)")
    args = ap.parse_args(argv)
    from coevo.store import TrajectoryStore

    settings = load_settings(args.config, args.overrides)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with TrajectoryStore(args.store or out / "store.sqlite") as store:
        summary = GRPOBaseline(settings, out / "trl", store, args.run_id).run()
    (out / "grpo_summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
