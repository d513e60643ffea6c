"""ES generation records and replay.

A ``GenerationRecord`` holds everything the update of one generation depends on; since ``es_update`` is a
pure, device-independent function of these values and the weights (``coevo.es.update``), applying the
records in order to the initial weights reproduces the trained weights bit-identically, without any
rollout. ``weight_hash_after`` (``coevo.es.hashing.weights_hash`` of the working tensors in scope after the
update) lets ``replay`` prove it, generation by generation. Records of runs without float32 masters are
exact too, as long as every perturbation was restored in ``"exact"`` mode (``coevo.es.perturb``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from coevo.es.device_noise import record_noise
from coevo.es.lowrank import LOWRANK_SPEC, check_rank, lowrank_update
from coevo.es.noise import NOISE_SPEC, check_seed
from coevo.es.normalize import METHODS
from coevo.es.params import ESParams
from coevo.es.scope import ScopeSpec, select_params
from coevo.es.update import UpdateStats, es_update

_MASTER_DTYPES = {None: None, "float32": torch.float32}
#: perturbation kinds -> the noise definition their records must carry
PERTURBATIONS = {"full": NOISE_SPEC, "lowrank": LOWRANK_SPEC}


class ReplayMismatchError(RuntimeError):
    """Replayed weights differ from a record's ``weight_hash_after``."""


@dataclass
class GenerationRecord:
    """One ES generation's update inputs and result (JSON-serialisable via ``to_dict``).

    Attributes:
        generation: generation index t (>= 0).
        seeds, signs: per member (length N): noise seed, +1 / -1.
        rewards: raw member rewards (higher is better), length N.
        coeffs: shaped rewards actually used in the update, length N.
        sigma, alpha: the generation's perturbation scale and learning rate.
        normalization: the shaping method that turned ``rewards`` into ``coeffs``.
        scope: the ``ScopeSpec`` (as dict) of the tensors updated.
        divide_by_sigma, weight_decay: update options (``coevo.es.update.es_update``).
        skipped: whether the update was skipped (sigma == 0).
        weight_hash_after: ``weights_hash`` of the tensors in scope after this generation, or None.
        master_dtype: ``"float32"`` when the run kept float32 masters, else None.
        noise_spec: the noise definition used (``coevo.es.noise.NOISE_SPEC``; ``coevo.es.lowrank.LOWRANK_SPEC``
            for low-rank records).
        perturbation: ``"full"`` (eps of every element, ``coevo.es.update``) or ``"lowrank"`` (EGGROLL factors
            of rank ``rank``, ``coevo.es.lowrank``).
        rank: the factors' rank for ``"lowrank"`` (None for ``"full"``).
    """

    generation: int
    seeds: list[int]
    signs: list[int]
    rewards: list[float]
    coeffs: list[float]
    sigma: float
    alpha: float
    normalization: str = "zscore"
    scope: dict[str, Any] = field(default_factory=lambda: ScopeSpec().to_dict())
    divide_by_sigma: bool = False
    weight_decay: float = 0.0
    skipped: bool = False
    weight_hash_after: str | None = None
    master_dtype: str | None = None
    noise_spec: str = NOISE_SPEC
    perturbation: str = "full"
    rank: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.generation, int) or self.generation < 0:
            raise ValueError(f"generation must be an int >= 0, got {self.generation!r}")
        n = len(self.seeds)
        if n == 0 or not len(self.signs) == len(self.rewards) == len(self.coeffs) == n:
            raise ValueError(
                f"generation {self.generation}: seeds, signs, rewards, coeffs must be non-empty and equally "
                f"long, got {n}, {len(self.signs)}, {len(self.rewards)}, {len(self.coeffs)}"
            )
        self.seeds = [check_seed(s, f"seeds[{i}]") for i, s in enumerate(self.seeds)]
        for fname in ("sigma", "alpha", "weight_decay"):
            v = getattr(self, fname)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"generation {self.generation}: {fname} must be a finite number >= 0, got {v!r}")
        if self.normalization not in METHODS:
            raise ValueError(f"normalization must be one of {METHODS}, got {self.normalization!r}")
        if self.master_dtype not in _MASTER_DTYPES:
            raise ValueError(f"master_dtype must be 'float32' or None, got {self.master_dtype!r}")
        if self.perturbation not in PERTURBATIONS:
            raise ValueError(f"perturbation must be one of {sorted(PERTURBATIONS)}, got {self.perturbation!r}")
        if self.perturbation == "lowrank":
            check_rank(self.rank)
            if self.noise_spec == NOISE_SPEC:
                self.noise_spec = LOWRANK_SPEC
        elif self.rank is not None:
            raise ValueError(f"generation {self.generation}: rank is only used with perturbation 'lowrank'")
        self.scope = ScopeSpec.from_dict(dict(self.scope)).to_dict()
        self.seeds, self.signs = list(self.seeds), [int(s) for s in self.signs]
        self.rewards, self.coeffs = [float(r) for r in self.rewards], [float(c) for c in self.coeffs]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GenerationRecord:
        """Inverse of ``to_dict``. Raises ValueError on unknown keys or invalid values."""
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown GenerationRecord keys {sorted(unknown)}")
        return cls(**d)

    def apply(self, params: ESParams) -> UpdateStats:
        """Apply this record's update to ``params`` (``es_update``) with the noise stream ``noise_spec`` names
        (``coevo.es.device_noise.record_noise``: NoiseDeviceError for another device's stream); a skipped
        record applies nothing."""
        if self.skipped:
            return UpdateStats(skipped=True, reason="recorded as skipped", n_elements=params.numel)
        args = (params, self.seeds, self.signs, self.coeffs, self.alpha, self.sigma)
        options = {"divide_by_sigma": self.divide_by_sigma, "weight_decay": self.weight_decay}
        if self.perturbation == "lowrank":
            return lowrank_update(*args, rank=self.rank, generation=self.generation, **options)
        with record_noise(params, self.noise_spec):  # the stream the record was drawn with, or NoiseDeviceError
            return es_update(*args, **options)


