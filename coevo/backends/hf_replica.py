"""The in-process ES replica of a Hugging Face policy (:class:`coevo.es.replica.ESReplica` for ``HFPolicy``).

An :class:`HFReplica` holds the policy and its ES parameters (``coevo.es.ESParams`` over the policy's
``named_parameters()``: scope, optional float32 masters). It perturbs members in place and restores them
(exception safe, ``coevo.es.perturb``), applies recorded updates, and saves / loads weight snapshots. The
same class runs inside every Ray actor of :class:`coevo.backends.ray_pool.RayReplicaPool`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from coevo.es import ESParams, GenerationRecord, ScopeSpec, UpdateStats, apply_records, perturb, select_params
from coevo.es.checkpoint import load_snapshot, rebuild, save_snapshot
from coevo.types import ESMember


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
        self.params = ESParams(select_params(policy.named_parameters(), scope),
                               master_dtype=torch.float32 if master_weights else None)  # fmt: skip

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
