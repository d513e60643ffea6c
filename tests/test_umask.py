"""Model files written by coevo (cached tiny models, exported weights, ES snapshots) follow the user's umask,
not the 0600 / 0700 that safetensors and mkdtemp use."""

from __future__ import annotations

import os
import stat

import pytest

from coevo.umask import current_umask, honour_umask


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_current_umask_and_honour_umask(tmp_path, umask_027):
    assert current_umask() == 0o027
    (tmp_path / "d").mkdir(mode=0o700)
    f, x = tmp_path / "d" / "w.safetensors", tmp_path / "d" / "run.sh"
    f.write_text("w")
    x.write_text("#!/bin/sh\n")
    os.chmod(f, 0o600)
    os.chmod(x, 0o700)
    honour_umask(tmp_path / "d")
    assert (_mode(tmp_path / "d"), _mode(f), _mode(x)) == (0o750, 0o640, 0o750)


def test_cached_tiny_model_and_exported_weights_follow_the_umask(tmp_path, umask_027):
    from coevo.backends.hf import HFPolicy
    from coevo.backends.tiny import build_tiny_from_spec
    from coevo.es.checkpoint import export_hf

    folder = build_tiny_from_spec('{"hidden_size": 16, "layers": 1, "seed": 11}', tmp_path / "cache")
    assert _mode(folder) == 0o750
    assert _mode(folder / "model.safetensors") == 0o640 and _mode(folder / "config.json") == 0o640
    policy = HFPolicy(folder, dtype="float32")
    out = export_hf(policy.model, policy.tokenizer, tmp_path / "export")
    assert _mode(out / "model.safetensors") == 0o640
