"""Prompts of the web agent: one system prompt per episode, one user message per step.

The layout follows BrowserGym's generic agent (goal, open page, accessibility tree, last action error,
action history) cut down for small models: the user message is rebuilt every step instead of growing a chat,
so the context stays bounded by ``max_obs_chars`` plus a short action history.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SYSTEM_TEMPLATE = """\
You are a web agent. You act on a web page to achieve a goal. You see the page as an accessibility tree: \
each line is one element, and an element you can act on starts with its id in brackets, e.g. `[13] button 'OK'`. \
Actions refer to elements by that id, as a string: click('13').

# Action space
{actions}
{skills}
# Output format
Think briefly if needed, then give exactly ONE action in a code block, for example:
```
{example}
```
Only the actions listed above exist.{answer}"""

#: the output-format line about answers, present only when ``send_msg_to_user`` is in the action set
ANSWER_LINE = ' Use send_msg_to_user("...") to give an answer the goal asks for; it ends the episode.'

SKILLS_TEMPLATE = """
# Skills
Skills are instructions written for tasks like yours. Load one before acting when it fits the goal.
{catalog}

Skill actions (they do not touch the page; the text comes back as feedback):
load_skill("name")
    Examples:
        load_skill("skill-name")
read_skill_file("name", "path")
    Examples:
        read_skill_file("skill-name", "references/details.md")
"""


def system_prompt(action_space: str, skill_catalog: str | None = None, actions: Sequence[str] | None = None) -> str:
    """The system message: action space description (BrowserGym ``HighLevelActionSet.describe``) and, when
    ``skill_catalog`` is a non-empty string, the skill catalog with the two skill actions.

    ``actions`` are the action names the environment executes (default: all of
    :data:`coevo.envs.web.WEB_ACTION_NAMES`): the example and the answer line name only those, so the prompt
    never suggests an action the environment rejects."""
    from coevo.agents.actions import example_action
    from coevo.envs.web import WEB_ACTION_NAMES

    names = list(WEB_ACTION_NAMES if actions is None else actions)
    skills = SKILLS_TEMPLATE.format(catalog=skill_catalog.strip()) if skill_catalog and skill_catalog.strip() else ""
    return SYSTEM_TEMPLATE.format(
        actions=action_space.strip(),
        skills=skills,
        example=example_action(names),
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
    """
    parts = [f"# Goal\n{goal.strip()}", f"# Current page\nURL: {url}\nStep {step} of at most {max_steps}."]
    for name, text in (skill_texts or {}).items():
        parts.append(f"# Loaded skill: {name}\n{text.strip()}")
    parts.append(f"# Accessibility tree\n{_clip(axtree.rstrip(), max_obs_chars)}")
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
