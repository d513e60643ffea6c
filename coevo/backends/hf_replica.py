"""The in-process ES replica of a Hugging Face policy (:class:`coevo.es.replica.ESReplica` for ``HFPolicy``).

An :class:`HFReplica` holds the policy and its ES parameters (``coevo.es.ESParams`` over the policy's
``named_parameters()``: scope, optional float32 masters). It perturbs members in place and restores them
(exception safe, ``coevo.es.perturb``), applies recorded updates, and saves / loads weight snapshots. The
same class runs inside every Ray actor of :class:`coevo.placement.ray_pool.RayReplicaPool`.

Population batches (``perturbation: lowrank``, EGGROLL, arXiv 2511.16652; math in ``coevo.es.lowrank``).
:meth:`HFReplica.population` draws the members' factors (:class:`coevo.es.lowrank.FactorBank`) and registers
a forward hook on every ``nn.Linear`` whose weight is in scope. A call of the yielded :class:`HFPopulation`
takes ``(member, conversation)`` rows; before each model batch (``HFPolicy.batch_size`` rows, KV cache and chat
template as in plain generation) it sets the batch's per-row tables ``slots`` / ``scales`` (shape ``(b,)``),
and each hooked layer returns ``y + scale_b (x_b B_{slot_b}) A_{slot_b}^T``:

    x: (b, T, n) -> gather B rows (b, n, r), bmm -> (b, T, r), scale, bmm with A^T (b, r, m) -> (b, T, m),

``2 r (m + n)`` multiply-adds per token and layer beside the base ``m n``, computed in float32 and added in
the activation dtype. The weights are never modified (no perturb / restore pass, no drift, no masters
needed for rollouts), and rows of the centre (member None) get scale 0. Outside a population batch the hooks
do nothing, so the policy itself stays the centre. A token prefix shared by a batch's rows (chat template,
task text) is prefilled once per member present in the batch, not once per row (``HFPolicy._prefix_cache``):
the prefix's keys and values depend on the member's weights, but not on which of its rows carries it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from coevo.backends.base import Completion, Message, Policy, PolicyAbilities, SamplingParams, request_seed
from coevo.es import ESParams, GenerationRecord, ScopeSpec, UpdateStats, apply_records, perturb, select_params
from coevo.es.checkpoint import load_snapshot, rebuild, save_snapshot
from coevo.es.lowrank import FactorBank, check_matrices
from coevo.es.replica import member_position, member_row_indices
from coevo.types import ESMember

#: one row of a population call: (member, or None for the centre; chat conversation)
Row = tuple[ESMember | None, list[Message]]


class HFReplica:
    """A policy with an in-process parameter space plus its ES parameters.

    Args:
        policy: a policy whose ``named_parameters()`` yields the tensors (``policy.has_parameters``), e.g.
            ``HFPolicy``.
        scope: the tensors ES perturbs and updates.
        master_weights: keep float32 masters of bf16/fp16 tensors (``coevo.es.params``).
        restore_mode: ``"exact"`` (bit-identical restores) or ``"inference"`` (``coevo.es.perturb``).

    Attributes:
        policy, scope, restore_mode: as given. params: the ``ESParams``.

    Raises:
        TypeError: the policy has no parameter space. ValueError: the scope selects no tensor.
    """

    def __init__(self, policy, scope: ScopeSpec, master_weights: bool = True, restore_mode: str = "exact") -> None:
        if not getattr(policy, "has_parameters", False):
            raise TypeError(f"ES needs a policy with a parameter space (hf backend), got {type(policy).__name__}")
        self.policy = policy
        self.scope = scope
        self.restore_mode = restore_mode
        self.params = ESParams(
            select_params(policy.named_parameters(), scope), master_dtype=torch.float32 if master_weights else None
        )

    @property
    def active(self) -> bool:
        """Whether a perturbation is applied to the weights right now."""
        return self.params.active is not None

    @contextmanager
    def perturbed(self, member: ESMember) -> Iterator[Any]:
        """``with replica.perturbed(member) as policy:`` the policy at ``theta + sign * sigma * eps(seed)``;
        restored on exit, also when the body raises."""
        with perturb(self.params, member.seed, member.sigma, member.sign, self.restore_mode):
            yield self.policy

    @contextmanager
    def population(self, members: Sequence[ESMember], rank: int) -> Iterator[HFPopulation]:
        """``with replica.population(members, rank) as pop:`` every member's rank-``rank`` perturbation served
        by forward hooks (module docstring); the hooks are removed on exit, also when the body raises.

        Raises:
            ValueError: a tensor in scope is not the weight of an ``nn.Linear`` (use scope all_linear), an
                empty population or a bad rank. RuntimeError: a full-rank perturbation is active.
        """
        if self.active:
            raise RuntimeError("a perturbation is active: restore it before evaluating a low-rank population")
        check_matrices(self.params)
        model = self.policy.model
        modules: list[tuple[str, nn.Linear]] = []
        for name, t in self.params.items():
            owner = model.get_submodule(name.removesuffix(".weight")) if name.endswith(".weight") else None
            if not isinstance(owner, nn.Linear) or owner.weight.data_ptr() != t.data_ptr():
                raise ValueError(f"low-rank ES needs {name!r} to be the weight of an nn.Linear (use scope all_linear)")
            modules.append((name, owner))
        pop = HFPopulation(self.policy, list(members), FactorBank(self.params, members, rank))
        handles = [mod.register_forward_hook(pop.hook(name)) for name, mod in modules]
        try:
            yield pop
        finally:
            for h in handles:
                h.remove()

    def weights_hash(self) -> str:
        """``weights_hash`` of the tensors in scope (64 hex chars)."""
        return self.params.weights_hash()

    def noise_hash(self, member: ESMember) -> str:
        """``weights_hash`` of the tensors in scope while perturbed by ``member`` (restored after): equal
        across replicas iff they hold the same weights and draw the same noise."""
        with self.perturbed(member):
            return self.params.weights_hash()

    def apply(self, record: GenerationRecord) -> tuple[UpdateStats, str]:
        """Apply one generation's update (skipped records apply nothing); returns (stats, hash after)."""
        stats = record.apply(self.params)
        return stats, self.params.weights_hash()

    def save_snapshot(self, path: str | Path, meta: dict[str, Any] | None = None) -> str:
        """Write the scope's weights (and masters) to ``path``; returns their hash (``coevo.es.checkpoint``)."""
        return save_snapshot(path, self.params, meta)

    def load(self, snapshot: str | Path | None, records: Sequence[GenerationRecord]) -> str:
        """Load ``snapshot`` (None: keep the current weights), then re-apply ``records`` checking their
        hashes; returns the final hash."""
        if snapshot is not None:
            load_snapshot(snapshot, self.params)
        return apply_records(self.params, records).weights_hash

    def rebuild(self, run_dir: str | Path, rows: Sequence[dict[str, Any]], generation: int) -> tuple[str, int | None]:
        """Weights after ``generation`` from the newest snapshot plus history ``rows`` (``coevo.es.checkpoint``)."""
        return rebuild(self.params, run_dir, rows, generation)


