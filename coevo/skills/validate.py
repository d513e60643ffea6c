"""Check a skill folder against the Agent Skills specification.

Rules (agentskills.io/specification; docs/references.md §3):

- the folder holds ``SKILL.md`` (that exact case) with YAML front matter; in a folder of skills every
  non-hidden subfolder must be a skill;
- ``name``: 1-64 chars of lowercase ``a-z``, ``0-9`` and single hyphens, no leading/trailing hyphen, equal to
  the folder name;
- ``description``: 1-1024 chars, no ``<`` or ``>``;
- optional ``license`` (string), ``compatibility`` (1-500 chars), ``metadata`` (map of string to string),
  ``allowed-tools`` (space-delimited string); any other key is a violation;
- body fewer than 500 lines and fewer than 5000 tokens (:func:`coevo.skills.spec.estimate_tokens`);
- every relative file the body refers to (:func:`coevo.skills.markdown.referenced_paths`) exists inside the
  folder.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coevo.skills.markdown import referenced_paths
from coevo.skills.spec import (
    ALLOWED_KEYS,
    BODY_LINE_LIMIT,
    BODY_TOKEN_LIMIT,
    CHARS_PER_TOKEN,
    COMPATIBILITY_MAX_CHARS,
    DESCRIPTION_MAX_CHARS,
    NAME_MAX_CHARS,
    NAME_PATTERN,
    SKILL_FILE,
    SkillFormatError,
    Tokenizer,
    estimate_tokens,
    is_skill_dir,
    read_skill_document,
    resolve_inside,
)


@dataclass(frozen=True)
class Violation:
    """One broken rule.

    Attributes:
        file: the file (or folder) at fault, as a path string.
        field: the front-matter key, ``"body"``, ``"front-matter"``, ``"SKILL.md"`` or ``"folder"``.
        message: what is wrong and what to change.
    """

    file: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.message}"


def _check_name(value: Any, folder_name: str | None) -> list[tuple[str, str]]:
    if value is None:
        return [("name", "required field is missing")]
    if not isinstance(value, str):
        return [("name", f"must be a string, got {type(value).__name__}")]
    out = []
    if not 1 <= len(value) <= NAME_MAX_CHARS:
        out.append(("name", f"must be 1-{NAME_MAX_CHARS} characters, got {len(value)}"))
    if value and not NAME_PATTERN.match(value):
        msg = f"{value!r} must use only lowercase a-z, 0-9 and single hyphens, with no leading or trailing hyphen"
        out.append(("name", msg))
    if folder_name is not None and value != folder_name:
        out.append(("name", f"{value!r} must equal the folder name {folder_name!r}"))
    return out


def _check_description(value: Any) -> list[tuple[str, str]]:
    if value is None:
        return [("description", "required field is missing")]
    if not isinstance(value, str):
        return [("description", f"must be a string, got {type(value).__name__}")]
    out = []
    if not value.strip():
        out.append(("description", "must not be empty"))
    if len(value) > DESCRIPTION_MAX_CHARS:
        out.append(("description", f"must be at most {DESCRIPTION_MAX_CHARS} characters, got {len(value)}"))
    if "<" in value or ">" in value:
        out.append(("description", "must not contain '<' or '>'"))
    return out


def _check_optional(fm: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    if "license" in fm and not isinstance(fm["license"], str):
        out.append(("license", f"must be a string, got {type(fm['license']).__name__}"))
    if "compatibility" in fm:
        value = fm["compatibility"]
        if not isinstance(value, str):
            out.append(("compatibility", f"must be a string, got {type(value).__name__}"))
        elif not 1 <= len(value) <= COMPATIBILITY_MAX_CHARS:
            out.append(("compatibility", f"must be 1-{COMPATIBILITY_MAX_CHARS} characters, got {len(value)}"))
    if "metadata" in fm:
        value = fm["metadata"]
        if not isinstance(value, dict):
            out.append(("metadata", f"must be a map of string to string, got {type(value).__name__}"))
        else:
            for k, v in value.items():
                if not isinstance(k, str) or not isinstance(v, str):
                    msg = f"entry {k!r}: {v!r} must map a string to a string (quote numbers and dates)"
                    out.append(("metadata", msg))
    if "allowed-tools" in fm and not isinstance(fm["allowed-tools"], str):
        out.append(("allowed-tools", "must be a space-delimited string of tool names"))
    for key in fm:
        if key not in ALLOWED_KEYS:
            msg = f"unknown front-matter key; allowed keys are {', '.join(ALLOWED_KEYS)} (custom fields go in metadata)"
            out.append((key, msg))
    return out


def validate_front_matter(
    front_matter: dict[str, Any], folder_name: str | None = None, file: str = SKILL_FILE
) -> list[Violation]:
    """Check the front-matter map (name, description, optional keys, unknown keys).

    Args:
        front_matter: the parsed YAML map.
        folder_name: the skill folder's name, which ``name`` must equal (``None`` skips that rule).
        file: path reported in violations.
    """
    problems = _check_name(front_matter.get("name"), folder_name)
    problems += _check_description(front_matter.get("description"))
    problems += _check_optional(front_matter)
    return [Violation(file, f, m) for f, m in problems]


def validate_body(
    body: str, skill_dir: Path | str, file: str = SKILL_FILE, tokenizer: Tokenizer | None = None
) -> list[Violation]:
    """Check body length (lines, tokens) and that referenced relative files exist in ``skill_dir``."""
    out = []
    n_lines = len(body.splitlines())
    if n_lines >= BODY_LINE_LIMIT:
        out.append(
            Violation(
                file, "body", f"has {n_lines} lines; keep it under {BODY_LINE_LIMIT} and move details to references/"
            )
        )
    n_tokens = estimate_tokens(body, tokenizer)
    if n_tokens >= BODY_TOKEN_LIMIT:
        rule = "tokenizer count" if tokenizer is not None else f"estimate len/{CHARS_PER_TOKEN}"
        out.append(
            Violation(
                file,
                "body",
                f"has about {n_tokens} tokens ({rule}); keep it under "
                f"{BODY_TOKEN_LIMIT} and move details to references/",
            )
        )
    for rel in referenced_paths(body):
        try:
            target = resolve_inside(skill_dir, rel)
        except ValueError as exc:
            out.append(Violation(file, "body", f"reference {rel!r} refused: {exc}"))
            continue
        if not target.exists():
            out.append(Violation(file, "body", f"referenced file {rel!r} does not exist in the skill folder"))
    return out


def validate_skill(skill_dir: Path | str, tokenizer: Tokenizer | None = None) -> list[Violation]:
    """Check one skill folder against the specification.

    Args:
        skill_dir: the skill folder.
        tokenizer: optional, for exact body token counts (else ``len/4``).

    Returns:
        The violations found; empty when the skill is valid. Never raises for bad skill content.
    """
    root = Path(skill_dir)
    if not root.is_dir():
        return [Violation(str(root), "folder", "does not exist or is not a folder")]
    file = str(root / SKILL_FILE)
    misnamed = _misnamed_skill_files(root)
    if misnamed and not is_skill_dir(root):
        return [
            Violation(
                file,
                SKILL_FILE,
                f"missing: found {', '.join(misnamed)}; the file must be named {SKILL_FILE} (upper case)",
            )
        ]
    try:
        doc = read_skill_document(root)
    except SkillFormatError as exc:
        return [Violation(exc.file, exc.field, exc.message)]
    out = validate_front_matter(doc.front_matter, folder_name=root.resolve().name, file=file)
    out += validate_body(doc.body, root, file=file, tokenizer=tokenizer)
    return out


def _misnamed_skill_files(folder: Path) -> list[str]:
    """Names of files in ``folder`` that spell SKILL.md in another letter case (e.g. ``skill.md``)."""
    return sorted(
        c.name
        for c in folder.iterdir()
        if c.is_file() and c.name != SKILL_FILE and c.name.lower() == SKILL_FILE.lower()
    )


def _skill_candidates(paths: Iterable[Path | str] | Path | str) -> Iterator[Path]:
    """Expand each path into the folders to validate.

    A folder holding SKILL.md is one skill. A folder of skills -- one whose direct subfolders hold SKILL.md
    or a misnamed ``skill.md`` -- yields ALL its direct subfolders (hidden ones and ``__pycache__``
    excepted), so a subfolder without SKILL.md is reported instead of silently skipped. Any other path is
    yielded as is (and reported, e.g. as a missing SKILL.md).
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    for raw in paths:
        path = Path(raw)
        if is_skill_dir(path) or not path.is_dir():
            yield path
            continue
        subdirs = sorted(
            c for c in path.iterdir() if c.is_dir() and not c.name.startswith(".") and c.name != "__pycache__"
        )
        if any(is_skill_dir(c) or _misnamed_skill_files(c) for c in subdirs):
            yield from subdirs
        else:
            yield path


