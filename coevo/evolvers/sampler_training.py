"""The base of the gradient-trained sampler evolvers of heuristic design: ``grpo_ahd`` and ``dpo_ahd``.

Both train a LoRA adapter (:mod:`coevo.training.lora`) on the run's in-process model (``model.backend: hf``) with a
TRL trainer, beside a heuristic-design evolver (``evolver: eoh``, any :class:`~coevo.ahd.sampler.HeuristicSearch`)
whose sampler, population and prompts they use, as ES does in the same loop (:mod:`coevo.rollouts.eoh_children`).
The adapter lives in the model's own modules, so every later sample of the run (the search's own, these
evolvers') comes from the trained sampler. One :meth:`SamplerTrainingEvolver.step` is:

1. **groups** (``prompts_per_step`` P x ``answers_per_prompt`` G): P calls the searched evolver would give an ES
   member (its ``member_jobs``: EoH's m1 / m2 on parents drawn from its population by rank; ``i1`` before it has
   one; ``operators`` picks others), each asked G times with G seeds (same prompt, GRPO's group, EvoTune's K).
   They are sampled, evaluated in the sandbox and recorded by the search's sampler, exactly like ES members'
   children (author: this evolver; ``meta``: ``trainer``, ``update``, ``group``, ``reference_score``), so they
   enter the search's population at its next step and count in its best heuristic. Each answer gets CALM's
   typed reward (:func:`coevo.training.ahd_rewards.typed_reward`);
2. **update** (the subclass's :meth:`~SamplerTrainingEvolver.train_update`): one GRPO step on the groups
   (``grpo_ahd``) or one DPO pass over pairs from the run's store (``dpo_ahd``), measured (wall time, peak resident
   memory: :mod:`coevo.training.meter`). Where there is nothing to learn from (every group scored alike; no usable
   pair) the update is skipped with one logged line naming the reason, and sampling goes on with the model as it
   is (the frozen model, before any update): the documented fallback;
3. **checkpoint**: the adapter and the optimizer's state go to ``<run folder>/adapters/<evolver>/round-RRRRR/`` (a
   PEFT folder, written atomically), and a ``sampler_update`` artifact records the update (kind, reward
   statistics, pairs or groups, loss, wall time, peak memory, adapter hash and folder).

The run stops after ``total_updates`` updates (as ES stops after its generations).

Resume (Ctrl-C, ``kill -9``): the loop's checkpoint holds the number of updates and the adapter folder;
:meth:`~SamplerTrainingEvolver.load_checkpoint` loads the adapter and the optimizer state back and checks the
adapter's hash. An interrupted step re-runs whole: its answers are reused from the store (deterministic keys and
seeds), and the update is recomputed from the same adapter, optimizer state, data and seed, so an interrupted run
ends with the adapter an uninterrupted one ends with.

Export: every ``round-RRRRR`` folder is a PEFT adapter whose base is the run's ``model.name``; give the folder as
``model.name`` (or as a model path wherever coevo takes one) to sample with the trained sampler
(:mod:`coevo.backends.adapters`). ``init_adapter`` starts training from such a folder.

Limits: one model per run: these evolvers refuse a run with another parameter-space evolver (``es``) and need the
hf backend (the vLLM engine would sample from weights the trainer does not see).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator

from coevo.ahd.sampler import HeuristicSearch, OperatorName, SampleJob, heuristic_search, operators_field
from coevo.artifacts import SAMPLER_UPDATE
from coevo.backends.base import continues_final_message, render_chat, request_seed
from coevo.errors import ConfigError
from coevo.evolvers.base import Evolver, EvolverConfig, StepReport
from coevo.tables import fmt, md_table, mean
from coevo.training.ahd_rewards import group_spread, reward_kind, typed_reward
from coevo.training.lora import LoRASettings
from coevo.types import Trajectory

log = logging.getLogger(__name__)

#: file of the loop checkpoint's evolver folder pointing at the adapter
POINTER_FILE = "adapter.json"
#: folder of the run's adapters (``<run>/adapters/<evolver>/round-RRRRR``)
ADAPTERS_DIR = "adapters"


class SamplerTrainingConfig(EvolverConfig):
    """Settings shared by ``grpo_ahd`` and ``dpo_ahd`` (module docstring)."""

    evolver: str = Field(
        "eoh", description="the heuristic-design evolver whose sampler, population and prompts are used"
    )
    operators: list[OperatorName] | None = operators_field(
        "operators of the group prompts, in turn; default (null): the searched evolver's member "
        "operators (eoh: m1, m2; i1 while it has no population)"
    )
    prompts_per_step: int = Field(2, ge=0, description="P: prompts (groups) sampled per step")
    answers_per_prompt: int = Field(4, ge=2, le=64, description="G: answers per prompt (GRPO group, EvoTune's K)")
    total_updates: int = Field(4, ge=1, description="updates before the evolver (and the run) stops")
    learning_rate: float = Field(1e-4, gt=0, le=1, description="AdamW learning rate of the adapter")
    optim: str = Field("adamw_torch", description="transformers optimizer name")
    weight_decay: float = Field(0.0, ge=0, lt=1)
    max_grad_norm: float = Field(1.0, gt=0)
    micro_batch: int | None = Field(
        None, ge=1, description="sequences per forward/backward pass (lower: less peak memory, same update)"
    )
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass")
    improvement_scale: float = Field(
        0.1, gt=0, description="relative score change at which a typed reward saturates (coevo.training.ahd_rewards)"
    )
    lora: LoRASettings = Field(default_factory=LoRASettings, description="the adapter (coevo.training.lora)")
    init_adapter: str | None = Field(None, description="a PEFT adapter folder (same base, rank, targets) to start from")

    @field_validator("init_adapter")
    @classmethod
    def _adapter_folder(cls, v: str | None) -> str | None:
        if v is not None and not (Path(v).expanduser() / "adapter_model.safetensors").is_file():
            raise ValueError(f"{v} is not a PEFT adapter folder (no adapter_model.safetensors)")
        return v

    def link(self, name: str, run_config: Any) -> list[str]:
        """The searched evolver is a heuristic-design evolver of the run, no other evolver trains the weights, and
        the model runs in process (hf backend)."""
        from coevo.evolvers.ahd_common import AHDEvolver
        from coevo.evolvers.base import resolve_evolver

        errors = []
        types = {spec.name: spec.type for spec in run_config.evolvers}
        target = types.get(self.evolver)
        if target is not None and self.evolver != name and not issubclass(resolve_evolver(target), AHDEvolver):
            errors.append(f"evolvers.{name}.evolver: {self.evolver!r} ({target}) is not a heuristic-design evolver")
        others = [n for n, t in types.items() if n != name and resolve_evolver(t).space == "parameter"]
        if others:
            errors.append(
                f"evolvers.{name}.type: {others[0]!r} changes the model's weights too; a run trains its sampler with "
                "one parameter-space evolver"
            )
        model = getattr(run_config, "model", None)
        if model is not None and model.backend not in ("hf", "auto"):
            errors.append(
                f"evolvers.{name}.type / model.backend: a LoRA adapter is trained on the in-process model; set "
                f"model.backend: hf (not {model.backend!r})"
            )
        return errors


@dataclass
class Answer:
    """One recorded answer of a group, ready for a trainer: its prompt as the model saw it, the generated text."""

    trajectory: Trajectory
    prompt: str  # the rendered chat prompt (a prefilled answer's prefix included)
    completion: str  # the generated continuation (what the model wrote after the prompt)
    reward: float  # typed reward
    group: int = 0


@dataclass
class UpdateResult:
    """What one update did: ``skipped`` (the reason, one line) or the trainer's numbers."""

    skipped: str | None = None
    loss: float | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


