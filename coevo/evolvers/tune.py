"""Constants tuning of elite heuristics with ES, no LLM tokens (type ``tune``).

Small models write heuristics whose structure is sound and whose constants are guesses. This evolver takes
the elite heuristics of a heuristic-design evolver of the run (``eoh`` or ``sample``), finds their numeric
literals (:mod:`coevo.ahd.constants`, parsed under the trusted-side bound) and searches them with the
project's ES math (:mod:`coevo.es`) against the trusted evaluator on the **training** instances only. It
spends no LLM tokens: its evaluations count in a budget of their own (``max_evaluations``).

Anchors: LLaMEA-HPO (van Stein, Vermetten & Bäck, arXiv 2410.16309, 2024: SMAC3 tunes the hyper-parameters of
each LLM-written algorithm, equal quality with far fewer LLM queries) and HSEvo (Dat, Doan & Binh, AAAI 2025,
Section 3.4: harmony search over the parameters of elite heuristics). coevo uses ES instead of SMAC or harmony
search so that one search method (and one implementation of it) serves weights and constants.

Search, per elite with constants ``c0`` (``k`` of them, at most ``max_constants``), in scaled offsets
``u`` (the constants are ``c = c0 + s * u`` with per-constant scale ``s_j = max(|c0_j|, scale_floor)``):

* generation ``t = 0..T-1``: ``sigma_t`` from the cosine schedule ``sigma_T + (sigma_0 - sigma_T)(1 + cos(pi t / T))/2``
  (:class:`coevo.es.Schedule`); ``P = population_size / 2`` seeds, each an antithetic pair
  ``u +- sigma_t * eps_p`` with ``eps_p`` the project's keyed Gaussian noise (:func:`coevo.es.generate_noise`);
  all ``2P`` variants are evaluated together (the sandbox pool runs ``eval_workers`` at once);
* rewards (the evaluator's score, higher is better; an invalid variant gets the generation's worst valid
  score, or the parent's when none is valid) are shaped by :func:`coevo.es.normalize_rewards` (centred ranks
  by default: robust to the jumps an argmin rule makes), antithetic members are folded
  (:func:`coevo.es.fold_members`) and ``u += alpha_t / N * sum_j k_j * eps_j`` with ``N = 2P`` (Salimans et al.
  2017, Algorithm 2, mirrored sampling, ``1/sigma`` folded into ``alpha``), ``alpha_t = alpha * sigma_t / sigma_0``;
* the best variant seen (any member, or the final centre, evaluated last) is kept when its training score beats
  the parent's by more than ``min_improvement`` (relative): it enters the searched evolver's population as a new
  individual (operator ``tune``) with its provenance (parent, constants before / after, evaluations spent), and
  is recorded as a trajectory (``llm_calls = 0``) that the searched evolver's best-heuristic tracking and
  pooling read like any other sample.

Elites are the searched evolver's population (best first) and its best recorded heuristics; each code is tuned
once (heuristics made by ``tune`` are not tuned again). Held-out instances are never evaluated here: every call
goes to the searched evolver's sampler on its training set.

When it runs: as a scheduled step of the loop (between rounds: after the searched evolver's step). On a CPU
where the model's decoding already uses every core, running it concurrently with decoding would only slow the
decoding; this is why coevo schedules it between rounds rather than beside the LLM.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import Field, model_validator

from coevo.ahd.constants import (
    CandidateParseError,
    find_constants,
    lift_term_weights,
    round_constant,
    with_constants,
)
from coevo.ahd.population import Individual, survivors
from coevo.ahd.sampler import heuristic_search
from coevo.es.noise import generate_noise
from coevo.es.normalize import METHODS, normalize_rewards
from coevo.es.schedule import Schedule
from coevo.es.update import fold_members
from coevo.evolvers.base import Evolver, EvolverConfig, StepReport, register_evolver
from coevo.tables import md_table
from coevo.types import Step, Trajectory

NOISE_NAME = "tune/constants"


#: opens the note appended to a tuned heuristic's thought (a child of a tuned parent often copies the note)
TUNED_MARK = "(constants tuned by ES"
_TUNED_NOTE = re.compile(rf"\s*{re.escape(TUNED_MARK)}[^()]*\)\s*$")


def tuned_thought(thought: str, before: Sequence[float] = (), after: Sequence[float] = ()) -> str:
    """``thought`` with one note saying which constants tune changed: ``(constants tuned by ES: 0.7 -> 0.799,
    ...)``, since the numbers a thought names are those of the code before tuning (or of the LLM's claim).
    Notes already at its end (a child copies its tuned parent's thought) are replaced, not repeated."""
    thought = (thought or "").strip()
    while (m := _TUNED_NOTE.search(thought)) is not None:
        thought = thought[: m.start()].rstrip()
    changes = [f"{b:.4g} -> {a:.4g}" for b, a in zip(before, after) if f"{b:.4g}" != f"{a:.4g}"]
    note = f"{TUNED_MARK}: {', '.join(changes)})" if changes else f"{TUNED_MARK})"
    return f"{thought} {note}".strip()


class TuneConfig(EvolverConfig):
    """Settings of the constants evolver (module docstring). Defaults: 2 elites x (6 generations x 8 variants + 1)
    = 98 evaluations per step."""

    evolver: str = Field("eoh", description="the run's eoh or sample evolver whose elite heuristics are tuned")
    elites: int = Field(2, ge=1, le=64, description="elite heuristics tuned per step (best first, each code once)")
    max_constants: int = Field(12, ge=1, le=64, description="constants searched per heuristic (first in source order)")
    term_weights: bool = Field(
        True,
        description="put a weight 1.0 on each additive term of non-literal expressions so that the search has "
        "constants where the LLM wrote none (kept only where the weighted code scores exactly as its parent)",
    )
    population_size: int = Field(8, ge=2, le=256, description="variants per ES generation (antithetic pairs: even)")
    generations: int = Field(6, ge=1, le=1000, description="ES generations per elite (T)")
    sigma: float = Field(0.3, gt=0, le=10, description="sigma_0, in units of each constant's scale")
    sigma_final: float = Field(0.05, ge=0, le=10, description="sigma_T (> 0: the last generation still explores)")
    schedule: str = Field("cosine", description="sigma schedule: cosine, linear or constant")
    alpha: float = Field(1.0, gt=0, le=100, description="step size alpha_0 (scaled offsets per unit shaped reward)")
    normalization: str = Field("centered_rank", description="fitness shaping: centered_rank, zscore or none")
    scale_floor: float = Field(0.05, gt=0, description="smallest per-constant scale |c0| is raised to")
    min_improvement: float = Field(
        1e-6, ge=0, description="relative training-score gain a tuned variant needs to enter the population"
    )
    max_evaluations: int | None = Field(
        None, ge=1, description="evaluations allowed over the run (this evolver's own budget; None: unlimited)"
    )

    @model_validator(mode="after")
    def _check(self) -> TuneConfig:
        if self.population_size % 2:
            raise ValueError(f"population_size must be even (antithetic pairs), got {self.population_size}")
        if self.sigma_final > self.sigma:
            raise ValueError(f"sigma_final ({self.sigma_final}) must be <= sigma ({self.sigma})")
        if self.normalization not in METHODS:
            raise ValueError(f"normalization must be one of {METHODS}, got {self.normalization!r}")
        Schedule(kind=self.schedule, start=self.sigma, end=self.sigma_final, total=self.generations)
        return self

    def link(self, name: str, run_config: Any) -> list[str]:
        types = {spec.name: spec.type for spec in run_config.evolvers}
        if self.evolver not in types:
            return [
                f"evolvers.{name}.evolver: {self.evolver!r} is not an evolver of this run (evolvers: {sorted(types)})"
            ]
        if types[self.evolver] not in ("eoh", "sample"):
            return [
                f"evolvers.{name}.evolver: {self.evolver!r} is of type {types[self.evolver]!r}; tune needs eoh or sample"
            ]
        return []

    def evaluations_per_elite(self) -> int:
        """Evaluations one elite costs: T generations of ``population_size`` variants, plus the final centre."""
        return self.generations * self.population_size + 1


@register_evolver("tune")
class TuneEvolver(Evolver):
    """ES over the numeric constants of elite heuristics (module docstring)."""

    space: ClassVar[str] = "context"
    Config = TuneConfig
    uses_llm: ClassVar[bool] = False

    def __init__(self, name: str, config: TuneConfig, ctx):
        super().__init__(name, config, ctx)
        self.evaluations = 0  # spent over the run (own budget)
        self.tried: dict[str, dict[str, Any]] = {}  # code_key of an elite -> what tuning it gave
        self.target: Any = None

    def setup(self) -> None:
        self.target = heuristic_search(self.ctx.evolvers, self.config.evolver, f"evolvers.{self.name}.evolver")

    # ------------------------------------------------------------------ elites
    def _elites(self) -> list[Individual]:
        sampler = self.target.sampler
        pool = list(self.target.population)
        pool += [
            Individual.from_trajectory(t) for t in sampler.recorded() if t.meta.get("sampler") == self.config.evolver
        ]
        ranked, seen = [], set()
        pool = [i for i in pool if i.reward is not None and math.isfinite(i.reward) and i.objective is not None]
        for ind in sorted(pool, key=lambda i: (-i.reward, i.id)):
            k = ind.code_hash
            if k not in seen:
                seen.add(k)
                ranked.append((k, ind))
        return [i for k, i in ranked if i.operator != "tune" and k not in self.tried]

    def _left(self) -> int | None:
        cap = self.config.max_evaluations
        return None if cap is None else max(0, cap - self.evaluations)

    # ------------------------------------------------------------------ one elite
    def tune(self, parent: Individual, round_index: int) -> dict[str, Any]:
        """ES over ``parent``'s constants (module docstring). Returns the record of what happened:
        ``{parent, status, evaluations, constants_before, constants_after, objective_before, objective_after,
        invalid, seconds}``; ``status`` is ``improved``, ``no_gain``, ``no_constants``, ``unparsable``,
        ``budget`` (the evaluation budget cannot pay for one elite) or ``stopped`` (the wall budget ran out)."""
        cfg = self.config
        rec: dict[str, Any] = {
            "parent": parent.id,
            "objective_before": parent.objective,
            "evaluations": 0,
            "invalid": {},
            "round": round_index,
        }
        left = self._left()
        if left is not None and left < cfg.evaluations_per_elite():
            return {
                **rec,
                "status": "budget",
                "detail": f"{left} evaluations left, one elite needs {cfg.evaluations_per_elite()}",
            }
        t0 = time.perf_counter()
        try:
            base = self._lift(parent, rec) if cfg.term_weights else parent.code
            consts = find_constants(base, limit=cfg.max_constants)
        except CandidateParseError as exc:
            return {**rec, "status": "unparsable", "detail": str(exc)[:200]}
        if not consts:
            return {**rec, "status": "no_constants"}
        c0 = np.array([float(c.value) for c in consts])
        kinds = [c.kind for c in consts]
        scale = np.maximum(np.abs(c0), cfg.scale_floor)
        sched = Schedule(kind=cfg.schedule, start=cfg.sigma, end=cfg.sigma_final, total=cfg.generations)
        rng = self.ctx.rng(self.name, "tune", parent.id)
        u = np.zeros_like(c0)
        best = (parent.reward, c0.copy(), parent.objective, None)  # (score, constants, objective, metrics)

        def values(offsets: np.ndarray) -> list[float | int]:
            return [round_constant(float(v), kind) for v, kind in zip(c0 + scale * offsets, kinds)]

        def evaluate(points: list[np.ndarray]) -> list[float | None]:
            nonlocal best
            codes = [with_constants(base, values(p)) for p in points]
            results = self.target.sampler.evaluate(codes)
            rec["evaluations"] += len(codes)
            self.evaluations += len(codes)
            out: list[float | None] = []
            for p, res in zip(points, results):
                if res.valid and res.score is not None and math.isfinite(res.score):
                    out.append(float(res.score))
                    if res.score > best[0]:
                        best = (float(res.score), np.array(values(p), dtype=float), res.objective, res.metrics)
                else:
                    kind = res.error_kind or "invalid"
                    rec["invalid"][kind] = rec["invalid"].get(kind, 0) + 1
                    out.append(None)
            return out

        status = "no_gain"
        for t in range(cfg.generations):
            # SIGINT / SIGTERM: the step ends and re-runs whole on resume (as bit-identical as an uninterrupted
            # run); the wall-clock budget's end keeps what this search found so far (the run ends anyway)
            self.ctx.check_stop()
            if self.ctx.budget.wall_exhausted():
                status = "stopped"
                break
            sigma = sched(t)
            seeds = [rng.getrandbits(63) for _ in range(cfg.population_size // 2)]
            eps = [generate_noise(s, NOISE_NAME, (len(c0),)).double().numpy() for s in seeds]
            points, m_seeds, signs = [], [], []
            for s, e in zip(seeds, eps):
                for sign in (1, -1):
                    points.append(u + sign * sigma * e)
                    m_seeds.append(s)
                    signs.append(sign)
            scores = evaluate(points)
            valid = [s for s in scores if s is not None]
            floor = min(valid) if valid else parent.reward
            shaped = normalize_rewards([floor if s is None else s for s in scores], cfg.normalization)
            step = np.zeros_like(u)
            noise = dict(zip(seeds, eps))
            for seed, k in fold_members(m_seeds, signs, shaped.tolist()):
                step += k * noise[seed]
            u = u + (cfg.alpha * sigma / cfg.sigma) / len(points) * step
        if status != "stopped":
            evaluate([u])  # the final centre
        gain = best[0] - parent.reward
        rec.update(
            constants_before=[c.value for c in consts],
            constants_after=[round_constant(float(v), kind) for v, kind in zip(best[1], kinds)],
            objective_after=best[2],
            seconds=round(time.perf_counter() - t0, 2),
        )
        if gain > cfg.min_improvement * max(abs(parent.reward), 1e-12) and best[2] is not None:
            rec["status"] = "improved"
            rec["code"] = with_constants(base, list(best[1]))
            rec["score_after"] = best[0]
            rec["metrics"] = best[3]
        else:
            rec["status"] = status
        return rec

    def _lift(self, parent: Individual, rec: dict[str, Any]) -> str:
        """``parent``'s code with term weights (:func:`coevo.ahd.constants.lift_term_weights`) on the terms where
        a weight of 1.0 leaves its training score exactly as it was; ``parent.code`` when there are none.

        All weights are checked in one evaluation; when that changes the score, each weight alone (one
        evaluation each, at once in the pool), then the weights that passed together. The evaluations count
        in this evolver's budget; ``rec["term_weights"]`` records how many weights were kept of how many terms.

        Raises:
            CandidateParseError: the code does not parse under the trusted-side bound.
        """
        limit = self.config.max_constants
        lifted, n = lift_term_weights(parent.code, limit=limit)
        if n == 0:
            return parent.code

        def same(codes: list[str]) -> list[bool]:
            results = self.target.sampler.evaluate(codes)
            rec["evaluations"] += len(codes)
            self.evaluations += len(codes)
            return [
                r.valid and r.score is not None and math.isclose(r.score, parent.reward, rel_tol=1e-12, abs_tol=1e-12)
                for r in results
            ]

        kept = list(range(n))
        if not same([lifted])[0]:
            alone = same([lift_term_weights(parent.code, limit=limit, select=[i])[0] for i in range(n)])
            kept = [i for i, ok in enumerate(alone) if ok]
            lifted = lift_term_weights(parent.code, limit=limit, select=kept)[0] if kept else parent.code
            if len(kept) > 1 and not same([lifted])[0]:
                kept, lifted = [], parent.code
        rec["term_weights"] = [len(kept), n]
        return lifted

    def _record(self, parent: Individual, rec: dict[str, Any], round_index: int) -> Individual:
        """Store an improved variant as a trajectory and return it as an individual of the searched evolver."""
        sampler = self.target.sampler
        key = self.ctx.traj_key(self.name, f"r{round_index}", parent.id)
        meta = {
            "problem": sampler.problem.name,
            "sampler": self.config.evolver,
            "reward_unit": sampler.reward_unit,
            "operator": "tune",
            "instances": sampler.train_tag,
            "parent_ids": [parent.id],
            "parent_objectives": [parent.objective],
            "parent_objective": parent.objective,
            "parent_score": parent.reward,
            "code": rec["code"],
            "thought": tuned_thought(parent.thought, rec["constants_before"], rec["constants_after"]),
            "objective": rec["objective_after"],
            "metrics": rec.get("metrics") or {},
            "constants_before": rec["constants_before"],
            "constants_after": rec["constants_after"],
            "evaluations": rec["evaluations"],
        }
        traj = Trajectory(
            key=key,
            run_id=self.ctx.run_id,
            evolver=self.name,
            space="context",
            round=round_index,
            generation=round_index,
            task_id=sampler.train_tag,
            steps=[
                Step(
                    observation=f"tune constants of {parent.id}: {rec['constants_before']}",
                    model_output="",
                    action=rec["code"],
                    tool_result=f"{rec['evaluations']} evaluations; constants {rec['constants_after']}",
                    reward=rec["score_after"],
                )
            ],
            reward=rec["score_after"],
            valid=True,
            llm_calls=0,
            started_at=time.time(),
            duration_s=rec.get("seconds", 0.0),
            meta=meta,
        )
        return Individual.from_trajectory(self.ctx.record(traj))

    # ------------------------------------------------------------------ step
    def step(self, round_index: int) -> StepReport:
        """Tune up to ``elites`` not yet tuned elite heuristics of the searched evolver (module docstring)."""
        report = StepReport(reward_unit=f"tuned {self.target.sampler.reward_unit}")
        improved = tuned = 0
        for parent in self._elites()[: self.config.elites]:
            key = self.ctx.traj_key(self.name, f"r{round_index}", parent.id)
            stored = self.ctx.cached(key)  # a re-run after a crash: the variant is already recorded
            if stored is not None:
                rec = {"parent": parent.id, "status": "improved", "round": round_index, "resumed": True}
                child = Individual.from_trajectory(stored)
            else:
                rec = self.tune(parent, round_index)
                child = self._record(parent, rec, round_index) if rec["status"] == "improved" else None
            self.tried[parent.code_hash] = {k: v for k, v in rec.items() if k not in ("code", "metrics")}
            if rec["status"] == "budget":
                break
            tuned += rec["status"] in ("improved", "no_gain")
            if child is not None:
                improved += 1
                report.trajectories += 1
                report.best_reward = (
                    child.reward if report.best_reward is None else max(report.best_reward, child.reward)
                )
                self._insert(child)
            if rec["status"] == "stopped":
                break
        report.metrics.update(tuned=float(tuned), improved=float(improved), evaluations=float(self.evaluations))
        return report

    def _insert(self, child: Individual) -> None:
        """Put an improved variant into the searched evolver's population (EoH survivors) and best tracking."""
        target = self.target
        size = getattr(getattr(target, "config", None), "population_size", None)
        if target.population or size:
            target.population = survivors(list(target.population) + [child], size or len(target.population) + 1)
        publish = getattr(target, "publish_best", None)
        if callable(publish):
            publish()

    # ------------------------------------------------------------------ state and report
    def state_dict(self) -> dict[str, Any]:
        return {"evaluations": self.evaluations, "tried": self.tried}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.evaluations = int(state.get("evaluations", 0))
        self.tried = dict(state.get("tried", {}))

    def report_markdown(self) -> str:
        rows = []
        for rec in self.tried.values():
            before, after = rec.get("objective_before"), rec.get("objective_after")
            rows.append(
                [
                    rec.get("parent"),
                    rec.get("round"),
                    rec.get("status"),
                    _count(rec),
                    before,
                    after if rec.get("status") == "improved" else None,
                    rec.get("evaluations"),
                    ", ".join(f"{k}: {n}" for k, n in sorted((rec.get("invalid") or {}).items())) or None,
                    _fmt_consts(rec.get("constants_before")),
                    _fmt_consts(rec.get("constants_after")) if rec.get("status") == "improved" else None,
                ]
            )
        cap = self.config.max_evaluations
        head = (
            f"Constants tuning (ES over numeric literals, no LLM tokens) of evolver `{self.config.evolver}`'s elites "
            f"on its training set: {self.evaluations} evaluations"
            + (f" of {cap} allowed" if cap else "")
            + f", {sum(r.get('status') == 'improved' for r in self.tried.values())} of {len(self.tried)} elites improved."
        )
        if not rows:
            return head + "\n\n(no elite tuned yet)"
        table = md_table(
            [
                "parent",
                "round",
                "status",
                "constants",
                "objective before",
                "objective after",
                "evaluations",
                "invalid variants",
                "constants before",
                "constants after",
            ],
            rows,
        )
        return f"{head}\n\n{table}"


def _count(rec: dict[str, Any]) -> str:
    """The report's ``constants`` cell: how many were searched, and how many of them are term weights."""
    n = len(rec.get("constants_before") or [])
    kept, terms = rec.get("term_weights") or (0, 0)
    return f"{n} ({kept} of {terms} term weights)" if terms else str(n)


def _fmt_consts(values: list[float] | None, limit: int = 6) -> str | None:
    if not values:
        return None
    shown = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in values[:limit])
    return shown + (", ..." if len(values) > limit else "")