def validate_paths(
    paths: Iterable[Path | str] | Path | str, tokenizer: Tokenizer | None = None
) -> dict[Path, list[Violation]]:
    """Validate every skill under ``paths`` (each a skill folder or a folder of skills).

    Unlike :func:`coevo.skills.spec.find_skill_dirs` (which loaders use, skipping non-skills), a folder of
    skills has every direct subfolder checked: one without SKILL.md (e.g. with a lower-case ``skill.md``)
    is reported as a ``SKILL.md`` violation. Returns folder -> violations, in order.
    """
    return {d: validate_skill(d, tokenizer) for d in _skill_candidates(paths)}


def attached_skill_dirs(paths: Iterable[Path | str], root: Path | str | None = None) -> list[Path]:
    """The skill folders a user attaches to an agent, checked as ``coevo skills validate`` checks them.

    Args:
        paths: each a skill folder or a folder of skill folders (a library), as given (relative to the
            current folder) or, failing that, relative to ``root``.
        root: second place to look (the repository root for the shipped ``skills/...`` paths).

    Returns:
        The skill folders (absolute), in order, libraries expanded.

    Raises:
        ValueError: a path that is no folder, a folder holding no skill, a skill violating the specification
            (each violation listed, as :func:`validate_paths` reports it), or two folders with one skill name.
    """
    out: list[Path] = []
    problems: list[str] = []
    for raw in paths:
        cands = [Path(raw).expanduser()] + ([Path(root) / raw] if root is not None else [])
        base = next((c for c in cands if c.is_dir()), None)
        if base is None or not (is_skill_dir(base) or any(is_skill_dir(c) for c in base.iterdir() if c.is_dir())):
            raise ValueError(f"skill_dirs: no skill folder (with SKILL.md) or folder of skill folders at {str(raw)!r}")
        for folder, violations in validate_paths(base).items():
            problems += [str(v) for v in violations]
            if is_skill_dir(folder):
                out.append(folder.resolve())
    if problems:
        raise ValueError(
            "skill_dirs: the attached skills violate the Agent Skills specification (as `coevo skills "
            "validate` reports): " + "; ".join(problems)
        )
    names: dict[str, Path] = {}
    for folder in out:
        name = read_skill_document(folder).name
        if name in names and names[name] != folder:
            raise ValueError(f"skill_dirs: skill {name!r} is given twice: {names[name]} and {folder}")
        names[name] = folder
    return list(dict.fromkeys(out))
