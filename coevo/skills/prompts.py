"""Prompts of the Trace2Skill evolver (analyst, patch, merge, fix) and the parts they are built from.

Trace2Skill (arXiv 2603.25158; docs/references.md §3): (2) one analyst per trajectory - a failure gets its root cause,
proven by a minimal fix, a success its lean solution path - and each analyst writes a few lessons from the
agent's view that never mention the ground truth; (3) each lesson batch proposes a patch against a frozen
snapshot of the skill (:data:`coevo.skills.patch.PATCH_FORMAT_HELP`); (4) patches are merged hierarchically;
(5) a patched skill that violates the spec gets fix rounds.

Ground truth: trajectories may carry reference answers in ``meta`` (WebArena-Lite ``reference_answers``, the
``answer`` of a countdown case, ...). :func:`ground_truth_values` collects them; :func:`redact` replaces every
occurrence in a prompt with :data:`HIDDEN`, and :func:`mentions` finds lessons that quote one anyway, so the
caller can drop them. ``meta`` itself is never shown to the analyst.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coevo.skills.apply import read_skill_files
from coevo.skills.patch import PATCH_FORMAT_HELP, Patch, edit_to_dict
from coevo.skills.patch import _json_objects as json_objects
from coevo.skills.spec import SKILL_FILE
from coevo.types import Trajectory

Message = dict[str, str]

#: ``meta`` keys (at any depth) whose values are reference answers hidden from the analyst.
GROUND_TRUTH_KEYS = (
    "answer",
    "answers",
    "reference_answer",
    "reference_answers",
    "ground_truth",
    "gold",
    "gold_answer",
    "expected",
    "expected_answer",
    "solution",
    "label",
    "reference_url",
    "must_include",
    "exact_match",
    "fuzzy_match",
    "program_html",
    "eval",
)
#: What a hidden value is replaced with in prompts.
HIDDEN = "[hidden]"
#: First line of each role's system prompt (lets logs and test doubles tell the calls apart).
ROLE_TITLES = {
    "analyst": "# Role: trajectory analyst",
    "patch": "# Role: skill patch proposer",
    "merge": "# Role: skill patch merger",
    "fix": "# Role: skill fixer",
}
MAX_LESSONS = 5
MAX_LESSON_CHARS = 600


# ------------------------------------------------------------------------------------------ ground truth
def ground_truth_values(meta: Any, keys: Iterable[str] = GROUND_TRUTH_KEYS) -> list[str]:
    """Every value stored under one of ``keys`` anywhere in ``meta`` (nested dicts and lists), as strings.

    Numbers become their shortest text (``42``, ``2.5``); booleans, ``None`` and empty strings are skipped.
    Returns unique values, longest first (so that :func:`redact` replaces longer values before parts of them).
    """
    wanted = {k.lower() for k in keys}
    found: list[str] = []

    def leaves(x: Any) -> Iterable[str]:
        if isinstance(x, Mapping):
            for v in x.values():
                yield from leaves(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                yield from leaves(v)
        elif isinstance(x, str) and x.strip():
            yield x.strip()
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            yield str(int(x)) if float(x).is_integer() else repr(float(x))

    def walk(x: Any) -> None:
        if isinstance(x, Mapping):
            for k, v in x.items():
                if str(k).lower() in wanted:
                    found.extend(leaves(v))
                else:
                    walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(meta)
    return sorted(dict.fromkeys(found), key=lambda s: (-len(s), s))


def _pattern(value: str) -> re.Pattern[str]:
    """``value`` as a case-insensitive regex that does not match inside a longer word or number."""
    left = r"(?<![\w])" if re.match(r"\w", value[0]) else ""
    right = r"(?![\w])" if re.match(r"\w", value[-1]) else ""
    return re.compile(left + re.escape(value) + right, re.IGNORECASE)


def redact(text: str, hidden: Sequence[str]) -> str:
    """``text`` with every occurrence of each hidden value (case-insensitive, whole words) set to HIDDEN."""
    for value in hidden:
        text = _pattern(value).sub(HIDDEN, text)
    return text


def mentions(text: str, hidden: Sequence[str]) -> list[str]:
    """The hidden values that occur in ``text`` (same matching as :func:`redact`)."""
    return [v for v in hidden if _pattern(v).search(text)]


# ------------------------------------------------------------------------------------------ rendering
def clip(text: str | None, max_chars: int) -> str:
    """``text`` cut to about ``max_chars`` characters, keeping its head and tail."""
    text = text or ""
    if len(text) <= max_chars:
        return text
    half = max(1, max_chars // 2)
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def outcome_of(t: Trajectory, success_threshold: float) -> str:
    """``"success"`` when the trajectory is valid with reward >= ``success_threshold``, else ``"failure"``."""
    ok = t.valid and t.reward is not None and t.reward >= success_threshold
    return "success" if ok else "failure"


def render_trajectory(t: Trajectory, outcome: str, *, max_steps: int = 40, max_chars: int = 1200) -> str:
    """The trajectory as analyst input: task, outcome, reward, failure kind and the steps (observation, agent
    output, action, environment feedback, step reward), long texts clipped, the middle steps omitted past
    ``max_steps``. ``meta`` is not shown. Callers redact the result (:func:`redact`)."""
    reward = "none" if t.reward is None else f"{t.reward:g}"
    lines = [f"Task: {t.task_id or '(no task id)'}", f"Outcome: {outcome.upper()} (reward {reward})"]
    if t.failure:
        lines.append(f"Failure kind: {t.failure}")
    if t.failure_detail:
        lines.append(f"Detail: {clip(t.failure_detail, max_chars)}")
    steps = list(enumerate(t.steps, 1))
    if len(steps) > max_steps:
        head, tail = steps[: max_steps // 2], steps[-(max_steps - max_steps // 2) :]
        steps = [*head, (None, None), *tail]
    lines.append(f"Steps ({len(t.steps)}):")
    for i, s in steps:
        if s is None:
            lines.append(f"[... {len(t.steps) - max_steps} steps omitted ...]")
            continue
        lines.append(f"### Step {i}")
        for label, value in (
            ("Observation", s.observation),
            ("Agent output", s.model_output),
            ("Action", s.action),
            ("Feedback", s.tool_result),
        ):
            if value:
                lines.append(f"{label}:\n{clip(value, max_chars)}")
        if s.reward is not None:
            lines.append(f"Step reward: {s.reward:g}")
    return "\n".join(lines)


def skill_text(skill_dir: Path | str, max_chars: int = 12000) -> str:
    """The skill folder as prompt text: SKILL.md in full (clipped to ``max_chars``), then each other text file
    under its path, clipped so that the whole stays within about ``2 * max_chars``."""
    files = read_skill_files(skill_dir)
    parts = [f"=== {SKILL_FILE} ===\n{clip(files.pop(SKILL_FILE, ''), max_chars)}"]
    per_file = max(200, max_chars // max(1, len(files)))
    for rel, text in files.items():
        parts.append(f"=== {rel} ===\n" + ("(binary file)" if text is None else clip(text, per_file)))
    return "\n\n".join(parts)


# ------------------------------------------------------------------------------------------ analyst
@dataclass
class Analysis:
    """What an analyst found in one trajectory.

    Attributes:
        diagnosis: root cause and minimal fix (failure) or lean solution path (success).
        lessons: 1-5 lessons, written from the agent's view.
        dropped: lessons removed because they quote a hidden reference value.
    """

    diagnosis: str
    lessons: list[str]
    dropped: list[str] = field(default_factory=list)


_ANALYST_SYSTEM = f"""{ROLE_TITLES["analyst"]}
You study one recorded run of an AI agent so that the agent's skill (written instructions it reads before
acting) can be improved. Write lessons from the agent's point of view: what to notice or do in tasks like
this one. Lessons must be general and reusable. Never state an expected answer, a reference solution or a
value shown as {HIDDEN}, and never refer to a grader or to hidden information."""

_FAILURE_TASK = """The run below FAILED.
1. Find the root cause: the earliest decision of the agent that made the run fail.
2. Prove it with a minimal fix: the smallest change of the agent's behaviour that would have avoided it.
3. Write 1-3 lessons that would prevent this failure in similar tasks.
Answer with one JSON object:
{"root_cause": "...", "minimal_fix": "...", "lessons": ["...", "..."]}"""

_SUCCESS_TASK = """The run below SUCCEEDED.
1. Extract the lean solution path: the essential actions, without detours or wasted steps.
2. Write 1-3 lessons that would let the agent reach the goal as directly in similar tasks.
Answer with one JSON object:
{"lean_path": "...", "lessons": ["...", "..."]}"""


def analyst_messages(trajectory_text: str, outcome: str, skill: str) -> list[Message]:
    """The analyst call for one trajectory (``outcome``: "success" or "failure")."""
    task = _SUCCESS_TASK if outcome == "success" else _FAILURE_TASK
    user = f"{task}\n\nThe skill the agent had:\n{skill}\n\nThe run:\n{trajectory_text}"
    return [{"role": "system", "content": _ANALYST_SYSTEM}, {"role": "user", "content": user}]


def _lesson_text(item: Any) -> str:
    if isinstance(item, Mapping):
        item = next((item[k] for k in ("lesson", "text", "content") if isinstance(item.get(k), str)), "")
    return " ".join(item.split())[:MAX_LESSON_CHARS] if isinstance(item, str) else ""


_BULLET_RE = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+(.+)$")


def parse_analysis(text: str) -> Analysis:
    """Read an analyst answer: a JSON object with a ``lessons`` list (fenced or bare, prose around it), or
    failing that, bullet or numbered lines after a line mentioning "lesson".

    Raises:
        ValueError: no lesson could be read (the message says what was found).
    """
    text = (text or "").replace("\x00", "")
    for obj in json_objects(text):
        if isinstance(obj, dict) and isinstance(obj.get("lessons"), list):
            lessons = [s for s in map(_lesson_text, obj["lessons"]) if s][:MAX_LESSONS]
            if not lessons:
                raise ValueError("the JSON 'lessons' list holds no non-empty lesson text")
            parts = [f"{k}: {obj[k]}" for k in ("root_cause", "minimal_fix", "lean_path") if obj.get(k)]
            return Analysis(diagnosis="\n".join(str(p) for p in parts), lessons=lessons)
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "lesson" in line.lower()), None)
    if start is not None:
        bullets = [m.group(1) for line in lines[start + 1 :] if (m := _BULLET_RE.match(line))]
        lessons = [s for s in map(_lesson_text, bullets) if s][:MAX_LESSONS]
        if lessons:
            return Analysis(diagnosis="\n".join(lines[:start]).strip()[:MAX_LESSON_CHARS], lessons=lessons)
    raise ValueError("no lessons found: expected a JSON object with a 'lessons' list of strings")


# ------------------------------------------------------------------------------------------ patch, merge, fix
_PATCH_RULES = """Rules: edits are minimal and additive, each one traced to a lesson; do not repeat what the
skill already says; keep the front-matter name and description unchanged; write instructions to the agent,
never task-specific answers."""

_PATCH_SYSTEM = f"""{ROLE_TITLES["patch"]}
You maintain an Agent Skill: a folder with SKILL.md (YAML front matter, then Markdown instructions) and
optional references/ files. Turn lessons learned from the agent's runs into a patch of the skill.
{_PATCH_RULES}"""

_MERGE_SYSTEM = f"""{ROLE_TITLES["merge"]}
Several patches were proposed independently against the same snapshot of an Agent Skill. Merge them into
one patch: keep one edit where several say the same thing, resolve edits that conflict at the same place
into one edit, and keep every unique insight. Anchors and old texts must still match the snapshot.
{_PATCH_RULES}"""

_FIX_SYSTEM = f"""{ROLE_TITLES["fix"]}
A patched Agent Skill violates the Agent Skills specification. Propose a patch that fixes exactly the listed
violations and changes nothing else (for example: move long details into a new references/ file with
"create" and shorten SKILL.md, or create a file that SKILL.md refers to, or remove the broken reference)."""


def patch_messages(skill: str, lessons: Sequence[tuple[str, str]]) -> list[Message]:
    """The patch proposal for one lesson batch: ``lessons`` are ``(outcome, lesson)`` pairs."""
    listed = "\n".join(f"- ({outcome}) {lesson}" for outcome, lesson in lessons)
    user = (
        f"Skill snapshot (frozen; anchors must be copied from it):\n{skill}\n\n"
        f"Lessons from the agent's runs:\n{listed}\n\n{PATCH_FORMAT_HELP}"
    )
    return [{"role": "system", "content": _PATCH_SYSTEM}, {"role": "user", "content": user}]


def patch_json(patch: Patch) -> str:
    """A patch as the JSON text the prompts show: one edit per line, without default fields (``file``
    SKILL.md, empty ``reason``)."""

    def compact(edit: Any) -> str:
        d = {
            k: v
            for k, v in edit_to_dict(edit).items()
            if not ((k == "file" and v == SKILL_FILE and edit.op != "create") or (k == "reason" and not v))
        }
        return json.dumps({"op": d.pop("op"), **d}, ensure_ascii=False)

    edits = ",\n  ".join(map(compact, patch.edits))
    return (
        f'{{"reasoning": {json.dumps(patch.reasoning, ensure_ascii=False)},\n "edits": [\n  {edits}],\n'
        f' "changelog": {json.dumps(patch.changelog, ensure_ascii=False)}}}'
    )


def merge_messages(skill: str, patches: Sequence[Patch]) -> list[Message]:
    """The merge of one batch of patches into one."""
    listed = "\n\n".join(f"Patch {i}:\n{patch_json(p)}" for i, p in enumerate(patches, 1))
    user = f"Skill snapshot:\n{skill}\n\n{listed}\n\n{PATCH_FORMAT_HELP}"
    return [{"role": "system", "content": _MERGE_SYSTEM}, {"role": "user", "content": user}]


def fix_messages(skill: str, violations: Sequence[str]) -> list[Message]:
    """A fix round: the patched skill and the spec violations it has."""
    listed = "\n".join(f"- {v}" for v in violations)
    user = f"Patched skill:\n{skill}\n\nViolations:\n{listed}\n\n{PATCH_FORMAT_HELP}"
    return [{"role": "system", "content": _FIX_SYSTEM}, {"role": "user", "content": user}]


def messages_text(messages: Sequence[Message]) -> str:
    """A conversation as one text (the ``observation`` of the recorded call)."""
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)
