"""Prompts of the web agent: one system prompt per episode, one user message per step.

The layout follows BrowserGym's generic agent (goal, open page, accessibility tree, last action error,
action history) cut down for small models: the user message is rebuilt every step instead of growing a chat,
so the context stays bounded by ``max_obs_chars`` plus a short action history.

The system prompt teaches from what the episode has, never from fixed examples a small model would copy: the
element line and ids of its examples come from the episode's first page (:class:`PageExample`; BrowserGym's
own examples such as ``b534`` are replaced, :func:`describe_actions`), and the skill actions' examples name a
skill and a file of the attached library.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SYSTEM_TEMPLATE = """\
You are a web agent. You act on a web page to achieve a goal. You see the page as an accessibility tree: \
each line is one element, and an element you can act on starts with its id in brackets{element}. \
Actions refer to elements by that id, as a string{call}.

# Action space
{actions}
{skills}
# Output format
Think briefly if needed, then give exactly ONE action in a code block, for example:
```
{example}
```
Only the actions listed above exist; when an output holds several, only the first valid one runs.{answer}"""

#: the output-format line about answers, present only when ``send_msg_to_user`` is in the action set
ANSWER_LINE = ' Use send_msg_to_user("...") to give an answer the goal asks for; it ends the episode.'

SKILLS_TEMPLATE = """
# Skills
Skills are instructions written for tasks like yours. When a skill's description fits the goal, load it \
with your first action: its text then stays in every prompt of this episode.
{catalog}

Skill actions (they do not touch the page; the result comes back as feedback):
load_skill(name)
    Show a skill's instructions, e.g. load_skill("{name}")
{read}"""

#: the note under the tree of a page where no element is marked clickable
NO_CLICKABLE = "Note: no element on this page is marked clickable; click needs an id from the tree."

#: the read_skill_file entry of :data:`SKILLS_TEMPLATE`, present only when a skill of the library has files
READ_SKILL_FILE = """read_skill_file(name, path)
    Read one file of a skill (loading a skill lists its files), e.g. read_skill_file("{name}", "{path}")
