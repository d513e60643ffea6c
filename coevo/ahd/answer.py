"""The answer format of heuristic design: what the model is given to continue, where its answer ends, and how the
answer is read back into the code that is evaluated.

Two formats (the AHD evolvers' setting ``answer_format``):

* ``free`` (EoH's own, Liu et al., ICML 2024, Section 3.3): the model is asked for a one-sentence thought in braces,
  then a fenced Python block defining the function (:func:`coevo.ahd.prompts.answer_format`); the code is found
  anywhere in the answer (:func:`coevo.sandbox.extract.extract_code`).
* ``prefill`` (code first, the signature given): the assistant turn is opened for the model with the code fence,
  the template's imports, the problem function's exact ``def`` line and a first body line ``    # idea:``
  (:func:`answer_prefix`); the model continues that message (HF chat templates rendered with
  ``continue_final_message``, vLLM's ``LLM.chat(..., add_generation_prompt=False, continue_final_message=True)``
  and its OpenAI server's request fields of the same names). A wrong function name, prose before the code or an
  answer without code cannot happen. Measured on the embedded 0.5B model (docs/ahd.md, "Answer format"; field
  notes §8): 16 of 16 TSP answers define the function and compile against 1 of 16 in the free format.

**Where the thought differs from EoH's.** EoH asks for the thought as a sentence in braces *before* the code and
parses the first ``{...}``. Under ``prefill`` the code comes first, so the thought is the text of the comment
line the prefix opens (``# idea: <sentence>``), plus directly following comment lines (a sentence the model
wrapped); braces around it are dropped. It is stored as the individual's thought exactly as EoH's is, and the
e1/e2/m1-m3 prompts show it the same way (``Idea: {...}``).

**Grammar-constrained decoding** (``answer_grammar``, off by default): the continuation is constrained to
:data:`BODY_REGEX` on backends that offer structured outputs (the vLLM engine, vLLM's server).

**The answer ends where the function ends** (:data:`FUNCTION_END_STOPS`, :func:`cut_after_function`): under
``prefill`` everything after the ``def`` line is the body, so the first line that starts at column 0 (the closing
fence, a second ``def``, a test call, prose) ends the answer. The backends stop decoding there (stop strings);
the same cut is applied to the text afterwards, for a backend that ignores stop strings or takes only a few of
them (vLLM's OpenAI server: 4 by default; :func:`answer_stops` orders them so those few end most answers).

**Read back** (:func:`read_answer`): prefix and continuation are glued into the full function, extracted with
:func:`~coevo.sandbox.extract.extract_code` (the same parser as the free format: missing imports added, tabs
fixed) and stripped of docstrings and comments (:func:`~coevo.sandbox.extract.strip_docstrings`: what is
evaluated, stored and shown to later prompts is the code without them; the duplicate key
:func:`coevo.ahd.population.code_key` ignores them too). Bad answers are recorded as invalid samples of their
own failure kind (:data:`ANSWER_FAILURE_KINDS`), never raised:

* ``truncated``: the answer reached the token cap before its function ended and what was written does not
  compile (``syntax`` is kept for code that ended and still does not compile);
* ``no_code``: a thought but no statement in the body (the comment line only, or ``pass`` / ``...``);
* ``empty_body``: neither a thought nor a statement (an empty continuation);
* ``parse``: the free format's answer without the function (cannot happen under ``prefill``).
"""

from __future__ import annotations

import ast
import copy
import re
import string
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from coevo.sandbox.extract import Extraction, extract_code, parse_bounded, strip_docstrings

#: the answer formats (the AHD evolvers' setting ``answer_format``)
ANSWER_FORMATS = ("prefill", "free")

#: failure kinds of an answer that yields no code to evaluate (also in :data:`coevo.types.FAILURE_KINDS`)
ANSWER_FAILURE_KINDS = ("parse", "syntax", "truncated", "no_code", "empty_body")

#: failure kinds of an answer that defines no function at all (a parse retry asks such a call again)
NO_FUNCTION_KINDS = ("parse", "no_code", "empty_body")

#: the body's first line in the prefix; its text is the thought
IDEA_MARK = "# idea:"

