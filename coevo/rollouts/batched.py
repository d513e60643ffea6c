"""Two families of rollouts, each written once: single-turn cases and multi-turn episodes.

* :class:`SingleTurnRollout`: one conversation per case (an optional system message, then the case's user
  message), every case of a call, and with :meth:`~SingleTurnRollout.run_population` every member's cases, in
  one batched policy pass; one trajectory per case. Context slots: ``system_prompt`` and ``instruction`` (the
  user message's template, ``{prompt}`` standing for the case's question). Used by ``countdown`` and
  ``target_logprob``.
* :class:`EpisodeRollout`: multi-turn episodes driven together, one batched ``generate`` per turn
  (:func:`coevo.envs.multiturn.drive`): a member's episodes, and with :meth:`~EpisodeRollout.run_population`
  every member's episodes, step together; one trajectory per episode. Context slot: ``system_prompt`` (replaces
  the environment's own system message when published). Used by ``sudoku`` and ``react_math``.

A subclass supplies the cases (or episodes) and how an output becomes trajectory fields; the provenance,
keys, timing, context and the member bookkeeping are here.
"""

from __future__ import annotations

import random
import time
from abc import abstractmethod
from typing import Any, ClassVar

from pydantic import Field

from coevo.backends.base import SamplingParams
from coevo.envs.multiturn import TurnEpisode, drive, turns_to_steps
from coevo.rollouts.base import Rollout, RolloutCall, RolloutConfig, RolloutContext, Split
from coevo.types import Trajectory

#: the placeholder of the case's question in an ``instruction`` template
PROMPT_FIELD = "{prompt}"


class SingleTurnConfig(RolloutConfig):
    """Fields of every single-turn rollout: the default context (used while nothing is published)."""

    system_prompt: str = Field("", description="system message before each case ('' = none); context slot")
    instruction: str = Field(
        PROMPT_FIELD, description="user message template, {prompt} = the case's question; context slot"
    )


def user_message(instruction: str, prompt: str) -> str:
    """The user message for a case: ``instruction`` with ``{prompt}`` replaced by the case's question (plain
    replacement, so braces elsewhere are kept); an instruction without ``{prompt}`` is followed by the question
    on a new paragraph."""
    if PROMPT_FIELD in instruction:
        return instruction.replace(PROMPT_FIELD, prompt)
    return f"{instruction}\n\n{prompt}" if instruction else prompt


class SingleTurnRollout(Rollout):
    """One conversation per case, every member's conversations in one batched pass (module docstring)."""

    Config: ClassVar[type[RolloutConfig]] = SingleTurnConfig
    context_slots: ClassVar[dict[str, str]] = {
        "system_prompt": "system message before each case ('' = none)",
        "instruction": "template of each case's user message; {prompt} = the case's question",
    }

    def context_defaults(self) -> dict[str, Any]:
        return {"system_prompt": self.config.system_prompt, "instruction": self.config.instruction}

    @abstractmethod
    def cases(self, split: Split, generation: int, member_index: int = 0) -> list[dict[str, Any]]:
        """The cases of one member's call, each with a ``"prompt"`` (the question)."""

    @abstractmethod
    def answer(self, policy: Any, rows: list[Any], cases: list[dict[str, Any]], split: Split, generation: int):
        """One output per row from one batched pass. ``rows`` are conversations (:meth:`run`) or
        ``(member, conversation)`` pairs of a low-rank population (:meth:`run_population`); ``cases[i]`` is
        row i's case."""

    @abstractmethod
    def case_fields(self, case: dict[str, Any], output: Any, call: RolloutCall, index: int) -> dict[str, Any]:
        """The :class:`~coevo.types.Trajectory` fields of case ``index`` of ``call`` (task_id, steps, reward,
        llm_calls, ...; ``duration_s`` is filled in unless given)."""

    def conversation(self, case: dict[str, Any], context: RolloutContext) -> list[dict[str, str]]:
        """``[system?, user]`` for one case under ``context``."""
        system = context.values.get("system_prompt") or ""
        user = user_message(context.values.get("instruction") or PROMPT_FIELD, case["prompt"])
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]

    def run_call(self, policy, call: RolloutCall):
        """The call's cases as rows of one batched pass."""
        return self._batched(policy, [call], False)[0]

    def run_population(
        self, population, members, *, generation, key_prefixes, split: Split = "train", evolver="es", round_index=0
    ):
        """Every member's cases as rows of one batched pass (``population.generate`` / ``population.logprob``)."""
        calls = self.member_calls(
            members, key_prefixes, generation=generation, split=split, evolver=evolver, round_index=round_index
        )
        return self._batched(population, calls, True)

    def _batched(self, target, calls: list[RolloutCall], paired: bool):
        """One trajectory list per call: every call's cases in one pass of ``target`` (a policy, or with
        ``paired`` a population served ``(member, conversation)`` rows)."""
        if not calls:
            return []
        split, generation = calls[0].split, calls[0].generation
        members = [c.member for c in calls]
        per_member = [self.cases(split, generation, m.index if m is not None else 0) for m in members]
        rows, flat = [], []
        for m, call, cases in zip(members, calls, per_member, strict=True):
            for case in cases:
                conv = self.conversation(case, call.context)
                rows.append((m, conv) if paired else conv)
                flat.append(case)
        t0 = time.time()
        outputs = self.answer(target, rows, flat, split, generation) if rows else []
        dt = (time.time() - t0) / max(1, len(rows))
        result, start = [], 0
        for call, cases in zip(calls, per_member, strict=True):
            result.append(
                [
                    self.case_trajectory(
                        call, i, **{"duration_s": dt, **self.case_fields(case, outputs[start + i], call, i)}
                    )
                    for i, case in enumerate(cases)
                ]
            )
            start += len(cases)
        return result


