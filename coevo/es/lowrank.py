"""Low-rank ES perturbations (EGGROLL): factors, the population-batched forward term, the update.

EGGROLL (Sarkar et al., "Evolution Strategies at the Hyperscale", arXiv 2511.16652, §3): for a matrix
``W`` of shape ``(m, n)`` (``y = x W^T``, HF ``nn.Linear`` layout: m = out_features, n = in_features) member
i uses the rank-``r`` perturbation

    E_i = A_i B_i^T / sqrt(r),   A_i: (m, r),  B_i: (n, r),  entries standard normal,

so ``x (W + s_i sigma E_i)^T = x W^T + (s_i sigma / sqrt(r)) (x B_i) A_i^T`` (``s_i = +-1``: antithetic pairs
share the factors, opposite signs). All members share the base matmul; each row adds a rank-r term of cost
``2 r (m + n)`` multiply-adds per token (``m n`` for the base), and the weights are never modified.

Factors (the replay rule; any backend that perturbs or updates with low-rank factors, e.g. a vLLM LoRA
path, must draw them exactly so). With the counter-based noise of ``coevo.es.noise`` (``NOISE_SPEC``):

    A_i[:, k] = generate_noise(seed_i, f"{name}#lowrank.A{k}", (m,))      (float32, drawn on the CPU)
    B_i[:, k] = generate_noise(seed_i, f"{name}#lowrank.B{k}", (n,))      for k = 0 .. r-1

``name`` is the canonical (HF) tensor name; every column is its own keyed stream, so the factors of rank r
are the first r columns of those of any larger rank. The draws are tiny
(``(m + n) r`` per matrix) and made on the CPU, then moved to the tensor's device: the same on every device.
For vLLM's fused ``qkv_proj`` / ``gate_up_proj`` the factors are those of the HF parts (``q_proj`` ... ),
i.e. the LoRA weights of each packed sub-module. As a PEFT LoRA adapter (``y = x W^T + (alpha_lora / r_lora)
(x lora_A^T) lora_B^T``, ``lora_A``: (r, n), ``lora_B``: (m, r)) member i is ``lora_A = B_i^T``, ``lora_B = s_i sigma
A_i / sqrt(r)`` with ``alpha_lora = r_lora = r``; the update is the same record (``GenerationRecord.apply``)
merged into the base weights, so such a history replays on HF and vice versa.

Scope: matrices only. Low-rank ES perturbs and updates the 2-D weights of linear layers (``scope:
all_linear``): biases and norm gains are vectors, for which a rank-r factorisation saves nothing and a
per-row perturbation would need a hook per norm module; they hold ~0.1% of the weights of a Qwen2 model
and stay fixed. Embeddings and the LM head (lookups, often tied) are out of ``all_linear`` too.

Update (Salimans et al. 2017, Algorithm 2, with EGGROLL's E_i): ``theta += alpha / N sum_i c_i s_i E_i``,
computed per matrix as one product ``A diag(k) B^T`` over the distinct seeds (members sharing a seed folded
first, ``coevo.es.update.fold_members``; an antithetic pair with equal rewards has k = 0 and is skipped, so
it cancels exactly), evaluated exactly as follows so that the result is bit-identical on every device,
BLAS, and thread count:

  1. per seed j: ``a_j = fl32(alpha k_j / (N sqrt(r)) [/ sigma])`` (the coefficient computed in float64,
     rounded once to float32);
  2. per block of rows ``[lo, hi)`` of ``W`` (``max(1, 2**22 // n)`` rows), in float32:
     ``acc = 0; acc += fl32(fl32(A_j[lo:hi, k] a_j) outer B_j[:, k])`` for each seed j in order, then each
     rank k (element-wise multiply, then add: a fixed-order sum of rank-1 terms, no matmul, no FMA);
  3. ``new = fl32(base [* (1 - alpha weight_decay)] + acc)``, ``base`` the float32 master or the working
     values.

Rounding of the working tensor. With a float32 master the master takes ``new`` and the working tensor
``cast(new)`` (as for full rank). Without masters a bf16 / fp16 working tensor takes ``new`` rounded
*stochastically*: rounding up with probability equal to the fraction of the gap, so a step far below half
an ulp still moves the weight in expectation (round-to-nearest would drop it: ~90% of bf16 entries never
change under 1e-5 steps, docs/references.md §1), with no float32 copy of the model. The random bits are
deterministic: for block b of tensor ``name`` they are ``torch.randint(0, 2**d, ..., dtype=int32)`` from a
CPU generator seeded with ``chunk_seed(round_seed, f"{name}#round", b)``, where ``round_seed`` is derived
from the generation index and its seeds (:func:`round_seed`); the value is rounded by adding them to the
low ``d`` bits of the float32 bit pattern and clearing those bits (``d`` = 16 for bf16, 13 for fp16: an
integer operation, exact everywhere). So a replay of the history reproduces the weights bit for bit.
For fp16, values in the fp16 subnormal range (|x| < 6.1e-5) are then rounded to nearest.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Iterable, Sequence

import torch

from coevo.es.noise import NOISE_CHUNK_NUMEL, NOISE_SPEC, check_seed, chunk_seed, generate_noise
from coevo.es.params import ESParams, as_es_params
from coevo.es.update import UpdateStats, UpdateWriter, plan_update

#: identifier of the low-rank definition (factors, update arithmetic, rounding), recorded in history rows
LOWRANK_SPEC = f"eggroll-AB^T/sqrt(r);factors=column-streams;update=rank1-fp32;round=stochastic-bits;{NOISE_SPEC}"
#: low bits of the float32 pattern dropped by stochastic rounding to each low-precision dtype
_DROP_BITS = {torch.bfloat16: 16, torch.float16: 13}


def check_rank(rank: int) -> int:
    """Validate a perturbation rank (an int >= 1). Raises ValueError."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank must be an int >= 1, got {rank!r}")
    return rank


