"""ES rollout for automatic heuristic design: population members write heuristics under perturbed weights.

Agentic ESOpt's AHD setting (docs/references.md §2): at test time, the chosen EoH operators (e.g. M1, M2) generate
their children under perturbed weights, one ES member per seed; the same children enter the EoH population
(pooled samples: the EoH evolver folds them in at its next step), and ES adapts the model's weights from
their rewards. What a member writes is the searched evolver's to say: the rollout asks it for the member's calls
(``member_jobs`` of the :class:`~coevo.ahd.sampler.HeuristicSearch` interface, e.g.
:meth:`coevo.evolvers.ahd_common.AHDEvolver.member_jobs`: EoH's m1 / m2 children of its population, the hill
climber's improved variants of its incumbent, any heuristic-design evolver's own prompts), so ES perturbs the
model while it writes what that search asks for. Children are sampled, evaluated and recorded by the searched
evolver's sampler service (:class:`coevo.ahd.sampler.HeuristicSampler`), so they use its training set and count
in its best heuristic.

Member rewards are computed in score space, ``s = -objective`` for minimisation problems and ``s = objective``
for maximisation (the evaluator's score, higher is better), so every problem direction is rewarded the
same way; "parent" is the child's best parent. For minimisation these are the paper's rules on objectives:

* EoH children: ``R = s_child - s_parent`` (``parent_objective - child_objective`` when minimising); a
  child that is invalid, or worse than the population's worst, gets ``max(s_worst - s_parent, -1)``
  (``invalid: paper``).
* Sampling (i1 children, no parent): ``R = s_child`` (``-child_objective`` when minimising); an invalid
  child gets ``min(valid R) - std(valid R)`` over the generation (``invalid: paper``), which is why rewards
  are computed per population (:meth:`EoHChildrenRollout.population_rewards`).

``invalid: zero`` gives invalid children 0.0 and ``invalid: <number>`` that number instead. A member's
reward is the mean over its children.

``reward: rank`` (not in the paper) separates members even when children are invalid, where the paper's rule
gives every member the same reward (all children invalid: every ``R`` is 0, the z-scores vanish and ES
applies no update). Each child of the generation gets a key ``(stage, value)``: the stage says how far it
got, ``0`` no code (``llm_error``, ``parse``, ``no_code``, ``empty_body``, ``sandbox``, ``other``), ``1``
code that does not compile (``syntax``, ``truncated``), ``2`` code that fails while loading or running
(``import``, ``runtime``, ``timeout``, ``memory``), ``3`` code that runs but returns a wrong or infeasible
answer (``return_type``, ``infeasible``), ``4`` a copy of an existing heuristic (``duplicate``), ``5`` a new valid heuristic, whose
value is the paper's reward above (``s_child - s_parent``, or ``s_child`` for i1). So an invalid child always
ranks below every valid one, and a better child above a worse one. The child's reward is its rank among the
generation's children (ties share their mean rank), scaled to ``[-0.5, 0.5]``; a member's reward is the
mean over its children. With every child equal (e.g. all unparsable) every member still gets 0. The rollout does not run on the held-out split: the heuristics'
held-out quality is reported by the AHD evolver itself.
"""

from __future__ import annotations

import statistics
from typing import Literal

from pydantic import Field

from coevo.ahd.sampler import HeuristicSearch, OperatorName, operators_field
from coevo.rollouts.base import Rollout, RolloutConfig, Split, register_rollout
from coevo.types import Trajectory

#: how far an invalid child got (see ``reward: rank`` in the module docstring); a valid new child is stage 5
_STAGE = {
    "llm_error": 0,
    "parse": 0,
    "no_code": 0,
    "empty_body": 0,
    "truncated": 1,
    "sandbox": 0,
    "other": 0,
    "syntax": 1,
    "import": 2,
    "runtime": 2,
    "timeout": 2,
    "memory": 2,
    "return_type": 3,
    "infeasible": 3,
    "duplicate": 4,
    "behavioural_duplicate": 4,
}


class EoHChildrenConfig(RolloutConfig):
    type: str = "eoh_children"
    evolver: str = Field("eoh", description="name of the run's heuristic-design evolver (eoh, sample, hillclimb, ...)")
    operators: list[OperatorName] | None = operators_field(
        "operators run under perturbed weights; default (null): the searched evolver's own "
        "(member_operators: eoh m1, m2; sample i1; hillclimb m1 on its incumbent)"
    )
    children_per_operator: int = Field(1, ge=1, description="children per operator and member")
    invalid: Literal["paper", "zero"] | float = Field("paper", description="reward rule for invalid children")
    reward: Literal["paper", "rank"] = Field(
        "paper",
        description="paper: the paper's member rewards; rank: ranks of (stage reached, paper reward) over "
        "the generation's children, so invalid children still separate members (see the module docstring)",
    )


