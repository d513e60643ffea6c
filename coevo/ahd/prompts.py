"""Prompts of the EoH search operators, as chat messages.

Evolution of Heuristics (EoH; Liu et al., "Evolution of Heuristics: Towards Efficient Automatic Algorithm
Design Using Large Language Model", ICML 2024, Section 3.3 "Prompt strategies") evolves a population of
heuristics, each a one-sentence *thought* plus the code that implements it, with five prompt strategies in
two families plus an initialisation prompt:

- ``i1`` (initialisation): design a new heuristic from scratch.
- ``e1`` (exploration): a heuristic as different as possible from the ``m`` given parents.
- ``e2`` (exploration): name the backbone idea the ``m`` parents share, then build a new heuristic on it.
- ``m1`` (modification): a modified version of one parent.
- ``m2`` (modification): the same structure as one parent with different parameter settings.
- ``m3`` (modification): one parent with the parts that may overfit the training instances simplified.

Optionally (``reflection`` of the EoH evolver, off by default), a parent operator's prompt carries a short
*reflection*: the model's own one- or two-sentence answer to "why is the better of these two heuristics better?"
(:func:`reflection_messages`), after ReEvo's short-term reflection (Ye et al., "ReEvo: Large Language Models as
Hyper-Heuristics with Reflective Evolution", NeurIPS 2024, Section 3.2: the LLM compares a better and a worse
parent and its verbal hint guides the next crossover or mutation). coevo asks one reflection per EoH generation,
on the population's best and worst heuristic, and gives it to every parent operator of that generation.

Every prompt asks for the answer in one fixed shape (:mod:`coevo.ahd.answer`). In the ``free`` format (EoH's): the
thought in braces on one line, then a fenced Python block defining the problem's function with exactly its
signature (:func:`answer_format`). In the ``prefill`` format the messages end with an assistant turn that already
holds the code fence, the template's imports, the exact ``def`` line and the body's first line ``# idea:``
(:func:`coevo.ahd.answer.answer_prefix`); the model continues it, and the user message asks for that continuation
(:func:`prefill_format`). :func:`free_format_messages` turns such messages back into the free format, for a backend
that cannot continue an assistant message.
The wording is this project's own. As in EoH, the function's inputs and output are described in prose: the
template is shown without its docstring, and parents' code without docstrings and comments
(:func:`coevo.sandbox.extract.strip_docstrings`), and the reply is asked to carry none. Measured on the
embedded 0.5B model with the docstring in the template, about 130 of a sample's ~230 completion tokens were
that docstring copied verbatim, and truncation at 256 tokens was among the commonest failures.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from coevo.ahd.answer import ANSWER_FORMATS, CHANGE_MARKS, IDEA_MARK, answer_prefix
from coevo.sandbox.extract import function_docstring, strip_docstrings

Message = dict[str, str]

#: operator -> (number of parents it needs: 0, 1, or None for the configurable ``m``; one-line purpose)
OPERATORS: dict[str, tuple[int | None, str]] = {
    "i1": (0, "design a new heuristic from scratch"),
    "e1": (None, "design a heuristic totally different from the parents"),
    "e2": (None, "find the parents' common backbone idea, then design a new heuristic on it"),
    "m1": (1, "modify the parent"),
    "m2": (1, "change the parameter settings of the parent"),
    "m3": (1, "simplify the parts of the parent that may overfit"),
}

SYSTEM_PROMPT = (
    "You are an expert in algorithm design and combinatorial optimisation. You write short, correct, "
    "self-contained Python heuristics that use only the standard library and numpy."
)


class ParentHeuristic(Protocol):
    """What a prompt needs of a parent heuristic (e.g. :class:`coevo.evolvers.ahd_common.Individual`)."""

    thought: str
    code: str
    objective: float | None


def parents_needed(operator: str, m: int) -> int:
    """How many parents ``operator`` takes (``m`` for e1/e2, 1 for m1-m3, 0 for i1).

    Raises:
        ValueError: unknown operator (the message lists the known ones) or ``m < 1``.
    """
    if operator not in OPERATORS:
        raise ValueError(f"operator: unknown EoH operator {operator!r}; known: {', '.join(OPERATORS)}")
    if m < 1:
        raise ValueError(f"m (parents for e1/e2) must be >= 1, got {m}")
    need = OPERATORS[operator][0]
    return m if need is None else need


def _signature(spec: dict[str, Any]) -> str:
    return f"{spec['function_name']}({', '.join(spec['inputs'])})"


def task_text(spec: dict[str, Any]) -> str:
    """The problem part shared by all prompts: task, what is optimised, and the function to write.

    Args:
        spec: :meth:`coevo.ahd.problem.HeuristicProblem.prompt_spec` (keys task, function_name, inputs,
            outputs, template, direction, objective).
    """
    goal = "lower" if spec.get("direction", "minimize") == "minimize" else "higher"
    outputs = ", ".join(spec.get("outputs") or []) or "the result"
    template = spec["template"].strip()
    doc = function_docstring(template, spec["function_name"])
    shown = strip_docstrings(template) if doc else None
    described = f"\nWhat it gets and returns:\n{doc.strip()}\n\n" if doc else ""
    return (
        f"Problem: {spec['task']}\n"
        f"Heuristics are scored by the {spec.get('objective') or 'objective'} they achieve "
        f"({goal} is better), averaged over a set of instances.\n"
        f"The heuristic is the Python function `{_signature(spec)}`, which returns {outputs}. "
        f"{described}"
        "A template with the exact signature and a naive body to improve on:\n"
        f"```python\n{shown or template}\n```"
    )


def answer_format(spec: dict[str, Any]) -> str:
    """The reply format every operator asks for: a braced one-sentence thought, then the fenced code."""
    return (
        "Reply in exactly this form:\n"
        "1. One sentence describing the idea of your heuristic, enclosed in braces, e.g. "
        "{Prefer nodes that are close now and keep the remaining nodes compact.}\n"
        f"2. A ```python code block that defines `{_signature(spec)}` with exactly this name and these "
        "arguments, imports what it uses (numpy is allowed), and does not read or write files. "
        "Write no docstring and no comments in the code.\n"
        "Give no explanation besides the sentence in braces and the code."
    )


#: what the model is asked to write on the prefilled first comment line, per mark (:data:`IDEA_MARK`, and the
#: m1 / m2 / m3 marks of :data:`coevo.ahd.answer.CHANGE_MARKS`)
MARK_ASKS: dict[str, str] = {
    IDEA_MARK: "one sentence describing the idea of your heuristic",
    CHANGE_MARKS["m1"]: "one sentence saying what your variant changes in the heuristic above",
    CHANGE_MARKS["m2"]: "the parameters you change and their new values, in one line",
    CHANGE_MARKS["m3"]: "one sentence saying what your simpler version leaves out",
}


def prefill_format(spec: dict[str, Any], mark: str = IDEA_MARK) -> str:
    """The reply format of the ``prefill`` answer: continue the opened code (:func:`coevo.ahd.answer.answer_prefix`),
    the thought as the ``# idea:`` comment (or the change ``mark`` opened instead), then the body, then the closing
    fence.

    Raises:
        KeyError: ``mark`` is not one of :data:`MARK_ASKS`.
    """
    return (
        f"Your reply is already started for you: a ```python code block with the imports and the exact line "
        f"`def {_signature(spec)}:`, then the comment `{mark}`. Continue it: finish that comment with "
        f"{MARK_ASKS[mark]}, then write the function's body (indented; numpy is "
        "allowed; no file access), then close the code block with ``` right after the function. Write no "
        "docstring, no other comments and no explanation."
    )


def _prefix_mark(prefix: str) -> str:
    """The comment mark a prefilled assistant turn ends with (:data:`IDEA_MARK` when it is none of :data:`MARK_ASKS`)."""
    last = prefix.rsplit("\n", 1)[-1].strip()
    return last if last in MARK_ASKS else IDEA_MARK


def free_format_messages(messages: list[Message], spec: dict[str, Any]) -> list[Message]:
    """``messages`` of the ``prefill`` format (:func:`build_messages`) as the ``free`` format's: the assistant turn
    dropped and the user message's reply format replaced by :func:`answer_format`. Messages already in the free
    format are returned unchanged (a copy)."""
    out = [dict(m) for m in messages]
    if not out or out[-1]["role"] != "assistant":
        return out
    ask = prefill_format(spec, _prefix_mark(out.pop()["content"]))
    user = out[-1]
    if user["content"].endswith(ask):
        user["content"] = user["content"][: -len(ask)] + answer_format(spec)
    return out


def _describe(parents: Sequence[ParentHeuristic]) -> str:
    parts = []
    for i, p in enumerate(parents, 1):
        score = "not evaluated" if p.objective is None else f"{p.objective:.6g}"
        code = strip_docstrings(p.code) or p.code.strip()
        parts.append(f"Heuristic {i} (objective {score}):\nIdea: {{{p.thought.strip()}}}\n```python\n{code}\n```")
    return "\n\n".join(parts)


def _instruction(operator: str, n_parents: int) -> str:
    several = "these heuristics" if n_parents > 1 else "this heuristic"
    return {
        "i1": "Invent a new heuristic for this problem.",
        "e1": f"Above are {n_parents} existing heuristic(s). Invent a new heuristic whose idea is entirely "
        f"different from {several}: do not reuse their rules or scoring terms.",
        "e2": f"Above are {n_parents} existing heuristic(s). First work out the core idea that {several} "
        "share, then invent a new heuristic that builds on that core idea but differs from each of them "
        "in form.",
        "m1": "Above is an existing heuristic. Write an improved variant of it: change its rule in a way "
        "you expect to give a better objective.",
        "m2": "Above is an existing heuristic. Keep its structure but identify its numeric parameters "
        "(weights, thresholds, exponents) and give them different settings you expect to work better.",
        "m3": "Above is an existing heuristic. Find the parts of it that may be tuned to the training "
        "instances and would not generalise, and write a simpler version without them.",
    }[operator]


#: the label of the reflection block when the caller names none: what EoH's ``reflection`` option passes on
REFLECTION_LABEL = (
    "A note from comparing a better and a worse heuristic of the current population (use it where it helps):"
)


def reflection_block(reflection: str, label: str | None = None) -> str:
    """The part of a parent operator's prompt that passes on a reflection: ``label`` (default
    :data:`REFLECTION_LABEL`) on its own line, then the reflection."""
    return f"{(label or REFLECTION_LABEL).strip()}\n{reflection.strip()}"


def reflection_messages(spec: dict[str, Any], better: ParentHeuristic, worse: ParentHeuristic) -> list[Message]:
    """The chat messages of one reflection call: why ``better`` beats ``worse`` (ReEvo's short-term reflection,
    Ye et al., NeurIPS 2024, Section 3.2; this project's wording), answered in at most two sentences, no code.

    Raises:
        ValueError: a spec field missing.
    """
    for key in ("task", "function_name", "inputs", "template"):
        if key not in spec:
            raise ValueError(f"spec: missing field {key!r} (use HeuristicProblem.prompt_spec())")
    ask = (
        "Above are two heuristics for this problem; heuristic 1 achieves a better objective than heuristic 2. "
        "In at most two sentences, say what heuristic 1 does that makes it better, as advice for designing an even "
        "better heuristic. Write no code."
    )
    body = "\n\n".join([task_text(spec), _describe([better, worse]), ask])
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": body}]


def build_messages(
    operator: str,
    spec: dict[str, Any],
    parents: Sequence[ParentHeuristic] = (),
    reflection: str | None = None,
    answer: str = "free",
    change_marks: bool = False,
    *,
    reflection_label: str | None = None,
    instruction: str | None = None,
) -> list[Message]:
    """The chat messages of one EoH operator call, or of an operator of the caller's own (``instruction``).

    Args:
        operator: one of :data:`OPERATORS`; with ``instruction``, any name (recorded as the sample's operator).
        spec: the problem's :meth:`~coevo.ahd.problem.HeuristicProblem.prompt_spec`.
        parents: the parent heuristics (none for i1; one for m1-m3; one or more for e1/e2; any number with
            ``instruction``), shown in order as "Heuristic 1", "Heuristic 2", ... with their objectives.
        reflection: a reflection to pass on (:func:`reflection_block`, after the parents); ignored without parents.
        reflection_label: the line that introduces it (default :data:`REFLECTION_LABEL`, "A note from comparing
            a better and a worse heuristic ..."); name what the text is, e.g. "Long-term reflection:".
        instruction: what to write, in place of the operator's own instruction (after the parents and the
            reflection, before the answer format).
        answer: the answer format, one of :data:`coevo.ahd.answer.ANSWER_FORMATS` (module docstring).
        change_marks: under ``prefill``, open m1 / m2 / m3 answers with their change mark
            (:data:`coevo.ahd.answer.CHANGE_MARKS`: the variant's change, not an idea, on the first line) instead
            of ``# idea:``.

    Returns:
        ``[{"role": "system", ...}, {"role": "user", ...}]``, and for ``answer="prefill"`` a third message
        ``{"role": "assistant", "content": answer_prefix(spec)}`` for the model to continue.

    Raises:
        ValueError: unknown operator or answer format, a spec field missing, or a parent count the operator
            cannot take.
    """
    if answer not in ANSWER_FORMATS:
        raise ValueError(f"answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {answer!r}")
    if operator not in OPERATORS and instruction is None:
        raise ValueError(f"operator: unknown EoH operator {operator!r}; known: {', '.join(OPERATORS)}")
    for key in ("task", "function_name", "inputs", "template"):
        if key not in spec:
            raise ValueError(f"spec: missing field {key!r} (use HeuristicProblem.prompt_spec())")
    need = OPERATORS[operator][0] if instruction is None else len(parents)
    if (need == 0 and parents) or (need == 1 and len(parents) != 1) or (need is None and not parents):
        want = "no parents" if need == 0 else "exactly 1 parent" if need == 1 else "at least 1 parent"
        raise ValueError(f"parents: operator {operator} takes {want}, got {len(parents)}")
    blocks = [task_text(spec)]
    if parents:
        blocks.append(_describe(parents))
        if reflection and reflection.strip():
            blocks.append(reflection_block(reflection, reflection_label))
    mark = CHANGE_MARKS.get(operator, IDEA_MARK) if change_marks else IDEA_MARK
    blocks += [
        instruction.strip() if instruction is not None else _instruction(operator, len(parents)),
        prefill_format(spec, mark) if answer == "prefill" else answer_format(spec),
    ]
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(blocks)}]
    if answer == "prefill":
        messages.append({"role": "assistant", "content": answer_prefix(spec, mark)})
    return messages


#: the operator name of a repair call (not one of EoH's :data:`OPERATORS`: it takes a failed answer, not parents)
REPAIR = "repair"


def repair_messages(messages: Sequence[Message], answer: str, error: str, spec: dict[str, Any]) -> list[Message]:
    """The chat messages of one repair call: the failed call's own conversation, its answer as the assistant
    turn, then one user turn with the one-line error and the answer format again. A prefilled call (its messages
    end with the assistant turn :func:`coevo.ahd.answer.answer_prefix` opened) gets a prefilled repair: the failed
    answer (``answer``, the prefix included) replaces that turn and the same opening ends the repair's messages.

    Error feedback in the conversation, as ReEvo's and OpenEvolve's samplers give it (OpenEvolve PR #443 puts
    the previous attempt's error into the next prompt; ReEvo, Ye et al. NeurIPS 2024, re-asks with the
    failure); this project's wording. One repair per failed sample (:mod:`coevo.ahd.sampler`).

    Args:
        messages: the failed call's messages (system + user). answer: the model's answer that failed (str).
        error: the failure in one line (e.g. ``ZeroDivisionError: division by zero (line 2 in f)``).
        spec: the problem's :meth:`~coevo.ahd.problem.HeuristicProblem.prompt_spec`.

    Raises:
        ValueError: empty ``messages`` or a spec without ``function_name`` / ``inputs``.
    """
    if not messages:
        raise ValueError("messages: the failed call's conversation is empty")
    for key in ("function_name", "inputs"):
        if key not in spec:
            raise ValueError(f"spec: missing field {key!r} (use HeuristicProblem.prompt_spec())")
    prefilled = messages[-1]["role"] == "assistant"  # the prefill format: the failed call continued this turn
    base = list(messages[:-1]) if prefilled else list(messages)
    ask = (
        f"Your code failed when it was run: {error.strip()}\n"
        "Fix this error and write the whole corrected heuristic, keeping its idea.\n\n"
        + (prefill_format(spec, _prefix_mark(messages[-1]["content"])) if prefilled else answer_format(spec))
    )
    out = [*base, {"role": "assistant", "content": answer}, {"role": "user", "content": ask}]
    if prefilled:  # the repair is prefilled too: it continues the same opening (fence, imports, def line)
        out.append({"role": "assistant", "content": messages[-1]["content"]})
    return out