def check_matrices(params: ESParams) -> None:
    """Raise ValueError unless every tensor in ``params`` is a 2-D matrix (the low-rank scope, module docstring)."""
    bad = [(e.name, tuple(e.tensor.shape)) for e in params.entries if e.tensor.dim() != 2]
    if bad:
        raise ValueError(f"low-rank ES perturbs matrices only (use scope all_linear); not 2-D: {bad[:4]}")


def draw_factors(
    seed: int, name: str, shape: Sequence[int], rank: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The factors ``(A, B)`` of member ``seed`` for matrix ``name`` of shape ``(m, n)`` (module docstring).

    Returns:
        float32 tensors ``A`` of shape ``(m, rank)`` and ``B`` of shape ``(n, rank)``, contiguous, on ``device``.

    Raises:
        ValueError / TypeError: bad seed, rank or a shape that is not 2-D.
    """
    check_seed(seed)
    check_rank(rank)
    if len(shape) != 2:
        raise ValueError(f"{name}: low-rank factors need a 2-D shape, got {tuple(shape)}")
    m, n = (int(d) for d in shape)
    a = torch.stack([generate_noise(seed, f"{name}#lowrank.A{k}", (m,)) for k in range(rank)], dim=1)
    b = torch.stack([generate_noise(seed, f"{name}#lowrank.B{k}", (n,)) for k in range(rank)], dim=1)
    return a.to(device), b.to(device)


def dense_perturbation(seed: int, name: str, shape: Sequence[int], rank: int) -> torch.Tensor:
    """``E = A B^T / sqrt(rank)`` as a dense float32 CPU tensor of ``shape`` (for checks and tests)."""
    a, b = draw_factors(seed, name, shape, rank)
    return (a.double() @ b.double().t() / math.sqrt(rank)).float()


def round_seed(generation: int, seeds: Sequence[int]) -> int:
    """Seed of the stochastic rounding of one generation's update: ``blake2b("round:{generation}:{seeds}")``,
    63 bits (``seeds`` in member order, comma separated)."""
    text = f"round:{int(generation)}:{','.join(str(int(s)) for s in seeds)}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") & (2**63 - 1)


def stochastic_round(values: torch.Tensor, dtype: torch.dtype, seed: int, name: str, block: int) -> torch.Tensor:
    """Round float32 ``values`` to ``dtype`` (bf16 / fp16) stochastically and deterministically (module docstring).

    Args:
        values: float32 tensor (any shape, any device).
        dtype: ``torch.bfloat16`` or ``torch.float16``.
        seed, name, block: key of the random bits (``chunk_seed(seed, f"{name}#round", block)``).

    Returns:
        Tensor of ``values``' shape in ``dtype``; each element is one of the two neighbours of its value.

    Raises:
        ValueError: values not float32, or a dtype without a stochastic-rounding rule.
    """
    if values.dtype != torch.float32:
        raise ValueError(f"stochastic_round takes float32 values, got {values.dtype}")
    if dtype not in _DROP_BITS:
        raise ValueError(f"stochastic rounding is defined for {list(_DROP_BITS)}, got {dtype}")
    d = _DROP_BITS[dtype]
    g = torch.Generator(device="cpu")
    g.manual_seed(chunk_seed(seed, f"{name}#round", block))
    noise = torch.randint(0, 1 << d, values.shape, generator=g, dtype=torch.int32).to(values.device)
    bits = values.contiguous().view(torch.int32)
    rounded = (bits + noise) & ~((1 << d) - 1)
    return rounded.view(torch.float32).to(dtype)


def rows_per_block(n: int) -> int:
    """Rows of one block of a matrix with ``n`` columns (``max(1, 2**22 // n)``): the blocks the update and its
    stochastic rounding walk, block ``b`` keyed ``chunk_seed(seed, f"{name}#round", b)``."""
    return max(1, NOISE_CHUNK_NUMEL // max(n, 1))


def stochastic_round_into(dst: torch.Tensor, values: torch.Tensor, seed: int, name: str) -> None:
    """Write float32 ``values`` into the bf16 / fp16 tensor ``dst`` (same shape), rounded stochastically
    (:func:`stochastic_round`) in the row blocks of :func:`rows_per_block`, viewing ``dst`` as
    ``(shape[0], -1)``.

    Raises:
        ValueError: as :func:`stochastic_round`.
    """
    flat_dst, flat = dst.view(dst.shape[0], -1), values.reshape(values.shape[0], -1)
    rows = rows_per_block(flat.shape[1])
    for block, lo in enumerate(range(0, flat.shape[0], rows)):
        flat_dst[lo : lo + rows] = stochastic_round(flat[lo : lo + rows], dst.dtype, seed, name, block)


def lowrank_update(
    params: ESParams | Iterable[tuple[str, torch.Tensor]],
    seeds: Sequence[int],
    signs: Sequence[int],
    coeffs: Sequence[float],
    alpha: float,
    sigma: float,
    rank: int,
    generation: int,
    divide_by_sigma: bool = False,
    weight_decay: float = 0.0,
) -> UpdateStats:
    """Apply one low-rank ES update in place (module docstring for the exact arithmetic and the rounding).

    Args:
        params: the matrices (an ``ESParams``, with or without float32 masters, or ``(name, tensor)`` pairs).
        seeds, signs, coeffs: per member (length N >= 1): factor seed, +1 / -1, shaped reward.
        alpha: learning rate (>= 0). sigma: the generation's scale (>= 0); 0 skips the update.
        rank: the factors' rank r (>= 1).
        generation: generation index (keys the stochastic rounding).
        divide_by_sigma, weight_decay: as ``coevo.es.update.es_update``.

    Returns:
        ``UpdateStats`` (``n_noise_streams``: distinct seeds with a non-zero coefficient).

    Raises:
        ValueError: bad lengths, signs, seeds, rank, non-matrices or non-finite / negative numbers.
        RuntimeError: a perturbation of ``params`` is active.
    """
    es = as_es_params(params)
    check_matrices(es)
    check_rank(rank)
    stats, members, decay = plan_update(es, seeds, signs, coeffs, alpha, sigma, weight_decay)
    if members is None:
        return stats
    denom = len(seeds) * (sigma if divide_by_sigma else 1.0) * math.sqrt(rank)
    steps = [(seed, float(torch.tensor(alpha * k / denom, dtype=torch.float32))) for seed, k in members if k != 0.0]
    stats.n_noise_streams = len(steps)
    if not steps and decay == 1.0:
        return stats
    rseed = round_seed(generation, seeds)
    writer = UpdateWriter(es, stats, decay)
    for e in es.entries:
        m, n = e.tensor.shape
        dev = e.tensor.device
        factors = [(draw_factors(seed, e.name, (m, n), rank, dev), a) for seed, a in steps]
        rows = rows_per_block(n)
        tmp = torch.empty((min(rows, m), n), dtype=torch.float32, device=dev)
        for block, lo in enumerate(range(0, m, rows)):
            hi = min(lo + rows, m)
            acc = torch.zeros((hi - lo, n), dtype=torch.float32, device=dev)
            t = tmp[: hi - lo]
            for (fa, fb), a in factors:
                for k in range(rank):
                    col = fa[lo:hi, k].mul(a)  # fl32(A_j[:, k] a_j)
                    torch.mul(col[:, None], fb[None, :, k], out=t)  # fl32 rank-1 term
                    acc.add_(t)
            cast = None
            if e.master is None and e.tensor.dtype in _DROP_BITS:
                cast = functools.partial(stochastic_round, dtype=e.tensor.dtype, seed=rseed, name=e.name, block=block)
            writer.write(e, lo * n, hi * n, acc.view(-1), cast)
    return writer.finish()


def member_scale(member, rank: int) -> float:
    """``sign * sigma / sqrt(rank)``: the factor of member ``member``'s rank-r term ``(x B) A^T`` (and of its
    LoRA ``lora_B``; ``coevo.backends.vllm_lora``)."""
    return int(member.sign) * float(member.sigma) / math.sqrt(check_rank(rank))


class FactorBank:
    """The factors of a population's members for every matrix in scope, stacked per tensor on its device.

    Args:
        params: ``(name, tensor)`` pairs or an ``ESParams``: the 2-D matrices ``(m, n)`` perturbed.
        members: objects with ``seed``, ``sigma``, ``sign`` (``coevo.types.ESMember``); members sharing a
            seed (antithetic pairs) share factors.
        rank: r >= 1.

    Attributes:
        slots: per member, the index of its seed among the distinct seeds. scales: per member,
        ``sign * sigma / sqrt(r)`` (float). A, B: name -> float32 ``(S, m, r)`` / ``(S, n, r)`` stacks over the
        S distinct seeds.

    Memory: ``S r sum(m + n)`` float32 values (0.5B Qwen2, r = 1: 2.2 MB per seed).

    Raises:
        ValueError: a tensor that is not 2-D, an empty population, a bad rank or seed.
    """

    def __init__(self, params: ESParams | Iterable[tuple[str, torch.Tensor]], members: Sequence, rank: int) -> None:
        pairs = params.items() if isinstance(params, ESParams) else list(params)
        if not members:
            raise ValueError("a population needs at least one member")
        self.rank = check_rank(rank)
        seeds = list(dict.fromkeys(int(m.seed) for m in members))
        self.slots = [seeds.index(int(m.seed)) for m in members]
        self.scales = [member_scale(m, rank) for m in members]
        self.A: dict[str, torch.Tensor] = {}
        self.B: dict[str, torch.Tensor] = {}
        for name, t in pairs:
            if t.dim() != 2:
                raise ValueError(f"low-rank ES perturbs matrices only; {name} has shape {tuple(t.shape)}")
            drawn = [draw_factors(s, name, t.shape, rank, t.device) for s in seeds]
            self.A[name] = torch.stack([a for a, _ in drawn])
            self.B[name] = torch.stack([b for _, b in drawn])

    def row_tables(self, positions: Sequence[int | None], device: torch.device | str = "cpu"):
        """Per-row ``(slots, scales)`` for rows that belong to members ``positions`` (index into ``members``;
        None = the centre, scale 0): a long tensor and a float32 tensor of shape ``(len(positions),)``."""
        slots = [0 if p is None else self.slots[p] for p in positions]
        scales = [0.0 if p is None else self.scales[p] for p in positions]
        return (
            torch.tensor(slots, dtype=torch.long, device=device),
            torch.tensor(scales, dtype=torch.float32, device=device),
        )

    def delta(self, name: str, x: torch.Tensor, slots: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """The rows' perturbation term of a linear layer: ``scale_b (x_b B_{slot_b}) A_{slot_b}^T``.

        Args:
            name: the layer's weight name. x: its input, shape ``(b, ..., n)`` (any float dtype).
            slots, scales: from :meth:`row_tables`, shape ``(b,)``.

        Returns:
            float32 tensor of shape ``(b, ..., m)``; cost ``2 r (m + n)`` multiply-adds per token.
        """
        a_rows, xb = self._projected(name, x, slots, scales)
        out = torch.bmm(xb, a_rows)  # (b, T, m)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def _projected(self, name: str, x: torch.Tensor, slots: torch.Tensor, scales: torch.Tensor):
        """``(A_{slot_b}^T, scale_b x_b B_{slot_b})`` per row: float32 ``(b, r, m)`` and ``(b, T, r)``."""
        x3 = x.reshape(x.shape[0], -1, x.shape[-1]).float()  # (b, T, n)
        xb = torch.bmm(x3, self.B[name][slots]) * scales[:, None, None]  # (b, T, r)
        return self.A[name][slots].transpose(1, 2), xb

    def add_delta(self, name: str, x: torch.Tensor, output: torch.Tensor, slots, scales) -> torch.Tensor:
        """``output + delta(name, x, slots, scales)``: a float32 ``output`` (shape ``(b, ..., m)``, the layer's
        fresh output) is updated in place by one ``baddbmm`` (no ``(b, T, m)`` temporary: 3x faster over a
        prefill than the separate product and add); another dtype gets the float32 term cast and added.
        Returns the sum, shaped like ``output``."""
        if output.dtype != torch.float32:
            return output + self.delta(name, x, slots, scales).to(output.dtype)
        a_rows, xb = self._projected(name, x, slots, scales)
        out3 = output.reshape(x.shape[0], -1, output.shape[-1])
        return out3.baddbmm_(xb, a_rows).reshape(output.shape)