#: stop strings that end a prefilled answer at its first line starting at column 0: a newline followed by any
#: printable non-blank ASCII character (the closing fence "\\n```" among them); blank lines inside the body
#: ("\\n\\n", "\\n    ") do not stop it. vLLM checks stop strings on the decoded text, the HF backend through
#: transformers' ``stop_strings``; both remove the stop string from the text.
FUNCTION_END_STOPS: tuple[str, ...] = tuple("\n" + c for c in string.printable if not c.isspace())

#: the first body line of a prefilled m1 / m2 / m3 answer under ``change_marks`` (the AHD evolvers' setting): the
#: model states what its variant changes in the parent instead of an idea, which it tended to copy from the
#: parent's ``Idea: {...}`` together with the parent's code
CHANGE_MARKS: dict[str, str] = {"m1": "# change:", "m2": "# new parameter values:", "m3": "# simplified:"}

#: stop strings of a prefilled answer that starts its first comment line (``# idea:`` or a change mark) again:
#: the answer began on that line, so a second one is the 0.5B model's comment loop (47 of 405 answers repeated
#: ``# idea:``, 29 of them until the token cap, 2026-12-07); stopping there records the same failure
#: (``no_code``, or the body written before it) with fewer tokens
MARK_REPEAT_STOPS: tuple[str, ...] = tuple("\n    " + m for m in dict.fromkeys((IDEA_MARK, *CHANGE_MARKS.values())))

#: the stop strings of a prefilled answer sent first, before the rest of :data:`FUNCTION_END_STOPS`, for a server
#: that takes only a few per request (vLLM's OpenAI server: ``VLLM_MAX_STOP_STRINGS``, default 4; the OpenAI API: 4):
#: the closing fence, a second ``def`` and a comment at column 0 (code after the function: "# Example usage", a
#: helper); :func:`answer_stops` puts the repeated first comment line (:data:`MARK_REPEAT_STOPS`, the comment loop
#: that ran 29 of 405 answers to the token cap) second
FIRST_STOPS: tuple[str, ...] = ("\n`", "\nd", "\n#", "\ni", "\np")

#: the continuation of a prefilled answer as a regular expression, for grammar-constrained decoding (vLLM's
#: structured outputs; the setting ``answer_grammar``, after SynCode's grammar-constrained decoding, Ugare et al.
#: 2024, here only the layout of a function body): the rest of the ``# idea:`` line, then body lines indented by
#: multiples of 4 spaces that are no comment and start no docstring (a line's first character is not ``#``, a
#: quote or white space), or blank lines, then the closing fence. It does not check Python's syntax inside a line.
BODY_REGEX = r"[^\n]*\n(?:(?: {4})+[^ \t\n#\"'][^\n]*\n|\n)*```"

_COLUMN0 = re.compile(r"^\S", re.MULTILINE)


def template_imports(template: str) -> list[str]:
    """The top-level import statements of a problem's template, as source lines (``ast.unparse``), in order."""
    tree = parse_bounded(template)
    return [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]


def def_line(template: str, function_name: str) -> str:
    """The exact signature line of ``function_name`` in ``template``: ``def name(args) -> ret:`` as
    ``ast.unparse`` writes it (decorators and body dropped, annotations and defaults kept).

    Raises:
        ValueError: the template defines no top-level function ``function_name``.
    """
    tree = parse_bounded(template)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function_name:
            bare = copy.copy(node)
            bare.decorator_list, bare.body = [], [ast.Pass()]
            return ast.unparse(bare).split("\n", 1)[0]
    raise ValueError(f"template: no top-level function {function_name!r}")


def answer_prefix(spec: dict[str, Any], mark: str = IDEA_MARK) -> str:
    """The opening of a prefilled answer: the code fence, the template's imports, the exact ``def`` line of the
    problem's function and the body's first line ``    # idea:`` (no trailing newline: the model continues the
    comment with its thought).

    Args:
        spec: :meth:`coevo.ahd.problem.HeuristicProblem.prompt_spec` (``template``, ``function_name``).
        mark: the first body line's comment: :data:`IDEA_MARK`, or one of :data:`CHANGE_MARKS`.

    Raises:
        ValueError: the template does not parse or does not define the function.
    """
    template, name = spec["template"], spec["function_name"]
    imports = template_imports(template)
    head = "\n".join(imports) + "\n\n\n" if imports else ""
    return f"```python\n{head}{def_line(template, name)}\n    {mark}"


