"""float32 linear layers on CPU through oneDNN instead of torch's default BLAS call.

For the small row counts of decoding (one row per sequence of the batch), ``torch.nn.functional.linear`` in
the CPU wheels calls MKL's sgemm, which on AMD CPUs (which MKL does not tune for) runs far below the machine's
speed: measured on this project's 2-core AMD EPYC machine, 8 x 896 by 896 x 4864 at 8-9 GFLOP/s, against
24-26 GFLOP/s through oneDNN's inner product on the same dense weight (numpy's OpenBLAS: 20-32), and the
0.5B model's ``lm_head`` (151936 x 896) likewise 8 vs 24 GFLOP/s. Prefill shapes (hundreds of rows) are at
60-70 GFLOP/s either way.

:func:`use_onednn_linear` makes every ``torch.nn.Linear`` of a model call
``torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")`` (the oneDNN inner product that
torch's own Inductor emits for CPU linears) whenever the input and weight are float32 CPU tensors, no
gradient is being recorded and CPU autocast is off; anything else (bf16/fp16, CUDA, autograd, autocast) goes
through ``F.linear`` as before.
The weight stays the module's dense ``nn.Parameter``: nothing is packed or copied, so in-place ES
perturbations, restores and updates are seen by the next forward, and forward hooks (the low-rank
population's terms) run as before. Results equal ``F.linear`` up to float32 summation order.

The op is private to torch; :func:`onednn_available` checks it exists and agrees with ``F.linear`` on a small
case, and the policy falls back to ``F.linear`` when it does not (``model.cpu_linear: auto``).
"""

from __future__ import annotations

import functools
import types

import torch
from torch import nn
from torch.nn import functional as F

#: settings of ``model.cpu_linear``
CPU_LINEAR_MODES = ("auto", "onednn", "torch")


@functools.lru_cache(maxsize=1)
def onednn_available() -> bool:
    """True when ``torch.ops.mkldnn._linear_pointwise`` exists and matches ``F.linear`` (float32, 3-D input
    with bias, 1e-4 relative) on this machine."""
    try:
        op = torch.ops.mkldnn._linear_pointwise
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(2, 3, 16, generator=gen)
        w = torch.randn(24, 16, generator=gen)
        b = torch.randn(24, generator=gen)
        with torch.inference_mode():
            got, want = op(x, w, b, "none", [], ""), F.linear(x, w, b)
    except (AttributeError, RuntimeError):
        return False
    return got.shape == want.shape and bool(torch.allclose(got, want, rtol=1e-4, atol=1e-4))


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    w = self.weight
    if (
        x.dtype == torch.float32
        and w.dtype == torch.float32
        and x.device.type == "cpu"
        and w.device.type == "cpu"
        and not torch.is_grad_enabled()
        and not torch.is_autocast_enabled("cpu")
    ):
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, self.bias, "none", [], "")
    return F.linear(x, w, self.bias)


def use_onednn_linear(model: nn.Module) -> int:
    """Route the float32 CPU forward of every ``nn.Linear`` in ``model`` through oneDNN (module docstring).

    Returns:
        the number of linear layers switched (their ``forward`` is replaced on the instance).

    Raises:
        RuntimeError: the oneDNN op is not available or disagrees with ``F.linear`` here.
    """
    if not onednn_available():
        raise RuntimeError("torch.ops.mkldnn._linear_pointwise is unavailable or disagrees with F.linear here")
    n = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.forward = types.MethodType(_forward, module)
            n += 1
    return n


def use_torch_linear(model: nn.Module) -> int:
    """Undo :func:`use_onednn_linear`: every ``nn.Linear`` of ``model`` uses its class's ``forward`` again.
    Returns the number of layers restored."""
    n = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and "forward" in vars(module):
            del module.forward
            n += 1
    return n
