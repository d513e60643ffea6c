"""A local Hugging Face transformers model as a :class:`~coevo.backends.base.Policy`.

The policy owns the ``torch.nn.Module`` (``policy.model``) so that ES (``coevo.es``) can perturb its
parameters in place; :meth:`HFPolicy.named_parameters` yields them under their canonical HF names.
Generation is batched with the model's chat template and left padding; a given ``SamplingParams.seed``
makes sampling reproducible without disturbing the global torch RNG: row i of a call seeded ``s`` samples
from its own generator seeded ``request_seed(s, i)`` (as the vLLM backend seeds its requests), so a row's
completion does not depend on the other rows of its batch nor on ``batch_size``.

Population batches (low-rank ES, :mod:`coevo.backends.hf_replica`) use :meth:`HFPolicy.generate_rows` and
the ``batch_hook`` of :meth:`HFPolicy.logprob`: the caller gets each model batch's row range before its
forward passes run, to tell its forward hooks which member each row belongs to.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch

from coevo.backends import check_conversations, check_sampling_params, cut_at_stop
from coevo.backends.base import (
    Completion,
    Message,
    Policy,
    PolicyError,
    SamplingParams,
    request_seed,
    terminal_token_ids,
    torch_dtype,
)

#: ``batch_hook(start, stop)``: a context manager entered around the model batch holding rows [start, stop); with
#: ``row_groups`` it yields ``narrow(indices)``, a context manager under which the model serves only those rows
#: of the batch (the per-group prefix prefill)
BatchHook = Callable[[int, int], AbstractContextManager]


class RowSampler:
    """A ``transformers`` logits processor that samples every row from its own seeded generator.

    Per decoding step, for each row b: the scores are warped as HF's sampling does (temperature, then top-k,
    then top-p, with ``transformers``' own warpers), a token is drawn with ``torch.multinomial(softmax(scores_b),
    1, generator=g_b)``, and the returned scores are ``-inf`` except 0 at that token, so greedy decoding
    (``do_sample=False``) emits it. Row b's draws depend only on its own scores and generator, not on the
    other rows of the batch.

    Args:
        params: decoding settings (temperature > 0). seeds: one generator seed per row. device: of the scores.
    """

    def __init__(self, params: SamplingParams, seeds: Sequence[int], device: torch.device) -> None:
        from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        self.warpers = [TemperatureLogitsWarper(float(params.temperature))]
        if params.top_k > 0:
            self.warpers.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(float(params.top_p)))
        self.generators = []
        for seed in seeds:
            g = torch.Generator(device=device)
            g.manual_seed(int(seed))
            self.generators.append(g)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """``scores``: (B, V) next-token scores -> (B, V) with one finite entry per row."""
        for w in self.warpers:
            scores = w(input_ids, scores)
        probs = torch.softmax(scores.float(), dim=-1)
        picks = torch.cat([torch.multinomial(probs[b], 1, generator=g) for b, g in enumerate(self.generators)])
        out = torch.full_like(scores, float("-inf"))
        out[torch.arange(out.shape[0], device=out.device), picks] = 0.0
        return out


def shared_prefix_len(rows: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix common to every row (0 for no rows)."""
    if not rows:
        return 0
    first, n = rows[0], min(len(r) for r in rows)
    for i in range(n):
        tok = first[i]
        if any(r[i] != tok for r in rows):
            return i
    return n