def answer_stops(prefixes: Iterable[str], extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The stop strings of a call of prefilled answers, most useful first (a backend that can send only the first
    few sends those and cuts the text at all of them afterwards, :func:`coevo.backends.cut_at_stop`): the closing
    fence, the first comment line of these ``prefixes`` (:func:`answer_prefix`) started again, the rest of
    :data:`FIRST_STOPS`, then ``extra`` (the config's ``sampling.stop``), the rest of :data:`FUNCTION_END_STOPS` and
    of :data:`MARK_REPEAT_STOPS`; no string twice.

    Args:
        prefixes: the prefilled openings of the call's answers (each ends with its mark, e.g. ``    # idea:``).
        extra: further stop strings, kept in their order.
    """
    repeats = [s for s in MARK_REPEAT_STOPS if any(p.endswith(s) for p in prefixes)]
    first = (FIRST_STOPS[0], *repeats, *FIRST_STOPS[1:])
    return tuple(dict.fromkeys((*first, *extra, *FUNCTION_END_STOPS, *MARK_REPEAT_STOPS)))


def cut_after_function(continuation: str) -> tuple[str, bool]:
    """The continuation of a prefilled answer up to its first line that starts at column 0 (after the comment
    line the continuation begins on), and whether anything was cut (the post-hoc form of
    :data:`FUNCTION_END_STOPS`)."""
    first_break = continuation.find("\n")
    if first_break < 0:
        return continuation, False
    m = _COLUMN0.search(continuation, first_break + 1)
    if m is None:
        return continuation, False
    return continuation[: m.start()].rstrip("\n"), True


def prefilled_thought(continuation: str) -> str | None:
    """The thought of a prefilled answer: the rest of the ``# idea:`` line, joined with the comment lines right
    after it while the sentence has not ended (a sentence the model wrapped); braces around it and surrounding
    white space dropped; None when empty."""
    lines = continuation.split("\n")
    text = lines[0].strip()
    for line in lines[1:4]:
        s = line.strip()
        if not s.startswith("#") or text.endswith((".", "!", "?", "}")):
            break
        text = f"{text} {s.lstrip('#').strip()}"
    text = " ".join(text.split())
    if text.startswith("{") and "}" in text:
        text = text[1 : text.index("}")].strip()
    return text or None


def _statements(code: str, function_name: str) -> int:
    """Statements in the body of ``function_name`` that do something (not a docstring, ``pass`` or ``...``)."""
    tree = parse_bounded(code)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function_name:
            return sum(
                1
                for s in node.body
                if not isinstance(s, ast.Pass) and not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
            )
    return 0


def read_answer(text: str, function_name: str, *, prefix: str = "", finish_reason: str = "stop") -> Extraction:
    """The code to evaluate and the thought of one answer (module docstring, "Read back").

    Args:
        text: the model's text; under ``prefill`` only its continuation (without ``prefix``).
        function_name: the problem's function.
        prefix: the prefilled opening the text continues (:func:`answer_prefix`); "" for the free format.
        finish_reason: the completion's (``"length"``: cut at the token cap).

    Returns:
        An :class:`~coevo.sandbox.extract.Extraction`: ``code`` without docstrings and comments, or ``error`` one
        of :data:`ANSWER_FAILURE_KINDS` with a detail. Never raises on bad model output.
    """
    if prefix:
        body, _ = cut_after_function(text)
        thought = prefilled_thought(body)
        if not any(line.strip() and not line.strip().startswith("#") for line in body.split("\n")[1:]):
            kind = "no_code" if thought else "empty_body"
            return Extraction(None, thought, kind, f"the body of {function_name} has no statement")
        ex = replace(extract_code(prefix + body + "\n```\n", function_name), thought=thought)
    else:
        ex = extract_code(text, function_name)
    if ex.code is None:
        if ex.error == "syntax" and finish_reason == "length":
            return replace(ex, error="truncated", detail=f"cut at the token cap: {ex.detail}")
        if ex.error == "parse" and ex.thought:
            return replace(ex, error="no_code", detail="a thought but no function")
        return ex
    if _statements(ex.code, function_name) == 0:
        kind = "no_code" if ex.thought else "empty_body"
        return Extraction(None, ex.thought, kind, f"the body of {function_name} has no statement")
    stripped = strip_docstrings(ex.code)
    return replace(ex, code=(stripped + "\n") if stripped else ex.code)