class EpisodeRollout(Rollout):
    """Multi-turn episodes driven together, one trajectory per episode (module docstring)."""

    context_slots: ClassVar[dict[str, str]] = {
        "system_prompt": "system message of every turn (None = the environment's own)",
    }

    @abstractmethod
    def episodes(self, split: Split, generation: int = 0) -> list[TurnEpisode]:
        """Fresh episodes of one call."""

    def sampling(self, split: Split, generation: int, turn: int) -> SamplingParams:
        """Decoding of one turn from the config's ``max_new_tokens``, ``temperature``, ``top_p``, ``top_k`` (and
        ``stop`` when it has one). The seed depends on (seed, split, generation, turn), not on the member, so every
        member of a generation draws the same random numbers (common random numbers); on the held-out split it
        does not depend on the generation either, so every held-out evaluation (the base model's, the last one,
        another method's on the same rollout) samples with the same random numbers and differs only by the
        weights and the context."""
        cfg = self.config
        salt = 7_919 if split == "test" else 0
        if split == "test":
            generation = 0
        return SamplingParams(
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            stop=tuple(getattr(cfg, "stop", ())),
            seed=(cfg.seed * 1_000_003 + generation * 1_009 + turn + salt) % 2**31,
        )

    def draw(self, pool: list[Any], k: int, generation: int) -> list[Any]:
        """Generation ``generation``'s ``k`` train items from ``pool`` (seeded by the config's ``seed`` and the
        generation: the same for every member)."""
        return [pool[i] for i in random.Random(f"{self.config.seed}/draw/{generation}").sample(range(len(pool)), k)]

    @abstractmethod
    def task_id(self, episode: TurnEpisode) -> str:
        """The task id recorded for an episode."""

    def episode_meta(self, episode: TurnEpisode) -> dict[str, Any]:
        """Extra ``meta`` of an episode's trajectory (default: the episode's summary)."""
        return episode.summary()

    def turn_context(self) -> str:
        """What each turn shows (:func:`coevo.envs.multiturn.drive`): ``"history"`` (default) or ``"board"``."""
        return "history"

    def run_call(self, policy, call: RolloutCall):
        """The call's episodes driven together, one batched ``generate`` per turn."""
        return self._driven(policy, [call], False)[0]

    def run_population(
        self, population, members, *, generation, key_prefixes, split: Split = "train", evolver="es", round_index=0
    ):
        """Every member's episodes driven together: each turn, the unfinished episodes of all members go to
        ``population.generate`` as ``(member, conversation)`` rows of one call. A member's k-th unfinished episode
        samples with the seed it gets when the member runs alone (:class:`coevo.es.replica.Population`), so the
        trajectories equal :meth:`run` of each member's policy up to batch tolerance."""
        calls = self.member_calls(
            members, key_prefixes, generation=generation, split=split, evolver=evolver, round_index=round_index
        )
        return self._driven(population, calls, True)

    def _driven(self, target, calls: list[RolloutCall], paired: bool) -> list[list[Trajectory]]:
        """One trajectory list per call: every call's episodes stepped together through ``target`` (a policy, or
        with ``paired`` a population served ``(member, conversation)`` rows)."""
        if not calls:
            return []
        split, generation = calls[0].split, calls[0].generation
        per_call, owners = [], []
        for call in calls:
            episodes = self.episodes(split, generation)
            system = call.context.values.get("system_prompt")
            for ep in episodes if system else ():
                ep.system = system
            per_call.append(episodes)
            owners += [call.member] * len(episodes)
        flat = [ep for episodes in per_call for ep in episodes]
        t0 = time.time()
        all_turns = drive(
            flat,
            lambda rows, turn: target.generate(rows, self.sampling(split, generation, turn)),
            self.turn_context(),
            owners=owners if paired else None,
        )
        dt = (time.time() - t0) / max(1, len(flat))
        result, start = [], 0
        for call, episodes in zip(calls, per_call, strict=True):
            turns = all_turns[start : start + len(episodes)]
            result.append(
                [self._episode_trajectory(call, i, ep, t, dt) for i, (ep, t) in enumerate(zip(episodes, turns))]
            )
            start += len(episodes)
        return result

    def _episode_trajectory(self, call: RolloutCall, i: int, ep: TurnEpisode, turns: list, dt: float) -> Trajectory:
        """The trajectory of episode ``i`` of ``call`` from its turns (``dt``: wall seconds per episode)."""
        errors = [t.error for t in turns if t.error]
        return self.case_trajectory(
            call,
            i,
            task_id=self.task_id(ep),
            steps=turns_to_steps(turns),
            reward=ep.reward(),
            valid=not errors,
            failure="llm_error" if errors else None,
            failure_detail=errors[0] if errors else None,
            llm_calls=len(turns),
            prompt_tokens=sum(t.prompt_tokens for t in turns),
            completion_tokens=sum(t.completion_tokens for t in turns),
            duration_s=dt,
            meta=self.episode_meta(ep),
        )
