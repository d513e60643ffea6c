"""A set of skills offered to an agent with progressive disclosure, and the agent's skill actions.

Progressive disclosure (Agent Skills specification, "How skills work"): at start-up the agent sees only each
skill's name and description (:meth:`SkillLibrary.catalog_prompt`); it loads a skill's body when a task
matches (:meth:`SkillLibrary.activate`), and reads the skill's other files only on demand
(:meth:`SkillLibrary.read_reference`).

Skill actions use the same call syntax as BrowserGym actions, so a web agent emits them in place of a
browser action and the agent loop answers them without touching the page::

    load_skill("web-navigation")
    read_skill_file("web-navigation", "references/action-reference.md")

:meth:`SkillLibrary.handle` returns the text to show the agent for such an action, or ``None`` for any
other action (pass it on to the browser).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from coevo.sandbox.extract import CandidateParseError, parse_bounded
from coevo.skills.spec import Skill, SkillFormatError, find_skill_dirs, load_skill, resolve_inside

LOAD_SKILL = "load_skill"
READ_SKILL_FILE = "read_skill_file"
#: Number of string arguments each skill action takes.
SKILL_ACTIONS = {LOAD_SKILL: 1, READ_SKILL_FILE: 2}
_EXAMPLES = {
    LOAD_SKILL: 'load_skill("skill-name")',
    READ_SKILL_FILE: 'read_skill_file("skill-name", "references/file.md")',
}

SKILL_ACTIONS_HELP = (
    "Skills hold instructions for kinds of tasks. Only their names and descriptions are listed here. "
    "When a task matches a description, load the skill before acting, with the action\n"
    '    load_skill("skill-name")\n'
    "To read a file that a loaded skill mentions, use\n"
    '    read_skill_file("skill-name", "references/file.md")\n'
    "These two actions return text to you and do not change the page; use them as a whole action, "
    "one per step."
)


class SkillAccessError(ValueError):
    """A skill or skill file that cannot be given to the agent (unknown name, missing file, path refused)."""


@dataclass(frozen=True)
class SkillCall:
    """A parsed skill action.

    Attributes:
        action: ``"load_skill"`` or ``"read_skill_file"``.
        name: the skill name.
        path: the relative file path (``read_skill_file`` only).
        error: why the call is malformed (wrong arguments), ``None`` when well formed.
    """

    action: str
    name: str = ""
    path: str | None = None
    error: str | None = None


def parse_skill_call(action: str | None) -> SkillCall | None:
    """Parse an action string as a skill action.

    The whole (stripped) action must be one Python-style call of ``load_skill`` or ``read_skill_file``
    with string-literal arguments, in single or double quotes (a trailing ``;`` or surrounding backticks
    are tolerated).

    Returns:
        ``None`` when the action is not a skill action (it is meant for the browser); otherwise a
        :class:`SkillCall`, whose ``error`` is set when the call is malformed (wrong count or type of
        arguments). Never raises.
    """
    if not action or not isinstance(action, str):
        return None
    text = action.strip().strip("`").strip().rstrip(";").strip()
    if not text.startswith((LOAD_SKILL, READ_SKILL_FILE)):
        return None
    try:
        tree = parse_bounded(text, mode="eval")
    except CandidateParseError:
        fname = READ_SKILL_FILE if text.startswith(READ_SKILL_FILE) else LOAD_SKILL
        return SkillCall(fname, error=f"could not parse {text[:120]!r}; write e.g. {_EXAMPLES[fname]}")
    call = tree.body
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in SKILL_ACTIONS):
        return None
    fname = call.func.id
    args = list(call.args) + [kw.value for kw in call.keywords]
    want = SKILL_ACTIONS[fname]
    if len(args) != want or not all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args):
        return SkillCall(fname, error=f"{fname} takes {want} quoted string argument(s)")
    values = [a.value for a in args]
    return SkillCall(fname, name=values[0], path=values[1] if want == 2 else None)


class SkillLibrary:
    """Skills loaded from folders, offered with progressive disclosure.

    Args:
        dirs: skill folders and/or folders of skill folders (see :func:`coevo.skills.spec.find_skill_dirs`).

    Attributes:
        skills: name -> :class:`~coevo.skills.spec.Skill`, in load order.
        load_errors: folder -> reason, for folders skipped because their SKILL.md is missing or malformed.

    Raises:
        ValueError: two folders define the same skill name.
    """

    def __init__(self, dirs: Iterable[Path | str] | Path | str):
        self.skills: dict[str, Skill] = {}
        self.load_errors: dict[str, str] = {}
        for d in find_skill_dirs(dirs):
            try:
                skill = load_skill(d)
            except SkillFormatError as exc:
                self.load_errors[str(d)] = str(exc)
                continue
            if skill.name in self.skills:
                raise ValueError(
                    f"skill name {skill.name!r} is defined twice: {self.skills[skill.name].path} and {skill.path}"
                )
            self.skills[skill.name] = skill

    def names(self) -> list[str]:
        """Skill names in load order."""
        return list(self.skills)

    def get(self, name: str) -> Skill:
        """The skill called ``name``.

        Raises:
            SkillAccessError: no such skill (the message lists the available names).
        """
        skill = self.skills.get(name)
        if skill is None:
            raise SkillAccessError(f"no skill named {name!r}; available: {', '.join(self.skills) or 'none'}")
        return skill

    def catalog_prompt(self, with_help: bool = False) -> str:
        """System-prompt text listing each skill as ``- name: description`` (never bodies).

        Args:
            with_help: also add a ``## Available skills`` heading and :data:`SKILL_ACTIONS_HELP`, which
                explains the skill actions (leave off when the agent's prompt already explains them).
        """
        lines = [f"- {s.name}: {' '.join(s.description.split())}" for s in self.skills.values()]
        if with_help:
            lines = ["## Available skills", SKILL_ACTIONS_HELP, "", *lines]
        return "\n".join(lines)

    def activate(self, name: str) -> str:
        """The skill's SKILL.md body (front matter removed).

        Raises:
            SkillAccessError: unknown skill.
        """
        return self.get(name).body

    def files(self, name: str) -> list[str]:
        """Relative paths of the skill's files other than SKILL.md."""
        return list(self.get(name).files)

    def read_reference(self, name: str, relpath: str, max_chars: int | None = None) -> str:
        """Read one file of a skill as text.

        Args:
            name: the skill name.
            relpath: path relative to the skill folder, e.g. ``references/forms.md``.
            max_chars: cut the text to this many characters (a note says so), ``None`` for all.

        Raises:
            SkillAccessError: unknown skill, absolute path or one escaping the folder (``..``, symlinks),
                missing file, or a file that is not UTF-8 text.
        """
        skill = self.get(name)
        try:
            target = resolve_inside(skill.path, relpath)
        except ValueError as exc:
            raise SkillAccessError(f"skill {name!r}: {exc}") from exc
        if not target.is_file():
            listing = ", ".join(skill.files) or "none"
            raise SkillAccessError(f"skill {name!r} has no file {relpath!r}; its files: {listing}")
        try:
            text = target.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise SkillAccessError(f"skill {name!r}: {relpath!r} is not a text file") from exc
        if max_chars is not None and len(text) > max_chars:
            text = text[:max_chars] + f"\n[... cut at {max_chars} of {len(text)} characters]"
        return text

    def handle(self, action: str | None, max_chars: int | None = 20_000) -> str | None:
        """Answer a skill action for the agent.

        Returns:
            ``None`` when ``action`` is not a skill action (send it to the browser). Otherwise the text to
            show the agent: the skill body (followed by a list of the skill's files) for ``load_skill``, the
            file content for ``read_skill_file``, or a line starting with ``Error:`` for a malformed call,
            an unknown skill or a refused path. Never raises for bad agent output.
        """
        call = parse_skill_call(action)
        if call is None:
            return None
        if call.error:
            return f"Error: {call.error}"
        try:
            if call.action == LOAD_SKILL:
                body = self.activate(call.name)
                files = self.files(call.name)
                tail = ("\n\nFiles in this skill (read with read_skill_file): " + ", ".join(files)) if files else ""
                return body + tail
            return self.read_reference(call.name, call.path or "", max_chars=max_chars)
        except SkillAccessError as exc:
            return f"Error: {exc}"