class HFPopulation(PolicyAbilities):
    """Batched generation and scoring for a low-rank population on an ``HFPolicy`` (module docstring).

    Implements :class:`coevo.es.replica.Population`. Rows of one call may belong to different members; they go
    through ``ceil(rows / batch_size)`` model batches. Sampling seeds are per member: the k-th row of a member
    in a call seeded ``s`` uses ``request_seed(s, k)``, as if that member's rows were generated alone.

    Attributes:
        policy: the ``HFPolicy`` (centre weights). members: the members served. bank: their factors.
        tokenizer: the policy's tokenizer.
    """

    def __init__(self, policy, members: list[ESMember], bank: FactorBank) -> None:
        self.policy = policy
        self.members = members
        self.bank = bank
        self.tokenizer = policy.tokenizer
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None  # (slots, scales) of the running batch

    def hook(self, name: str):
        """The forward hook of the linear layer whose weight is ``name``: adds the rows' low-rank terms."""

        def add_term(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
            if self._tables is None:
                return None
            slots, scales = self._tables
            if args[0].shape[0] != slots.shape[0]:
                raise RuntimeError(f"{name}: a batch of {args[0].shape[0]} rows but {slots.shape[0]} row tables")
            return self.bank.add_delta(name, args[0], output, slots, scales)

        return add_term

    def _batch_hook(self, positions: list[int | None]):
        """``batch_hook(start, stop)`` for ``HFPolicy.generate_rows`` / ``logprob``: sets the rows' tables for
        the batch and yields ``narrow(indices)``, a context manager that restricts them to some of the batch's
        rows (the per-member prefix prefill of ``HFPolicy._prefix_cache``)."""

        @contextmanager
        def tables(start: int, stop: int) -> Iterator[Any]:
            batch = positions[start:stop]
            self._tables = self.bank.row_tables(batch, self.policy.device)

            @contextmanager
            def narrow(indices: Sequence[int]) -> Iterator[None]:
                saved = self._tables
                self._tables = self.bank.row_tables([batch[i] for i in indices], self.policy.device)
                try:
                    yield
                finally:
                    self._tables = saved

            try:
                yield narrow
            finally:
                self._tables = None

        return tables

    def generate(
        self, rows: Sequence[Row], params: SamplingParams, seed_indices: Sequence[int] | None = None
    ) -> list[Completion]:
        """One completion per ``(member, conversation)`` row, in order (``HFPolicy.generate_rows``); row i
        samples with ``request_seed(params.seed, k_i)``, ``k_i = seed_indices[i]`` or (default) the row's
        index among its member's rows.

        Raises:
            ValueError: ``seed_indices`` of the wrong length, a member not in the population.
        """
        positions = [member_position(self.members, m) for m, _ in rows]
        if seed_indices is not None and len(seed_indices) != len(rows):
            raise ValueError(f"seed_indices has {len(seed_indices)} items for {len(rows)} rows")
        seeds = None
        if params.seed is not None:
            index = member_row_indices(positions) if seed_indices is None else seed_indices
            seeds = [request_seed(params.seed, int(k)) for k in index]
        return self.policy.generate_rows(
            [c for _, c in rows], params, row_seeds=seeds, batch_hook=self._batch_hook(positions), row_groups=positions
        )

    def logprob(self, rows: Sequence[Row], targets: Sequence[str]) -> torch.Tensor:
        """``log p(target | conversation)`` (nats) under each row's member: float32 CPU tensor (len(rows),)."""
        positions = [member_position(self.members, m) for m, _ in rows]
        return self.policy.logprob([c for _, c in rows], list(targets), batch_hook=self._batch_hook(positions))

    def member_policy(self, member: ESMember) -> MemberPolicy:
        """A :class:`~coevo.backends.base.Policy` view of one member (all its rows belong to ``member``)."""
        member_position(self.members, member)
        return MemberPolicy(self, member)


class MemberPolicy(Policy):
    """One member of an :class:`HFPopulation` as a plain :class:`~coevo.backends.base.Policy` (``generate``,
    ``logprob``, ``tokenizer``), for rollouts that drive a policy themselves (agents, EoH sampling). Its calls
    are population calls whose rows all belong to the member: same math, no weight pass."""

    def __init__(self, population: HFPopulation, member: ESMember) -> None:
        self.population = population
        self.member = member
        self.tokenizer = population.tokenizer
        self.model_id = population.policy.model_id

    @property
    def can_continue_final_message(self) -> bool:
        return self.population.can_continue_final_message

    @property
    def can_constrain(self) -> bool:
        return self.population.can_constrain

    def generate(self, conversations: list[list[Message]], params: SamplingParams) -> list[Completion]:
        return self.population.generate([(self.member, c) for c in conversations], params)

    def logprob(self, conversations: list[list[Message]], targets: list[str]) -> torch.Tensor:
        return self.population.logprob([(self.member, c) for c in conversations], targets)
