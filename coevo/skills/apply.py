"""Apply a Trace2Skill patch to a copy of a skill folder, then diff and validate the result.

Trace2Skill (arXiv 2603.25158) step 5: edits are applied programmatically to the skill, never in place on the
frozen snapshot the patches were proposed against, and the result is validated against the spec. Each edit
is applied on its own: one that cannot apply (missing or ambiguous anchor, missing section, path outside the
folder, a change to the front-matter ``name``/``description``, no effect) is rejected with the reason while
the others still apply. The operations are described in :mod:`coevo.skills.patch`.
"""

from __future__ import annotations

import difflib
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coevo.skills.markdown import Section, find_sections, split_heading_ref
from coevo.skills.patch import (
    AddSection,
    AppendToSection,
    CreateFile,
    DeleteFile,
    DeleteSection,
    Edit,
    InsertAfter,
    InsertBefore,
    Patch,
    Rejection,
    ReplaceInSection,
    parse_patch,
)
from coevo.skills.spec import SKILL_FILE, SkillFormatError, Tokenizer, parse_skill_md, resolve_inside
from coevo.skills.validate import Violation, validate_skill


class EditRejected(ValueError):
    """An edit that cannot be applied; the message is the reason."""


@dataclass
class ApplyResult:
    """What applying a patch did.

    Attributes:
        skill_dir: the new skill folder (a patched copy; the source folder is untouched).
        applied: edits applied, in order.
        rejected: ``(op, reason)`` pairs for edits (or unparsable patch text) that were not applied.
        diff: unified diff (difflib) of every file, source -> new, with ``a/`` and ``b/`` prefixes.
        changelog: the patch's changelog.
    """

    skill_dir: Path
    applied: list[Edit] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    diff: str = ""
    changelog: str = ""


def _block(content: str) -> list[str]:
    """Content as whole lines, each ending with a newline."""
    return [line + "\n" for line in content.rstrip("\n").split("\n")]


def _find_unique(text: str, needle: str, what: str) -> tuple[int, str]:
    """Offset of the only occurrence of ``needle`` (exact, else stripped of surrounding whitespace)."""
    for cand in dict.fromkeys((needle, needle.strip())):
        if not cand:
            continue
        count = text.count(cand)
        if count == 1:
            return text.index(cand), cand
        if count > 1:
            raise EditRejected(f"{what} occurs {count} times; give a longer, unique {what}")
    raise EditRejected(f"{what} {needle[:80]!r} not found")


def _one_section(lines: list[str], offset: int, ref: str) -> Section:
    """The only section matching ``ref`` in ``lines[offset:]``, with line numbers relative to ``offset``."""
    found = find_sections("".join(lines[offset:]), ref)
    if not found:
        raise EditRejected(f"section {ref!r} not found")
    if len(found) > 1:
        raise EditRejected(
            f"section {ref!r} is ambiguous ({len(found)} headings match); give the level, e.g. '## Title'"
        )
    return found[0]


def _insert_lines(lines: list[str], at: int, block: list[str]) -> list[str]:
    before = lines[:at]
    if before and not before[-1].endswith("\n"):
        before[-1] += "\n"
    return before + block + lines[at:]


def _insert_anchor(lines: list[str], offset: int, edit: InsertAfter | InsertBefore) -> list[str]:
    text = "".join(lines)
    start, anchor = _find_unique(text, edit.anchor, "anchor")
    if isinstance(edit, InsertAfter):
        end = start + len(anchor)
        line = text.count("\n", 0, end) + (0 if anchor.endswith("\n") else 1)
    else:
        line = text.count("\n", 0, start)
    return _insert_lines(lines, line, _block(edit.content))


def _append_to_section(lines: list[str], offset: int, edit: AppendToSection) -> list[str]:
    sec = _one_section(lines, offset, edit.section)
    at = offset + sec.own_end
    while at > offset + sec.heading.end_line and not lines[at - 1].strip():
        at -= 1
    block = _block(edit.content)
    if at == offset + sec.heading.end_line:
        block = ["\n"] + block
    if at < len(lines) and lines[at].strip():
        block = block + ["\n"]
    return _insert_lines(lines, at, block)