class HFPolicy(Policy):
    """A causal LM loaded from a local folder with transformers.

    Args:
        model: a local HF folder, a registry name or ``tiny:<preset>`` (see
            :func:`coevo.backends.models.resolve_model`).
        dtype: weight dtype, "float32" (default; ES wants fp32 master weights), "bfloat16" or "float16".
        device: "cpu", "cuda" or "cuda:N".
        batch_size: conversations per forward batch (>= 1); larger batches are split.
        cpu_linear: kernel of the linear layers of a float32 model on CPU (:mod:`coevo.backends.cpu_linear`):
            "auto" (default: oneDNN where torch's op works here, else torch's), "onednn" (required) or
            "torch" (``F.linear``). About 3x faster decoding matmuls on AMD CPUs; no effect on GPU or bf16.
        cache_dir: coevo cache root used to resolve names (default ``$COEVO_CACHE`` or ``~/.cache/coevo``).

    Attributes:
        model: the ``transformers`` model (eval mode). tokenizer: its tokenizer (left padding).
        model_id: the reference given. path: the resolved folder.

    Raises:
        ValueError: bad dtype, device, batch_size or cpu_linear, or an unresolvable model reference.
        PolicyError: the folder cannot be loaded, CUDA was requested but is unavailable, or cpu_linear
            "onednn" was asked for where it cannot run.
    """

    has_parameters = True
    #: shortest shared token prefix worth a prefix cache (:meth:`_generate_batch`); larger than any length disables it
    min_shared_prefix = 16

    def __init__(
        self,
        model: str | Path,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        batch_size: int = 8,
        cache_dir: str | Path | None = None,
        cpu_linear: str = "auto",
    ) -> None:
        from transformers import AutoModelForCausalLM

        from coevo.backends.models import load_tokenizer, resolve_model

        self.dtype = torch_dtype(dtype)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        try:
            self.device = torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}") from e
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise PolicyError(f"device {device!r} requested but CUDA is not available")
        self.path = resolve_model(model, cache_dir=cache_dir)
        self.model_id = str(model)
        self.batch_size = batch_size
        os.environ["HF_HUB_OFFLINE"] = "1"
        try:
            self.tokenizer = load_tokenizer(self.path)
            self.model = AutoModelForCausalLM.from_pretrained(self.path, local_files_only=True, dtype=self.dtype)
        except (OSError, ValueError) as e:
            raise PolicyError(f"cannot load model from {self.path}: {e}") from e
        self.model.to(self.device).eval()
        #: the kernel of float32 CPU linear layers: "onednn" or "torch" (coevo.backends.cpu_linear)
        self.cpu_linear = self._linear_kernel(cpu_linear)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.tokenizer.chat_template is None:
            raise PolicyError(f"tokenizer in {self.path} has no chat template")
        self._stop_ids = terminal_token_ids(self.tokenizer, self.model.generation_config.eos_token_id)

    def _linear_kernel(self, mode: str) -> str:
        from coevo.backends.cpu_linear import CPU_LINEAR_MODES, onednn_available, use_onednn_linear

        if mode not in CPU_LINEAR_MODES:
            raise ValueError(f"cpu_linear must be one of {', '.join(CPU_LINEAR_MODES)}, got {mode!r}")
        applies = self.device.type == "cpu" and self.dtype == torch.float32
        if mode == "onednn" and not (applies and onednn_available()):
            raise PolicyError(
                "cpu_linear 'onednn' needs a float32 model on cpu and torch's oneDNN linear op "
                f"(dtype {self.dtype}, device {self.device}, op available: {onednn_available()})"
            )
        if mode == "torch" or not applies or not onednn_available():
            return "torch"
        use_onednn_linear(self.model)
        return "onednn"

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """``(HF name, parameter)`` in ``model.named_parameters()`` order; tied weights appear once."""
        return self.model.named_parameters()

    def es_replica(self, scope, *, master_weights: bool = True, restore_mode: str = "exact"):
        """An in-process :class:`~coevo.backends.hf_replica.HFReplica` over this policy's weights
        (see :meth:`Policy.es_replica`)."""
        from coevo.backends.hf_replica import HFReplica

        return HFReplica(self, scope, master_weights, restore_mode)

    def _prompts(self, conversations: list[list[Message]]) -> list[str]:
        return [
            self.tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
            for conv in conversations
        ]

    def generate(self, conversations: list[list[Message]], params: SamplingParams) -> list[Completion]:
        """Generate one completion per conversation (see :meth:`Policy.generate`).

        Decoding is greedy when ``params.temperature == 0``, else multinomial sampling with temperature,
        top-p and top-k (no repetition penalty). With ``params.seed`` set, row i samples from a generator
        seeded ``request_seed(params.seed, i)`` (:class:`RowSampler`): equal inputs give equal outputs on the
        same device, whatever the batch split, and the global RNG is unchanged. ``completion_tokens`` counts
        the generated tokens including a terminating EOS; ``prompt_tokens`` counts the templated prompt.

        Raises:
            ValueError, TypeError: malformed conversations or params (field named).
            PolicyError: the device ran out of memory (lower ``batch_size``).
        """
        check_conversations(conversations)
        check_sampling_params(params)
        seeds = None if params.seed is None else [request_seed(params.seed, i) for i in range(len(conversations))]
        return self.generate_rows(conversations, params, row_seeds=seeds)

    def generate_rows(
        self,
        conversations: list[list[Message]],
        params: SamplingParams,
        *,
        row_seeds: Sequence[int] | None = None,
        batch_hook: BatchHook | None = None,
        row_groups: Sequence[Hashable] | None = None,
    ) -> list[Completion]:
        """:meth:`generate` with explicit per-row sampling seeds and a hook around each model batch.

        Args:
            conversations: the rows. params: decoding settings (``params.seed`` is not used here).
            row_seeds: one generator seed per row for sampled decoding (None: HF's sampling from the global
                torch RNG); unused when greedy.
            batch_hook: ``batch_hook(start, stop)`` entered around the generation of rows ``[start, stop)``
                (batches of ``batch_size`` rows, in order).
            row_groups: with ``batch_hook``, one tag per row; rows with equal tags run under the same weights (a
                low-rank population's member). A batch's shared token prefix is then prefilled once per tag
                present (one row each, under ``narrow``, see :data:`BatchHook`) and its cache copied to the
                other rows of the tag. Without it, a batch under a hook shares no prefix.

        Raises:
            ValueError, TypeError: malformed input, or ``row_seeds`` of the wrong length.
            PolicyError: out of memory.
        """
        check_conversations(conversations)
        check_sampling_params(params)
        if row_seeds is not None and len(row_seeds) != len(conversations):
            raise ValueError(f"row_seeds has {len(row_seeds)} seeds for {len(conversations)} conversations")
        if row_groups is not None and len(row_groups) != len(conversations):
            raise ValueError(f"row_groups has {len(row_groups)} tags for {len(conversations)} conversations")
        prompts = self._prompts(conversations)
        out: list[Completion] = []
        for start in range(0, len(prompts), self.batch_size):
            stop = min(start + self.batch_size, len(prompts))
            seeds = None if row_seeds is None else row_seeds[start:stop]
            try:
                with batch_hook(start, stop) if batch_hook is not None else nullcontext() as narrow:
                    groups = None if row_groups is None else list(row_groups[start:stop])
                    # a population batch's rows run under different members' weights: a prefix is shared per
                    # member (groups), never across members
                    share = batch_hook is None or (groups is not None and narrow is not None)
                    out.extend(self._generate_batch(prompts[start:stop], params, seeds, share, groups, narrow))
            except torch.OutOfMemoryError as e:
                raise PolicyError(f"out of memory generating a batch of {self.batch_size}; lower batch_size") from e
        return out

    def _generation_config(self, params: SamplingParams, row_sampling: bool = False):
        """HF generation settings; with ``row_sampling`` the sampling is done by :class:`RowSampler` and HF
        decodes greedily over its output."""
        from transformers import GenerationConfig

        sample = params.temperature > 0 and not row_sampling
        return GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=sample,
            temperature=params.temperature if sample else None,
            top_p=params.top_p if sample else None,
            top_k=params.top_k if sample else None,
            eos_token_id=self._stop_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            bos_token_id=self.model.generation_config.bos_token_id,
            stop_strings=list(params.stop) or None,
        )

    def _encode(self, prompts: list[str], share_prefix: bool) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(input_ids, attention_mask, prefix)`` of one batch, both (B, L) on the device, and the length of
        the token prefix all rows share (0 when not shared, see :meth:`_generate_batch`).

        Without a shared prefix: every row left-padded. With one: ``[prefix][left padding][rest of the
        row]``; the padding in the middle is masked out and the position ids (from the attention mask's
        cumulative sum) continue across it, so each row sees exactly its own prompt.
        """
        ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        prefix = shared_prefix_len(ids) if share_prefix and len(ids) > 1 else 0
        prefix = min(prefix, min(len(x) for x in ids) - 1)  # every row keeps >= 1 token to run
        if prefix < self.min_shared_prefix:
            prefix = 0
        width = max(len(x) for x in ids) - prefix
        input_ids = torch.full((len(ids), prefix + width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(ids), prefix + width), dtype=torch.long)
        for i, x in enumerate(ids):
            rest = x[prefix:]
            input_ids[i, :prefix] = torch.tensor(x[:prefix], dtype=torch.long)
            input_ids[i, prefix + width - len(rest) :] = torch.tensor(rest, dtype=torch.long)
            mask[i, :prefix] = 1
            mask[i, prefix + width - len(rest) :] = 1
        return input_ids.to(self.device), mask.to(self.device), prefix

    def _prefix_cache(self, input_ids: torch.Tensor, prefix: int, groups: list | None = None, narrow=None):
        """The KV cache of the shared prefix, computed once on one row and repeated for every row; with
        ``groups`` (and ``narrow``, :data:`BatchHook`), computed on the first row of each group under
        ``narrow`` and copied to that group's rows."""
        from transformers import DynamicCache

        cache = DynamicCache()
        if groups is None:  # one set of weights: every row is of the same group
            groups, narrow = [0] * input_ids.shape[0], lambda rows: nullcontext()
        firsts = list(dict.fromkeys(groups))
        reps = [groups.index(g) for g in firsts]
        with narrow(reps):
            self.model(input_ids=input_ids[reps, :prefix], past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.reorder_cache(torch.tensor([firsts.index(g) for g in groups], dtype=torch.long))
        return cache

    @torch.inference_mode()
    def _generate_batch(
        self,
        prompts: list[str],
        params: SamplingParams,
        seeds: Sequence[int] | None,
        share_prefix: bool = True,
        groups: list | None = None,
        narrow=None,
    ) -> list[Completion]:
        """One model batch. When its rows share a token prefix of at least ``min_shared_prefix`` tokens (the
        system message and task text of an EoH generation, an environment's instructions), the prefix is
        prefilled once and its KV cache repeated for every row, as vLLM's prefix caching does: prefill costs
        one prefix plus the rows' own tokens instead of every row's whole prompt. The rows' outputs are the
        same up to float32 summation order."""
        from transformers import LogitsProcessorList

        t0 = time.perf_counter()
        input_ids, attention_mask, prefix = self._encode(prompts, share_prefix)
        row_sampling = seeds is not None and params.temperature > 0
        processors = LogitsProcessorList([RowSampler(params, seeds, self.device)] if row_sampling else [])
        cache = {"past_key_values": self._prefix_cache(input_ids, prefix, groups, narrow)} if prefix else {}
        seqs = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=self._generation_config(params, row_sampling),
            logits_processor=processors,
            tokenizer=self.tokenizer if params.stop else None,
            **cache,
        )
        duration = time.perf_counter() - t0
        gen = seqs[:, input_ids.shape[1] :].tolist()  # (B, new tokens)
        prompt_lens = attention_mask.sum(dim=1).tolist()
        stop_ids = set(self._stop_ids)
        out = []
        for row, n_prompt in zip(gen, prompt_lens):
            end = next((i for i, tok in enumerate(row) if tok in stop_ids), None)
            text = self.tokenizer.decode(row[:end], skip_special_tokens=True)
            text, stopped = cut_at_stop(text, params.stop)
            if stopped:  # generation halted on the stop string; what follows is padding
                n_completion, reason = (end if end is not None else len(row)), "stop"
            elif end is not None:
                n_completion, reason = end + 1, "stop"
            else:
                n_completion, reason = len(row), "length"
            out.append(
                Completion(
                    text=text,
                    prompt_tokens=int(n_prompt),
                    completion_tokens=n_completion,
                    finish_reason=reason,
                    duration_s=duration,
                )
            )
        return out

    @torch.inference_mode()
    def logprob(
        self, conversations: list[list[Message]], targets: list[str], *, batch_hook: BatchHook | None = None
    ) -> torch.Tensor:
        """Sum log-probability of each target completion given its chat prompt.

        ``log p(target | prompt) = sum_j log softmax(logits_{t_j - 1})[target_j]`` over the target's tokens
        (no EOS appended), the prompt being the chat template with the assistant generation prompt.

        Args:
            conversations: B conversations.
            targets: B completion texts.
            batch_hook: ``batch_hook(start, stop)`` entered around the forward pass of rows ``[start, stop)``.

        Returns:
            float32 CPU tensor of shape (B,), in nats; 0.0 for an empty target.

        Raises:
            TypeError: malformed conversations (field named).
            ValueError: malformed conversations, targets not a list of str, or length mismatch.
        """
        check_conversations(conversations)
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise ValueError("targets must be a list of str")
        if len(targets) != len(conversations):
            raise ValueError(f"targets has {len(targets)} items but conversations has {len(conversations)}")
        prompts = self._prompts(conversations)
        parts = []
        for start in range(0, len(prompts), self.batch_size):
            stop = min(start + self.batch_size, len(prompts))
            with batch_hook(start, stop) if batch_hook is not None else nullcontext():
                parts.append(self._logprob_batch(prompts[start:stop], targets[start:stop]))
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float32)

    def _logprob_batch(self, prompts: list[str], targets: list[str]) -> torch.Tensor:
        tok = self.tokenizer
        seqs, n_target = [], []
        for p, t in zip(prompts, targets):
            p_ids = tok(p, add_special_tokens=False)["input_ids"]
            t_ids = tok(t, add_special_tokens=False)["input_ids"] if t else []
            seqs.append(p_ids + t_ids)
            n_target.append(len(t_ids))
        width = max(len(s) for s in seqs)
        keep = max(n_target) + 1  # logits needed: the last max-target positions (+1 for alignment)
        ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):  # left padding: every target ends at the last column
            ids[i, width - len(s) :] = torch.tensor(s)
            mask[i, width - len(s) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=pos.to(self.device),
            logits_to_keep=keep,
        ).logits.float()  # (B, keep, V); column k predicts token at width - keep + k + 1
        logp = torch.log_softmax(logits[:, :-1], dim=-1)  # (B, keep - 1, V) predicting the last keep-1 tokens
        tgt = ids[:, width - keep + 1 :].to(self.device)  # (B, keep - 1)
        token_lp = logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)  # (B, keep - 1)
        cols = torch.arange(keep - 1, device=self.device)
        in_target = cols.unsqueeze(0) >= (keep - 1 - torch.tensor(n_target, device=self.device)).unsqueeze(1)
        return torch.where(in_target, token_lp, 0.0).sum(dim=1).float().cpu()

    def close(self) -> None:
        """Drop the model and free cached device memory."""
        self.model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
