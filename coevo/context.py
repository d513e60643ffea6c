"""The run context: what a run shares with its evolvers and rollouts.

One :class:`RunContext` per run, built by the loop (:class:`coevo.loop.CoEvolutionLoop`) and handed to every
evolver (``Evolver(name, config, ctx)``) and rollout (``Rollout(config, ctx)``). It sits below both, so
rollouts need not import the evolvers package. See :mod:`coevo.evolvers.base` for the resume contract
(deterministic keys, :meth:`RunContext.cached`).

The context channel (co-evolution): a context-space evolver calls ``ctx.publish(key, value)`` (a system prompt,
an instruction, the current skill...); the value is stored as version k of the ``context`` artifact ``key``
(:mod:`coevo.artifacts`) and becomes what every rollout that declares ``key`` reads from its next call on
(:meth:`coevo.rollouts.base.Rollout.current_context`), in-process or on Ray actors (the ES evolver sends the
declared keys' values with each job). Each trajectory records the versions it ran under in
``Trajectory.context.versions``. The current version per key is part of :attr:`RunContext.shared` (saved with
checkpoints), and a publish is idempotent on ``(key, current version, value)``: a step re-run after a crash
republishes its value as the same version. There is one way for context to reach a rollout: the built-in
Trace2Skill publishes its skill on this channel (key ``skill``) too.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coevo.types import Trajectory

if TYPE_CHECKING:
    from coevo.backends.base import Policy
    from coevo.budget import Budget
    from coevo.store import TrajectoryStore

#: the key of :attr:`RunContext.shared` that holds the current published version of each context key
CONTEXT_STATE = "context"


@dataclass(frozen=True)
class ContextValue:
    """One version of a published context key.

    Attributes:
        key: the context key (e.g. ``"system_prompt"``).
        version: 0 = nothing published (the rollout uses its own default; ``value`` is None), else the
            1-based version of the ``context`` artifact ``key``.
        value: the published JSON value (str, number, list, dict) or None.
    """

    key: str
    version: int
    value: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "version": self.version, "value": self.value}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ContextValue:
        return cls(str(d["key"]), int(d["version"]), d.get("value"))


@dataclass
class RunContext:
    """Everything an evolver may use, shared by all evolvers of a run.

    Attributes:
        run_id: id of the run (the run folder's name).
        run_dir: the run folder.
        store: the shared trajectory store (single writer: the loop's process).
        budget: the run's sample budget; evolvers call ``budget.remaining()`` before sampling.
        policy_factory: returns the run's policy (created once, lazily); ``None`` when the run has none.
        placement: where the run's model replicas live (a :class:`coevo.placement.Placement`, chosen once by
            the loop; its ``policy_factory`` is the one above), or None for a context built outside the loop.
        shared: small JSON-serialisable board for cross-evolver state, saved with checkpoints (the context
            channel keeps its current versions under ``shared["context"]``; publish with :meth:`publish`).
        evolvers: the run's evolvers (:class:`coevo.evolvers.Evolver`) by name, for evolvers and rollouts
            that cooperate (e.g. ES members writing EoH children through EoH's sampler).
        seed: the run's base seed.
        round: the current round (set by the loop).
        sampling: the run's default decoding settings (``coevo.config.SamplingConfig``), see
            :meth:`sampling_params`.
        progress: called as ``progress(kind, n)`` on progress inside a step (set by the loop, may be None):
            ``"sampling"`` (n LLM samples about to be drawn), ``"samples"`` (n drawn) and ``"trajectories"``
            (n new trajectories recorded, e.g. evaluated candidates); ``"loading"`` / ``"loaded"`` around
            the creation of the policy; from a backend that reports decoding (``policy.progress``, set by
            :meth:`observe`): ``"batch"`` (rows of a model batch), ``"tokens"`` (rows still decoding, once per
            step) and ``"rows"`` (rows finished). See :meth:`report_progress`.
        stop_requested: why the run should stop at the next sample boundary (set by :meth:`request_stop`,
            e.g. on SIGINT), or None.

    Public API for evolvers and rollouts: :attr:`run_id`, :attr:`run_dir`, :attr:`store` (read it through
    :meth:`pool`), :attr:`budget`, :attr:`policy`, :attr:`placement`, :attr:`evolvers` (filled before any ``setup()`` hook runs),
    :attr:`seed`, :attr:`round`, :meth:`rng`, :meth:`traj_key`, :meth:`cached`, :meth:`record`,
    :meth:`publish`, :meth:`context`, :meth:`pool`, :meth:`sampling_params`, :meth:`sample_boundary`.
    Attributes starting with ``_`` are the loop's.

    Sample boundaries: the policy returned by :attr:`policy` (and any policy passed through
    :meth:`observe`) calls :meth:`sample_boundary` before each ``generate`` / ``logprob`` call and reports
    the samples it drew; evolvers that draw samples another way call :meth:`sample_boundary` themselves.
    """

    run_id: str
    run_dir: Path
    store: TrajectoryStore
    budget: Budget
    policy_factory: Callable[[], Policy] | None = None
    placement: Any = None
    shared: dict[str, Any] = field(default_factory=dict)
    evolvers: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    round: int = 0
    sampling: Any = None
    progress: Callable[[str, int], None] | None = None
    stop_requested: tuple[str, int] | None = None
    _policy: Policy | None = None
    _context_values: dict[tuple[str, int], Any] = field(default_factory=dict)

    @property
    def policy(self) -> Policy:
        """The run's policy, created on first use and observed (:meth:`observe`).

        Raises:
            ConfigError: when the run config has no model.
        """
        if self._policy is None:
            if self.policy_factory is None:
                from coevo.errors import ConfigError

                raise ConfigError("this run has no model configured (config field `model`)")
            self.report_progress("loading", 1)  # a model may take minutes to build and load: say so
            try:
                policy = self.policy_factory()
            finally:
                self.report_progress("loaded", 1)
            self._policy = self.observe(policy)
        return self._policy

    @property
    def policy_loaded(self) -> bool:
        """Whether the run's policy has been created (first use of :attr:`policy`)."""
        return self._policy is not None

    def close_policy(self) -> None:
        """Release the run's policy if it was created (engines, clients); a later use creates it again."""
        if self._policy is not None:
            policy, self._policy = self._policy, None
            policy.close()

    def observe(self, policy: Policy) -> Policy:
        """Make ``policy`` call :meth:`sample_boundary` before, and :meth:`report_progress` after, each
        ``generate(conversations, ...)`` and ``logprob(conversations, ...)`` call (one sample per
        conversation). The methods are wrapped on the instance, so ``isinstance`` checks and every other
        attribute are unchanged; observing twice is a no-op, and a policy observed by another (earlier) run
        context is re-wrapped from its original methods, never wrapped twice. Returns ``policy``."""
        if getattr(policy, "_observed_by", None) is self:
            return policy
        originals = policy.__dict__.get("_unobserved")  # a policy shared with an earlier run context
        if originals is None:
            originals = {n: getattr(policy, n) for n in ("generate", "logprob") if callable(getattr(policy, n, None))}
            policy._unobserved = originals  # type: ignore[attr-defined]
        for name, inner in originals.items():
            setattr(policy, name, self._observed(inner))
        if hasattr(policy, "progress"):  # a backend that reports decoding progress (HFPolicy: tokens, rows)
            policy.progress = self.report_progress  # type: ignore[attr-defined]
        policy._observed_by = self  # type: ignore[attr-defined]
        return policy

    def _observed(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(inner)
        def call(conversations, *args: Any, **kwargs: Any):
            n = len(conversations)
            self.sample_boundary(n)
            out = inner(conversations, *args, **kwargs)
            self.report_progress("samples", n)
            return out

        return call

    def request_stop(self, reason: str, signum: int = 0) -> None:
        """Ask the run to stop: the next :meth:`sample_boundary` raises :class:`~coevo.errors.RunInterrupted`,
        and the loop stops before the next step (e.g. from a SIGINT handler)."""
        if self.stop_requested is None:
            self.stop_requested = (reason, signum)

    def check_stop(self) -> None:
        """A safe point inside a step that draws no LLM samples (e.g. between ``tune``'s ES generations): the
        step ends here when a stop was requested, and re-runs whole on resume (nothing of it is kept).

        Raises:
            RunInterrupted: a stop was requested (:meth:`request_stop`).
        """
        from coevo.errors import RunInterrupted

        if self.stop_requested is not None:
            raise RunInterrupted(*self.stop_requested)

    def sample_boundary(self, n: int = 1) -> None:
        """Called before drawing ``n`` LLM samples inside a step: a safe point to end the step.

        Raises:
            RunInterrupted: a stop was requested (:meth:`request_stop`).
            BudgetExhausted: the wall-clock budget is spent (the sample budget is enforced by
                ``budget.allow`` instead, which evolvers call before sampling).
        """
        from coevo.errors import BudgetExhausted

        self.check_stop()
        wall = self.budget.wall_exhausted()
        if wall:
            raise BudgetExhausted(wall)
        self.report_progress("sampling", n)

    def report_progress(self, kind: str, n: int = 1) -> None:
        """Tell the progress display that ``n`` things of ``kind`` happened ("sampling", "samples",
        "trajectories"); a no-op without a display."""
        if self.progress is not None and n:
            self.progress(kind, n)

    def sampling_params(self, **overrides: Any):
        """The run's decoding settings as :class:`~coevo.backends.base.SamplingParams`, with overrides."""
        from coevo.backends.base import SamplingParams

        base = self.sampling.model_dump() if self.sampling is not None else {}
        base.update({k: v for k, v in overrides.items() if v is not None})
        if "stop" in base:
            base["stop"] = tuple(base["stop"])
        return SamplingParams(**base)

    def cached(self, key: str) -> Trajectory | None:
        """The stored trajectory with this idempotency key, or None (resume contract: :mod:`coevo.evolvers.base`)."""
        return self.store.get_by_key(key)

    def record(self, trajectory: Trajectory) -> Trajectory:
        """Store a trajectory (idempotent); its ``llm_calls`` count against the budget once.

        Returns the stored trajectory (the earlier copy if the key already existed).
        """
        stored, inserted = self.store.add_trajectory(trajectory)
        if inserted:
            self.report_progress("trajectories", 1)
        return stored

    def traj_key(self, evolver: str, *parts: object) -> str:
        """Deterministic idempotency key: ``run/evolver/part/part/...``."""
        return "/".join([self.run_id, evolver, *map(str, parts)])

    def rng(self, *parts: object) -> random.Random:
        """A deterministic RNG keyed by the run seed and ``parts`` (stable across resumes)."""
        return random.Random("/".join([str(self.seed), *map(str, parts)]))

    # ------------------------------------------------------------------ the context channel
    def publish(
        self, key: str, value: Any, *, evolver: str, round_index: int | None = None, meta: dict | None = None
    ) -> ContextValue:
        """Make ``value`` the current context ``key`` for every rollout's next call; returns its version.

        Stored as the next version of the ``context`` artifact ``key`` (parent: the current version), keyed
        by ``(run, key, current version, value)``: publishing the same value again at the same version (a
        step re-run after a crash) returns the stored version and writes nothing; publishing the current
        value again is a no-op.

        Args:
            key: the context key rollouts declare (``"system_prompt"``, ``"skill"``, any name).
            value: JSON-serialisable (a prompt string, a skill's ``{name, version, path, source}``, ...);
                not None.
            evolver: the publishing evolver's name (recorded).
            round_index: the loop round (default: :attr:`round`).
            meta: free JSON metadata of the version (e.g. the candidate's score).

        Raises:
            TypeError / ValueError: an empty key, a None or non-JSON value.
        """
        if not isinstance(key, str) or not key:
            raise ValueError(f"context key must be a non-empty string, got {key!r}")
        if value is None:
            raise ValueError(f"context {key!r}: a published value cannot be None")
        try:
            text = json.dumps(value, sort_keys=True, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"context {key!r}: the value is not JSON-serialisable ({exc})") from None
        current = self.context(key)
        if current.version and json.dumps(current.value, sort_keys=True, ensure_ascii=False) == text:
            return current
        from coevo.artifacts import CONTEXT

        digest = hashlib.sha256(text.encode()).hexdigest()[:20]
        rnd = self.round if round_index is None else round_index
        art = self.store.put_artifact(
            self.run_id,
            CONTEXT,
            key,
            {"key": key, "value": value, "evolver": evolver, "round": rnd},
            key=f"{self.run_id}/context/{key}/after-v{current.version}/{digest}",
            parent_version=current.version or None,
            meta=meta,
        )
        self.shared.setdefault(CONTEXT_STATE, {})[key] = art.version
        self._context_values[(key, art.version)] = art.content["value"]
        return ContextValue(key, art.version, art.content["value"])

    def context(self, key: str) -> ContextValue:
        """The current version of context ``key`` (version 0, value None, when nothing was published)."""
        version = int(self.shared.get(CONTEXT_STATE, {}).get(key, 0))
        if version == 0:
            return ContextValue(key, 0, None)
        if (key, version) not in self._context_values:
            from coevo.artifacts import CONTEXT

            art = self.store.get_artifact(CONTEXT, key, version)
            if art is None:
                raise RuntimeError(f"context {key!r} version {version} is in the checkpoint but not in the store")
            self._context_values[(key, version)] = art.content["value"]
        return ContextValue(key, version, self._context_values[(key, version)])

    def context_history(self, key: str) -> list[ContextValue]:
        """Every version of context ``key`` this run published, oldest first."""
        from coevo.artifacts import CONTEXT

        return [
            ContextValue(key, a.version, a.content["value"])
            for a in self.store.list_artifacts(kind=CONTEXT, name=key, run_id=self.run_id)
        ]

    # ------------------------------------------------------------------ the pool
    def pool(
        self,
        *,
        split: str | None = "train",
        members_only: bool = False,
        evolver: str | None = None,
        space: str | None = None,
        generation: int | None = None,
        round: int | None = None,
        valid: bool | None = None,
        top_k: int | None = None,
        bottom_k: int | None = None,
        distinct_task: bool = False,
        with_steps: bool = True,
    ) -> list[Trajectory]:
        """This run's pooled trajectories, filtered; what a proposer may be shown.

        Args:
            split: ``"train"`` (default): only trajectories of train cases (``meta["split"] == "train"``), so
                the held-out evaluation of an ES centre, which has the same ``generation`` as its members,
                never leaks into a proposer's input; ``"test"``: the held-out ones; None: every trajectory,
                with or without a split (e.g. context evolvers' own LLM calls).
            members_only: only ES population members' rollouts (``member`` set; not the centre's).
            evolver, space, generation, round: equality filters (``round``: the loop round).
            valid: True: valid ones only; False: failures only.
            top_k / bottom_k: the k highest / lowest rewards (valid, reward set; ties: earliest first);
                at most one of them.
            distinct_task: one trajectory per ``task_id`` (the first in the order: the best per task with
                ``top_k``, the worst with ``bottom_k``, else the earliest), applied before ``k``.
            with_steps: load steps (False is much cheaper).

        Returns:
            Trajectories in insertion order, or by reward with ``top_k`` / ``bottom_k``.

        Raises:
            ValueError: both ``top_k`` and ``bottom_k``, or a bad filter value.
        """
        if top_k is not None and bottom_k is not None:
            raise ValueError("pool: give top_k or bottom_k, not both")
        k = top_k if top_k is not None else bottom_k
        filters: dict[str, Any] = {
            "run_id": self.run_id,
            "split": split,
            "evolver": evolver,
            "space": space,
            "generation": generation,
            "round": round,
            "valid": True if k is not None else valid,
            "member": True if members_only else None,
        }
        if k is not None:
            if valid is False:
                raise ValueError("pool: top_k / bottom_k rank valid trajectories; drop valid=False")
            filters["min_reward"] = float("-inf")  # drops rows without a reward
        order = {"order_by": "reward", "descending": top_k is not None} if k is not None else {}
        limit = None if distinct_task or k is None else k
        found = self.store.query(
            **{n: v for n, v in filters.items() if v is not None}, **order, limit=limit, with_steps=with_steps
        )
        if distinct_task:
            seen: set[str | None] = set()
            unique = []
            for t in found:
                if t.task_id not in seen:
                    seen.add(t.task_id)
                    unique.append(t)
            found = unique if k is None else unique[:k]
        return found
