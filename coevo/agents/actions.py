"""Extract one action from a model's free-text output.

Rule: the recognised action calls of the output's fenced code blocks (```...```), in order; when no block
holds one, the recognised calls of the whole output, in order. The *first valid* one runs (valid: a known
name with well-formed arguments). Code blocks come first because a small model often echoes the prompt's
action descriptions (with their example calls) before its answer. Every other recognised call of the output
(in the blocks, then outside them) is kept in :attr:`ParsedAction.ignored` so that the agent says in its
feedback which one ran and which did not (a small model often writes ``load_skill(...)`` and its next
step in one output; running the last one, as this module did before issue 48, silently dropped the load).
Calls are parsed with BrowserGym's own high-level action grammar
(``browsergym.core.action.parsers.highlevel_action_parser``: Python-like calls with literal arguments), so
what parses here is what the environment executes.

Recognised calls are the browser actions the environment executes (``actions``, default
:data:`coevo.envs.web.WEB_ACTION_NAMES`; the agent passes its env's :attr:`~coevo.envs.web.WebEnv.action_names`,
so prompt, parser, feedback and environment share one action set) and the skill actions
``load_skill("name")`` / ``read_skill_file("name", "path")``, which the agent routes to a skill library
instead of the browser. Anything else raises :class:`ActionParseError` with a message meant to be shown to
the model as feedback.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from coevo.envs.web import WEB_ACTION_NAMES

#: skill actions: name -> number of string arguments
SKILL_ACTIONS: dict[str, int] = {"load_skill": 1, "read_skill_file": 2}
#: browser actions whose first argument is an element id (``bid``), normalised to str
BID_ACTIONS = frozenset({"click", "fill", "select_option", "press"})
#: actions after which the agent ends the episode (the answer has been given / the task declared infeasible)
STOP_ACTIONS = frozenset({"send_msg_to_user", "report_infeasible"})

_FENCE = re.compile(r"```[^\n`]*\n?(.*?)```", re.DOTALL)


class ActionParseError(ValueError):
    """No single valid action could be read from the model output (message = feedback for the model)."""


@dataclass(frozen=True)
class ParsedAction:
    """One parsed action call.

    Attributes:
        name: function name (``click``, ``load_skill``, ...).
        args: positional arguments (Python literals); keyword arguments are kept in ``kwargs``.
        kwargs: keyword arguments.
        text: canonical call string, e.g. ``click('13')``, as sent to the environment.
        ignored: the other calls of the output (canonical text, or the raw name for a malformed one), in order;
            empty when the output held one call.
    """

    name: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()
    ignored: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs]
        return f"{self.name}({', '.join(parts)})"

    @property
    def is_skill(self) -> bool:
        return self.name in SKILL_ACTIONS

    def ignored_note(self) -> str:
        """Feedback line naming the action that ran and the ignored ones ("" when the output held one call)."""
        if not self.ignored:
            return ""
        n = len(self.ignored) + 1
        return (
            f"Your output held {n} actions; only {self.text} ran (one action per step). "
            f"Not run: {', '.join(self.ignored)}."
        )


def _calls(text: str) -> list[tuple[str, list[Any]]]:
    """All call-like expressions in ``text`` as ``(name, args)``; unparsable text yields none."""
    import pyparsing as pp
    from browsergym.core.action.parsers import highlevel_action_parser

    try:
        found = highlevel_action_parser.search_string(text.replace("\x00", ""))
    except (pp.ParseBaseException, ValueError, SyntaxError, RecursionError):
        return []
    return [(name, list(args)) for name, args in itertools.chain.from_iterable(found.as_list())]


def _build(name: str, raw_args: list[Any]) -> ParsedAction:
    from browsergym.core.action.parsers import NamedArgument

    args = [a for a in raw_args if not isinstance(a, NamedArgument)]
    kwargs = tuple((a.name, a.value) for a in raw_args if isinstance(a, NamedArgument))
    if name in SKILL_ACTIONS:
        want = SKILL_ACTIONS[name]
        if kwargs or len(args) != want or not all(isinstance(a, str) and a for a in args):
            usage = 'load_skill("name")' if name == "load_skill" else 'read_skill_file("name", "path")'
            raise ActionParseError(f"{name} takes {want} non-empty string argument(s): {usage}")
    if name in BID_ACTIONS and args and isinstance(args[0], int) and not isinstance(args[0], bool):
        args[0] = str(args[0])
    return ParsedAction(name=name, args=tuple(args), kwargs=kwargs)


def _text(name: str, args: list[Any]) -> str:
    """Canonical text of a recognised call, or ``name(...) (malformed)`` when its arguments are not valid."""
    try:
        return _build(name, args).text
    except ActionParseError:
        return f"{name}(...) (malformed)"


def example_action(actions: Sequence[str] | None = None, bid: str | None = None) -> str:
    """An example call for prompts and feedback, taken from ``actions``: ``click('<bid>')`` when click is offered,
    with ``bid`` an element id of the current page (without one: a placeholder naming where ids come from, never
    an id the page may not have)."""
    names = [a for a in (actions or WEB_ACTION_NAMES) if a != "noop"] or ["noop"]
    target = repr(str(bid)) if bid else "'<id from the tree>'"
    return {
        "click": f"click({target})",
        "fill": f"fill({target}, 'text')",
        "goto": "goto('http://example.com')",
        "send_msg_to_user": "send_msg_to_user('answer')",
    }.get("click" if "click" in names else names[0], f"{names[0]}()")


def parse_action(
    output: str, *, allow_skills: bool = True, actions: Sequence[str] | None = None, bid: str | None = None
) -> ParsedAction:
    """Parse the action to run from a model output (module docstring: the first valid call).

    Args:
        output: the raw completion text.
        allow_skills: whether ``load_skill`` / ``read_skill_file`` are recognised.
        actions: the browser action names the environment executes (default :data:`WEB_ACTION_NAMES`); any
            other name is an unknown action, and the feedback lists only these.
        bid: an element id of the current page for the example in error messages (see :func:`example_action`).

    Returns:
        The :class:`ParsedAction` to run; its ``ignored`` lists the output's other calls.

    Raises:
        ActionParseError: empty output, no recognised call, an unknown action name, or only malformed calls
            (e.g. skill actions without their string arguments). The message says what to write instead.
    """
    example = example_action(actions, bid)
    if not isinstance(output, str) or not output.strip():
        raise ActionParseError(f"empty output: reply with exactly one action, e.g. ```{example}```")
    known = set(WEB_ACTION_NAMES if actions is None else actions) | (set(SKILL_ACTIONS) if allow_skills else set())
    fenced = [c for m in _FENCE.finditer(output) for c in _calls(m.group(1)) if c[0] in known]
    calls = fenced or [c for line in output.splitlines() for c in _calls(line) if c[0] in known]
    chosen: ParsedAction | None = None
    first_error: ActionParseError | None = None
    ignored: list[str] = []
    for name, args in calls:
        try:
            built = _build(name, args)
        except ActionParseError as exc:
            first_error = first_error or exc
            ignored.append(f"{name}(...) (malformed)")
            continue
        if chosen is None:
            chosen = built
        else:
            ignored.append(built.text)
    if chosen is not None:
        if fenced:  # calls outside the code blocks did not run either: name them too
            outside = _FENCE.sub("\n", output)
            ignored += [_text(n, a) for line in outside.splitlines() for n, a in _calls(line) if n in known]
        return dataclasses.replace(chosen, ignored=tuple(ignored))
    if first_error is not None:
        raise first_error
    unknown = sorted({n for n, _ in _calls(output)} - known)
    allowed = ", ".join(sorted(known))
    if unknown:
        raise ActionParseError(f"unknown action(s) {', '.join(unknown)}; allowed: {allowed}")
    raise ActionParseError(f"no action found; write exactly one call of: {allowed}, e.g. ```{example}```")
