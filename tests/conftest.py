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
