"""The policy protocol every model backend implements.

A *policy* turns chat conversations into completions. Backends with a parameter space (HF transformers,
vLLM engines) also expose their named parameters so that ES (``coevo.es``) can perturb them in place;
API backends (OpenAI-compatible endpoints) have none and serve context evolution only.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from coevo.es.replica import ESReplica
    from coevo.es.scope import ScopeSpec

from coevo.errors import DeadlineReached, UserError

Message = dict[str, str]  # {"role": "system"|"user"|"assistant", "content": str}

#: weight dtypes of the parameter-space backends (HF, vLLM), by config name
DTYPE_NAMES = ("float32", "bfloat16", "float16")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a config dtype name (one of :data:`DTYPE_NAMES`), shared by the HF and vLLM backends.

    Raises:
        ValueError: an unknown name (the message lists the allowed ones).
    """
    import torch

    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_NAMES)}, got {name!r}")
    return getattr(torch, name)


#: the decode deadline of the running evolver step, in ``time.monotonic()`` seconds (None: none); set by
#: :func:`decode_deadline`, read by every backend (process-wide, so threads a backend starts see it too)
_DEADLINE: float | None = None


@contextmanager
def decode_deadline(at: float | None) -> Iterator[None]:
    """``with decode_deadline(t):`` every backend call inside stops decoding at ``time.monotonic() >= t``.

    The run loop enters it around each evolver step with the wall-clock budget's deadline
    (:meth:`coevo.budget.Budget.deadline`), so a batch that would run past ``budget.max_wall_s`` is cut: the HF
    backend checks it before each model batch and at every decoding step (a ``transformers`` stopping
    criterion), the OpenAI backend bounds each request's timeout by it. A cut call raises
    :class:`~coevo.errors.DeadlineReached` and returns nothing. Nested blocks keep the earlier deadline;
    ``None`` adds none. The previous deadline is restored on exit.
    """
    global _DEADLINE
    old = _DEADLINE
    if at is not None:
        _DEADLINE = float(at) if old is None else min(old, float(at))
    try:
        yield
    finally:
        _DEADLINE = old


def current_deadline() -> float | None:
    """The decode deadline in force (``time.monotonic()`` seconds), or None (:func:`decode_deadline`)."""
    return _DEADLINE


def deadline_passed(deadline: float | None) -> bool:
    """Whether ``deadline`` (``time.monotonic()`` seconds, None = never) has passed."""
    return deadline is not None and time.monotonic() >= deadline


def deadline_reached(
    backend: str, rows: int, *, rows_decoded: int = 0, new_tokens: int = 0, started: float | None = None
):
    """The :class:`~coevo.errors.DeadlineReached` a backend raises when it cuts a call of ``rows`` samples
    (``started``: the call's ``time.monotonic()`` start, for ``decode_s``)."""
    decode_s = 0.0 if started is None else time.monotonic() - started
    return DeadlineReached(
        f"decoding stopped at the wall-clock deadline ({backend}: a call of {rows} samples cut after {decode_s:.1f} s)",
        rows=rows,
        rows_decoded=rows_decoded,
        new_tokens=new_tokens,
        decode_s=decode_s,
        backend=backend,
    )


