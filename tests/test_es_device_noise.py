"""Device-drawn full-rank noise (coevo.es.device_noise) and its replay rule.

On this CPU-only machine the device is the CPU, whose device stream is the canonical one: the tests check
that the device path (device buffer, device-side update accumulation) gives the canonical weights bit for
bit, and that a record drawn on a GPU is refused here with a message naming both streams. The CUDA
stream itself is checked on a GPU by ``benchmarks/gpu_vllm_check.py`` (HF and vLLM on one GPU, equal hashes).
"""

from __future__ import annotations

import pytest
import torch
from support import antithetic_record, one_member_record

from coevo.es import NOISE_SPEC, ESParams, GenerationRecord, NoiseBuffer, es_update, noise_layout, perturb
from coevo.es.device_noise import (
    DeviceNoiseBuffer,
    NoiseDeviceError,
    device_noise_spec,
    is_device_spec,
    record_noise,
    use_device_noise,
)

H200 = "blake2b64(seed:name:chunk)/chunk=2^22/torch-2.13-cuda-philox-randn-fp32/NVIDIA H200/sm_90/132SM/v1"


def tensors(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    return [
        ("a.weight", torch.randn(300, 70, generator=g).to(dtype)),
        ("b.weight", torch.randn(5000, generator=g).to(dtype)),
    ]


def test_device_buffer_on_cpu_draws_the_canonical_chunks():
    seg = noise_layout("a.weight", 2**22 + 10)[1]
    dev, cpu = DeviceNoiseBuffer("cpu"), NoiseBuffer()
    assert dev.spec == NOISE_SPEC == device_noise_spec("cpu") and not is_device_spec(dev.spec)
    assert torch.equal(dev.fill(7, seg), cpu.fill(7, seg)) and dev.fill(7, seg).shape == (10,)


def test_device_path_update_and_perturb_equal_the_canonical_ones():
    ref, dev = ESParams(tensors(), master_dtype=torch.float32), ESParams(tensors(), master_dtype=torch.float32)
    dev.noise = DeviceNoiseBuffer("cpu")  # the device code path, drawing the CPU stream
    for p in (ref, dev):
        es_update(p, [3, 3, 9], [1, -1, 1], [0.7, -0.2, 1.1], 1e-2, 1e-3)
    assert ref.weights_hash() == dev.weights_hash()
    with perturb(ref, 5, 1e-2), perturb(dev, 5, 1e-2):
        assert ref.weights_hash() == dev.weights_hash()


def test_record_drawn_on_another_device_is_refused_with_both_streams_named():
    params = ESParams(tensors())
    before = params.weights_hash()
    rec = antithetic_record(1, noise_spec=H200)
    assert is_device_spec(H200)
    with pytest.raises(NoiseDeviceError, match=r"NVIDIA H200.*here the tensors are on cpu.*same GPU model"):
        rec.apply(params)
    assert params.weights_hash() == before and type(params.noise) is NoiseBuffer
    canonical = GenerationRecord(**{**rec.to_dict(), "noise_spec": NOISE_SPEC})
    with record_noise(params, NOISE_SPEC) as buf:
        assert type(buf) is NoiseBuffer
    assert canonical.apply(params).update_norm > 0


def test_use_device_noise_refuses_while_perturbed_and_needs_one_device():
    params = ESParams(tensors())
    assert use_device_noise(params) == NOISE_SPEC  # CPU tensors: the canonical stream
    with perturb(params, 2, 1e-2), pytest.raises(RuntimeError, match="while a perturbation is active"):
        use_device_noise(params, False)
    with pytest.raises(ValueError, match="cpu and cuda"):
        device_noise_spec("meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_stream_is_named_and_replays_on_the_same_device():
    t = [("a.weight", torch.randn(300, 70, device="cuda").to(torch.bfloat16))]
    a, b = ESParams([(n, x.clone()) for n, x in t]), ESParams([(n, x.clone()) for n, x in t])
    spec = use_device_noise(a)
    assert is_device_spec(spec) and spec == device_noise_spec("cuda")
    rec = one_member_record(4, alpha=1e-2, noise_spec=spec)
    rec.apply(a)
    rec.apply(b)  # b draws the canonical stream by default; the record's spec selects the device stream
    assert a.weights_hash() == b.weights_hash()
