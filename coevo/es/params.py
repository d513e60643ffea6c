"""``ESParams``: the named tensors ES perturbs and updates, with optional float32 master copies.

Why masters. A bfloat16 weight has 8 significant bits: near 1.0 its spacing (ulp) is 7.8e-3, so an ES
step of 1e-4..1e-3 rounds away, and an Agentic-ESOpt-style in-place ``x + s*e - s*e`` does not give ``x``
back (docs/references.md §1: 37 % of weights changed after 400 cycles). With ``master_dtype=torch.float32`` each
low-precision tensor (bf16/fp16) gets a float32 master copy; then

  * updates accumulate in the master (float32 holds 1e-4 relative steps), and the working tensor is
    re-derived as ``cast(master)`` after every update (round to nearest even);
  * a perturbation writes ``cast(master + sigma * eps)`` into the working tensor, and a restore writes
    ``cast(master)``: bit-identical and free of extra memory, because ``working == cast(master)`` holds
    between perturbations;
  * the working dtype the engine runs in is unchanged (inference speed and memory of the model stay).

Memory cost of masters: 4 bytes per element of each low-precision tensor in scope (2x a bf16 model), on
``master_device`` (default: the tensor's device; ``"cpu"`` keeps GPU memory at inference level at the
cost of host-to-device copies per chunk). Float32 tensors need no master (they are their own master).
Without masters, exact restores need a backup copy per perturbation (see ``coevo.es.perturb``).

An ``ESParams`` also carries the fused-tensor map (vLLM ``qkv_proj`` / ``gate_up_proj`` -> HF parts) so
that noise is keyed by HF names on every backend, and the guard against overlapping perturbations: a
tensor's storage can be claimed by one active perturbation at a time, process-wide.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from coevo.es.hashing import weights_hash
from coevo.es.noise import FusedMap, FusedPart, NoiseBuffer, Segment, noise_layout

if TYPE_CHECKING:
    from coevo.es.perturb import Perturbation

_LOW_PRECISION = (torch.bfloat16, torch.float16)
_CLAIM_LOCK = threading.Lock()
_CLAIMED: dict[tuple[str, int], str] = {}  # (device, data_ptr) -> name, for tensors under a perturbation


@dataclass(frozen=True)
class _Entry:
    name: str
    tensor: torch.Tensor  # the working tensor (modified in place)
    master: torch.Tensor | None  # float32 flat master, or None
    layout: tuple[Segment, ...]  # noise chunks over the flattened tensor
    parts: tuple[FusedPart, ...] | None

    @property
    def flat(self) -> torch.Tensor:
        return self.tensor.view(-1)


class ESParams:
    """Named tensors for ES, in canonical (sorted-by-name) order.

    Args:
        params: ``(canonical name, tensor)`` pairs, e.g. from ``coevo.es.scope.select_params``. Each tensor
            must be floating point and contiguous; no two may share storage. Tensors are modified in place.
        master_dtype: ``torch.float32`` to keep float32 masters of bf16/fp16 tensors, or ``None``.
        master_device: device of the masters (default: each tensor's own device).
        fused: fused tensor name -> ``[(hf_name, shape), ...]`` (concatenated on dim 0); the noise of a
            fused tensor is the concatenation of its parts' noises (``coevo.es.noise.fused_noise``).

    Raises:
        ValueError: empty params, duplicate names, non-floating, non-contiguous or aliasing tensors,
            unknown ``master_dtype``, fused entries not in params or whose parts do not add up.
    """

    def __init__(
        self,
        params: Iterable[tuple[str, torch.Tensor]],
        master_dtype: torch.dtype | None = None,
        master_device: torch.device | str | None = None,
        fused: FusedMap | None = None,
    ) -> None:
        pairs = sorted(params, key=lambda p: p[0])
        if not pairs:
            raise ValueError("params is empty: select at least one tensor (coevo.es.scope.select_params)")
        if master_dtype not in (None, torch.float32):
            raise ValueError(f"master_dtype must be torch.float32 or None, got {master_dtype}")
        fused = dict(fused or {})
        names = [n for n, _ in pairs]
        if len(set(names)) != len(names):
            raise ValueError(f"params has duplicate names: {sorted({n for n in names if names.count(n) > 1})}")
        unknown = set(fused) - set(names)
        if unknown:
            raise ValueError(f"fused names {sorted(unknown)} are not in params")
        storages: set[tuple[str, int]] = set()
        self.master_dtype = master_dtype
        self._entries: list[_Entry] = []
        for name, t in pairs:
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise ValueError(f"params[{name!r}] must be a floating-point tensor, got {getattr(t, 'dtype', t)}")
            if not t.is_contiguous():
                raise ValueError(f"params[{name!r}] must be contiguous (call .contiguous() on the module's weight)")
            key = (str(t.device), t.data_ptr())
            if t.numel() and key in storages:
                raise ValueError(f"params[{name!r}] shares storage with another tensor (tied weights?)")
            storages.add(key)
            parts = tuple((str(n), tuple(int(d) for d in s)) for n, s in fused[name]) if name in fused else None
            master = None
            if master_dtype is not None and t.dtype in _LOW_PRECISION:
                dev = t.device if master_device is None else torch.device(master_device)
                master = t.detach().reshape(-1).to(device=dev, dtype=torch.float32, copy=True)
            layout = tuple(noise_layout(name, t.numel(), parts))
            self._entries.append(_Entry(name, t.detach(), master, layout, parts))
        self.noise = NoiseBuffer()
        self.active: Perturbation | None = None

    # ---- views -------------------------------------------------------------------------------------
    @property
    def entries(self) -> Sequence[_Entry]:
        return self._entries

    @property
    def names(self) -> list[str]:
        return [e.name for e in self._entries]

    def items(self) -> list[tuple[str, torch.Tensor]]:
        """``[(name, working tensor), ...]`` in canonical order."""
        return [(e.name, e.tensor) for e in self._entries]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def numel(self) -> int:
        """Total number of elements in scope."""
        return sum(e.tensor.numel() for e in self._entries)

    @property
    def master_bytes(self) -> int:
        """Bytes held by float32 masters (0 without masters)."""
        return sum(e.master.numel() * 4 for e in self._entries if e.master is not None)

    def weights_hash(self) -> str:
        """SHA-256 of the working tensors in scope (``coevo.es.hashing.weights_hash``)."""
        return weights_hash(self.items())

    # ---- arithmetic helpers --------------------------------------------------------------------
    def base(self, entry: _Entry, start: int, stop: int) -> torch.Tensor:
        """Float32 values of elements ``[start, stop)`` on the working device: the master if any, else the
        working tensor (a view, not a copy, when the working tensor is float32)."""
        if entry.master is not None:
            return entry.master[start:stop].to(entry.tensor.device)
        return entry.flat[start:stop].float()

    def write(self, entry: _Entry, start: int, stop: int, values: torch.Tensor) -> None:
        """Cast float32 ``values`` (shape ``(stop - start,)``) into the working tensor."""
        entry.flat[start:stop].copy_(values)

    def sync_masters(self) -> None:
        """Re-copy masters from the working tensors (after weights were loaded from outside ES).

        Raises:
            RuntimeError: a perturbation is active (the working tensors are perturbed).
        """
        if self.active is not None:
            raise RuntimeError("cannot sync masters while a perturbation is active; restore it first")
        for e in self._entries:
            if e.master is not None:
                e.master.copy_(e.flat)

    # ---- perturbation guard ------------------------------------------------------------------------
    def claim(self, owner: Perturbation) -> None:
        """Mark every tensor as perturbed by ``owner``.

        Raises:
            RuntimeError: a perturbation of these params, or of any tensor sharing their storage through
                another ``ESParams``, is already active.
        """
        with _CLAIM_LOCK:
            if self.active is not None:
                raise RuntimeError("a perturbation is already active on these params; restore it first")
            keys = [(str(e.tensor.device), e.tensor.data_ptr()) for e in self._entries if e.tensor.numel()]
            busy = [_CLAIMED[k] for k in keys if k in _CLAIMED]
            if busy:
                raise RuntimeError(f"tensors {busy[:4]} are already perturbed by another active perturbation")
            for k, e in zip(keys, (e for e in self._entries if e.tensor.numel()), strict=True):
                _CLAIMED[k] = e.name
            self.active = owner

    def release(self, owner: Perturbation) -> None:
        """Undo :meth:`claim` once ``owner`` is fully restored."""
        with _CLAIM_LOCK:
            if self.active is not owner:
                raise RuntimeError("release() called by a perturbation that is not the active one")
            for e in self._entries:
                if e.tensor.numel():
                    _CLAIMED.pop((str(e.tensor.device), e.tensor.data_ptr()), None)
            self.active = None


def as_es_params(params: ESParams | Iterable[tuple[str, torch.Tensor]]) -> ESParams:
    """Return ``params`` if it is an ``ESParams``, else wrap the pairs (no masters, no fused map)."""
    return params if isinstance(params, ESParams) else ESParams(params)
