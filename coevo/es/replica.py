"""The ES replica: the interface between the ES evolver and a backend's weights.

A *replica* is a parameter-space policy together with its ES parameters (the tensors in scope, optional
float32 masters). The ES evolver talks to every backend through this one interface; each backend provides
one implementation, returned by :meth:`coevo.backends.base.Policy.es_replica`:

* :class:`coevo.backends.hf_replica.HFReplica` - an in-process ``HFPolicy`` (also the replica inside each
  Ray actor of :class:`coevo.placement.ray_pool.RayReplicaPool`);
* :class:`coevo.backends.vllm_engine.VLLMReplica` - a vLLM engine whose workers run the same ES math
  (``coevo.backends.vllm_worker``) through ``collective_rpc``.

The Ray pool holds many replicas on actors; it implements the weight side (:class:`WeightReplica`:
update, hashes, load) for all of them at once and evaluates members remotely.

Members are evaluated either one at a time under an in-place full-rank perturbation
(:meth:`ESReplica.perturbed`, ``perturbation: full``), or all together without touching the weights
(:meth:`ESReplica.population`, ``perturbation: lowrank``, EGGROLL, arXiv 2511.16652, ``coevo.es.lowrank``): the
replica then yields a :class:`Population`, whose batched calls take rows that belong to different members.
The rollout itself is run by the caller (the ES evolver, or the Ray actor holding the replica). Replicas
whose backend has no batched low-rank path raise ``NotImplementedError`` from ``population`` (saying why).

:func:`member_position` and :func:`member_row_indices` are the row bookkeeping every ``Population`` shares
(which member a row belongs to, and the per-member row index its sampling seed is keyed by).

Only ``typing`` is used here, so this module sits in the math package without importing any backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from coevo.es.history import GenerationRecord
    from coevo.es.update import UpdateStats
    from coevo.types import ESMember


@runtime_checkable
class WeightReplica(Protocol):
    """The weight operations every replica (and a pool of replicas) provides."""

    def weights_hash(self) -> str:
        """``coevo.es.hashing.weights_hash`` of the tensors in scope (64 hex chars)."""
        ...

    def apply(self, record: GenerationRecord) -> tuple[UpdateStats, str]:
        """Apply one generation's update (``GenerationRecord.apply``); returns (stats, weights hash after)."""
        ...

    def load(self, snapshot: str | Path | None, records: Sequence[GenerationRecord]) -> str:
        """Load a weight snapshot (None: keep the weights), then re-apply ``records`` checking their hashes
        (``coevo.es.history.apply_records``); returns the final hash."""
        ...


@runtime_checkable
class ESReplica(WeightReplica, Protocol):
    """A policy plus its ES parameters (module docstring).

    Attributes:
        policy: the backend's :class:`~coevo.backends.base.Policy` at the centre weights.
    """

    policy: Any

    @property
    def active(self) -> bool:
        """Whether a perturbation is applied to the weights right now."""
        ...

    def perturbed(self, member: ESMember) -> AbstractContextManager[Any]:
        """``with replica.perturbed(member) as policy:`` the policy at ``theta + sign * sigma * eps(seed)``
        (full rank, in place); restored exactly on exit, also when the body raises."""
        ...

    def population(self, members: Sequence[ESMember], rank: int) -> AbstractContextManager[Population]:
        """``with replica.population(members, rank) as pop:`` a :class:`Population` serving every member's
        rank-``rank`` perturbation at once, without modifying the weights.

        Raises:
            NotImplementedError: the backend has no batched low-rank path (the message says what to use).
        """
        ...

    def noise_hash(self, member: ESMember) -> str:
        """Hash of the scope while perturbed (full rank) by ``member``, restored after."""
        ...

    def save_snapshot(self, path: str | Path, meta: dict[str, Any] | None = None) -> str:
        """Write the scope's weights (and masters) to ``path`` (``coevo.es.checkpoint``); returns their hash."""
        ...

    def rebuild(self, run_dir: str | Path, rows: Sequence[dict[str, Any]], generation: int) -> tuple[str, int | None]:
        """Weights after ``generation`` updates from the newest snapshot plus the history ``rows``
        (``coevo.es.checkpoint.rebuild``); returns (hash, snapshot generation used or None)."""
        ...


@runtime_checkable
class Population(Protocol):
    """Batched access to a population of low-rank perturbed policies (``ESReplica.population``).

    Rows of one call may belong to different members (``(member, conversation)``; member None = the centre);
    the backend runs them through as few batched forward passes as its batch size allows. Sampling seeds are
    per member: the k-th row of a member in a call seeded ``s`` samples with
    ``coevo.backends.base.request_seed(s, k)``, as if that member's rows were generated alone.

    Attributes:
        members: the members served, in the order given. tokenizer: the policy's tokenizer.
        can_continue_final_message, can_constrain: the policy's (``coevo.backends.base.Policy``): whether a row
            ending with an assistant message is continued, whether ``SamplingParams.regex`` is honoured.
    """

    members: Sequence[ESMember]
    tokenizer: Any
    can_continue_final_message: bool
    can_constrain: bool

    def generate(
        self,
        rows: Sequence[tuple[Any, list[dict[str, str]]]],
        params: Any,
        seed_indices: Sequence[int] | None = None,
    ) -> list[Any]:
        """One :class:`~coevo.backends.base.Completion` per row, in order. With ``seed_indices``, row i samples
        with ``request_seed(params.seed, seed_indices[i])`` instead of its index among its member's rows (a
        caller whose rows have their own stable index, e.g. a job's slot, so that a partial re-run samples
        them as the full call did)."""
        ...

    def logprob(self, rows: Sequence[tuple[Any, list[dict[str, str]]]], targets: Sequence[str]) -> Any:
        """Float32 CPU tensor (len(rows),) of ``log p(target | conversation)`` in nats under each row's member."""
        ...

    def member_policy(self, member: ESMember) -> Any:
        """A :class:`~coevo.backends.base.Policy` view of one member (its rows only), for rollouts that drive a
        policy themselves (agents, EoH sampling): same math, still no weight pass."""
        ...


def member_position(members: Sequence[ESMember], member: ESMember | None) -> int | None:
    """Index of ``member`` in a population's ``members`` (None for the centre).

    Raises:
        ValueError: ``member`` is not in ``members``.
    """
    if member is None:
        return None
    for i, m in enumerate(members):
        if m == member:
            return i
    raise ValueError(f"member {member} is not in this population")


def member_row_indices(positions: Sequence[int | None]) -> list[int]:
    """Per row, how many earlier rows of the same call belong to its member (``positions`` from
    :func:`member_position`; the centre counts as one member): the ``k`` of the row's sampling seed
    ``request_seed(s, k)`` (:class:`Population`), so a member's rows sample as if generated alone."""
    count: dict[int | None, int] = {}
    out = []
    for p in positions:
        out.append(count.get(p, 0))
        count[p] = out[-1] + 1
    return out
