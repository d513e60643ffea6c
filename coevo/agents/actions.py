"""Extract one action from a model's free-text output.

Rule: the *last* fenced code block (```...```) that contains a recognised action call is the action source;
without one, the last line that contains a recognised call is. The source must hold exactly one recognised
call. Calls are parsed with BrowserGym's own high-level action grammar
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
    """

    name: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()

    @property
    def text(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs]
        return f"{self.name}({', '.join(parts)})"

    @property
    def is_skill(self) -> bool:
        return self.name in SKILL_ACTIONS


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


def example_action(actions: Sequence[str] | None = None) -> str:
    """An example call for feedback messages, taken from ``actions`` (``click('13')`` when click is offered)."""
    names = [a for a in (actions or WEB_ACTION_NAMES) if a != "noop"] or ["noop"]
    return {
        "click": "click('13')",
        "fill": "fill('13', 'text')",
        "goto": "goto('http://example.com')",
        "send_msg_to_user": "send_msg_to_user('answer')",
    }.get("click" if "click" in names else names[0], f"{names[0]}()")


def parse_action(output: str, *, allow_skills: bool = True, actions: Sequence[str] | None = None) -> ParsedAction:
    """Parse the single action in a model output.

    Args:
        output: the raw completion text.
        allow_skills: whether ``load_skill`` / ``read_skill_file`` are recognised.
        actions: the browser action names the environment executes (default :data:`WEB_ACTION_NAMES`); any
            other name is an unknown action, and the feedback lists only these.

    Returns:
        The :class:`ParsedAction`.

    Raises:
        ActionParseError: empty output, no recognised call, several calls in the source, an unknown action
            name, or malformed skill-action arguments. The message says what to write instead.
    """
    example = example_action(actions)
    if not isinstance(output, str) or not output.strip():
        raise ActionParseError(f"empty output: reply with exactly one action, e.g. ```{example}```")
    known = set(WEB_ACTION_NAMES if actions is None else actions) | (set(SKILL_ACTIONS) if allow_skills else set())
    sources = [m.group(1) for m in _FENCE.finditer(output)][::-1] + output.splitlines()[::-1]
    for source in sources:
        calls = [(n, a) for n, a in _calls(source) if n in known]
        if not calls:
            continue
        if len(calls) > 1:
            names = ", ".join(n for n, _ in calls)
            raise ActionParseError(f"give exactly one action per step, got {len(calls)} ({names})")
        return _build(*calls[0])
    unknown = sorted({n for n, _ in _calls(output)} - known)
    allowed = ", ".join(sorted(known))
    if unknown:
        raise ActionParseError(f"unknown action(s) {', '.join(unknown)}; allowed: {allowed}")
    raise ActionParseError(f"no action found; write exactly one call of: {allowed}, e.g. ```{example}```")
