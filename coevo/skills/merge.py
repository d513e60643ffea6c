"""Hierarchical merging of skill patches (Trace2Skill, arXiv 2603.25158, step 4).

Patches proposed from separate lesson batches are merged ``batch_size`` at a time, level by level, for at
most ``max_depth`` levels (paper defaults 5 and 5); the last allowed level merges whatever remains in one
call. Each merge is done by a *merger*, ``Callable[[list[Patch]], Patch]``: the Trace2Skill evolver plugs in
an LLM merger; the default here is programmatic:

- identical edits (same op and fields) are kept once;
- two different edits from different patches on the same target conflict, and the first is kept: the same
  anchor (insert ops), the same section (section ops, matched by normalised title), or the same file
  (``create`` / ``delete_file``; also any edit of a file that an earlier kept edit deletes, and a
  ``delete_file`` of a file an earlier kept edit touches); each dropped edit is recorded as a
  :class:`Conflict`;
- reasoning and changelog texts are concatenated without repeated lines.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from coevo.skills.patch import CreateFile, DeleteFile, Edit, Patch, edit_to_dict

Merger = Callable[[list[Patch]], Patch]
DEFAULT_BATCH_SIZE = 5
DEFAULT_MAX_DEPTH = 5


@dataclass(frozen=True)
class Conflict:
    """An edit dropped because an earlier kept edit targets the same place.

    Attributes:
        kept: the earlier edit that was kept.
        dropped: the later edit that was dropped.
        target: ``"file:kind:key"`` naming the shared target.
    """

    kept: Edit
    dropped: Edit
    target: str


@dataclass
class MergeResult:
    """Outcome of :func:`merge_patches`.

    Attributes:
        patch: the single merged patch.
        conflicts: conflicts recorded by the programmatic merger (empty with a custom merger).
        levels: number of merge levels run (0 when there was at most one patch).
        merges: number of merger calls.
    """

    patch: Patch
    conflicts: list[Conflict] = field(default_factory=list)
    levels: int = 0
    merges: int = 0


def _join_unique(texts: Sequence[str]) -> str:
    lines: dict[str, None] = {}
    for t in texts:
        for line in t.splitlines():
            if line.strip():
                lines.setdefault(line.rstrip(), None)
    return "\n".join(lines)


def programmatic_merge(patches: list[Patch], conflicts: list[Conflict] | None = None) -> Patch:
    """Merge patches without a model: deduplicate identical edits; of conflicting edits from different
    patches keep the first (rules in the module docstring).

    Args:
        patches: patches in priority order (earlier wins a conflict).
        conflicts: if given, dropped edits are appended to it.

    Returns:
        One patch with the surviving edits in their original order.
    """
    kept: list[Edit] = []
    seen: set[str] = set()
    # Each index maps to (patch position, edit); only edits from different patches conflict, so a patch
    # may still append twice to one section.
    by_target: dict[tuple[str, str, str], tuple[int, Edit]] = {}
    touched: dict[str, tuple[int, Edit]] = {}  # file -> first kept edit touching it
    deleted: dict[str, tuple[int, Edit]] = {}  # file -> kept delete_file
    for idx, patch in enumerate(patches):
        for edit in patch.edits:
            key = json.dumps(edit_to_dict(edit), sort_keys=True)
            if key in seen:
                continue
            target = edit.target()
            rivals = [by_target.get(target), deleted.get(edit.file)]
            if isinstance(edit, (DeleteFile, CreateFile)):
                rivals.append(touched.get(edit.file))
            rival = next((r[1] for r in rivals if r is not None and r[0] != idx), None)
            if rival is not None:
                if conflicts is not None:
                    conflicts.append(Conflict(kept=rival, dropped=edit, target=":".join(target)))
                continue
            seen.add(key)
            kept.append(edit)
            by_target.setdefault(target, (idx, edit))
            touched.setdefault(edit.file, (idx, edit))
            if isinstance(edit, DeleteFile):
                deleted[edit.file] = (idx, edit)
    return Patch(
        reasoning=_join_unique([p.reasoning for p in patches]),
        edits=kept,
        changelog=_join_unique([p.changelog for p in patches]),
    )


def merge_patches(
    patches: Sequence[Patch],
    merger: Merger | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> MergeResult:
    """Merge patches hierarchically into one.

    Args:
        patches: the proposed patches, in priority order.
        merger: merges one batch into one patch; ``None`` uses :func:`programmatic_merge`.
        batch_size: patches per merger call (>= 2).
        max_depth: maximum merge levels (>= 1); the last level merges all remaining patches at once.

    Returns:
        A :class:`MergeResult`. No patches give an empty patch; one patch is returned unchanged.

    Raises:
        ValueError: ``batch_size`` < 2 or ``max_depth`` < 1.
        TypeError: the merger returned something other than a :class:`Patch`.
    """
    if batch_size < 2:
        raise ValueError(f"batch_size must be >= 2, got {batch_size}")
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    conflicts: list[Conflict] = []
    if merger is None:

        def merger(batch: list[Patch]) -> Patch:
            return programmatic_merge(batch, conflicts)

    level: list[Patch] = list(patches)
    if not level:
        return MergeResult(patch=Patch())
    levels = merges = 0
    while len(level) > 1:
        levels += 1
        size = len(level) if levels == max_depth else batch_size
        nxt = []
        for i in range(0, len(level), size):
            batch = level[i : i + size]
            if len(batch) == 1:
                nxt.append(batch[0])
                continue
            merged = merger(batch)
            merges += 1
            if not isinstance(merged, Patch):
                raise TypeError(f"merger must return a Patch, got {type(merged).__name__}")
            nxt.append(merged)
        level = nxt
    return MergeResult(patch=level[0], conflicts=conflicts, levels=levels, merges=merges)
