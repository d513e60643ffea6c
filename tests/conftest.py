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


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The benchmark instances in ``../shared/data`` beside the repository (or ``$COEVO_SHARED_DATA``)."""
    import os

    env = os.environ.get("COEVO_SHARED_DATA")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    if not (path / "tsp").is_dir():
        pytest.skip(f"shared benchmark data not found at {path} (set COEVO_SHARED_DATA)")
    return path