@dataclass
class ReplayReport:
    """Outcome of :func:`apply_records`.

    Attributes:
        applied: records applied. weights_hash: ``weights_hash`` of the scope after the last one.
        stats: the ``UpdateStats`` of each record applied, in order.
        first_mismatch: generation of the first record whose ``weight_hash_after`` differs from the replayed
            weights (None: all recorded hashes matched, or none were checked). expected, got: those two hashes.
    """

    applied: int
    weights_hash: str
    first_mismatch: int | None = None
    expected: str | None = None
    got: str | None = None
    stats: list[UpdateStats] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.first_mismatch is None


def apply_records(
    params: ESParams, records: Iterable[GenerationRecord], *, check_hash: bool = True, on_mismatch: str = "raise"
) -> ReplayReport:
    """Re-apply recorded updates to ``params`` in place, in order (no rollouts): THE replay loop of coevo.

    Every replay goes through here: :func:`replay`, weight rebuilds from snapshots
    (``coevo.es.checkpoint.rebuild``), ``coevo es replay`` / ``export``, replicas loading a snapshot plus
    history (HF, Ray actors, vLLM workers).

    Args:
        params: the tensors, holding the weights the first record started from.
        records: in generation order.
        check_hash: compare ``weights_hash`` after each record that has ``weight_hash_after``.
        on_mismatch: ``"raise"`` (ReplayMismatchError at the first mismatch) or ``"report"`` (keep applying,
            report the first mismatching generation).

    Returns:
        A :class:`ReplayReport`.

    Raises:
        ValueError: unknown ``on_mismatch``. ReplayMismatchError: see ``on_mismatch``.
    """
    if on_mismatch not in ("raise", "report"):
        raise ValueError(f"on_mismatch must be 'raise' or 'report', got {on_mismatch!r}")
    report = ReplayReport(applied=0, weights_hash="")
    digest: str | None = None
    for r in records:
        report.stats.append(r.apply(params))
        report.applied += 1
        digest = None
        if check_hash and r.weight_hash_after is not None:
            digest = params.weights_hash()
            if digest != r.weight_hash_after and report.first_mismatch is None:
                report.first_mismatch, report.expected, report.got = r.generation, r.weight_hash_after, digest
                if on_mismatch == "raise":
                    raise ReplayMismatchError(
                        f"generation {r.generation}: replayed weights hash {digest[:16]}… != recorded "
                        f"{r.weight_hash_after[:16]}… (different initial weights, scope, torch build or CPU?)"
                    )
    report.weights_hash = digest if digest is not None else params.weights_hash()
    return report


def replay(
    named_params: torch.nn.Module | Iterable[tuple[str, torch.Tensor]],
    records: Sequence[GenerationRecord | dict[str, Any]],
    check_hash: bool = True,
    fused: dict | None = None,
) -> ESParams:
    """Re-apply recorded ES updates in order to the initial weights, in place (no rollouts).

    Args:
        named_params: the model (or its ``(name, tensor)`` pairs) holding the weights the first record
            started from; the records' scope selects the tensors.
        records: ``GenerationRecord``s or their dicts, in increasing generation order; all must share one
            scope, master dtype and the current ``NOISE_SPEC``.
        check_hash: compare ``weights_hash`` after each record that has ``weight_hash_after``.
        fused: fused-tensor map when replaying onto a fused (vLLM-layout) model.

    Returns:
        The ``ESParams`` used (with masters if the run had them), ready to continue training.

    Raises:
        ValueError: empty or inconsistent records. ReplayMismatchError: a hash differs.
    """
    recs = [r if isinstance(r, GenerationRecord) else GenerationRecord.from_dict(r) for r in records]
    if not recs:
        raise ValueError("records is empty")
    first = recs[0]
    for prev, r in itertools.pairwise(recs):
        if r.generation <= prev.generation:
            raise ValueError(f"records must be in increasing generation order: {prev.generation} then {r.generation}")
    for r in recs:
        if (r.scope, r.master_dtype) != (first.scope, first.master_dtype):
            raise ValueError(f"generation {r.generation}: scope/master_dtype differ from generation {first.generation}")
        if r.noise_spec != PERTURBATIONS[r.perturbation]:
            raise ValueError(
                f"generation {r.generation} used noise {r.noise_spec!r}, this coevo draws "
                f"{PERTURBATIONS[r.perturbation]!r} for perturbation {r.perturbation!r}"
            )
    params = ESParams(select_params(named_params, first.scope), _MASTER_DTYPES[first.master_dtype], fused=fused)
    apply_records(params, recs, check_hash=check_hash)
    return params
