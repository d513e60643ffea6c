"""Content hash of named weights, used to check that a replayed history gives the trained weights.

``weights_hash`` is a SHA-256 over, for each tensor in canonical order (sorted by name): the name, the
dtype, the shape and the raw little-endian bytes of the values. Two weight sets have equal hashes iff
(barring collisions) they have the same names, dtypes, shapes and bit patterns; ``-0.0`` and ``0.0``
differ, as do NaNs with different payloads. Host memory: one block of at most 64 MiB per tensor at a time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch
from torch import nn

_BLOCK_BYTES = 64 * 2**20


def weights_hash(named_params: nn.Module | Iterable[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 hex digest (64 chars) of ``(name, tensor)`` pairs, order-independent (sorted by name).

    Raises:
        ValueError: duplicate names.
    """
    pairs = list(named_params.named_parameters()) if isinstance(named_params, nn.Module) else list(named_params)
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError("named_params has duplicate names")
    h = hashlib.sha256()
    for name, t in sorted(pairs, key=lambda p: p[0]):
        header = f"{name}|{str(t.dtype).removeprefix('torch.')}|{tuple(t.shape)}|".encode()
        h.update(len(header).to_bytes(8, "little") + header)
        flat = t.detach().contiguous().reshape(-1).view(torch.uint8)  # raw bytes, (numel * itemsize,)
        for lo in range(0, flat.numel(), _BLOCK_BYTES):
            h.update(flat[lo : lo + _BLOCK_BYTES].cpu().numpy().tobytes())
    return h.hexdigest()
