"""Multi-turn text environments: the episode protocol and a batched driver that steps many episodes together.

An episode (:class:`TurnEpisode`) is a task state that takes one model reply per turn and answers with
feedback; the driver (:func:`drive`) renders every unfinished episode's conversation, asks one ``generate``
callable for all of them at once (one batched call per turn, whatever the number of episodes), and steps each
episode with its reply, until all are done. It knows nothing about policies: ``generate`` is
``Policy.generate`` for ES rollouts, or any function with the same shape.

Two context modes (how a turn's conversation is built):

* ``"board"``: the system message and the current observation only (no chat history), as the reference Sudoku
  environment of Agentic ESOpt (docs/references.md §6): the observation re-renders the whole state each turn.
* ``"history"``: the whole episode so far as a chat (system, first observation, reply, observation, ...). This
  is what a token-level RL trainer needs (every turn of the trajectory is one token sequence, see
  :mod:`coevo.rl.grpo`), and what tool-use (ReAct) episodes need to see their earlier calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from coevo.types import Step

Context = Literal["board", "history"]
Message = dict[str, str]


class TurnEpisode(ABC):
    """One multi-turn episode. Subclasses set ``system`` and implement the four methods below."""

    #: instructions shown as the system message of every turn's conversation
    system: str = ""

    @property
    @abstractmethod
    def done(self) -> bool:
        """True when no more turns are taken (solved, failed, or turn limit)."""

    @abstractmethod
    def observation(self) -> str:
        """The user message of the coming turn (for the first turn: the task itself)."""

    @abstractmethod
    def step(self, text: str) -> tuple[str | None, str]:
        """Consume one model reply; returns (parsed action or None, feedback). Must not raise on bad text."""

    @abstractmethod
    def reward(self) -> float:
        """The trajectory's reward (higher is better); terminal tasks return their final reward."""

    def summary(self) -> dict[str, Any]:
        """JSON-able facts about the episode recorded in the trajectory's ``meta``."""
        return {}


@dataclass
class Turn:
    """One turn: what the agent saw, what it wrote, what the environment did with it.

    Attributes:
        observation: the user message of this turn. output: the model's reply text. action: parsed action or
        None. feedback: the environment's answer. prompt_tokens, completion_tokens: token counts of the call.
        error: the backend's error for this reply (the reply is then empty and still counted as a turn).
    """

    observation: str
    output: str
    action: str | None
    feedback: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def conversation(episode: TurnEpisode, turns: Sequence[Turn], context: Context) -> list[Message]:
    """The chat the model answers at the coming turn of ``episode`` (see the module docstring for ``context``)."""
    msgs: list[Message] = [{"role": "system", "content": episode.system}] if episode.system else []
    if context == "history":
        for t in turns:
            msgs += [{"role": "user", "content": t.observation}, {"role": "assistant", "content": t.output}]
    elif context != "board":
        raise ValueError(f"context must be 'board' or 'history', got {context!r}")
    return [*msgs, {"role": "user", "content": episode.observation()}]


def drive(
    episodes: Sequence[TurnEpisode],
    generate: Callable[[list[list[Message]], int], list[Any]],
    context: Context = "board",
    owners: Sequence[Any] | None = None,
) -> list[list[Turn]]:
    """Step every episode to its end, one batched ``generate`` call per turn over all unfinished episodes.

    Args:
        episodes: fresh episodes (stepped in place).
        generate: ``generate(conversations, turn_index) -> completions`` (objects with ``text`` and optionally
            ``prompt_tokens``, ``completion_tokens``, ``error``, as :class:`coevo.backends.base.Completion`), one
            per conversation, in order.
        context: ``"board"`` or ``"history"``.
        owners: optional, one tag per episode (e.g. the low-rank population member whose episode it is); when
            given, ``generate`` receives ``(owner, conversation)`` rows instead of bare conversations, so the
            episodes of several members step together in one batched call.

    Returns:
        The turns of each episode, in episode order.

    Raises:
        ValueError: ``generate`` returned the wrong number of completions, a bad ``context``, or ``owners`` of
            another length than ``episodes``.
    """
    if owners is not None and len(owners) != len(episodes):
        raise ValueError(f"{len(owners)} owners for {len(episodes)} episodes")
    turns: list[list[Turn]] = [[] for _ in episodes]
    index = 0
    while True:
        active = [i for i, ep in enumerate(episodes) if not ep.done]
        if not active:
            return turns
        convs = [conversation(episodes[i], turns[i], context) for i in active]
        outs = generate(convs if owners is None else [(owners[i], c) for i, c in zip(active, convs)], index)
        if len(outs) != len(active):
            raise ValueError(f"generate returned {len(outs)} completions for {len(active)} conversations")
        for i, conv, out in zip(active, convs, outs):
            text = out.text or ""
            action, feedback = episodes[i].step(text)
            turns[i].append(
                Turn(
                    observation=conv[-1]["content"],
                    output=text,
                    action=action,
                    feedback=feedback,
                    prompt_tokens=getattr(out, "prompt_tokens", 0),
                    completion_tokens=getattr(out, "completion_tokens", 0),
                    error=getattr(out, "error", None),
                )
            )
        index += 1


def turns_to_steps(turns: Sequence[Turn]) -> list[Step]:
    """Store steps of an episode's turns (step reward None: the reward is terminal, on the trajectory)."""
    return [
        Step(
            observation=t.observation,
            model_output=t.output,
            action=t.action,
            tool_result=t.feedback,
            meta={
                "prompt_tokens": t.prompt_tokens,
                "completion_tokens": t.completion_tokens,
                **({"error": t.error} if t.error else {}),
                **t.meta,
            },
        )
        for t in turns
    ]
