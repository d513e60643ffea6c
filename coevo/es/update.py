"""The ES parameter update ``theta <- theta + alpha / N * sum_i c_i * s_i * eps_i``.

Agentic-ESOpt, docs/references.md §1 step 5 (Salimans et al. 2017, Algorithm 2): ``c_i`` are the shaped rewards
(``coevo.es.normalize``), ``s_i`` the member signs (+1, or -1 for mirrored members), ``eps_i`` the
members' noises, ``N`` the population size. ``1/sigma`` is folded into ``alpha`` unless
``divide_by_sigma=True`` (then the step is ``alpha / (N * sigma) * sum ...``, the Monte-Carlo gradient
estimate of the Gaussian-smoothed reward). Optional L2 weight decay (Salimans et al. 2017's ``l2coeff``):
``theta <- theta + alpha * (g - weight_decay * theta)`` with ``g`` the step above divided by alpha.

Exactness and replay. The update is a pure function of (weights, seeds, signs, coeffs, alpha, sigma,
divide_by_sigma, weight_decay):
  1. members sharing a seed are folded first, in float64: ``k_j = sum_{i: seed_i = j} s_i * c_i``
     (members in the given order, seeds in order of first appearance); a mirrored pair with equal
     coefficients gives ``k_j = 0`` exactly and is skipped, so it cancels exactly, not to rounding;
  2. per noise chunk, in float32 on the device the noise is drawn on (the CPU; ``coevo.es.device_noise``): ``acc = 0; acc += fl32(eps_j * a_j)`` for each seed j with
     ``a_j = fl32(alpha * k_j / N [/ sigma])``; separate multiply and add (no fused multiply-add), so the
     result does not depend on the device or on how kernels contract operations;
  3. ``new = fl32(base [* (1 - alpha * weight_decay)] + acc)`` where ``base`` is the float32 master or the
     working values; the master (if any) takes ``new`` and the working tensor ``cast(new)``, added once.
Temporary memory: three float32 chunk buffers (48 MiB), one float64 chunk buffer (32 MiB, the norm) plus one
device chunk.

Thread count. Every step above is element-wise (noise draws are serial per chunk, ``coevo.es.noise``), so the
weights do not depend on how many threads compute them. The one reduction, ``UpdateStats.update_norm``, is
summed in a fixed order too (:func:`pairwise_sum_`): a BLAS dot product (float32 ``torch.dot``) splits its sum
by thread count and kernel, and gave 13.571562240 in vLLM's worker on two OpenMP threads against 13.571562170 on
HF with one (docs/vllm.md); a history's statistics would then differ between the engines that wrote and replayed it.

sigma == 0. At sigma = 0 every member equals the centre, so the "gradient" is noise uncorrelated with
the reward: the reference code still applied it (a random walk, docs/references.md §1 defects). Here nothing is
applied and ``UpdateStats.skipped`` is True: at a zero-sigma (test-time) generation ES only evaluates, and
the caller keeps the centre or the best member.

alpha == 0 (the noise-only control). The members are still perturbed and rolled out, but no step is taken:
nothing is applied and ``UpdateStats.skipped`` is True. It separates what the perturbation noise alone does
from what the updates add (the seed paper's ablation, docs/field-notes §8: TSP50 6.545 -> 6.484 with noise
alone, 6.463 with updates); with ``alpha * weight_decay`` = 0 the decay is nothing either.

Precision. A bf16 working tensor without master cannot represent steps below half an ulp (7.8e-3 near
1.0): those steps are lost (``UpdateStats.changed_fraction`` shows how many entries moved). Use
``ESParams(master_dtype=torch.float32)`` so small steps accumulate in the master.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import torch

from coevo.es.noise import NOISE_CHUNK_NUMEL, check_seed
from coevo.es.params import ESParams, as_es_params

_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass
class UpdateStats:
    """What one ``es_update`` did.

    Attributes:
        skipped: True when no update was applied (sigma == 0); ``reason`` says why.
        update_norm: L2 norm of the float32 step applied to the master/float32 values, over all tensors
            (squares exact in float64, summed in a fixed pairwise order per chunk, :func:`pairwise_sum_`, chunks
            in order: the same value on every device and thread count; relative error ~1e-15).
        max_abs_update: largest absolute element of that step.
        changed_fraction: fraction of working-tensor elements whose stored value changed (in [0, 1]).
        n_elements: elements in scope.
        n_noise_streams: distinct seeds drawn after folding members that share a seed.
    """

    skipped: bool = False
    reason: str | None = None
    update_norm: float = 0.0
    max_abs_update: float = 0.0
    changed_fraction: float = 0.0
    n_elements: int = 0
    n_noise_streams: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def _finite(value: float, field: str, minimum: float | None = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{field} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{field} must be >= {minimum}, got {value!r}")
    return float(value)


def fold_members(seeds: Sequence[int], signs: Sequence[int], coeffs: Sequence[float]) -> list[tuple[int, float]]:
    """Fold members sharing a seed: ``[(seed_j, k_j = sum s_i c_i), ...]`` in order of first appearance.

    Raises:
        ValueError: empty or unequal lengths, signs not +-1, non-finite coefficients, bad seeds.
    """
    n = len(seeds)
    if n == 0 or len(signs) != n or len(coeffs) != n:
        raise ValueError(
            f"seeds, signs, coeffs must be non-empty and equally long, got {n}, {len(signs)}, {len(coeffs)}"
        )
    folded: dict[int, float] = {}
    for i, (seed, sign, c) in enumerate(zip(seeds, signs, coeffs, strict=True)):
        seed = check_seed(seed, f"seeds[{i}]")
        if sign not in (1, -1):
            raise ValueError(f"signs[{i}] must be +1 or -1, got {sign!r}")
        c = _finite(c, f"coeffs[{i}]", minimum=None)
        folded[seed] = folded.get(seed, 0.0) + int(sign) * c
    return list(folded.items())


def plan_update(
    es: ESParams,
    seeds: Sequence[int],
    signs: Sequence[int],
    coeffs: Sequence[float],
    alpha: float,
    sigma: float,
    weight_decay: float,
) -> tuple[UpdateStats, list[tuple[int, float]] | None, float]:
    """The checks and folding every ES update starts with (full rank here, low rank in ``coevo.es.lowrank``).

    Returns:
        ``(stats, members, decay)``: fresh ``UpdateStats``; the folded ``(seed_j, k_j)`` (``fold_members``), or
        None when nothing is to be written (sigma == 0: ``stats.skipped``); ``decay = 1 - alpha weight_decay``.

    Raises:
        ValueError: bad lengths, signs, seeds or non-finite / negative numbers (message names the field).
        RuntimeError: a perturbation of ``es`` is active.
    """
    members = fold_members(seeds, signs, coeffs)
    alpha = _finite(alpha, "alpha")
    sigma = _finite(sigma, "sigma")
    weight_decay = _finite(weight_decay, "weight_decay")
    if alpha * weight_decay >= 1.0:
        raise ValueError(f"alpha * weight_decay must be < 1, got {alpha * weight_decay}")
    if es.active is not None:
        raise RuntimeError("cannot update while a perturbation is active; restore it first")
    stats = UpdateStats(n_elements=es.numel)
    if sigma == 0.0:
        stats.skipped = True
        stats.reason = "sigma == 0: the population equals the centre, an update would be pure noise"
        return stats, None, 1.0
    if alpha == 0.0:
        stats.skipped = True
        stats.reason = "alpha == 0: the noise-only control (members perturbed, no update)"
        return stats, None, 1.0
    return stats, members, 1.0 - alpha * weight_decay


def pairwise_sum_(x: torch.Tensor) -> float:
    """Sum of the flat tensor ``x`` in a fixed order, whatever the thread count, BLAS or device; ``x`` is
    overwritten (scratch).

    Pairwise halving: while ``n > 1`` elements remain, ``h = ceil(n / 2)`` and ``x[i] += x[h + i]`` for
    ``i < n - h``, so the sum is a fixed binary tree over the elements (rounding error ``~log2(n)`` ulps of the
    accumulation dtype). Each step is an element-wise add, which no thread split reorders, unlike a reduction
    kernel (``torch.sum`` / ``torch.dot`` split their sums by thread count). Cost: ``n`` adds in
    ``ceil(log2(n))`` kernel calls (20 ms for 2**22 float64 values on one EPYC core).

    Args:
        x: a 1-D floating tensor (its dtype is the accumulation dtype); empty sums to 0.0.

    Returns:
        The sum as a Python float.
    """
    n = x.numel()
    while n > 1:
        h = (n + 1) // 2
        x[: n - h].add_(x[h:n])
        n = h
    return float(x[0]) if n else 0.0


class UpdateWriter:
    """Step 3 of every ES update (module docstring): ``new = fl32(base [* decay] + acc)`` written into the
    master (if any) and, cast, into the working tensor, one span at a time; tallies the ``UpdateStats``.

    Args:
        es: the parameters. stats: from :func:`plan_update`. decay: ``1 - alpha weight_decay`` (1.0: none).
    """

    def __init__(self, es: ESParams, stats: UpdateStats, decay: float) -> None:
        self.es, self.stats, self.decay = es, stats, decay
        self._sq_norm, self._max_abs, self._changed = 0.0, 0.0, 0
        self._squares: torch.Tensor | None = None  # float64 scratch for the norm, one chunk, on the tensors' device

    def write(self, e, start: int, stop: int, acc: torch.Tensor, cast=None) -> None:
        """Add the float32 step ``acc`` (flat, ``stop - start`` values, on the tensor's device) to entry ``e``'s
        span ``[start, stop)``. ``cast(new)``: the working-dtype value (default: round to nearest)."""
        base = self.es.base(e, start, stop)
        new = base.mul(self.decay) if self.decay != 1.0 else base.clone()
        new.add_(acc)
        delta = new - base
        self._sq_norm += self._sum_of_squares(delta)
        lo, hi = torch.aminmax(delta)
        self._max_abs = max(self._max_abs, -float(lo), float(hi))
        out = new.to(e.tensor.dtype) if cast is None else cast(new)
        bits = _BITS[out.element_size()]  # compare stored bit patterns (fast, exact)
        self._changed += int(torch.count_nonzero(out.view(bits) != e.flat[start:stop].view(bits)))
        if e.master is not None:
            e.master[start:stop].copy_(new)
        e.flat[start:stop].copy_(out)

    def _sum_of_squares(self, delta: torch.Tensor) -> float:
        """``sum(delta ** 2)``: float32 squares are exact in float64, then :func:`pairwise_sum_` (fixed order)."""
        n = delta.numel()
        if self._squares is None or self._squares.numel() < n or self._squares.device != delta.device:
            self._squares = torch.empty(max(n, NOISE_CHUNK_NUMEL), dtype=torch.float64, device=delta.device)
        sq = self._squares[:n].copy_(delta)
        return pairwise_sum_(sq.mul_(sq))

    def finish(self) -> UpdateStats:
        """The stats with norm, largest element and changed fraction filled in."""
        self.stats.update_norm = math.sqrt(self._sq_norm)
        self.stats.max_abs_update = self._max_abs
        self.stats.changed_fraction = self._changed / max(self.stats.n_elements, 1)
        return self.stats


def es_update(
    params: ESParams | Iterable[tuple[str, torch.Tensor]],
    seeds: Sequence[int],
    signs: Sequence[int],
    coeffs: Sequence[float],
    alpha: float,
    sigma: float,
    divide_by_sigma: bool = False,
    weight_decay: float = 0.0,
) -> UpdateStats:
    """Apply one ES update in place (module docstring for the exact arithmetic).

    Args:
        params: the tensors (an ``ESParams`` — keep the same one across generations when it holds
            float32 masters — or ``(name, tensor)`` pairs, updated without masters).
        seeds, signs, coeffs: per member, length N >= 1: seed (0 <= seed < 2**63), sign (+1/-1),
            shaped reward (finite float).
        alpha: learning rate (>= 0).
        sigma: the generation's perturbation scale (>= 0); 0 skips the update.
        divide_by_sigma: divide the step by sigma (otherwise 1/sigma is folded into alpha).
        weight_decay: L2 coefficient (>= 0, with alpha * weight_decay < 1).

    Returns:
        ``UpdateStats``.

    Raises:
        ValueError: bad lengths, signs, seeds or non-finite / negative numbers (message names the field).
        RuntimeError: a perturbation of ``params`` is active (restore it before updating).
    """
    es = as_es_params(params)
    stats, members, decay = plan_update(es, seeds, signs, coeffs, alpha, sigma, weight_decay)
    if members is None:
        return stats
    denom = len(seeds) * (sigma if divide_by_sigma else 1.0)
    steps = [(seed, alpha * k / denom) for seed, k in members if k != 0.0]
    stats.n_noise_streams = len(steps)
    if not steps and decay == 1.0:
        return stats
    noise_device = es.noise.buffer.device  # the CPU, or the tensors' device (coevo.es.device_noise)
    acc = torch.empty(NOISE_CHUNK_NUMEL, dtype=torch.float32, device=noise_device)
    tmp = torch.empty(NOISE_CHUNK_NUMEL, dtype=torch.float32, device=noise_device)
    writer = UpdateWriter(es, stats, decay)
    for e in es.entries:
        for seg in e.layout:
            a = acc[: seg.numel].zero_()
            for seed, step in steps:
                torch.mul(es.noise.fill(seed, seg), step, out=tmp[: seg.numel])
                a.add_(tmp[: seg.numel])
            writer.write(e, seg.start, seg.stop, a.to(e.tensor.device))
    return writer.finish()
