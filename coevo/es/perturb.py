"""In-place perturbation ``theta + sign * sigma * eps(seed)`` and its restore.

Agentic-ESOpt, docs/references.md §1 step 2: for member i, every selected tensor p becomes
``p + sigma_t * eps_i(p)``; mirrored (antithetic) members use ``sign = -1`` (Salimans et al. 2017).

Arithmetic (identical on every device): per noise chunk, ``d = fl32(sign * sigma * eps)``; the working
tensor receives ``cast(fl32(base + d))`` where ``base`` is the float32 master if the tensor has one, else
the working values in float32. One rounding to the working dtype, never a bf16 add.

Restore modes:
  * ``"exact"`` (default): bit-identical. Tensors with a float32 master (``ESParams(master_dtype=
    torch.float32)``) are restored as ``cast(master)``: no extra memory. Other tensors are backed up
    before they are perturbed: extra memory = 1x the size of the perturbed tensors without master, on
    ``backup_device`` (default: the tensor's device; ``"cpu"`` moves the cost to host memory).
  * ``"inference"``: restore subtracts the regenerated noise, ``cast(fl32(p - d))``: extra memory is one
    noise chunk, but rounding makes the weights drift over cycles (tests/test_es_perturb.py, tiny Qwen2,
    sigma 1e-3, 50 cycles: bf16 RMS 2.3e-4 with 28 % of entries changed; float32 RMS 1.2e-8 with about
    half the entries off by an ulp or so; after 400 cycles bf16 RMS 3.0e-4 with 36 % changed, as in
    the reference code, docs/references.md §1). Tensors with a master are still restored from the master.

Exception safety: progress is tracked per tensor (exact restores) or per chunk (subtraction). If
perturbing fails part-way (an error, or a KeyboardInterrupt, in the middle of the tensor list or of a
tensor), what was written is restored before the error propagates; if the rollout inside
``with perturb(...)`` raises, the weights are restored on exit. If a restore itself fails, it still
restores every other tensor, re-raises the first error, and stays active: call ``restore()`` again
(``params.active`` holds it) to finish. A second perturbation of the same tensors while one is active
raises RuntimeError. Limit of the ``"inference"`` mode only: an asynchronous interrupt landing exactly
between a chunk's write and its bookkeeping can leave that one chunk off by ``sigma * eps`` (exact
restores are idempotent and have no such window).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from coevo.es.noise import check_seed, iter_noise
from coevo.es.params import ESParams, _Entry, as_es_params

MODES = ("exact", "inference")


def _add_note(err: BaseException, note: str) -> None:
    """``err.add_note(note)`` where supported (Python >= 3.11)."""
    if hasattr(err, "add_note"):
        err.add_note(note)


class Perturbation:
    """An active perturbation of ``params`` (applied by the constructor); a context manager.

    Args:
        params: the tensors (an ``ESParams`` or ``(name, tensor)`` pairs).
        seed: member seed, 0 <= seed < 2**63.
        sigma: perturbation scale (>= 0, finite; units of the weights). ``sigma == 0`` changes nothing.
        sign: +1, or -1 for the mirrored member of an antithetic pair.
        mode: ``"exact"`` or ``"inference"`` (module docstring).
        backup_device: where exact-mode backups live (default: each tensor's device).

    Raises:
        ValueError / TypeError: bad seed, sigma, sign or mode.
        RuntimeError: a perturbation of these tensors is already active.
    """

    def __init__(
        self,
        params: ESParams | Iterable[tuple[str, torch.Tensor]],
        seed: int,
        sigma: float,
        sign: int = 1,
        mode: str = "exact",
        backup_device: torch.device | str | None = None,
    ) -> None:
        self.params = as_es_params(params)
        self.seed = check_seed(seed)
        if not isinstance(sigma, (int, float)) or not math.isfinite(sigma) or sigma < 0:
            raise ValueError(f"sigma must be a finite float >= 0, got {sigma!r}")
        if sign not in (1, -1):
            raise ValueError(f"sign must be +1 or -1, got {sign!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.sigma, self.sign, self.mode = float(sigma), int(sign), mode
        self.backup_device = None if backup_device is None else torch.device(backup_device)
        n = len(self.params)
        self._lo = [0] * n  # elements [lo, hi) of tensor i are currently perturbed
        self._hi = [0] * n
        self._backups: list[torch.Tensor | None] = [None] * n
        self.params.claim(self)
        self.active = True
        try:
            self._apply()
        except BaseException as err:
            try:
                self.restore()
            except BaseException as rollback_err:  # noqa: BLE001 - report both, keep the original
                _add_note(
                    err,
                    f"rollback after failed perturb also failed: {rollback_err!r}; call "
                    "params.active.restore() to finish restoring",
                )
            raise

    @property
    def scale(self) -> float:
        """``sign * sigma`` (float)."""
        return self.sign * self.sigma

    def _apply(self) -> None:
        if self.sigma == 0.0:
            return
        for i, e in enumerate(self.params.entries):
            exact = self.mode == "exact" or e.master is not None
            if exact:
                if e.master is None:
                    dev = e.tensor.device if self.backup_device is None else self.backup_device
                    self._backups[i] = e.flat.to(dev, copy=True)
                self._hi[i] = e.tensor.numel()  # mark before writing: restoring a clean chunk is harmless
            for seg, eps in iter_noise(self.seed, e.name, e.tensor.numel(), e.parts, self.params.noise):
                d = eps.to(e.tensor.device).mul_(self.scale)  # fl32(sign*sigma*eps); eps buffer is scratch
                d.add_(self.params.base(e, seg.start, seg.stop))
                self.params.write(e, seg.start, seg.stop, d)
                if not exact:  # subtraction must only touch written chunks: mark after writing
                    self._hi[i] = seg.stop

    def _restore_entry(self, i: int, e: _Entry) -> None:
        lo, hi = self._lo[i], self._hi[i]
        source = e.master if e.master is not None else self._backups[i]
        if source is not None:
            e.flat[lo:hi].copy_(source[lo:hi])
            self._lo[i] = hi
            return
        for seg, eps in iter_noise(self.seed, e.name, e.tensor.numel(), e.parts, self.params.noise, start=lo):
            if seg.start >= hi:
                break
            d = eps.to(e.tensor.device).mul_(self.scale)
            values = e.flat[seg.start : seg.stop].float() - d
            self.params.write(e, seg.start, seg.stop, values)
            self._lo[i] = seg.stop

    def restore(self) -> None:
        """Undo the perturbation (idempotent once complete).

        Raises:
            the first error met while restoring (after trying every tensor); the perturbation then
            stays active and ``restore()`` may be called again.
        """
        if not self.active:
            return
        errors: list[BaseException] = []
        for i, e in enumerate(self.params.entries):
            if self._lo[i] < self._hi[i]:
                try:
                    self._restore_entry(i, e)
                except BaseException as err:  # noqa: BLE001 - keep restoring the other tensors
                    errors.append(err)
        if errors:
            for extra in errors[1:]:
                _add_note(errors[0], f"restore also failed with {extra!r}")
            raise errors[0]
        self._backups = [None] * len(self._backups)
        self.active = False
        self.params.release(self)

    def __enter__(self) -> Perturbation:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()


def perturb(
    params: ESParams | Iterable[tuple[str, torch.Tensor]],
    seed: int,
    sigma: float,
    sign: int = 1,
    mode: str = "exact",
    backup_device: torch.device | str | None = None,
) -> Perturbation:
    """Add ``sign * sigma * eps(seed)`` to ``params`` in place; returns the active ``Perturbation``.

    Use as ``with perturb(p, seed, sigma): rollout()`` or call ``.restore()`` explicitly. See
    ``Perturbation`` for arguments, modes, memory and errors.
    """
    return Perturbation(params, seed, sigma, sign, mode, backup_device)
