"""Skill versions in the trajectory store: snapshot a skill folder as an artifact and write it back out.

A version is a store artifact of kind ``"skill"`` named after the skill. Its content (JSON) is::

    {"format": 1,
     "name": "web-navigation",
     "files": {"SKILL.md": "...", "references/x.md": "..."},   # every UTF-8 file, SKILL.md included
     "binary_files": {"assets/logo.png": "<base64>"},           # any other file
     "diff": "--- a/SKILL.md ...",                             # unified diff from the parent version
     "trajectory_ids": [12, 15]}                               # store ids of the trajectories that caused it

``meta`` holds the caller's ``version_meta`` plus ``sha256`` (of the files) and ``n_files``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coevo.artifacts import SKILL as SKILL_ARTIFACT_KIND
from coevo.skills.apply import diff_file_maps, read_skill_files
from coevo.skills.spec import NAME_PATTERN, SKILL_FILE, read_skill_document, resolve_inside

if TYPE_CHECKING:
    from coevo.store import Artifact, TrajectoryStore

SNAPSHOT_FORMAT = 1


def snapshot_skill(skill_dir: Path | str) -> dict[str, Any]:
    """The folder as a JSON-ready dict ``{"format", "name", "files", "binary_files"}``.

    Raises:
        SkillFormatError: SKILL.md missing or malformed.
        ValueError: the front-matter name is not a usable skill name.
    """
    root = Path(skill_dir)
    name = read_skill_document(root).name
    if not name or not NAME_PATTERN.match(name):
        raise ValueError(f"skill at {root} has front-matter name {name!r}, which is not a valid skill name")
    files: dict[str, str] = {}
    binary: dict[str, str] = {}
    for rel, text in read_skill_files(root).items():
        if text is None:
            binary[rel] = base64.b64encode((root / rel).read_bytes()).decode("ascii")
        else:
            files[rel] = text
    return {"format": SNAPSHOT_FORMAT, "name": name, "files": files, "binary_files": binary}


def _sha256(snapshot: dict[str, Any]) -> str:
    blob = json.dumps([snapshot["files"], snapshot["binary_files"]], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _file_map(content: dict[str, Any]) -> dict[str, str | None]:
    out: dict[str, str | None] = dict(content.get("files") or {})
    out.update({rel: None for rel in content.get("binary_files") or {}})
    return out


def write_skill_version(
    store: TrajectoryStore,
    run_id: str,
    skill_dir: Path | str,
    version_meta: dict[str, Any] | None = None,
    *,
    diff: str | None = None,
    trajectory_ids: Iterable[int] = (),
    parent_version: int | None = None,
    key: str | None = None,
) -> Artifact:
    """Store the skill folder as the next version of artifact ``("skill", <name>)``.

    Args:
        store: the trajectory store.
        run_id: the run writing the version.
        skill_dir: the skill folder (its front-matter name names the artifact).
        version_meta: free JSON metadata (changelog, evolver, round, held-out score, ...).
        diff: unified diff from the parent; ``None`` computes it from the stored ``parent_version`` (or
            against an empty folder when there is no parent).
        trajectory_ids: store ids of the trajectories whose analysis produced this version.
        parent_version: the version this one was derived from (must exist in the store).
        key: idempotency key (a re-run writing the same key gets the stored artifact back).

    Returns:
        The stored :class:`~coevo.store.Artifact`.

    Raises:
        SkillFormatError / ValueError: unreadable skill, bad trajectory ids, missing parent version.
    """
    snap = snapshot_skill(skill_dir)
    ids = list(trajectory_ids)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"trajectory_ids must be integer store ids, got {ids!r}")
    if diff is None:
        parent = None
        if parent_version is not None:
            parent = store.get_artifact(SKILL_ARTIFACT_KIND, snap["name"], parent_version)
            if parent is None:
                raise ValueError(f"parent_version {parent_version} of skill {snap['name']!r} is not in the store")
        diff = diff_file_maps(_file_map(parent.content) if parent else {}, _file_map(snap))
    content = {**snap, "diff": diff, "trajectory_ids": ids}
    meta = {**(version_meta or {}), "sha256": _sha256(snap), "n_files": len(snap["files"]) + len(snap["binary_files"])}
    return store.put_artifact(
        run_id, SKILL_ARTIFACT_KIND, snap["name"], content, key=key, parent_version=parent_version, meta=meta
    )


def materialize(artifact: Artifact | dict[str, Any], parent_dir: Path | str, overwrite: bool = False) -> Path:
    """Write a stored skill version out as the folder ``parent_dir/<name>``.

    Args:
        artifact: a skill artifact, or its ``content`` dict.
        parent_dir: folder to write into (created if needed).
        overwrite: replace an existing ``parent_dir/<name>``; otherwise that is an error.

    Returns:
        The skill folder written.

    Raises:
        ValueError: content without a valid name or SKILL.md, or a file path escaping the folder.
        FileExistsError: the folder exists and ``overwrite`` is False.
    """
    content = artifact if isinstance(artifact, dict) else artifact.content
    name = content.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ValueError(f"artifact content has no valid skill name (got {name!r})")
    files, binary = content.get("files") or {}, content.get("binary_files") or {}
    if SKILL_FILE not in files:
        raise ValueError(f"artifact for skill {name!r} has no {SKILL_FILE}")
    target = Path(parent_dir) / name
    writes = [(resolve_inside(target, rel), text.encode("utf-8")) for rel, text in files.items()]
    writes += [(resolve_inside(target, rel), base64.b64decode(data)) for rel, data in binary.items()]
    if target.exists():
        if not overwrite:
            raise FileExistsError(f"{target} exists; pass overwrite=True to replace it")
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for path, data in writes:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return target
