"""Wall time and peak memory of one piece of work (a GRPO or DPO update, an ES generation), in this process.

Peak resident memory is the kernel's high-water mark ``VmHWM`` (``/proc/self/status``), reset at the start with
``/proc/self/clear_refs`` = ``5`` (Linux >= 4.0, allowed for one's own process), so the peak is that of the
measured window, not of the process's life. Where the reset is refused or ``/proc`` is missing, the process's
lifetime peak is reported (``ru_maxrss``) and :attr:`Usage.peak_scope` says ``"process"``. RSS counts every
resident page of the process (weights, activations, optimizer states, allocator caches, libraries); other
processes (sandboxed evaluations) are not counted. On CUDA the peak allocated device memory of the window is
read too (``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``).

Resetting ``VmHWM`` changes what a later reader of the process's peak sees (e.g. a benchmark reading
``VmHWM`` at exit); measure such a process's lifetime peak before a window, or in another process.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MIB = 2**20


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def rss_mib() -> float | None:
    """Current resident set size of this process in MiB (``VmRSS``), or None without ``/proc``."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib / 1024


def reset_peak() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS; False where the kernel refuses (module docstring)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@dataclass
class Usage:
    """What :func:`measure` recorded (filled when its block ends).

    Attributes:
        wall_s: wall-clock seconds of the block.
        rss_before_mib: resident memory when the block began (MiB; None without ``/proc``).
        peak_rss_mib: peak resident memory during the block (MiB; ``peak_scope`` says over which window).
        peak_scope: ``"window"`` (the block only) or ``"process"`` (the process's lifetime peak: reset refused).
        peak_cuda_mib: peak allocated CUDA memory during the block (MiB), None off CUDA.
        peak_before_mib: ``VmHWM`` just before the block reset it (MiB): the peak of whatever window was open
            around it (a caller measuring a larger window takes the larger of this and its own reading).
    """

    wall_s: float = 0.0
    rss_before_mib: float | None = None
    peak_rss_mib: float | None = None
    peak_scope: str = "window"
    peak_cuda_mib: float | None = None
    peak_before_mib: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@contextmanager
def measure(cuda: bool = False) -> Iterator[Usage]:
    """Measure the wall time and peak memory of the ``with`` block (module docstring); the yielded
    :class:`Usage` is filled when the block ends (also when it raises)."""
    hwm = _status_kib("VmHWM")
    usage = Usage(rss_before_mib=rss_mib(), peak_before_mib=None if hwm is None else hwm / 1024)
    if not reset_peak():
        usage.peak_scope = "process"
    if cuda:
        import torch

        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        yield usage
    finally:
        usage.wall_s = time.perf_counter() - t0
        hwm = _status_kib("VmHWM") if usage.peak_scope == "window" else None
        usage.peak_rss_mib = (
            hwm / 1024 if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        )
        if hwm is None:
            usage.peak_scope = "process"
        if cuda:
            import torch

            usage.peak_cuda_mib = torch.cuda.max_memory_allocated() / MIB
