"""Hierarchical patch merging: deduplication, conflicts, levels, plug-in mergers, merge+apply validity."""

from __future__ import annotations

import json
import shutil

import pytest

from coevo.skills import SHIPPED_SKILLS_DIR, apply_and_validate, merge_patches, parse_patch
from coevo.skills.merge import programmatic_merge
from coevo.skills.patch import Patch


def patch(*edits: dict, reasoning: str = "", changelog: str = "") -> Patch:
    p, rejections = parse_patch({"reasoning": reasoning, "edits": list(edits), "changelog": changelog})
    assert rejections == []
    return p


TIP = {"op": "append_to_section", "section": "## When stuck", "content": "- Reload once."}


def test_identical_edits_are_deduplicated():
    a = patch(TIP, reasoning="seen in traj 1", changelog="add reload tip")
    b = patch(dict(TIP), reasoning="seen in traj 2", changelog="add reload tip")
    result = merge_patches([a, b])
    assert result.patch.edits == a.edits and result.conflicts == []
    assert result.patch.reasoning == "seen in traj 1\nseen in traj 2"
    assert result.patch.changelog == "add reload tip"
    assert (result.levels, result.merges) == (1, 1)


def test_conflicting_edits_keep_first_and_record():
    first = patch({"op": "insert_after", "anchor": "## When stuck", "content": "- A"})
    second = patch(
        {"op": "insert_after", "anchor": "## When stuck ", "content": "- B"},
        {"op": "append_to_section", "section": "when stuck", "content": "- C"},
        {"op": "create", "file": "references/new.md", "content": "n"},
    )
    third = patch(
        {"op": "delete_section", "section": "## When stuck"},
        {"op": "create", "file": "references/new.md", "content": "other"},
        {"op": "delete_file", "file": "references/new.md"},
    )
    result = merge_patches([first, second, third])
    kept = [(e.op, getattr(e, "content", None)) for e in result.patch.edits]
    assert kept == [("insert_after", "- A"), ("append_to_section", "- C"), ("create", "n")]
    dropped = [(c.dropped.op, c.kept.op, c.target) for c in result.conflicts]
    assert dropped == [
        ("insert_after", "insert_after", "SKILL.md:anchor:## When stuck"),
        ("delete_section", "append_to_section", "SKILL.md:section:when stuck"),
        ("create", "create", "references/new.md:file:references/new.md"),
        ("delete_file", "create", "references/new.md:file:references/new.md"),
    ]


def test_edits_within_one_patch_do_not_conflict():
    p = patch(TIP, {"op": "append_to_section", "section": "## When stuck", "content": "- Second tip."})
    assert len(programmatic_merge([p]).edits) == 2


def test_hierarchy_levels_and_batches():
    patches = [patch({"op": "create", "file": f"references/r{i}.md", "content": str(i)}) for i in range(12)]
    calls: list[int] = []

    def counting_merger(batch):
        calls.append(len(batch))
        return programmatic_merge(batch)

    result = merge_patches(patches, merger=counting_merger, batch_size=5, max_depth=5)
    # level 1: 5 + 5 + (2) -> 3 patches; level 2: one batch of 3
    assert calls == [5, 5, 2, 3] and result.levels == 2 and result.merges == 4
    assert [e.file for e in result.patch.edits] == [f"references/r{i}.md" for i in range(12)]
    calls.clear()
    capped = merge_patches(patches, merger=counting_merger, batch_size=2, max_depth=2)
    assert calls == [2] * 6 + [6] and capped.levels == 2  # the last level merges everything left
    assert capped.patch.edits == result.patch.edits


def test_trivial_inputs_and_bad_arguments():
    assert merge_patches([]).patch == Patch()
    single = patch(TIP)
    assert merge_patches([single]).patch is single and merge_patches([single]).levels == 0
    with pytest.raises(ValueError, match="batch_size"):
        merge_patches([single], batch_size=1)
    with pytest.raises(ValueError, match="max_depth"):
        merge_patches([single], max_depth=0)
    with pytest.raises(TypeError, match="merger must return a Patch"):
        merge_patches([single, single], merger=lambda batch: {"edits": []})


def test_plugged_in_merger_parses_model_output():
    """A merger that, like an LLM merger, returns JSON text which is parsed into a patch."""

    def text_merger(batch):
        chosen = batch[-1].model_dump(mode="json")
        text = f"Merged.\n```json\n{json.dumps(chosen)}\n```"
        return parse_patch(text)[0]

    a, b = patch(TIP), patch({"op": "delete_section", "section": "## When stuck"})
    result = merge_patches([a, b], merger=text_merger)
    assert result.patch.edits == b.edits and result.conflicts == []


def test_merge_then_apply_keeps_skill_valid(tmp_path):
    src = tmp_path / "frozen" / "miniwob-forms"
    shutil.copytree(SHIPPED_SKILLS_DIR / "miniwob-forms", src)
    proposals = [
        patch(
            {
                "op": "append_to_section",
                "section": "## Submitting",
                "content": "4. After submitting, do not act again; the episode is over.",
            },
            changelog="stop",
        ),
        patch(
            {
                "op": "append_to_section",
                "section": "## Submitting",
                "content": "4. Submit twice to be safe.",
            },  # conflicts with the first: dropped
            {
                "op": "add_section",
                "heading": "## Drag and drop",
                "content": "Use drag_and_drop(from_bid, to_bid); see [patterns](references/drag.md).",
            },
            {"op": "create", "file": "references/drag.md", "content": "# Drag tasks\nDrop on the target.\n"},
        ),
        patch(
            {
                "op": "append_to_section",
                "section": "## Submitting",
                "content": "4. After submitting, do not act again; the episode is over.",
            }
        ),  # duplicate
    ]
    merged = merge_patches(proposals, batch_size=2)
    assert len(merged.conflicts) == 1 and len(merged.patch.edits) == 3
    new_dir, result, violations = apply_and_validate(src, merged.patch, dest=tmp_path / "new" / "miniwob-forms")
    assert result.rejected == [] and len(result.applied) == 3
    assert violations == []
    assert "Submit twice" not in (new_dir / "SKILL.md").read_text()
    assert "+## Drag and drop" in result.diff
