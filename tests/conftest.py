"""Shared pytest fixtures for coevo's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one thread for a module's tests, restored after them (use it as
    ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``). Two-thread BLAS on a shared 2-core machine is
    about 20x slower for a tiny model, and results do not depend on the thread count; the subprocesses
    (``OMP_NUM_THREADS=1``) and the Ray actors (``ReplicaWorker`` ``torch_threads``) run with one thread too."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``COEVO_CACHE`` pointed at a fresh ``cache`` folder under the test's ``tmp_path`` (what coevo caches,
    e.g. generated problem instances, stays out of the user's cache); returns that folder (not created)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("COEVO_CACHE", str(cache))
    return cache


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2ForCausalLM folder (hidden 32, 2 layers, 4 heads, 2 KV heads, tied embeddings,
    float32 safetensors, seed 0) with a real byte-level BPE tokenizer (512 tokens, ChatML template, trained
    in code by :func:`coevo.backends.tiny.build_bpe_tokenizer`). Built once per test session (a few seconds,
    mostly imports); it never needs the 0.5B model, so results are the same on every machine. Treat it as read-only.
    """
    from coevo.backends.tiny import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny_qwen2"), tokenizer_from="bpe", seed=0)


#: the smallest Qwen2 vLLM's CPU attention runs (head dim 64 / 2 = 32; it has no kernel for tiny_model_dir's 8)
VLLM_TINY = {"hidden_size": 64, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 128}


@pytest.fixture(scope="session")
def vllm_tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 folder that vLLM's CPU build can serve (:data:`VLLM_TINY`, BPE tokenizer, seed 0),
    shared by the real-engine tests (tests/test_vllm_cpu.py, tests/test_es_vllm_ray.py). Treat it as read-only."""
    from coevo.backends.tiny import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("vllm_tiny"), tokenizer_from="bpe", seed=0, **VLLM_TINY)


@pytest.fixture(scope="module")
def vllm_tiny_hf(vllm_tiny_dir: Path):
    """``HFPolicy`` (float32) on :func:`vllm_tiny_dir`: the reference the vLLM engines are compared with. One per
    module: tests apply ES updates to it, in order."""
    from coevo.backends.hf import HFPolicy

    return HFPolicy(vllm_tiny_dir, dtype="float32")


#: The benchmark instance files vendored for the tests (sources and checksums: tests/data/README.md).
DATA_DIR = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder of benchmark instance files vendored in ``tests/data`` (``tsp/``, ``bpp_online/``,
    ``tsplib/``), copied from the public benchmark sets named in ``tests/data/README.md``."""
    return DATA_DIR


SITE_VARS = ("WA_SHOPPING", "WA_SHOPPING_ADMIN", "WA_REDDIT", "WA_GITLAB", "WA_MAP", "WA_WIKIPEDIA")


@pytest.fixture
def deployment(monkeypatch, tmp_path):
    """What a WebArena-Lite user provides, minus the sites themselves: the WA_* URLs (nothing is contacted at
    validation), an OpenAI key variable for the LLM judge, and an NLTK data folder holding punkt_tab (an empty
    stand-in folder: validation only checks that NLTK finds it; no evaluator runs here)."""
    for var in SITE_VARS:
        monkeypatch.setenv(var, f"http://{var.lower()}.example.invalid:7770")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")
    (tmp_path / "nltk" / "tokenizers" / "punkt_tab").mkdir(parents=True)
    monkeypatch.setenv("NLTK_DATA", str(tmp_path / "nltk"))
    return monkeypatch


@pytest.fixture(scope="module")
def sandbox():
    """A module's sandbox (20 s, 1 GiB): the default of the sandbox tests; a module may define its own."""
    from coevo.sandbox.runner import Sandbox, SandboxLimits

    return Sandbox(SandboxLimits(timeout_s=20, memory_mb=1024))


@pytest.fixture(scope="module")
def bpp():
    """The ``bpp_online`` problem, loaded once per module."""
    from coevo.ahd import load_problem

    return load_problem("bpp_online")