def request_seed(seed: int, index: int) -> int:
    """Sampling seed of request ``index`` of a batch seeded with ``seed``: ``blake2b("seed:index")``, 63 bits.

    Every backend seeds each request separately with it (vLLM per request, HF with one generator per row), so
    equal prompts in one batch sample independently, a seeded batch is reproducible, and a request's sample
    does not depend on the other requests of its batch or on how the batch is split.
    """
    import hashlib

    digest = hashlib.blake2b(f"{int(seed)}:{int(index)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def terminal_token_ids(tokenizer: Any, eos_token_id: int | Iterable[int] | None) -> list[int]:
    """Token ids that end a completion, as every backend uses them: the model's generation-config EOS id(s)
    (``eos_token_id``: an int, a list or None) plus the tokenizer's EOS and pad ids; sorted, unique."""
    ids: set[int] = {i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None}
    if isinstance(eos_token_id, int):
        ids.add(eos_token_id)
    elif eos_token_id is not None:
        ids.update(int(i) for i in eos_token_id)
    return sorted(ids)


def continues_final_message(conversation: list[Message]) -> bool:
    """Whether a backend continues the conversation's last message instead of opening a new assistant turn: the
    last message is an assistant turn (a *prefilled* answer, e.g. code already opened by
    :func:`coevo.ahd.answer.answer_prefix`). Backends that can (``Policy.can_continue_final_message``) render
    such a conversation without a generation prompt, ending with that message's text, and return only what
    follows it."""
    return bool(conversation) and conversation[-1].get("role") == "assistant"


def render_chat(tokenizer: Any, conversation: list[Message]) -> str:
    """The prompt text of one conversation, as the HF and vLLM backends both tokenise it: the tokenizer's chat
    template with the assistant's generation prompt, or, when the conversation ends with an assistant message
    (:func:`continues_final_message`), rendered to continue that message (``add_generation_prompt=False,
    continue_final_message=True``, as vLLM's ``LLM.chat`` does): the text ends with that message's content."""
    if continues_final_message(conversation):
        return tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=False, continue_final_message=True
        )
    return tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings.

    Attributes:
        max_new_tokens: maximum completion length in tokens (>= 1).
        temperature: 0 means greedy decoding.
        top_p, top_k: nucleus / top-k filtering (top_k 0 = off).
        seed: seed of the sampling RNG; the same seed, prompts and weights give the same completions on
            the same backend and device. ``None`` draws from the backend's global RNG.
        stop: strings at which a completion is cut (the stop string itself is removed).
        regex: constrain decoding so that the completion matches this regular expression (structured outputs);
            None: unconstrained. Only backends with ``Policy.can_constrain`` honour it; the others raise
            :class:`PolicyError`.
    """

    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    regex: str | None = None

    def with_seed(self, seed: int | None) -> SamplingParams:
        return replace(self, seed=seed)


@dataclass
class Completion:
    """One generated completion.

    Attributes:
        text: the completion text (without the prompt).
        prompt_tokens, completion_tokens: token counts.
        finish_reason: "stop" (EOS or stop string), "length" (max_new_tokens reached) or "error".
        error: error message when finish_reason is "error" (the text is then empty).
        duration_s: wall time of the batch this completion was part of (s).
    """

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    error: str | None = None
    duration_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)


class PolicyError(UserError, RuntimeError):
    """A backend could not produce completions (endpoint down, model missing, ...)."""


class PolicyAbilities:
    """What a population (:class:`coevo.es.replica.Population`) can do is what its ``policy`` can: the two
    capability flags of :class:`Policy`, read from ``self.policy`` (False where the policy does not say)."""

    policy: Any

    @property
    def can_continue_final_message(self) -> bool:
        """The policy's (``Policy.can_continue_final_message``): rows ending with an assistant message are continued."""
        return bool(getattr(self.policy, "can_continue_final_message", False))

    @property
    def can_constrain(self) -> bool:
        """The policy's (``Policy.can_constrain``): ``SamplingParams.regex`` is honoured."""
        return bool(getattr(self.policy, "can_constrain", False))


class Policy(ABC):
    """A chat model.

    Subclasses implement :meth:`generate`; parameter-space backends also implement
    :meth:`named_parameters` and set ``has_parameters = True``.
    """

    #: whether ES can perturb this policy's weights
    has_parameters: bool = False
    #: identifier of the loaded model (path or name), recorded in histories and reports
    model_id: str = ""
    #: whether a conversation ending with an assistant message is continued (:func:`continues_final_message`);
    #: callers give such a conversation only to a policy that can
    can_continue_final_message: bool = False
    #: whether ``SamplingParams.regex`` is honoured (constrained decoding)
    can_constrain: bool = False

    @abstractmethod
    def generate(self, conversations: list[list[Message]], params: SamplingParams) -> list[Completion]:
        """Generate one completion per conversation.

        Args:
            conversations: a batch of chat conversations (list of messages each).
            params: decoding settings.

        Returns:
            One :class:`Completion` per conversation, in order.

        Raises:
            PolicyError: when the backend cannot serve the request at all.
        """

    def named_parameters(self) -> Iterator[tuple[str, Any]]:
        """Yield ``(canonical HF name, tensor)`` pairs of the weights ES may perturb.

        Raises:
            TypeError: for backends without a parameter space.
        """
        raise TypeError(f"{type(self).__name__} has no parameter space; ES needs an HF or vLLM policy")

    def es_replica(self, scope: ScopeSpec, *, master_weights: bool = True, restore_mode: str = "exact") -> ESReplica:
        """The ES replica of this policy (:class:`coevo.es.replica.ESReplica`): how the ES evolver perturbs,
        updates, hashes and snapshots its weights.

        Args:
            scope: the tensors ES perturbs and updates.
            master_weights: keep float32 masters of bf16/fp16 tensors (``coevo.es.params``).
            restore_mode: ``"exact"`` or ``"inference"`` (``coevo.es.perturb``).

        Raises:
            TypeError: for backends without a parameter space.
        """
        raise TypeError(f"{type(self).__name__} has no parameter space; ES needs an HF or vLLM policy")

    def close(self) -> None:
        """Release resources (engines, clients)."""