def _replace_in_section(lines: list[str], offset: int, edit: ReplaceInSection) -> list[str]:
    sec = _one_section(lines, offset, edit.section)
    a, b = offset + sec.heading.line, offset + sec.end
    segment = "".join(lines[a:b])
    start, old = _find_unique(segment, edit.old, "old text")
    new_segment = segment[:start] + edit.new + segment[start + len(old) :]
    return lines[:a] + new_segment.splitlines(keepends=True) + lines[b:]


def _add_section(lines: list[str], offset: int, edit: AddSection) -> list[str]:
    level, _ = split_heading_ref(edit.heading)
    heading = edit.heading.strip() if level else f"## {edit.heading.strip()}"
    if find_sections("".join(lines[offset:]), heading):
        raise EditRejected(f"section {heading!r} already exists; use append_to_section or replace_in_section")
    at = offset + _one_section(lines, offset, edit.after_section).end if edit.after_section else len(lines)
    block = ["\n", heading + "\n"] + (["\n"] + _block(edit.content) if edit.content.strip() else [])
    if at < len(lines):
        block.append("\n")
    if at > offset and not lines[at - 1].strip():
        block = block[1:]
    return _insert_lines(lines, at, block)


def _delete_section(lines: list[str], offset: int, edit: DeleteSection) -> list[str]:
    sec = _one_section(lines, offset, edit.section)
    return lines[: offset + sec.heading.line] + lines[offset + sec.end :]


_TEXT_OPS: dict[type, Callable[[list[str], int, Any], list[str]]] = {
    InsertAfter: _insert_anchor,
    InsertBefore: _insert_anchor,
    AppendToSection: _append_to_section,
    ReplaceInSection: _replace_in_section,
    AddSection: _add_section,
    DeleteSection: _delete_section,
}


def _read_text(path: Path, rel: str) -> str:
    if not path.is_file():
        raise EditRejected(f"file {rel!r} does not exist in the skill folder")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise EditRejected(f"file {rel!r} is not UTF-8 text") from exc


def _check_front_matter(old_text: str, new_text: str) -> None:
    """Refuse SKILL.md edits that break the front matter or change name / description."""
    try:
        old_fm = parse_skill_md(old_text).front_matter
        new_fm = parse_skill_md(new_text).front_matter
    except SkillFormatError as exc:
        raise EditRejected(f"edit would break the SKILL.md front matter ({exc.message})") from None
    for key in ("name", "description"):
        if old_fm.get(key) != new_fm.get(key):
            raise EditRejected(f"edit would change the front-matter {key!r}, which patches must keep")


def apply_edit(skill_dir: Path, edit: Edit) -> None:
    """Apply one edit in place to ``skill_dir`` (a working copy).

    Raises:
        EditRejected: the edit cannot be applied; the folder is left unchanged.
    """
    try:
        path = resolve_inside(skill_dir, edit.file)
    except ValueError as exc:
        raise EditRejected(str(exc)) from None
    rel = path.relative_to(Path(skill_dir).resolve()).as_posix()
    if isinstance(edit, CreateFile):
        if path.exists():
            raise EditRejected(f"file {rel!r} already exists; edit it instead of creating it")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(edit.content, encoding="utf-8")
        return
    if isinstance(edit, DeleteFile):
        if rel == SKILL_FILE:
            raise EditRejected("SKILL.md cannot be deleted")
        if not path.is_file():
            raise EditRejected(f"file {rel!r} does not exist in the skill folder")
        path.unlink()
        return
    text = _read_text(path, rel)
    offset = parse_skill_md(text).body_line_offset if rel == SKILL_FILE else 0
    new_text = "".join(_TEXT_OPS[type(edit)](text.splitlines(keepends=True), offset, edit))
    if new_text == text:
        raise EditRejected("edit changes nothing")
    if rel == SKILL_FILE:
        _check_front_matter(text, new_text)
    path.write_text(new_text, encoding="utf-8")


def read_skill_files(root: Path | str) -> dict[str, str | None]:
    """Every regular file below ``root`` (SKILL.md included, symlinks skipped): rel POSIX path -> UTF-8 text,
    or ``None`` for a file that is not UTF-8 text."""
    root = Path(root)
    out: dict[str, str | None] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            try:
                out[p.relative_to(root).as_posix()] = p.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                out[p.relative_to(root).as_posix()] = None
    return out


