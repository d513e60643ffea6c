"""Full-rank ES noise drawn on the device where the tensor lives, and the replay rule for it.

Why. The canonical noise (``coevo.es.noise``, ``NOISE_SPEC``) is drawn on the CPU and copied to the tensor's
device: bit-identical everywhere, but for a 27B model one member costs ~27e9 host draws and ~100 GB of
host-to-device copies (fp32). :class:`DeviceNoiseBuffer` draws the same keyed chunks directly on the device:

    chunk c of tensor n for member s  =  torch.randn(len, generator=g, device=D),
    g = torch.Generator(device=D) seeded with coevo.es.noise.chunk_seed(s, n, c)

(same chunk layout, keys and fused-tensor rule as ``coevo.es.noise``; float32; one reused device buffer of
``NOISE_CHUNK_NUMEL`` elements, 16 MiB). Perturb, restore and update use it unchanged (they take their noise
from ``ESParams.noise``): the update's float32 accumulation then runs on the device too, with the same
separate multiply / add as on the CPU (``coevo.es.update``), so it is exact for the noise it is given.

Replay rule. A device generator is not the CPU's: CUDA draws with Philox, and the mapping of elements to
Philox counters follows the launch grid, which PyTorch sizes by the GPU's multiprocessor count. So
device-drawn noise is a *different* stream, reproducible only on the same kind of device with the same
torch build. :func:`device_noise_spec` names it: ``blake2b64(seed:name:chunk)/chunk=2^22/torch-<major.minor>-
cuda-philox-randn-fp32/<GPU name>/sm_<cc>/<SMs>SM/v1``; the history rows record that spec instead of
``NOISE_SPEC`` (``GenerationRecord.noise_spec``), and :func:`record_noise` - used by
``GenerationRecord.apply``, i.e. by every replay, rebuild, resume and replica update - draws a record's
noise from the stream its spec names: the CPU stream for ``NOISE_SPEC`` (also on a GPU, copied as before),
the device stream when the spec equals this device's, and otherwise refuses with :class:`NoiseDeviceError`
naming both devices. A history drawn on an H200 therefore replays on any H200 (any process, HF or vLLM,
same torch minor version), and is refused, not silently wrong, on a CPU or another GPU model. The CPU
stream stays the canonical, portable default; device noise is an opt-in (``noise_device: device`` of the
vLLM backend). On a CPU "device" the device stream *is* the canonical one (:func:`device_noise_spec`
returns ``NOISE_SPEC``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from coevo.es.noise import NOISE_CHUNK_NUMEL, NOISE_SPEC, NoiseBuffer, Segment, chunk_seed
from coevo.es.params import ESParams

#: prefix shared by every device-noise spec (and by ``NOISE_SPEC``: the key and chunk size are the same)
KEYING = "blake2b64(seed:name:chunk)/chunk=2^22"


class NoiseDeviceError(ValueError):
    """A record's noise was drawn on a device whose stream this process cannot draw (module docstring)."""


def device_noise_spec(device: torch.device | str) -> str:
    """The noise definition of :class:`DeviceNoiseBuffer` on ``device`` (module docstring).

    Returns:
        ``NOISE_SPEC`` for a CPU device; for CUDA (also ROCm's HIP, which torch exposes as ``cuda``)
        ``f"{KEYING}/torch-{major.minor}-cuda-philox-randn-fp32/{name}/sm_{cc}/{SMs}SM/v1"``.

    Raises:
        ValueError: a device type other than cpu / cuda, or a CUDA device that is not visible.
    """
    dev = torch.device(device)
    if dev.type == "cpu":
        return NOISE_SPEC
    if dev.type != "cuda":
        raise ValueError(f"device noise is defined for cpu and cuda devices, got {dev}")
    if not torch.cuda.is_available():
        raise ValueError(f"device noise on {dev} needs a visible CUDA device")
    props = torch.cuda.get_device_properties(dev)
    torch_minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    return (
        f"{KEYING}/torch-{torch_minor}-cuda-philox-randn-fp32/{props.name}/sm_{props.major}{props.minor}/"
        f"{props.multi_processor_count}SM/v1"
    )


def is_device_spec(spec: str) -> bool:
    """Whether ``spec`` names a device-drawn stream (not the canonical CPU one)."""
    return isinstance(spec, str) and spec.startswith(KEYING + "/torch-") and "-cuda-" in spec


