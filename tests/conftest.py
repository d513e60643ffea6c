"""Shared pytest fixtures for coevo's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


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
