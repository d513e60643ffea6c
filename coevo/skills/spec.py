"""The Agent Skills folder format: reading, writing and locating skill folders.

A skill is a folder ``<name>/`` holding ``SKILL.md`` (YAML front matter between ``---`` lines, then a
Markdown body) and optional ``scripts/``, ``references/`` and ``assets/`` folders.
Source: the Agent Skills specification (agentskills.io/specification); docs/references.md §3.

This module only parses and writes; :mod:`coevo.skills.validate` checks the rules.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

SKILL_FILE = "SKILL.md"
#: Optional resource folders named by the specification.
RESOURCE_DIRS = ("scripts", "references", "assets")
#: Front-matter keys the specification defines; any other key is a violation.
ALLOWED_KEYS = ("name", "description", "license", "compatibility", "metadata", "allowed-tools")
NAME_MAX_CHARS = 64
#: Lowercase letters and digits in groups joined by single hyphens (no leading/trailing/double hyphen).
NAME_PATTERN = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
DESCRIPTION_MAX_CHARS = 1024
COMPATIBILITY_MAX_CHARS = 500
#: The body must have fewer lines than this.
BODY_LINE_LIMIT = 500
#: The body must have fewer tokens than this (see :func:`estimate_tokens`).
BODY_TOKEN_LIMIT = 5000
#: Characters per token in the tokenizer-free estimate (a common rule of thumb for English BPE vocabularies).
CHARS_PER_TOKEN = 4

_FRONT_MATTER_RE = re.compile(r"\A---[ \t]*\r?\n(.*?)^---[ \t]*(?:\r?\n|\Z)", re.DOTALL | re.MULTILINE)


class SkillFormatError(ValueError):
    """A SKILL.md that cannot be split into front matter and body, or whose front matter is not a YAML map.

    Attributes:
        file: the offending file.
        field: the part at fault (``"SKILL.md"`` or ``"front-matter"``).
    """

    def __init__(self, file: Path | str, field: str, message: str):
        super().__init__(f"{file}: {field}: {message}")
        self.file = str(file)
        self.field = field
        self.message = message


class Tokenizer(Protocol):
    """Anything with a Hugging Face style ``encode(text) -> list[int]``."""

    def encode(self, text: str) -> list[int]: ...


@dataclass
class SkillDocument:
    """A parsed ``SKILL.md``.

    Attributes:
        front_matter: the YAML map, keys as written (``allowed-tools`` keeps its hyphen).
        body: the Markdown after the closing ``---`` line.
        body_line_offset: 0-based line number in the file where the body starts.
    """

    front_matter: dict[str, Any]
    body: str
    body_line_offset: int = 0

    @property
    def name(self) -> str | None:
        value = self.front_matter.get("name")
        return value if isinstance(value, str) else None

    @property
    def description(self) -> str | None:
        value = self.front_matter.get("description")
        return value if isinstance(value, str) else None


@dataclass
class Skill:
    """A skill folder loaded from disk.

    Attributes:
        path: the skill folder.
        document: its parsed SKILL.md.
        files: paths of every other file, relative to ``path``, POSIX style, sorted.
    """

    path: Path
    document: SkillDocument
    files: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.document.name or self.path.name

    @property
    def description(self) -> str:
        return self.document.description or ""

    @property
    def body(self) -> str:
        return self.document.body


def parse_skill_md(text: str, file: Path | str = SKILL_FILE) -> SkillDocument:
    """Split SKILL.md text into front matter and body.

    Args:
        text: the file's content.
        file: used in error messages only.

    Raises:
        SkillFormatError: no front matter block, invalid YAML, or YAML that is not a map.
    """
    text = text.lstrip("\ufeff")
    match = _FRONT_MATTER_RE.match(text)
    if match is None:
        raise SkillFormatError(
            file, "front-matter", "SKILL.md must start with a '---' line, YAML, and a closing '---' line"
        )
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        raise SkillFormatError(file, "front-matter", f"invalid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SkillFormatError(file, "front-matter", f"must be a YAML map, got {type(data).__name__}")
    offset = text.count("\n", 0, match.end()) + (0 if text[: match.end()].endswith("\n") else 1)
    return SkillDocument(
        front_matter={str(k): v for k, v in data.items()}, body=text[match.end() :], body_line_offset=offset
    )


def render_skill_md(front_matter: dict[str, Any], body: str) -> str:
    """Inverse of :func:`parse_skill_md`: ``---`` + YAML (key order kept) + ``---`` + body."""
    yaml_text = yaml.safe_dump(front_matter, sort_keys=False, allow_unicode=True, width=100_000)
    return f"---\n{yaml_text}---\n{body}"


def read_skill_document(skill_dir: Path | str) -> SkillDocument:
    """Read and parse ``skill_dir/SKILL.md``.

    Raises:
        SkillFormatError: SKILL.md is missing, not UTF-8, or malformed.
    """
    path = Path(skill_dir) / SKILL_FILE
    if not path.is_file():
        raise SkillFormatError(path, SKILL_FILE, "missing: a skill folder must contain SKILL.md")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SkillFormatError(path, SKILL_FILE, f"not UTF-8 text: {exc}") from exc
    return parse_skill_md(text, path)


def list_skill_files(skill_dir: Path | str) -> list[str]:
    """Every regular file below ``skill_dir`` except SKILL.md, relative POSIX paths, sorted.

    Hidden entries (names starting with ``.``) and ``__pycache__`` folders are skipped.
    """
    root = Path(skill_dir)
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
            continue
        if p.is_file() and rel.as_posix() != SKILL_FILE:
            out.append(rel.as_posix())
    return out


def load_skill(skill_dir: Path | str) -> Skill:
    """Load a skill folder (no rule checks; see :func:`coevo.skills.validate.validate_skill`).

    Raises:
        SkillFormatError: SKILL.md missing or malformed.
    """
    root = Path(skill_dir)
    return Skill(path=root, document=read_skill_document(root), files=list_skill_files(root))


def write_skill(
    skill_dir: Path | str, front_matter: dict[str, Any], body: str, files: dict[str, str] | None = None
) -> Path:
    """Write a skill folder: SKILL.md plus extra text files.

    Args:
        skill_dir: the folder to write (created if needed; its name should equal ``front_matter["name"]``).
        front_matter: the YAML map.
        body: the Markdown body.
        files: relative path -> text for extra files (``references/x.md`` ...).

    Returns:
        The skill folder.

    Raises:
        ValueError: a relative path escapes the folder.
    """
    root = Path(skill_dir)
    root.mkdir(parents=True, exist_ok=True)
    (root / SKILL_FILE).write_text(render_skill_md(front_matter, body), encoding="utf-8")
    for rel, text in (files or {}).items():
        target = resolve_inside(root, rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return root


def resolve_inside(root: Path | str, relpath: str) -> Path:
    """Resolve ``relpath`` against ``root`` and refuse anything outside it.

    Absolute paths, ``..`` components, empty paths and symlinks that lead out of ``root`` are refused.

    Raises:
        ValueError: naming the path and why it is refused.
    """
    if not isinstance(relpath, str) or not relpath.strip():
        raise ValueError("path must be a non-empty relative path")
    if "\x00" in relpath:
        raise ValueError(f"path {relpath!r} contains a NUL byte")
    pure = Path(relpath)
    if pure.is_absolute() or relpath.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", relpath):
        raise ValueError(f"path {relpath!r} is absolute; give a path relative to the skill folder")
    if ".." in pure.parts or ".." in relpath.replace("\\", "/").split("/"):
        raise ValueError(f"path {relpath!r} escapes the skill folder ('..' is not allowed)")
    base = Path(root).resolve()
    target = (base / pure).resolve()
    if target != base and base not in target.parents:
        raise ValueError(f"path {relpath!r} resolves outside the skill folder")
    return target


def is_skill_dir(path: Path | str) -> bool:
    """Whether ``path`` is a folder holding a SKILL.md."""
    return (Path(path) / SKILL_FILE).is_file()


def find_skill_dirs(paths: Iterable[Path | str] | Path | str) -> Iterator[Path]:
    """Expand each path into skill folders.

    A path that holds SKILL.md is one skill; a folder whose direct subfolders hold SKILL.md is a folder of
    skills (each such subfolder is yielded, sorted by name); any other path is yielded as is, so that the
    caller reports it (for example as a missing SKILL.md).
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    for raw in paths:
        path = Path(raw)
        if is_skill_dir(path):
            yield path
            continue
        children = sorted(c for c in path.iterdir() if c.is_dir() and is_skill_dir(c)) if path.is_dir() else []
        if children:
            yield from children
        else:
            yield path


def estimate_tokens(text: str, tokenizer: Tokenizer | None = None) -> int:
    """Token count of ``text``.

    With a tokenizer: ``len(tokenizer.encode(text))``. Without: ``ceil(len(text) / 4)``, the usual
    four-characters-per-token rule for English text under BPE vocabularies (an estimate, not exact).
    """
    if tokenizer is not None:
        return len(tokenizer.encode(text))
    return math.ceil(len(text) / CHARS_PER_TOKEN)
