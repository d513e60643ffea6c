"""Trace2Skill context evolver (``type: trace2skill``): evolves an Agent Skill from pooled trajectories.

Trace2Skill (arXiv 2603.25158; docs/references.md §3), one step:

1. select pooled trajectories of the run from the store (new since the last step, or this round's): a mix of
   failures and successes (success: valid with reward >= ``success_threshold``);
2. one analyst LLM call per trajectory: root cause + minimal fix (failure) or lean path (success), and a few
   lessons from the agent's view; reference answers found in the trajectory's meta are redacted from the
   analyst's input and lessons quoting them are dropped (:mod:`coevo.skills.prompts`);
3. each batch of ``lessons_per_patch`` analyses proposes a patch against a FROZEN snapshot of the current
   skill; invalid JSON and edits whose anchors / sections do not match the snapshot are rejected with reasons;
4. the valid patches are merged hierarchically (:func:`coevo.skills.merge.merge_patches`, ``batch_size`` at a
   time, up to ``max_depth`` levels) by an LLM merger that falls back to the programmatic merger when its
   output is unusable;
5. the merged patch is applied to a copy (:func:`coevo.skills.apply.apply_and_validate`); a result that
   violates the spec gets up to ``fix_rounds`` LLM fix patches, else it is discarded;
6. optional gate: the unperturbed policy is rolled out on the held-out split with the current and the
   candidate skill pinned as context ``skill`` (``ESEvolver.score_context`` of the gated ES evolver, cached by
   key; :func:`coevo.evolvers.base.score_context` with the run's policy when the run has no ES evolver); the
   candidate is kept only if ``score(candidate) - score(current) >= min_delta``;
7. the new version is stored (:func:`coevo.skills.versions.write_skill_version`, with its diff and the ids of
   the trajectories whose analyses produced it), written to ``run_dir/skills/<name>/v<k>/<name>/`` (a skill
   folder must be named after the skill) and published on the context channel,
   ``ctx.publish("skill", {"name", "version": k, "path", "source"})``, for the next ES generation / web agent.

One skill library per run: version 0 is the folder the analysed evolvers' rollouts attach for ``skill`` (their
``skill_dirs``), else ``skills_dir/<skill>`` (default: the repository's ``skills/``). When both name a folder
and they differ, the run config is invalid (:meth:`Trace2SkillConfig.link`, called by
:func:`coevo.config.parse_config`, names both). The gate's rollout is the analysed evolver's rollout (same task
selection, held-out split and skills) with the gate's own fields on top; a gate field that would change the
task selection is an error. Version 0 is copied to ``run_dir/skills/<name>/v0/<name>/`` (it is not
a store artifact: store versions start at 1). Every LLM call is a trajectory of this evolver (space "context",
``llm_calls=1``, one step holding prompt and output, ``valid=False`` with a failure kind when unusable) with a
deterministic key, so a re-run step after a crash re-uses its calls and is not charged twice.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from coevo.artifacts import SKILL_GATE as GATE_KIND
from coevo.backends.base import Completion, Policy
from coevo.backends.spec import ModelConfig
from coevo.context import ContextValue
from coevo.errors import ConfigError
from coevo.evolvers.base import (
    ContextScore,
    Evolver,
    EvolverConfig,
    RunContext,
    StepReport,
    register_evolver,
    resolve_evolver,
    score_context,
)
from coevo.rollouts.base import build_rollout, resolve_rollout, validate_rollout_spec
from coevo.schema import ConfigModel
from coevo.skills import (
    SHIPPED_SKILLS_DIR,
    SKILL_ARTIFACT_KIND,
    Patch,
    apply_and_validate,
    apply_patch,
    materialize,
    merge_patches,
    parse_patch,
    programmatic_merge,
    skill_diff,
    validate_skill,
    write_skill_version,
)
from coevo.skills import prompts as P
from coevo.skills.patch import edit_to_dict
from coevo.skills.spec import NAME_PATTERN
from coevo.tables import md_table
from coevo.types import ContextRef, Trajectory


class GateConfig(ConfigModel):
    """Held-out gate: keep a candidate only if its score is not lower than the current version's."""

    model_config = ConfigDict(extra="forbid")
    rollout: dict[str, Any] | None = Field(
        None,
        description="overrides of the gated evolver's rollout spec (default: that rollout as is); it reads "
        "context 'skill'; fields that select tasks must not differ",
    )
    evolver: str | None = Field(
        None,
        description="the ES evolver whose centre scores the skills (default: the first analysed evolver with "
        "score_context; none: the run's policy)",
    )
    split: Literal["train", "test"] = Field("test", description="cases the gate scores on")
    min_delta: float = Field(0.0, description="keep iff score(candidate) - score(current) >= min_delta")

    @field_validator("rollout")
    @classmethod
    def _rollout(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None or "type" not in v:
            return v  # overrides only: checked merged with the gated rollout (Trace2SkillConfig.link)
        validate_rollout_spec(v, "rollout")
        return v


class Trace2SkillConfig(EvolverConfig):
    """Settings of the Trace2Skill evolver (paper defaults: merge 5 at a time, 5 levels, 3 fix rounds)."""

    skill: str = Field(description="name of the skill folder under skills_dir that version 0 is copied from")
    skills_dir: str | None = Field(None, description="folder of skill folders (default: the repository's skills/)")
    evolvers: list[str] | None = Field(None, description="analyse trajectories of these evolvers (None = all others)")
    window: Literal["since_last", "round"] = Field("since_last", description="new since the last step, or this round's")
    max_trajectories: int = Field(8, ge=1, description="trajectories analysed per step (one analyst call each)")
    success_threshold: float = Field(1.0, description="valid with reward >= this is a success; else a failure")
    failure_fraction: float = Field(0.5, ge=0, le=1, description="share of failures among the analysed ones")
    lessons_per_patch: int = Field(2, ge=1, description="analyses whose lessons form one patch proposal")
    model: ModelConfig | None = Field(None, description="model for analyst/patch/merge/fix calls (None = run's)")
    batch_size: int = Field(5, ge=2, description="patches per merge call")
    max_depth: int = Field(5, ge=1, description="merge levels at most")
    fix_rounds: int = Field(3, ge=0, description="LLM fix attempts for a patched skill violating the spec")
    gate: GateConfig | None = Field(None, description="held-out gate; None keeps every valid candidate")
    max_new_tokens: int | None = Field(None, ge=1, description="analyst completion limit (default: run's)")
    patch_max_new_tokens: int | None = Field(None, ge=1, description="patch/merge/fix completion limit")
    temperature: float | None = Field(None, ge=0, description="overrides the run's sampling.temperature")
    ground_truth_keys: list[str] = Field(list(P.GROUND_TRUTH_KEYS), description="meta keys hidden from analysts")
    max_steps_shown: int = Field(40, ge=2, description="trajectory steps shown to an analyst")
    max_step_chars: int = Field(1200, ge=100, description="characters per observation/output in analyst input")
    max_skill_chars: int = Field(12000, ge=500, description="characters of SKILL.md shown in prompts")

    _source: Path | None = PrivateAttr(None)

    @field_validator("skill")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_PATTERN.match(v):
            raise ValueError(f"{v!r} is not a skill name (lowercase a-z, 0-9, single hyphens)")
        return v

    def source_dir(self) -> Path:
        """The folder version 0 is copied from: the one the rollouts attach (set by :meth:`link`), else
        ``skills_dir/<skill>`` (default the shipped ``skills/``)."""
        return self._source or Path(self.skills_dir or SHIPPED_SKILLS_DIR) / self.skill

    def link(self, name: str, run_config: Any) -> list[str]:
        """Cross-section checks against the run config (called by ``coevo.config.parse_config``).

        * the skill library: the analysed evolvers' rollouts that attach a folder for ``skill`` (their
          ``skill_folders()``) must agree with each other and with ``skills_dir``; that folder becomes version 0;
        * the gate: when the first analysed rollout's class declares ``selection_keys`` (the ``web`` rollout) and
          the gate's rollout is of the same type (or omitted), the gate's rollout becomes that rollout updated
          with the gate's fields; a gate field among ``selection_keys`` that differs is an error.

        Returns:
            Field-named error messages (empty when consistent). Mutates ``_source`` and ``gate.rollout``.
        """
        errors: list[str] = []
        rollouts = []  # (where, spec dict, rollout Config)
        for spec in run_config.evolvers:
            if spec.name == name or (self.evolvers is not None and spec.name not in self.evolvers):
                continue
            ro = getattr(spec.params, "rollout", None)
            if isinstance(ro, dict) and ro.get("type"):
                rcls = resolve_rollout(str(ro["type"]))
                rollouts.append((f"evolvers.{spec.name}.rollout", ro, rcls, rcls.Config.model_validate(ro)))
        found: dict[Path, str] = {}
        for where, _ro, _rcls, rcfg in rollouts:
            folders = rcfg.skill_folders() if callable(getattr(rcfg, "skill_folders", None)) else {}
            if self.skill in folders:
                found.setdefault(folders[self.skill], f"{where}.skill_dirs")
        if len(found) > 1:
            errors.append(
                f"evolvers.{name}.skill: skill {self.skill!r} comes from two folders: "
                + " and ".join(f"{p} ({w})" for p, w in found.items())
                + "; attach one"
            )
        elif found:
            folder, where = next(iter(found.items()))
            if self.skills_dir is not None and (Path(self.skills_dir) / self.skill).resolve() != folder:
                errors.append(
                    f"evolvers.{name}.skills_dir: {Path(self.skills_dir) / self.skill} differs from the "
                    f"folder {folder} that {where} attaches for skill {self.skill!r}; give one of them "
                    f"(the rollout's skill_dirs is enough)"
                )
            self._source = folder
        if self.gate is not None and rollouts:
            errors += self._link_gate(name, *rollouts[0][:3])
        if self.gate is not None:
            errors += self._link_gate_evolver(name, run_config)
        if self.gate is not None and self.gate.rollout is None:
            errors.append(
                f"evolvers.{name}.gate.rollout: required when no analysed evolver has a rollout to gate "
                "(give the gate's rollout spec with its type)"
            )
        return errors

    def _link_gate_evolver(self, name: str, run_config: Any) -> list[str]:
        """``gate.evolver``: named, or the first analysed evolver that can score a context (ESEvolver)."""
        scorers = [
            s.name
            for s in run_config.evolvers
            if s.name != name
            and (self.evolvers is None or s.name in self.evolvers)
            and callable(getattr(resolve_evolver(s.type), "score_context", None))
        ]
        if self.gate.evolver is None:
            self.gate.evolver = scorers[0] if scorers else None
            return []
        spec = next((s for s in run_config.evolvers if s.name == self.gate.evolver), None)
        if spec is not None and not callable(getattr(resolve_evolver(spec.type), "score_context", None)):
            what = f"{self.gate.evolver!r} (type {spec.type!r})"
            msg = (
                f"evolvers.{name}.gate.evolver: {what} cannot score a context under its centre (no "
                "score_context); name an es evolver or drop gate.evolver"
            )
            return [msg]
        return []  # an unknown name is reported by coevo.config.check_combinations

    def _link_gate(self, name: str, where: str, base: dict[str, Any], rcls: Any) -> list[str]:
        own = dict(self.gate.rollout or {})
        if own.get("type", base["type"]) != base["type"] or not hasattr(rcls, "selection_keys"):
            return []  # another rollout type, or one that declares no task selection: the gate is the user's own

        def merged_spec() -> dict[str, Any]:
            return rcls.Config.model_validate({**base, **own}).model_dump()

        where_gate = f"evolvers.{name}.gate.rollout"
        diff = [k for k in getattr(rcls, "selection_keys", ()) if k in own and own[k] != base.get(k)]
        if diff:  # a raw difference may vanish once defaults are filled in (e.g. a nested mapping)
            try:
                merged = merged_spec()
                diff = [k for k in diff if merged.get(k) != base.get(k)]
            except (ValidationError, ValueError):
                pass
        errors = [
            f"{where_gate}.{k}: {own[k]!r} differs from {where}.{k} {base.get(k)!r}; the gate scores the "
            f"held-out tasks of the rollout it gates (one task selection): drop {k} from the gate"
            for k in diff
        ]
        if errors:
            return errors
        try:
            merged = merged_spec()
        except ValidationError as exc:
            return [
                f"{'.'.join([where_gate, *map(str, e['loc'])])}: {e['msg'].removeprefix('Value error, ')}"
                for e in exc.errors()
            ]
        if not errors:
            self.gate.rollout = merged
        return errors


@dataclass
class Outcome:
    """A checked LLM answer: ``value`` when usable, else ``failure`` kind and ``detail``; rejected parts."""

    value: Any = None
    failure: str | None = None
    detail: str | None = None
    rejected: list[str] = field(default_factory=list)


def _reasons(outcomes: Iterable[Outcome], limit: int = 2, chars: int = 160) -> str:
    """The first ``limit`` distinct failure details of ``outcomes`` (each cut to ``chars``), ``; ``-joined."""
    seen: list[str] = []
    for o in outcomes:
        detail = " ".join(str(o.detail or o.failure or "").split())[:chars]
        if o.failure is not None and detail and detail not in seen:
            seen.append(detail)
    return "; ".join(seen[:limit]) or "no details"


@dataclass
class _Call:
    key: str
    role: str
    messages: list[dict[str, str]]
    check: Callable[[str], Outcome]
    task_id: str
    meta: dict[str, Any] = field(default_factory=dict)


@register_evolver("trace2skill")
class Trace2SkillEvolver(Evolver):
    """Evolves one Agent Skill by Trace2Skill (see the module docstring).

    Raises:
        ValueError: ``skill`` names no folder under ``skills_dir`` or a folder violating the spec.
    """

    space = "context"
    Config = Trace2SkillConfig

    def __init__(self, name: str, config: Trace2SkillConfig, ctx: RunContext):
        super().__init__(name, config, ctx)
        source = config.source_dir()
        if not (source / "SKILL.md").is_file():
            raise ConfigError(f"evolvers.{name}.skill: no skill folder {source} (SKILL.md missing)")
        problems = validate_skill(source)
        if problems:
            raise ConfigError(f"evolvers.{name}.skill: {source} violates the spec: " + "; ".join(map(str, problems)))
        if config.gate is not None and config.gate.rollout is None:
            raise ConfigError(
                f"evolvers.{name}.gate.rollout: required when the run config does not link the gate to "
                "the rollout it gates (construct the run with coevo.config.parse_config)"
            )
        if config.gate is not None:  # fail at start-up, not at the first gate
            try:
                validate_rollout_spec(config.gate.rollout, f"evolvers.{name}.gate.rollout")
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        self.source = source
        self.root = ctx.run_dir / "skills" / config.skill
        self.version, self.path = 0, self.root / "v0" / config.skill
        if not self.path.exists():
            shutil.copytree(source, self.path)
        self.cursor = 0
        self.steps_done = 0
        #: one record per step: what it analysed and made, and ``result``: the new version or why there is none
        self.step_log: list[dict[str, Any]] = []
        self._why = ""
        self._analyst: Policy | None = None
        self._tmp: Path | None = None
        self._made: list[Trajectory] = []
        self._gate_made: list[Trajectory] = []
        self._scorer: Any = None

    def setup(self) -> None:
        """Check the analysed evolvers exist and find the gate's scorer (``gate.evolver``, an ES evolver)."""
        unknown = sorted(set(self.config.evolvers or ()) - set(self.ctx.evolvers))
        if unknown:
            raise ConfigError(
                f"evolvers.{self.name}.evolvers: unknown {unknown}; the run has {sorted(self.ctx.evolvers)}"
            )
        gate = self.config.gate
        if gate is not None and gate.evolver is not None:
            scorer = self.ctx.evolvers.get(gate.evolver)
            if not callable(getattr(scorer, "score_context", None)):
                raise ConfigError(
                    f"evolvers.{self.name}.gate.evolver: {gate.evolver!r} is not an evolver of this run that "
                    f"can score a context (evolvers: {sorted(self.ctx.evolvers)})"
                )
            self._scorer = scorer

    def _published(self) -> dict[str, Any]:
        return {
            "name": self.config.skill,
            "version": self.version,
            "path": str(self.path),
            "source": str(self.source.resolve()),
        }

    # ------------------------------------------------------------------ LLM calls
    @property
    def analyst(self) -> Policy:
        """The model of every call of this evolver: ``model`` if configured, else the run's policy."""
        if self.config.model is None:
            return self.ctx.policy
        if self._analyst is None:
            from coevo.backends.factory import make_policy

            self._analyst = make_policy(self.config.model)
        return self._analyst

    def _run_calls(self, calls: list[_Call], round_index: int) -> list[tuple[_Call, Outcome]]:
        """Cached calls are re-used (their answers re-checked); the others, cut to the sample budget, are
        generated in one batch and recorded. Returns ``(call, outcome)`` for every call not cut.

        Raises:
            PolicyError: the backend cannot serve the batch at all (not recorded: a resumed run retries it).
        """
        found = {c.key: self.ctx.cached(c.key) for c in calls}
        outcomes: dict[str, Outcome] = {}
        pending = [c for c in calls if found[c.key] is None]
        pending = pending[: self.ctx.budget.allow(len(pending))]
        if pending:
            cfg = self.config
            max_new = cfg.max_new_tokens if pending[0].role == "analyst" else cfg.patch_max_new_tokens
            seed = self.ctx.rng(self.name, round_index, pending[0].key).getrandbits(31)
            params = self.ctx.sampling_params(max_new_tokens=max_new, temperature=cfg.temperature).with_seed(seed)
            started = time.time()
            completions = self.analyst.generate([call.messages for call in pending], params)
            for call, comp in zip(pending, completions):
                outcomes[call.key] = (
                    Outcome(failure="llm_error", detail=comp.error) if comp.error else call.check(comp.text)
                )
                found[call.key] = self.ctx.record(
                    self._trajectory(call, comp, outcomes[call.key], round_index, started, seed)
                )
        out = []
        for call in calls:
            t = found[call.key]
            if t is None:
                continue  # cut by the sample budget
            self._made.append(t)
            if call.key not in outcomes:
                text = (t.steps[0].model_output if t.steps else "") or ""
                outcomes[call.key] = Outcome(failure="llm_error") if t.failure == "llm_error" else call.check(text)
            out.append((call, outcomes[call.key]))
        return out

    def _trajectory(
        self, call: _Call, comp: Completion, out: Outcome, round_index: int, started: float, seed: int
    ) -> Trajectory:
        action = None
        if out.failure is None:
            action = P.patch_json(out.value) if isinstance(out.value, Patch) else "\n".join(out.value.lessons)
        return Trajectory.from_completion(
            comp,
            key=call.key,
            run_id=self.ctx.run_id,
            evolver=self.name,
            space="context",
            prompt=P.messages_text(call.messages),
            action=action,
            tool_result="\n".join(out.rejected) or out.detail,
            failure=out.failure,
            failure_detail=out.detail,
            round=round_index,
            generation=self.steps_done,
            task_id=call.task_id,
            context=ContextRef(skill_name=self.config.skill, skill_version=self.version, prompt=call.role),
            started_at=started,
            meta={
                "t2s_role": call.role,
                "seed": seed,
                "finish_reason": comp.finish_reason,
                "rejected": out.rejected,
                **call.meta,
            },
        )

    def _dest(self, tag: str) -> Path:
        assert self._tmp is not None
        n = len(list(self._tmp.iterdir()))
        return self._tmp / f"{n}-{tag}" / self.config.skill

    def _check_patch(self, text: str, base: Path, hidden: list[str]) -> Outcome:
        """Parse a patch and keep the edits that apply to ``base`` and quote no hidden value."""
        patch, rejections = parse_patch(text)
        reasons = [r.reason for r in rejections]
        if not patch.edits and any(r.startswith("invalid patch JSON") for r in reasons):
            return Outcome(failure="parse", detail=reasons[0], rejected=reasons)
        edits = []
        for e in patch.edits:
            if P.mentions(str(edit_to_dict(e)), hidden):
                reasons.append(f"{e.op} edit quotes a hidden reference value")
            else:
                edits.append(e)
        res = apply_patch(base, Patch(edits=edits), dest=self._dest("check"))
        reasons += [f"{getattr(r.op, 'op', 'edit')}: {r.reason}" for r in res.rejected]
        if not res.applied:
            return Outcome(
                failure="infeasible",
                detail="no applicable edit: " + "; ".join(reasons or ["no edits"]),
                rejected=reasons,
            )
        return Outcome(Patch(reasoning=patch.reasoning, edits=res.applied, changelog=patch.changelog), rejected=reasons)

    def _check_analysis(self, text: str, hidden: list[str]) -> Outcome:
        try:
            analysis = P.parse_analysis(text)
        except ValueError as exc:
            return Outcome(failure="parse", detail=str(exc))
        analysis.dropped = [s for s in analysis.lessons if P.mentions(s, hidden)]
        analysis.lessons = [s for s in analysis.lessons if s not in analysis.dropped]
        if not analysis.lessons:
            return Outcome(
                failure="infeasible", detail="every lesson quotes a hidden reference value", rejected=analysis.dropped
            )
        return Outcome(analysis, rejected=[f"lesson dropped (quotes a hidden value): {s}" for s in analysis.dropped])

    # ------------------------------------------------------------------ the step
    def _select(self, round_index: int) -> tuple[list[Trajectory], int]:
        c = self.config
        pool = [
            t
            for t in self.ctx.store.query(run_id=self.ctx.run_id, with_steps=False)
            if t.evolver != self.name and "t2s_role" not in t.meta and (c.evolvers is None or t.evolver in c.evolvers)
        ]
        cursor = max([self.cursor, *(t.id for t in pool)])
        fresh = [t for t in pool if (t.round == round_index if c.window == "round" else t.id > self.cursor)]
        fails = [t for t in fresh if P.outcome_of(t, c.success_threshold) == "failure"]
        wins = [t for t in fresh if P.outcome_of(t, c.success_threshold) == "success"]
        n_fail = min(len(fails), round(c.max_trajectories * c.failure_fraction))
        n_win = min(len(wins), c.max_trajectories - n_fail)
        n_fail = min(len(fails), c.max_trajectories - n_win)
        rng = self.ctx.rng(self.name, "select", round_index)
        picked = sorted(rng.sample(fails, n_fail) + rng.sample(wins, n_win), key=lambda t: t.id)
        loaded = [self.ctx.store.get_by_key(t.key) for t in picked]
        return [t for t in loaded if t is not None and t.steps], cursor

    def step(self, round_index: int) -> StepReport:
        """One Trace2Skill step (module docstring); returns metrics analysed, patches_valid, edits_applied,
        edits_rejected, version, new_version and, with a gate, gate_current / gate_candidate."""
        self._made, self._gate_made = [], []
        m = dict.fromkeys(
            (
                "analysed",
                "lessons",
                "lessons_dropped",
                "patches_valid",
                "patches_invalid",
                "edits_applied",
                "edits_rejected",
                "merge_calls",
                "merge_fallbacks",
                "fix_calls",
                "new_version",
            ),
            0.0,
        )
        selected, cursor = self._select(round_index)
        best = None
        self._why = "no new trajectories of the watched evolvers to analyse" if not selected else ""
        with tempfile.TemporaryDirectory(prefix="coevo-t2s-") as tmp:
            self._tmp = Path(tmp)
            candidate, sources, changelog = self._evolve(selected, round_index, m) if selected else (None, [], "")
            if candidate is not None:
                scores = self._gate(candidate, round_index) if self.config.gate else None
                keep = scores is None  # no gate configured
                if scores is not None:  # a score is None when the sample budget could not pay for the gate
                    m.update({k: s for k, s in zip(("gate_current", "gate_candidate"), scores) if s is not None})
                    best = scores[1]
                    keep = None not in scores and scores[1] - scores[0] >= self.config.gate.min_delta
                    if None in scores:
                        self._why = "the sample budget could not pay for the gate"
                    elif not keep:
                        self._why = (
                            f"the gate kept v{self.version}: candidate {scores[1]:.3g} < current {scores[0]:.3g} "
                            f"+ min_delta {self.config.gate.min_delta:g}"
                        )
                if keep:
                    self._store_version(candidate, sources, changelog, round_index, m, scores)
            self._tmp = None
        self.cursor = cursor
        self.step_log.append(
            {
                "round": round_index,
                "step": self.steps_done,
                "selected": len(selected),
                **{k: int(m[k]) for k in ("analysed", "patches_valid", "patches_invalid", "edits_applied")},
                "edits_rejected": int(m["edits_rejected"]),
                "result": f"new version v{self.version}" if m["new_version"] else f"no new version: {self._why}",
            }
        )
        self.steps_done += 1
        m["version"] = float(self.version)
        made = self._made + self._gate_made
        return StepReport(samples=sum(t.llm_calls for t in made), trajectories=len(made), best_reward=best, metrics=m)

    def _evolve(self, selected: list[Trajectory], round_index: int, m: dict[str, float]):
        """Steps 2-5: analyse, propose, merge, apply (+ fix). Returns (candidate dir | None, source ids,
        changelog)."""
        c, frozen = self.config, self.path
        skill = P.skill_text(frozen, c.max_skill_chars)
        hidden_of = {t.id: P.ground_truth_values(t.meta, c.ground_truth_keys) for t in selected}
        hidden = sorted({v for vs in hidden_of.values() for v in vs}, key=lambda s: (-len(s), s))
        calls = []
        for t in selected:
            outcome = P.outcome_of(t, c.success_threshold)
            text = P.render_trajectory(t, outcome, max_steps=c.max_steps_shown, max_chars=c.max_step_chars)
            msgs = [
                {**msg, "content": P.redact(msg["content"], hidden_of[t.id])}
                for msg in P.analyst_messages(text, outcome, skill)
            ]
            calls.append(
                _Call(
                    self.ctx.traj_key(self.name, round_index, "analyst", t.id),
                    "analyst",
                    msgs,
                    lambda out, h=hidden_of[t.id]: self._check_analysis(out, h),
                    t.task_id,
                    {"source_id": t.id, "source_key": t.key, "outcome": outcome},
                )
            )
        analysed = self._run_calls(calls, round_index)
        analyses = [(call.meta, o.value) for call, o in analysed if o.failure is None]
        m["analysed"] = float(len(analyses))
        if not analyses:
            self._why = f"no usable analysis in {len(analysed)} analyst call(s) ({_reasons(o for _, o in analysed)})"
        m["lessons"] = float(sum(len(a.lessons) for _, a in analyses))
        m["lessons_dropped"] = float(sum(len(a.dropped) for _, a in analyses))
        calls = []
        for i in range(0, len(analyses), c.lessons_per_patch):
            batch = analyses[i : i + c.lessons_per_patch]
            lessons = [(meta["outcome"], s) for meta, a in batch for s in a.lessons]
            calls.append(
                _Call(
                    self.ctx.traj_key(self.name, round_index, "patch", i // c.lessons_per_patch),
                    "patch",
                    P.patch_messages(skill, lessons),
                    lambda out: self._check_patch(out, frozen, hidden),
                    f"patch:{c.skill}",
                    {"source_ids": [meta["source_id"] for meta, _ in batch]},
                )
            )
        proposals = self._run_calls(calls, round_index)
        valid = [(call, o) for call, o in proposals if o.failure is None]
        m["patches_valid"], m["patches_invalid"] = float(len(valid)), float(len(proposals) - len(valid))
        m["edits_rejected"] = float(sum(len(o.rejected) for _, o in proposals))
        if not valid:
            self._why = self._why or (
                f"no valid patch in {len(proposals)} patch call(s) ({_reasons(o for _, o in proposals)})"
            )
            return None, [], ""
        sources = sorted({i for call, _ in valid for i in call.meta["source_ids"]})
        merged = merge_patches(
            [o.value for _, o in valid],
            merger=self._merger(round_index, skill, hidden, m),
            batch_size=c.batch_size,
            max_depth=c.max_depth,
        ).patch
        return self._apply(merged, round_index, hidden, m), sources, merged.changelog

    def _merger(self, round_index: int, skill: str, hidden: list[str], m: dict[str, float]):
        counter = itertools.count()

        def merge(batch: list[Patch]) -> Patch:
            call = _Call(
                self.ctx.traj_key(self.name, round_index, "merge", next(counter)),
                "merge",
                P.merge_messages(skill, batch),
                lambda out: self._check_patch(out, self.path, hidden),
                f"merge:{self.config.skill}",
                {"n_patches": len(batch)},
            )
            done = self._run_calls([call], round_index)
            m["merge_calls"] += len(done)
            if done and done[0][1].failure is None:
                return done[0][1].value
            m["merge_fallbacks"] += 1
            return programmatic_merge(batch)

        return merge

    def _apply(self, merged: Patch, round_index: int, hidden: list[str], m: dict[str, float]) -> Path | None:
        """Step 5: apply to a copy of the frozen snapshot; fix rounds for spec violations; None = discarded."""
        new_dir, res, violations = apply_and_validate(self.path, merged, dest=self._dest("apply"))
        m["edits_applied"] = float(len(res.applied))
        m["edits_rejected"] += len(res.rejected)
        if not res.applied:
            rejected = "; ".join(str(r.reason) for r in res.rejected[:2])
            self._why = (
                f"the merged patch applied no edit ({len(res.rejected)} rejected{': ' if rejected else ''}{rejected})"
            )
            return None
        for r in range(self.config.fix_rounds):
            if not violations:
                break
            listed = [f"{v.field}: {v.message}" for v in violations]
            call = _Call(
                self.ctx.traj_key(self.name, round_index, "fix", r),
                "fix",
                P.fix_messages(P.skill_text(new_dir, self.config.max_skill_chars), listed),
                lambda out, d=new_dir: self._check_patch(out, d, hidden),
                f"fix:{self.config.skill}",
                {"violations": listed},
            )
            done = self._run_calls([call], round_index)
            if not done:
                break  # sample budget reached
            m["fix_calls"] += 1
            if done[0][1].failure is None:
                new_dir, res, violations = apply_and_validate(new_dir, done[0][1].value, dest=self._dest("fix"))
                m["edits_applied"] += len(res.applied)
        if violations:
            listed = "; ".join(f"{v.field}: {v.message}" for v in violations[:2])
            self._why = f"the patched skill violates the spec after {int(m['fix_calls'])} fix call(s) ({listed})"
            return None
        return new_dir

    # ------------------------------------------------------------------ gate and versions
    def _gate(self, candidate: Path, round_index: int) -> tuple[float | None, float | None]:
        """Step 6: scores (mean reward on the gate's split) of the current version and the candidate, each
        pinned as context ``skill`` (the current one as published; version 0: the initial copy)."""
        rollout = build_rollout(self.config.gate.rollout, self.ctx)
        try:
            latest = self.ctx.store.get_artifact(SKILL_ARTIFACT_KIND, self.config.skill)
            published = self.ctx.context("skill")
            current_value = published if published.version else ContextValue("skill", 0, self._published())
            current = self._gate_score(rollout, f"v{self.version}", self.version, current_value, round_index)
            next_version = (latest.version if latest else 0) + 1
            value = {**self._published(), "version": next_version, "path": str(candidate)}
            return current, self._gate_score(rollout, f"r{round_index}-candidate", next_version, value, round_index)
        finally:
            rollout.close()

    def _gate_score(self, rollout, label: str, version: int, value: Any, round_index: int) -> float | None:
        name = f"{self.config.skill}/{self.name}"
        for art in self.ctx.store.list_artifacts(kind=GATE_KIND, name=name, run_id=self.ctx.run_id):
            if art.meta.get("label") == label:
                return art.content["score"]
        split = self.config.gate.split
        result: ContextScore | None
        if self._scorer is not None:
            result = self._scorer.score_context(
                {"skill": value}, evolver=self.name, label=f"gate/{label}", split=split, rollout=rollout
            )
        else:
            result = score_context(
                self.ctx,
                rollout,
                {"skill": value},
                evolver=self.name,
                key_prefix=self.ctx.traj_key(self.name, "gate", label),
                split=split,
                generation=self.steps_done,
            )
        if result is None:
            return None  # the sample budget cannot pay for the gate
        self._gate_made += result.trajectories
        self.ctx.store.put_artifact(
            self.ctx.run_id,
            GATE_KIND,
            name,
            {
                "score": result.score,
                "version": version,
                "split": split,
                "trajectory_ids": [t.id for t in result.trajectories],
            },
            key=f"{self.ctx.run_id}/{self.name}/gate/{label}",
            meta={"label": label},
        )
        return result.score

    def _store_version(
        self,
        candidate: Path,
        sources: list[int],
        changelog: str,
        round_index: int,
        m: dict[str, float],
        scores: tuple[float | None, float | None] | None,
    ) -> None:
        """Step 7: store, materialize and publish the candidate as the next version."""
        meta = {
            "evolver": self.name,
            "round": round_index,
            "changelog": changelog,
            "edits": int(m["edits_applied"]),
            "rejected": int(m["edits_rejected"]),
            "gate_current": scores[0] if scores else None,
            "gate_candidate": scores[1] if scores else None,
            "call_ids": [t.id for t in self._made],
        }
        art = write_skill_version(
            self.ctx.store,
            self.ctx.run_id,
            candidate,
            meta,
            diff=skill_diff(self.path, candidate),
            trajectory_ids=sources,
            parent_version=self.version or None,
            key=f"{self.ctx.run_id}/{self.name}/skill/{round_index}",
        )
        self.version = art.version
        self.path = materialize(art, self.root / f"v{art.version}", overwrite=True)
        self.ctx.publish("skill", self._published(), evolver=self.name, round_index=round_index)
        m["new_version"] = 1.0

    # ------------------------------------------------------------------ state and report
    def state_dict(self) -> dict[str, Any]:
        return {
            "cursor": self.cursor,
            "version": self.version,
            "path": str(self.path),
            "steps_done": self.steps_done,
            "step_log": self.step_log,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor = state.get("cursor", 0)
        self.version = state.get("version", 0)
        self.path = self.root / f"v{self.version}" / self.config.skill
        self.steps_done = state.get("steps_done", 0)
        self.step_log = list(state.get("step_log") or [])

    def report_markdown(self) -> str:
        """Skill versions (edits, rejected, gate score, causing trajectories) and the latest diff (cut)."""
        arts = [
            a
            for a in self.ctx.store.list_artifacts(SKILL_ARTIFACT_KIND, self.config.skill, self.ctx.run_id)
            if a.meta.get("evolver") == self.name
        ]
        gates = {
            a.meta.get("label"): a.content["score"]
            for a in self.ctx.store.list_artifacts(GATE_KIND, f"{self.config.skill}/{self.name}", self.ctx.run_id)
        }
        rows = [[0, None, None, gates.get("v0"), None, f"copied from `{self.source}`"]]
        rows += [
            [
                a.version,
                a.meta.get("edits"),
                a.meta.get("rejected"),
                a.meta.get("gate_candidate"),
                len(a.content.get("trajectory_ids") or []),
                a.meta.get("changelog", "").replace("\n", " ")[:120],
            ]
            for a in arts
        ]
        lines = [
            f"Skill `{self.config.skill}`: current version {self.version} (`{self.path}`).",
            "",
            md_table(["version", "edits", "rejected", "gate score", "caused by N trajectories", "changelog"], rows),
        ]
        if self.step_log:
            steps = [
                [
                    r["round"],
                    r["selected"],
                    r["analysed"],
                    f"{r['patches_valid']}/{r['patches_valid'] + r['patches_invalid']}",
                    r["edits_applied"],
                    r["edits_rejected"],
                    r["result"],
                ]
                for r in self.step_log
            ]
            lines += [
                "",
                "Steps (a step without a new version says why):",
                "",
                md_table(
                    [
                        "round",
                        "trajectories selected",
                        "analysed",
                        "valid patches",
                        "edits applied",
                        "edits rejected",
                        "result",
                    ],
                    steps,
                ),
            ]
        if arts:
            diff = arts[-1].content.get("diff", "").splitlines()
            cut = f"\n... ({len(diff) - 60} more lines)" if len(diff) > 60 else ""
            lines += ["", f"Diff of version {arts[-1].version}:", "", "```diff", "\n".join(diff[:60]) + cut, "```"]
        return "\n".join(lines)

    def close(self) -> None:
        if self._analyst is not None:
            self._analyst.close()