def diff_file_maps(old: dict[str, str | None], new: dict[str, str | None]) -> str:
    """Unified diff (difflib) between two ``rel path -> text`` maps (``None`` = binary), ``a/`` / ``b/``
    prefixes, ``/dev/null`` for added or removed files."""
    parts: list[str] = []
    for rel in sorted(set(old) | set(new)):
        a, b = old.get(rel), new.get(rel)
        if a == b and (rel in old) == (rel in new):
            continue
        if (rel in old and a is None) or (rel in new and b is None):
            parts.append(f"Binary file {rel} differs\n")
            continue
        for line in difflib.unified_diff(
            (a or "").splitlines(keepends=True),
            (b or "").splitlines(keepends=True),
            fromfile=f"a/{rel}" if rel in old else "/dev/null",
            tofile=f"b/{rel}" if rel in new else "/dev/null",
        ):
            parts.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(parts)


def skill_diff(old_dir: Path | str, new_dir: Path | str) -> str:
    """Unified diff of two skill folders (all files; binary files reported as differing)."""
    return diff_file_maps(read_skill_files(old_dir), read_skill_files(new_dir))


def _copy_skill(src: Path, dest: Path | None) -> Path:
    src = src.resolve()
    if dest is None:
        dest = Path(tempfile.mkdtemp(prefix="coevo-skill-")) / src.name
    dest = Path(dest).resolve()
    if dest == src or src in dest.parents:
        raise ValueError(f"dest {dest} must be outside the source skill folder {src} (patches never apply in place)")
    if dest.exists():
        raise ValueError(f"dest {dest} already exists; give a new folder")
    shutil.copytree(src, dest, symlinks=True)
    return dest


def apply_patch(
    skill_dir: Path | str, patch: Patch | str | dict[str, Any], dest: Path | str | None = None
) -> ApplyResult:
    """Apply a patch to a copy of ``skill_dir``.

    Args:
        skill_dir: the frozen source skill folder (never modified).
        patch: a :class:`Patch`, raw LLM output, or a decoded JSON dict (parsed with
            :func:`coevo.skills.patch.parse_patch`; parse rejections are reported in ``rejected``).
        dest: the new skill folder (must not exist); default ``<new temp dir>/<source folder name>`` so that
            the folder name still equals the skill name.

    Raises:
        ValueError: ``skill_dir`` is not a folder, or ``dest`` exists or lies inside ``skill_dir``.
    """
    src = Path(skill_dir)
    if not src.is_dir():
        raise ValueError(f"skill_dir {src} is not a folder")
    rejected: list[Rejection] = []
    if not isinstance(patch, Patch):
        patch, rejected = parse_patch(patch)
    new_dir = _copy_skill(src, Path(dest) if dest is not None else None)
    applied: list[Edit] = []
    for edit in patch.edits:
        try:
            apply_edit(new_dir, edit)
        except (EditRejected, SkillFormatError) as exc:
            rejected.append(Rejection(edit, str(exc)))
        except (OSError, UnicodeError) as exc:
            rejected.append(Rejection(edit, f"file system error: {exc}"))
        else:
            applied.append(edit)
    return ApplyResult(
        skill_dir=new_dir, applied=applied, rejected=rejected, diff=skill_diff(src, new_dir), changelog=patch.changelog
    )


def apply_and_validate(
    skill_dir: Path | str,
    patch: Patch | str | dict[str, Any],
    dest: Path | str | None = None,
    tokenizer: Tokenizer | None = None,
) -> tuple[Path, ApplyResult, list[Violation]]:
    """Apply ``patch`` to a copy of ``skill_dir`` and validate the result against the spec.

    Fix rounds (Trace2Skill allows up to 3) are the evolver's job: feed the violations back to the model and
    apply its fix patch to the returned folder.

    Returns:
        ``(new_dir, result, violations)``; an empty ``violations`` list means the new skill is valid.
    """
    result = apply_patch(skill_dir, patch, dest=dest)
    return result.skill_dir, result, validate_skill(result.skill_dir, tokenizer)