@register_rollout("eoh_children")
class EoHChildrenRollout(Rollout):
    """Children of the run's EoH (or sampling) evolver, generated by a perturbed policy."""

    Config = EoHChildrenConfig

    def _search(self) -> HeuristicSearch:
        """The run's heuristic-design evolver named by ``rollout.evolver`` (a :class:`HeuristicSearch`)."""
        if self.ctx is None:
            raise RuntimeError("eoh_children needs the run context (it cannot run inside a Ray actor)")
        ev = self.ctx.evolvers.get(self.config.evolver)
        if not isinstance(ev, HeuristicSearch):  # a config error (rollout.evolver), not a type error
            raise ValueError(  # noqa: TRY004
                f"rollout.evolver: {self.config.evolver!r} is not an AHD evolver of this run "
                f"(evolvers: {sorted(self.ctx.evolvers)})"
            )
        return ev

    def _local(self, key_prefix: str) -> str:
        """``key_prefix`` without the leading run id. The sampler builds children's keys with
        ``sampler.key`` (which adds the run id) and both paths seed their RNG from it, so the children's keys
        hold the run id once and their prompts and sampling seeds depend on the run seed only, not on the
        run folder."""
        return key_prefix.removeprefix(f"{self.ctx.run_id}/")

    def _jobs(self, search: HeuristicSearch, key_prefix: str) -> list:
        """The calls of one member keyed by ``key_prefix``, as the searched evolver makes them
        (``search.member_jobs``); deterministic in the run seed and the member's key."""
        return search.member_jobs(self._local(key_prefix), self.config.children_per_operator, self.config.operators)

    @staticmethod
    def _provenance(search: HeuristicSearch, generation: int, evolver: str, round_index: int) -> dict:
        """What both sampler calls record the children with, and the population they must differ from."""
        return {"round_index": round_index, "generation": generation, "evolver": evolver, "existing": search.population}

    def run(self, policy, *, generation, member, key_prefix, split: Split = "train", evolver="es", round_index=0):
        """Children (or, with no population yet or i1 only, fresh i1 samples) written by ``policy`` through
        the searched evolver's sampler, recorded with ``member`` and the ES ``generation``."""
        if split != "train":
            return []
        search = self._search()
        where = self._provenance(search, generation, evolver, round_index)
        return search.sampler.sample(self._jobs(search, key_prefix), policy=policy, member=member, **where)

    def run_population(
        self, population, members, *, generation, key_prefixes, split: Split = "train", evolver="es", round_index=0
    ):
        """Every member's children in one batched ``population.generate`` call (low-rank ES: rows of different
        members share the model batches), evaluated together, through
        :meth:`~coevo.ahd.sampler.HeuristicSampler.sample_population`. Job ``k`` of every member samples with
        the same seed (common random numbers), drawn from the run seed, the calling evolver and ``generation``."""
        if split != "train":
            return [[] for _ in members]
        search = self._search()
        groups = [(m, self._jobs(search, kp)) for m, kp in zip(members, key_prefixes, strict=True)]
        seed = self.ctx.rng(evolver, f"g{generation}", "population-sampling").getrandbits(63)
        where = self._provenance(search, generation, evolver, round_index)
        return search.sampler.sample_population(groups, population=population, seed=seed, **where)

    # ------------------------------------------------------------------ rewards
    def _child_reward(self, t: Trajectory) -> float | None:
        """Reward of one child, or None when it is invalid under the sampling rule (resolved per population)."""
        meta = t.meta
        child = t.reward if t.valid else None  # scores: higher is better in every problem direction
        parent = meta.get("parent_score")
        worst = meta.get("worst_score")
        if parent is None:  # i1 child (sampling)
            return child
        if child is None or (worst is not None and child < worst):
            return self._invalid_value(max(worst - parent, -1.0) if worst is not None else -1.0)
        return child - parent

    def _invalid_value(self, paper: float) -> float:
        inv = self.config.invalid
        if inv == "paper":
            return paper
        if inv == "zero":
            return 0.0
        return float(inv)

    def population_rewards(self, members: list[list[Trajectory]]) -> list[float]:
        """Member rewards of one generation (the paper's rules, or ranks with ``reward: rank``)."""
        if self.config.reward == "rank":
            return self._rank_rewards(members)
        raw = [[self._child_reward(t) for t in ts] for ts in members]
        valid = [r for rs in raw for r in rs if r is not None]
        if valid:
            spread = statistics.pstdev(valid) if len(valid) > 1 else 0.0
            fallback = self._invalid_value(min(valid) - spread)
        else:
            fallback = self._invalid_value(0.0)
        out = []
        for rs in raw:
            filled = [fallback if r is None else r for r in rs]
            out.append(sum(filled) / len(filled) if filled else fallback)
        return out

    def _rank_rewards(self, members: list[list[Trajectory]]) -> list[float]:
        keys = [[self._stage_key(t) for t in ts] for ts in members]
        flat = sorted(k for ks in keys for k in ks)
        if len(flat) < 2:
            return [0.0] * len(members)
        first: dict[tuple[int, float], int] = {}
        last: dict[tuple[int, float], int] = {}
        for pos, k in enumerate(flat):
            first.setdefault(k, pos)
            last[k] = pos
        scale = len(flat) - 1

        def centred(k: tuple[int, float]) -> float:
            return (first[k] + last[k]) / 2 / scale - 0.5

        return [sum(centred(k) for k in ks) / len(ks) if ks else 0.0 for ks in keys]

    def _stage_key(self, t: Trajectory) -> tuple[int, float]:
        if t.valid and t.reward is not None:
            parent = t.meta.get("parent_score")
            return (5, t.reward - parent if parent is not None else t.reward)
        return (_STAGE.get(t.failure or "other", 0), 0.0)

    def member_reward(self, trajectories: list[Trajectory]) -> float:
        return self.population_rewards([trajectories])[0]

    def n_cases(self, split: Split = "train") -> int:
        """Calls per member: ``children_per_operator`` x the operators (``operators``, else the searched
        evolver's ``member_operators``, read once the run's evolvers exist; 1 before)."""
        if split != "train":
            return 0
        ops = self.config.operators
        if ops is None:
            search = self.ctx.evolvers.get(self.config.evolver) if self.ctx is not None else None
            ops = getattr(search, "member_operators", None) or ["i1"]
        return self.config.children_per_operator * len(ops)