class DeviceNoiseBuffer(NoiseBuffer):
    """A :class:`coevo.es.noise.NoiseBuffer` whose chunks are drawn on ``device`` (module docstring).

    Same interface (``buffer``, ``generator``, :meth:`fill`); ``device`` and ``spec`` say where and which
    stream. Memory: ``NOISE_CHUNK_NUMEL * 4`` bytes (16 MiB) on ``device``. Not thread-safe.

    Raises:
        ValueError: see :func:`device_noise_spec`.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.spec = device_noise_spec(self.device)
        self.buffer = torch.empty(NOISE_CHUNK_NUMEL, dtype=torch.float32, device=self.device)
        self.generator = torch.Generator(device=self.device)

    def fill(self, seed: int, segment: Segment) -> torch.Tensor:
        """Draw the noise of ``segment`` for member ``seed`` on the device.

        Returns:
            float32 view of shape ``(segment.numel,)`` on ``device`` into the shared buffer.
        """
        self.generator.manual_seed(chunk_seed(seed, segment.name, segment.chunk))
        out = self.buffer[: segment.numel]
        torch.randn(segment.numel, generator=self.generator, out=out)
        return out


def noise_spec_of(buffer: NoiseBuffer) -> str:
    """The noise definition a buffer draws (``NOISE_SPEC`` for a plain CPU :class:`NoiseBuffer`)."""
    return getattr(buffer, "spec", NOISE_SPEC)


def params_device(params: ESParams) -> torch.device:
    """The one device of the tensors in ``params``.

    Raises:
        ValueError: the tensors live on more than one device (device noise needs one).
    """
    devices = {e.tensor.device for e in params.entries}
    if len(devices) != 1:
        raise ValueError(f"device noise needs every tensor in scope on one device, got {sorted(map(str, devices))}")
    return devices.pop()


def use_device_noise(params: ESParams, enabled: bool = True) -> str:
    """Make ``params`` draw its perturbations and updates on its tensors' device (``enabled``), or from the
    canonical CPU stream (not ``enabled``); returns the noise spec now in force.

    Raises:
        ValueError: tensors on several devices, or an unsupported device (:func:`device_noise_spec`).
        RuntimeError: a perturbation is active (its restore must use the noise it was drawn with).
    """
    if params.active is not None:
        raise RuntimeError("cannot change the noise stream while a perturbation is active; restore it first")
    dev = params_device(params)
    if enabled and dev.type != "cpu":
        if not isinstance(params.noise, DeviceNoiseBuffer) or params.noise.device != dev:
            params.noise = DeviceNoiseBuffer(dev)
    elif type(params.noise) is not NoiseBuffer:
        params.noise = NoiseBuffer()
    return noise_spec_of(params.noise)


@contextmanager
def record_noise(params: ESParams, spec: str) -> Iterator[NoiseBuffer]:
    """Within the block, ``params.noise`` draws the stream ``spec`` names (the replay rule, module docstring).

    ``NOISE_SPEC`` -> the canonical CPU stream; a device spec equal to :func:`device_noise_spec` of the
    tensors' device -> that device's stream; any other spec (e.g. a low-rank one, whose factors
    ``coevo.es.lowrank`` draws itself) leaves the buffer as it is. The previous buffer is restored on exit.

    Raises:
        NoiseDeviceError: ``spec`` is a device stream of another device (or torch version); the message
            names the recorded and the local stream.
    """
    previous = params.noise
    if spec == NOISE_SPEC and type(previous) is not NoiseBuffer:
        params.noise = NoiseBuffer()
    elif is_device_spec(spec) and noise_spec_of(previous) != spec:
        dev = params_device(params)
        local = device_noise_spec(dev) if dev.type in ("cpu", "cuda") else f"none on {dev}"
        if local != spec:
            raise NoiseDeviceError(
                f"this history's noise was drawn on a device: {spec!r}; here the tensors are on {dev}, which draws "
                f"{local!r}. Device-drawn noise replays only on the same GPU model with the same torch version "
                "(coevo.es.device_noise); replay it there, or train with the canonical CPU stream (noise_device: cpu)"
            )
        params.noise = DeviceNoiseBuffer(dev)
    try:
        yield params.noise
    finally:
        params.noise = previous
