"""Counter-based Gaussian noise keyed by (member seed, canonical tensor name, chunk index).

Definition (``NOISE_SPEC``). For a member seed ``s`` (int, 0 <= s < 2**63) and a tensor with canonical
(Hugging Face) name ``n`` and ``numel`` elements, the noise ``eps(s, n)`` is a float32 tensor of standard
normal samples, laid out over the tensor's flattened (row-major) elements in chunks of
``NOISE_CHUNK_NUMEL`` = 2**22 elements. Chunk ``c`` (elements ``[c * 2**22, min((c+1) * 2**22, numel))``)
is ``torch.randn(len, generator=g)`` with a CPU ``torch.Generator`` (Mersenne Twister) seeded with

    chunk_seed(s, n, c) = int.from_bytes(blake2b(f"{s}:{n}:{c}", digest_size=8), "little") & (2**63 - 1)

Properties:
  * different tensors and different chunks use unrelated generator seeds, so their noises are
    uncorrelated (unlike seeding every tensor with the member seed, as in Qiu et al. 2025's code);
  * noise is always drawn in float32 on the CPU, then moved to the tensor's device: the same on every
    device and process (``coevo.es.device_noise`` draws it on the device instead, a separate stream). It is bit-identical across processes and machines that run the same torch
    build on the same CPU family (x86-64 with AVX2 uses one vectorised Box-Muller path); a different
    torch version or CPU architecture may change the stream, which ``weights_hash`` checks in
    ``coevo.es.history.replay`` detect;
  * chunks are independent (counter-based), so any chunk can be drawn alone: updates accumulate many
    seeds chunk by chunk, and a restore can resume half-way through a tensor;
  * fused tensors (vLLM ``qkv_proj = cat(q, k, v)``, ``gate_up_proj = cat(gate, up)`` on dim 0) take the
    concatenation of their parts' noises keyed by the parts' HF names (``fused_noise``), so a history
    recorded on vLLM replays on HF and vice versa.

Temporary memory is bounded by one preallocated chunk buffer (``NoiseBuffer``, 16 MiB) that every chunk
reuses; the reference code allocated a fresh fp32 buffer per chunk (docs/references.md §5).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

#: elements per noise chunk; part of the noise definition (changing it changes every noise stream)
NOISE_CHUNK_NUMEL = 2**22
#: identifier of the noise definition, recorded in every ``GenerationRecord``
NOISE_SPEC = "blake2b64(seed:name:chunk)/chunk=2^22/torch-cpu-mt19937-randn-fp32/v1"
_MAX_SEED = 2**63

#: shape of a part of a fused tensor: (HF name, shape)
FusedPart = tuple[str, Sequence[int]]
#: fused tensor name -> its parts in concatenation order (dim 0)
FusedMap = Mapping[str, Sequence[FusedPart]]


def check_seed(seed: int, field: str = "seed") -> int:
    """Validate a member seed: a Python/NumPy int with 0 <= seed < 2**63. Raises ValueError/TypeError."""
    if isinstance(seed, bool) or not hasattr(seed, "__index__"):
        raise TypeError(f"{field} must be an int, got {type(seed).__name__}")
    seed = int(seed)
    if not 0 <= seed < _MAX_SEED:
        raise ValueError(f"{field} must satisfy 0 <= {field} < 2**63, got {seed}")
    return seed


def chunk_seed(seed: int, name: str, chunk: int) -> int:
    """Generator seed of chunk ``chunk`` of tensor ``name`` for member ``seed`` (63-bit int).

    Raises:
        ValueError/TypeError: bad seed, empty name or negative chunk.
    """
    seed = check_seed(seed)
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    if chunk < 0:
        raise ValueError(f"chunk must be >= 0, got {chunk}")
    digest = hashlib.blake2b(f"{seed}:{name}:{chunk}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (_MAX_SEED - 1)


@dataclass(frozen=True)
class Segment:
    """One noise chunk placed in a (possibly fused) flattened tensor.

    Attributes:
        start, stop: element range ``[start, stop)`` in the flattened target tensor.
        name: HF name whose noise stream this chunk belongs to (the part name for fused tensors).
        chunk: chunk index within that name's stream.
    """

    start: int
    stop: int
    name: str
    chunk: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        if int(d) < 0:
            raise ValueError(f"shape dimensions must be >= 0, got {tuple(shape)}")
        n *= int(d)
    return n


def noise_layout(name: str, numel: int, parts: Sequence[FusedPart] | None = None) -> list[Segment]:
    """Chunk layout of the noise for a tensor of ``numel`` elements.

    Args:
        name: canonical tensor name (used when ``parts`` is None).
        numel: number of elements of the (flattened) target tensor.
        parts: for a tensor fused along dim 0, its parts ``[(hf_name, shape), ...]`` in order; their
            element counts must add up to ``numel``.

    Returns:
        Segments covering ``[0, numel)`` in order.

    Raises:
        ValueError: the parts do not add up to ``numel``.
    """
    pieces = [(name, numel)] if parts is None else [(str(n), _numel(s)) for n, s in parts]
    total = sum(n for _, n in pieces)
    if total != numel:
        raise ValueError(
            f"fused parts of {name!r} cover {total} elements but the tensor has {numel}: "
            f"parts={[(n, tuple(s)) for n, s in parts or []]}"
        )
    out: list[Segment] = []
    offset = 0
    for part_name, n in pieces:
        for c, lo in enumerate(range(0, n, NOISE_CHUNK_NUMEL)):
            hi = min(lo + NOISE_CHUNK_NUMEL, n)
            out.append(Segment(offset + lo, offset + hi, part_name, c))
        offset += n
    return out


class NoiseBuffer:
    """A reusable float32 CPU buffer of one chunk plus its generator.

    Memory: ``NOISE_CHUNK_NUMEL * 4`` bytes (16 MiB). Not thread-safe: use one per thread.
    The views returned by :meth:`fill` are overwritten by the next call.
    """

    def __init__(self) -> None:
        self.buffer = torch.empty(NOISE_CHUNK_NUMEL, dtype=torch.float32)
        self.generator = torch.Generator(device="cpu")

    def fill(self, seed: int, segment: Segment) -> torch.Tensor:
        """Draw the noise of ``segment`` for member ``seed``.

        Returns:
            float32 CPU view of shape ``(segment.numel,)`` into the shared buffer.
        """
        self.generator.manual_seed(chunk_seed(seed, segment.name, segment.chunk))
        out = self.buffer[: segment.numel]
        torch.randn(segment.numel, generator=self.generator, out=out)
        return out


def iter_noise(
    seed: int,
    name: str,
    numel: int,
    parts: Sequence[FusedPart] | None = None,
    buffer: NoiseBuffer | None = None,
    start: int = 0,
) -> Iterator[tuple[Segment, torch.Tensor]]:
    """Yield ``(segment, noise)`` for every chunk of the tensor whose ``segment.stop > start``.

    ``noise`` is a float32 CPU tensor of shape ``(segment.numel,)`` living in ``buffer``: consume it
    before advancing the iterator. Chunks before ``start`` are not generated.
    """
    buf = buffer if buffer is not None else NoiseBuffer()
    for seg in noise_layout(name, numel, parts):
        if seg.stop > start:
            yield seg, buf.fill(seed, seg)


def generate_noise(
    seed: int,
    name: str,
    shape: Sequence[int],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    parts: Sequence[FusedPart] | None = None,
) -> torch.Tensor:
    """The whole noise tensor ``eps(seed, name)`` of the given shape (float32 draw, then cast).

    Memory: one tensor of ``shape`` in ``dtype`` on ``device`` plus one chunk buffer. Perturbation and
    update code stream chunks instead (``iter_noise``); this is for checks and small tensors.

    Returns:
        Tensor of ``shape``, ``dtype``, on ``device``.
    """
    numel = _numel(shape)
    out = torch.empty(numel, dtype=dtype, device=device)
    for seg, eps in iter_noise(seed, name, numel, parts):
        out[seg.start : seg.stop].copy_(eps)
    return out.view(*[int(d) for d in shape])


def fused_noise(
    seed: int,
    parts: Sequence[FusedPart],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Noise of a tensor fused along dim 0 from HF tensors: ``cat([eps(seed, n) for n, _ in parts], 0)``.

    Args:
        seed: member seed.
        parts: ``[(hf_name, shape), ...]`` in concatenation order, e.g. for vLLM's
            ``layers.0.self_attn.qkv_proj.weight``: q_proj, k_proj, v_proj weights with their HF shapes.
            All shapes must agree beyond dim 0.

    Returns:
        Tensor of shape ``(sum of dim-0 sizes, *shape[1:])`` in ``dtype`` on ``device``.

    Raises:
        ValueError: empty parts or shapes that disagree beyond dim 0.
    """
    if not parts:
        raise ValueError("parts must name at least one (hf_name, shape)")
    shapes = [tuple(int(d) for d in s) for _, s in parts]
    if any(len(s) == 0 for s in shapes) or len({s[1:] for s in shapes}) != 1:
        raise ValueError(f"parts must have >= 1 dims and equal shapes beyond dim 0, got {shapes}")
    fused_shape = (sum(s[0] for s in shapes), *shapes[0][1:])
    return generate_noise(seed, "+".join(n for n, _ in parts), fused_shape, dtype, device, parts)
