"""Tiny random Qwen2 models for tests and smoke runs.

:func:`build_tiny_qwen2` writes a randomly initialised ``Qwen2ForCausalLM`` (safetensors) plus a tokenizer
into a folder that :class:`coevo.backends.hf.HFPolicy` loads like any HF checkpoint. The tokenizer is the real
Qwen tokenizer of the prepared default model when that exists, else a small byte-level BPE trained here, in
code, on a short built-in text (so tests never need the 0.5B model). Both carry the ChatML chat template
used by Qwen2.5 (``<|im_start|>role\\n...<|im_end|>``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from coevo.umask import honour_umask

#: ChatML template (the format of Qwen2.5 chat models, without the default system prompt and tool support)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

#: presets accepted by ``tiny:<preset>`` model references
TINY_PRESETS: dict[str, dict] = {
    "micro": {"hidden_size": 32, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 64},
    "small": {"hidden_size": 64, "layers": 2, "heads": 4, "kv_heads": 2, "intermediate": 128},
}

_CORPUS = """\
def add(a, b):
    return a + b

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    # pick the nearest unvisited node
    return min(unvisited_nodes, key=lambda n: distance_matrix[current_node][n])

def score(item, bins):
    import numpy as np
    return -(bins - item)

class Solver:
    def __init__(self, seed=0):
        self.seed = seed
        self.values = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]

for i in range(10):
    if i % 2 == 0:
        print(f"even {i}")
    else:
        print("odd", i)