def quiet(trainer) -> None:
    """Drop transformers' ``PrinterCallback`` from ``trainer`` (it prints every log dict to stdout when progress bars
    are off); the update's loss reaches the run's log and report through the step report instead."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)


class SamplerTrainingEvolver(Evolver):
    """Base of ``grpo_ahd`` and ``dpo_ahd`` (module docstring); a subclass implements :meth:`train_update`."""

    space = "parameter"
    Config = SamplerTrainingConfig
    #: short method name (``grpo`` / ``dpo``), recorded in the answers' meta and the update records
    method: ClassVar[str] = ""

    def __init__(self, name: str, config: SamplerTrainingConfig, ctx) -> None:
        super().__init__(name, config, ctx)
        self.updates = 0  # updates applied (or skipped) so far
        self.adapter_hash: str | None = None
        self.adapter_dir: str | None = None  # relative to the run folder
        self.search: HeuristicSearch | None = None
        self._peft = None
        self._optimizer_state: dict[str, Any] | None = None
        self._tokenizer = None

    def setup(self) -> None:
        """Look up the searched evolver (:class:`~coevo.ahd.sampler.HeuristicSearch`).

        Raises:
            ConfigError: ``evolver`` names no heuristic-design evolver of the run.
        """
        self.search = heuristic_search(self.ctx.evolvers, self.config.evolver, f"evolvers.{self.name}.evolver")

    # ------------------------------------------------------------------ the model and its adapter
    @property
    def policy(self):
        """The run's policy (an :class:`~coevo.backends.hf.HFPolicy`), with the adapter attached on first use.

        Raises:
            ConfigError: the run's policy is not an in-process transformers model; ``init_adapter`` does not fit
                it (one line naming the field and the first mismatching tensor).
        """
        policy = self.ctx.policy
        if self._peft is None:
            from coevo.backends.hf import HFPolicy

            if not isinstance(policy, HFPolicy):
                raise ConfigError(
                    f"evolvers.{self.name}.type: {self.type_name} trains a LoRA adapter on the in-process model, but "
                    f"the run's policy is {type(policy).__name__}; set model.backend: hf"
                )
            from coevo.backends.adapters import AdapterError
            from coevo.training.lora import attach_lora, load_adapter

            seed = self.ctx.rng(self.name, "lora").getrandbits(63)
            self._peft = attach_lora(policy.model, self.config.lora, self.base_ref(policy), seed)
            policy.model.eval()
            if self.config.init_adapter:
                try:
                    load_adapter(self._peft, Path(self.config.init_adapter).expanduser())
                except AdapterError as e:
                    raise ConfigError(f"evolvers.{self.name}.init_adapter: {e}") from e
        return policy

    @property
    def peft_model(self):
        """The ``peft.PeftModel`` around the run's model (attached on first use)."""
        self.policy  # noqa: B018 (attaches the adapter)
        return self._peft

    def base_ref(self, policy) -> str:
        """The model reference recorded as the adapters' base: the config's ``model.name`` when the run has a model
        section (a registry name stays a name), else the policy's folder."""
        name = getattr(getattr(self.ctx.policy_factory, "model", None), "name", None)
        if not name:
            return str(Path(policy.path).resolve())
        folder = Path(name).expanduser()
        return str(folder.resolve()) if folder.is_dir() else name

    @property
    def tokenizer(self):
        """A tokenizer for the trainers (its own copy: the policy's pads on the left for generation)."""
        if self._tokenizer is None:
            from coevo.backends.models import load_tokenizer

            self._tokenizer = load_tokenizer(self.policy.path)
            if self._tokenizer.pad_token_id is None:
                self._tokenizer.pad_token = self._tokenizer.eos_token
        return self._tokenizer

    # ------------------------------------------------------------------ groups
    def group_jobs(self, update: int) -> list[list[SampleJob]]:
        """The P groups of G calls of update ``update`` (module docstring, step 1); deterministic in the run seed,
        the update and the searched evolver's population."""
        cfg, search = self.config, self.search
        ops = list(cfg.operators or search.member_operators or ("i1",))
        pop = search.population
        reference = pop[0].reward if pop else None
        groups = []
        for p in range(cfg.prompts_per_step):
            base = search.member_jobs(f"{self.name}/u{update:05d}/p{p}", 1, [ops[p % len(ops)]])[0]
            meta = {
                **base.extra_meta,
                "trainer": self.method,
                "space": "parameter",  # recorded as parameter-space samples, as ES members' children are
                "update": update,
                "group": p,
                "reference_score": reference,
            }
            groups.append(
                [
                    SampleJob(
                        key=f"{base.key}/a{k}",
                        operator=base.operator,
                        messages=[dict(m) for m in base.messages],
                        seed=request_seed(base.seed, k),
                        parents=list(base.parents),
                        extra_meta=dict(meta),
                    )
                    for k in range(cfg.answers_per_prompt)
                ]
            )
        return groups

    def sample_groups(self, round_index: int, rep: StepReport) -> list[list[Answer]] | None:
        """Sample, evaluate and record this step's groups through the searched evolver's sampler; None when the
        sample budget cannot pay for all of them (nothing is sampled then)."""
        groups = self.group_jobs(self.updates)
        flat = [job for g in groups for job in g]
        if not flat:
            return []
        pending = sum(self.ctx.store.get_by_key(job.key) is None for job in flat)
        if pending and self.ctx.budget.allow(pending) < pending:
            return None
        search = self.search
        made = search.sampler.sample(
            flat,
            round_index=round_index,
            generation=self.updates,
            evolver=self.name,
            policy=self.policy,
            existing=search.population,
        )
        by_key = {t.key: t for t in made}
        rep.samples += sum(by_key[job.key].llm_calls for job in flat if job.key in by_key)
        rep.trajectories += len(made)
        out = []
        for p, jobs in enumerate(groups):
            answers = [self.answer(by_key[job.key], job.messages, p) for job in jobs if job.key in by_key]
            out.append([a for a in answers if a is not None])
        return out

    def answer(self, t: Trajectory, messages: list[dict[str, str]], group: int = 0) -> Answer | None:
        """The :class:`Answer` of a recorded trajectory sampled from ``messages``; None when its text does not
        continue the prompt (an answer recorded without text: a failed LLM call)."""
        output = t.steps[0].model_output if t.steps else None
        if output is None:
            return None
        prefix = messages[-1]["content"] if continues_final_message(messages) else ""
        if not output.startswith(prefix):
            return None
        return Answer(
            trajectory=t,
            prompt=render_chat(self.tokenizer, messages),
            completion=output[len(prefix) :],
            reward=typed_reward(t, self.config.improvement_scale),
            group=group,
        )

    # ------------------------------------------------------------------ one step
    def train_update(self, round_index: int, groups: list[list[Answer]]) -> UpdateResult:
        """Train the adapter once (the subclass's method) on this step's ``groups`` (and what else it reads)."""
        raise NotImplementedError

    def step(self, round_index: int) -> StepReport:
        """Sample the groups, update the adapter, save it (module docstring); stops after ``total_updates``."""
        cfg = self.config
        rep = StepReport(reward_unit="typed reward (CALM): -1 invalid .. 1 better than its parent")
        if self.updates >= cfg.total_updates:
            rep.stop, rep.stop_reason = True, f"{self.name} completed its {cfg.total_updates} updates"
            return rep
        groups = self.sample_groups(round_index, rep)
        if groups is None:
            rep.stop = True
            rep.stop_reason = (
                f"the sample budget left ({self.ctx.budget.remaining()}) cannot cover {self.name}'s update "
                f"{self.updates} ({cfg.prompts_per_step} prompts x {cfg.answers_per_prompt} answers)"
            )
            return rep
        rewards = [a.reward for g in groups for a in g]
        self.policy  # noqa: B018 (the adapter exists before the update)
        result = self.train_update(round_index, groups)
        if result.skipped:
            log.warning("evolvers.%s: %s", self.name, result.skipped)
        self.policy.model.eval()
        self.save_round(round_index)
        self.record_update(round_index, groups, result)
        self.updates += 1
        if rewards:
            rep.best_reward = max(rewards)
            rep.metrics.update(
                mean_reward=mean(rewards),
                valid_answers=float(sum(a.trajectory.valid for g in groups for a in g)),
            )
        rep.metrics.update(
            update=float(self.updates - 1),
            skipped=float(result.skipped is not None),
            **{k: float(v) for k, v in result.usage.items() if isinstance(v, (int, float))},
        )
        if result.loss is not None:
            rep.metrics["loss"] = result.loss
        return rep

    # ------------------------------------------------------------------ checkpoints and records
    def round_dir(self, round_index: int) -> Path:
        """``<run>/adapters/<evolver>/round-RRRRR``: the adapter after this round's update."""
        return Path(self.ctx.run_dir) / ADAPTERS_DIR / self.name / f"round-{round_index:05d}"

    def trl_dir(self) -> Path:
        """TRL's output folder (``<run>/adapters/<evolver>/trl``; TRL saves nothing there: coevo checkpoints)."""
        path = Path(self.ctx.run_dir) / ADAPTERS_DIR / self.name / "trl"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def save_round(self, round_index: int) -> None:
        """Write the adapter (and the optimizer's state) of this round (:func:`coevo.training.lora.save_adapter`)."""
        from coevo.training.lora import save_adapter

        folder = self.round_dir(round_index)
        extra = {"optimizer": self._optimizer_state} if self._optimizer_state is not None else {}
        self.adapter_hash = save_adapter(self.peft_model, folder, extra)
        self.adapter_dir = str(folder.relative_to(self.ctx.run_dir))

    def record_update(self, round_index: int, groups: list[list[Answer]], result: UpdateResult) -> None:
        """Store the ``sampler_update`` artifact of this update (:mod:`coevo.artifacts`)."""
        answers = [a for g in groups for a in g]
        kinds: dict[str, int] = {}
        for a in answers:
            kinds[reward_kind(a.trajectory)] = kinds.get(reward_kind(a.trajectory), 0) + 1
        content = {
            "evolver": self.name,
            "method": self.method,
            "update": self.updates,
            "round": round_index,
            "answers": len(answers),
            "groups": len(groups),
            "answer_kinds": kinds,
            "mean_reward": mean([a.reward for a in answers]) if answers else None,
            "group_spread": mean([group_spread([a.reward for a in g]) for g in groups if g]) if answers else None,
            "skipped": result.skipped,
            "loss": result.loss,
            **result.usage,
            **result.info,
            "adapter": self.adapter_dir,
            "adapter_hash": self.adapter_hash,
        }
        self.ctx.store.put_artifact(
            self.ctx.run_id,
            SAMPLER_UPDATE,
            f"{self.ctx.run_id}/{self.name}/{self.updates:05d}",
            content,
            key=f"{self.ctx.run_id}/{self.name}/update/{self.updates:05d}",
        )

    def update_records(self) -> list[dict[str, Any]]:
        """The stored ``sampler_update`` records of this evolver, in update order."""
        arts = self.ctx.store.list_artifacts(SAMPLER_UPDATE, run_id=self.ctx.run_id)
        rows = [a.content for a in arts if a.content.get("evolver") == self.name]
        latest = {r["update"]: r for r in rows}
        return [latest[u] for u in sorted(latest)]

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates, "adapter_hash": self.adapter_hash, "adapter_dir": self.adapter_dir}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state.get("updates", 0))
        self.adapter_hash = state.get("adapter_hash")
        self.adapter_dir = state.get("adapter_dir")

    def save_checkpoint(self, directory: Path) -> None:
        """Write ``adapter.json``: updates done, the adapter folder (relative to the run folder) and its hash."""
        pointer = {"updates": self.updates, "adapter": self.adapter_dir, "adapter_hash": self.adapter_hash}
        (Path(directory) / POINTER_FILE).write_text(json.dumps(pointer, indent=1))

    def load_checkpoint(self, directory: Path) -> None:
        """Load the checkpointed adapter and optimizer state into the run's model.

        Raises:
            RuntimeError: the loaded adapter's hash differs from the checkpointed one (the folder changed).
        """
        from coevo.training.lora import adapter_hash, load_adapter

        path = Path(directory) / POINTER_FILE
        if not path.is_file():
            return
        pointer = json.loads(path.read_text())
        self.updates = int(pointer.get("updates", 0))
        if not pointer.get("adapter"):
            return
        extra = load_adapter(self.peft_model, Path(self.ctx.run_dir) / pointer["adapter"])
        self._optimizer_state = extra.get("optimizer")
        digest = adapter_hash(self.peft_model)
        if pointer.get("adapter_hash") and digest != pointer["adapter_hash"]:
            raise RuntimeError(
                f"evolvers.{self.name}: adapter {pointer['adapter']} has hash {digest[:16]}… but the checkpoint says "
                f"{pointer['adapter_hash'][:16]}…"
            )
        self.adapter_hash, self.adapter_dir = digest, pointer["adapter"]

    # ------------------------------------------------------------------ report
    def report_markdown(self) -> str | None:
        """A table of the updates: answers and their typed rewards, the update's loss, wall time and peak memory."""
        rows = self.update_records()
        if not rows:
            return None
        table = [
            [
                r["update"],
                r["round"],
                r.get("answers"),
                fmt(r.get("mean_reward")),
                fmt(r.get("group_spread")),
                r.get("pairs", "") if self.method == "dpo" else r.get("groups"),
                fmt(r.get("loss")),
                fmt(r.get("wall_s")),
                fmt(r.get("peak_rss_mib")),
                r.get("skipped") or "applied",
            ]
            for r in rows
        ]
        unit = "pairs" if self.method == "dpo" else "groups"
        head = (
            f"### {self.method.upper()} `{self.name}` (LoRA r={self.config.lora.r}, searched evolver "
            f"`{self.config.evolver}`)\n\n{len(rows)} of {self.config.total_updates} updates. Wall time and peak "
            "resident memory are the update's own (training only, sampling excluded). Trained adapter: "
            f"`{self.adapter_dir}` (a PEFT folder: give it as `model.name` to sample with it).\n\n"
        )
        return head + md_table(
            [
                "update",
                "round",
                "answers",
                "mean typed reward",
                "group spread",
                unit,
                "loss",
                "wall s",
                "peak RSS MiB",
                "update",
            ],
            table,
        )