"""

#: accessibility roles of elements that take text or a choice (the id of the fill / press / select examples)
FIELD_ROLES = frozenset({"textbox", "searchbox", "combobox", "spinbutton", "listbox"})

_BID_LINE = re.compile(r"^\s*\[([^\]]+)\] (.*)$")
_FIRST_STRING = re.compile(r"""^(\w+\()(['"])(.*?)\2""")


@dataclass(frozen=True)
class PageExample:
    """What the system prompt shows as examples, taken from the episode's first page.

    Attributes:
        line: the first tree line with an element id, e.g. ``[13] generic, clickable`` (None: the page has none).
        bid: the id examples use: the first clickable element, else the first element with an id (or None).
        field: the id the text-entry examples (``fill``, ``press``, ``select_option``) use: the first
            element whose role is in :data:`FIELD_ROLES`, else ``bid``.
    """

    line: str | None = None
    bid: str | None = None
    field: str | None = None

    @classmethod
    def from_tree(cls, axtree: str, clickable: Sequence[str] = ()) -> PageExample:
        """The example of a flattened tree and its clickable ids (:func:`coevo.envs.web.flatten_observation`)."""
        lines = [m for m in map(_BID_LINE.match, axtree.splitlines()) if m]
        chosen = next((m for m in lines if m.group(1) in set(clickable)), lines[0] if lines else None)
        if chosen is None:
            return cls()
        field = next((m.group(1) for m in lines if m.group(2).split(" ", 1)[0].rstrip(",") in FIELD_ROLES), None)
        return cls(line=f"[{chosen.group(1)}] {chosen.group(2).strip()}", bid=chosen.group(1), field=field)


def describe_actions(action_set: Any, page: PageExample) -> str:
    """The action space for the prompt: each BrowserGym action's signature, description and one example.

    BrowserGym's own examples (``HighLevelActionSet.describe``) name element ids such as ``b534`` that the page
    does not have, and a small model copies them; here an action whose first argument is an element id
    (:data:`coevo.agents.actions.BID_ACTIONS`) gets BrowserGym's first example with that id replaced by
    ``page.bid``, or no example when the page has no id. Other actions keep BrowserGym's first example.
    """
    from coevo.agents.actions import BID_ACTIONS

    out = []
    for name, action in action_set.action_set.items():
        entry = [action.signature, f"    {' '.join(str(action.description).split())}"]
        example = next(iter(action.examples or ()), None)
        if example and name in BID_ACTIONS:
            bid = page.bid if name == "click" else (page.field or page.bid)
            example = _FIRST_STRING.sub(lambda m, b=bid: f"{m.group(1)}{b!r}", example, count=1) if bid else None
        if example:
            entry.append(f"    Example: {example}")
        out.append("\n".join(entry))
    return "\n".join(out)


def system_prompt(
    action_space: str,
    skill_catalog: str | None = None,
    actions: Sequence[str] | None = None,
    *,
    page: PageExample | None = None,
    skill_example: tuple[str, str | None] | None = None,
) -> str:
    """The system message: action space description (:func:`describe_actions`) and, when ``skill_catalog`` is a
    non-empty string, the skill catalog with the two skill actions.

    ``actions`` are the action names the environment executes (default: all of
    :data:`coevo.envs.web.WEB_ACTION_NAMES`): the example and the answer line name only those, so the prompt
    never suggests an action the environment rejects. ``page`` gives the element line and id the examples use
    (from the episode's first page; default none: no id is named). ``skill_example`` is ``(skill name, file
    path or None)`` from the attached library, used in the skill actions' examples (default: the first
    ``- name:`` of the catalog, no file: ``read_skill_file`` is then not offered an example path)."""
    from coevo.agents.actions import example_action
    from coevo.envs.web import WEB_ACTION_NAMES

    page = page or PageExample()
    names = list(WEB_ACTION_NAMES if actions is None else actions)
    skills = ""
    if skill_catalog and skill_catalog.strip():
        if skill_example is None:
            first = re.search(r"^- ([^:\s]+):", skill_catalog, re.MULTILINE)
            skill_example = (first.group(1) if first else "name", None)
        name, path = skill_example
        read = READ_SKILL_FILE.format(name=name, path=path) if path else ""
        skills = SKILLS_TEMPLATE.format(catalog=skill_catalog.strip(), name=name, read=read)
    example = example_action(names, page.bid)
    return SYSTEM_TEMPLATE.format(
        element=f", e.g. `{page.line}`" if page.line else "",
        call=f": {example}" if page.bid and "click" in names else "",
        actions=action_space.strip(),
        skills=skills,
        example=example,
        answer=ANSWER_LINE if "send_msg_to_user" in names else "",
    )


@dataclass(frozen=True)
class HistoryItem:
    """One past step as shown to the model: the action (or ``None`` if unparsable) and its result."""

    action: str | None
    result: str


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [{len(text) - limit} more characters cut]"


def user_message(
    *,
    goal: str,
    url: str,
    axtree: str,
    feedback: str,
    step: int,
    max_steps: int,
    history: Sequence[HistoryItem] = (),
    skill_texts: Mapping[str, str] | None = None,
    max_obs_chars: int = 8000,
    history_len: int = 8,
    clickable: Sequence[str] | None = None,
) -> str:
    """The user message of one step.

    Args:
        goal: the task goal text.
        url: the active page URL.
        axtree: flattened accessibility tree (clipped to ``max_obs_chars`` characters).
        feedback: last action error, malformed-output feedback or skill text ("" when none).
        step: 1-based index of the step about to be taken; max_steps: the episode's step limit.
        history: previous steps (the last ``history_len`` are shown).
        skill_texts: skill name -> text of the skills loaded so far (kept visible for the rest of the
            episode), each shown once as given (the agent cuts them, with a note, when configured to).
        clickable: the ids BrowserGym marks clickable on the page (``obs["clickable"]``); an empty list adds
            a note that the page has no clickable element (``None``: not known, no note).
    """
    parts = [f"# Goal\n{goal.strip()}", f"# Current page\nURL: {url}\nStep {step} of at most {max_steps}."]
    for name, text in (skill_texts or {}).items():
        parts.append(f"# Loaded skill: {name}\n{text.strip()}")
    parts.append(f"# Accessibility tree\n{_clip(axtree.rstrip(), max_obs_chars)}")
    if clickable is not None and not clickable:
        parts.append(NO_CLICKABLE)
    if history:
        shown = list(history)[-history_len:]
        first = len(history) - len(shown) + 1
        lines = [
            f"{first + i}. {h.action if h.action is not None else '(no valid action)'}"
            + (f" -> {_clip(h.result, 200)}" if h.result else "")
            for i, h in enumerate(shown)
        ]
        parts.append("# Previous actions\n" + "\n".join(lines))
    if feedback:
        parts.append(f"# Feedback on your last action\n{_clip(feedback.strip(), max_obs_chars)}")
    parts.append("Give your next action.")
    return "\n\n".join(parts)