The agent reads the page, then it clicks the button. click('13') fill('19', 'hello world') goto(url)
send_msg_to_user("The answer is 42.") Write a Python function that adds two numbers. The user asks a question
and the assistant answers it. Solve the task step by step: set 1 2 3, set 4 5 6. Reward is higher when the
tour is shorter. Heuristics for the travelling salesman, knapsack, bin packing and vehicle routing problems.
{"thought": "greedy by ratio", "code": "def f(x): return x * 2"} [1, 2, 3] (a, b) <tag> True False None
"""


def build_bpe_tokenizer(vocab_size: int = 512):
    """Train a byte-level BPE tokenizer on the built-in text, with ChatML specials and chat template.

    Args:
        vocab_size: target vocabulary size including the 256 byte tokens and 3 special tokens (>= 300).

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` (eos ``<|im_end|>``, pad ``<|endoftext|>``).

    Raises:
        ValueError: ``vocab_size`` below 300.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 300:
        raise ValueError(f"vocab_size must be >= 300 (256 bytes + specials + merges), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHATML_TEMPLATE,
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
    )


def _load_tokenizer(tokenizer_from: str | Path | None):
    """Tokenizer for a tiny model: a folder, "bpe" (built here), or None (default model if prepared)."""
    from coevo.backends.models import DEFAULT_MODEL, default_cache_dir, load_tokenizer, read_marker

    if tokenizer_from == "bpe":
        return build_bpe_tokenizer()
    if tokenizer_from is None:
        prepared = default_cache_dir() / "models" / DEFAULT_MODEL
        if read_marker(prepared) is None:
            return build_bpe_tokenizer()
        tokenizer_from = prepared
    path = Path(tokenizer_from)
    if not path.is_dir():
        raise ValueError(f"tokenizer_from must be None, 'bpe' or an existing folder, got {tokenizer_from!r}")
    tok = load_tokenizer(path)
    if tok.chat_template is None:
        tok.chat_template = CHATML_TEMPLATE
    return tok


def build_tiny_qwen2(
    out_dir: str | Path,
    *,
    hidden_size: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 64,
    seed: int = 0,
    tokenizer_from: str | Path | None = None,
) -> Path:
    """Build a random ``Qwen2ForCausalLM`` (float32, tied embeddings) with a tokenizer in ``out_dir``.

    Args:
        out_dir: destination folder (created; existing files are overwritten).
        hidden_size, layers, heads, kv_heads, intermediate: architecture (``hidden_size`` divisible by
            ``heads``, ``heads`` by ``kv_heads``).
        seed: seed of the weight initialisation (the global RNG is left untouched).
        tokenizer_from: None (real Qwen tokenizer of the prepared default model if present, else the built-in
            BPE), "bpe" (always the built-in BPE) or a folder holding a tokenizer.

    Returns:
        ``out_dir`` as a Path (config.json, model.safetensors, generation_config.json, tokenizer files).

    Raises:
        ValueError: inconsistent sizes, or a tokenizer whose ids do not fit the vocabulary.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    for field_name, v in (
        ("hidden_size", hidden_size),
        ("layers", layers),
        ("heads", heads),
        ("kv_heads", kv_heads),
        ("intermediate", intermediate),
    ):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{field_name} must be a positive int, got {v!r}")
    if hidden_size % heads or heads % kv_heads:
        raise ValueError(
            f"hidden_size ({hidden_size}) must divide by heads ({heads}) and heads by kv_heads ({kv_heads})"
        )
    if (hidden_size // heads) % 2:
        raise ValueError(f"head dim hidden_size/heads = {hidden_size // heads} must be even (rotary embeddings)")
    tok = _load_tokenizer(tokenizer_from)
    tok.padding_side = "left"
    n_tokens = len(tok)
    vocab_size = -(-n_tokens // 64) * 64  # round up to a multiple of 64, as Qwen does
    max_id = max(tok.get_vocab().values())
    if max_id >= vocab_size:
        raise ValueError(f"tokenizer id {max_id} does not fit vocab_size {vocab_size}")
    eos_id = tok.convert_tokens_to_ids("<|im_end|>")
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from coevo.backends.models import no_library_bars

    with no_library_bars():  # transformers 5's "Writing model shards" bar
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
    return out


def parse_tiny_spec(spec: str) -> dict:
    """The :func:`build_tiny_qwen2` kwargs named by a preset or a JSON object (checked, nothing built).

    Raises:
        ValueError: unknown preset, malformed JSON, unknown keys or non-positive sizes (named in the message).
    """
    spec = spec.strip()
    if spec.startswith("{"):
        try:
            kwargs = json.loads(spec)
        except json.JSONDecodeError as e:
            raise ValueError(f"tiny model spec is not valid JSON: {e}") from e
        if not isinstance(kwargs, dict):
            raise ValueError("tiny model spec JSON must be an object")
    elif spec in TINY_PRESETS:
        kwargs = dict(TINY_PRESETS[spec])
    else:
        raise ValueError(f"unknown tiny preset {spec!r}; presets: {sorted(TINY_PRESETS)}, or a JSON object")
    allowed = {"hidden_size", "layers", "heads", "kv_heads", "intermediate", "seed", "tokenizer_from"}
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise ValueError(f"unknown tiny model field(s) {unknown}; allowed: {sorted(allowed)}")
    for field in ("hidden_size", "layers", "heads", "kv_heads", "intermediate"):
        value = kwargs.get(field, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"tiny model field {field!r} must be an int >= 1, got {value!r}")
    if kwargs.get("hidden_size", 32) % kwargs.get("heads", 4):
        raise ValueError("tiny model field 'hidden_size' must be divisible by 'heads'")
    if kwargs.get("heads", 4) % kwargs.get("kv_heads", 2):
        raise ValueError("tiny model field 'heads' must be divisible by 'kv_heads'")
    kwargs.setdefault("tokenizer_from", "bpe")
    return kwargs


def build_tiny_from_spec(spec: str, root: str | Path) -> Path:
    """Build (once) the tiny model named by a preset or a JSON object of :func:`build_tiny_qwen2` kwargs.

    The folder is ``<root>/tiny-<hash of the resolved kwargs and the transformers major version>``; it is built
    in a temporary folder and renamed, so a complete folder is reused by later calls.

    Raises:
        ValueError: see :func:`parse_tiny_spec`.
    """
    from coevo.backends.models import transformers_major

    kwargs = parse_tiny_spec(spec)
    # The key includes the transformers major version: a folder saved by 5.x cannot be loaded by 4.x, and
    # one cache may serve virtual environments with either.
    keyed = {**kwargs, "transformers_major": transformers_major()}
    key = hashlib.sha256(json.dumps(keyed, sort_keys=True, default=str).encode()).hexdigest()[:12]
    root = Path(root)
    out = root / f"tiny-{key}"
    if (out / "config.json").is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tiny-{key}.", dir=root))
    try:
        build_tiny_qwen2(tmp, **kwargs)
        honour_umask(tmp)  # mkdtemp / safetensors give 0700 / 0600 whatever the umask
        os.replace(tmp, out)
    except OSError:
        if not (out / "config.json").is_file():  # not a lost race with another builder
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out
