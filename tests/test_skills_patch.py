"""Trace2Skill patches: parsing LLM output, every edit operation on a real skill copy, rejections, diff."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from coevo.skills import SHIPPED_SKILLS_DIR, apply_patch, parse_patch, validate_skill
from coevo.skills.apply import apply_and_validate, read_skill_files
from coevo.skills.patch import AppendToSection, CreateFile, InsertAfter, Patch, parse_edit
from coevo.skills.spec import parse_skill_md


@pytest.fixture(autouse=True)
def _temp_dirs_in_tmp_path(tmp_path, monkeypatch):
    """apply_patch without ``dest`` copies into a new temp dir the caller owns: keep those under tmp_path."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


@pytest.fixture()
def skill(tmp_path) -> Path:
    """A frozen copy of a shipped skill (the patch source)."""
    dest = tmp_path / "frozen" / "web-navigation"
    shutil.copytree(SHIPPED_SKILLS_DIR / "web-navigation", dest)
    return dest


def body_of(skill_dir: Path) -> str:
    return parse_skill_md((skill_dir / "SKILL.md").read_text()).body


def apply_one(skill_dir: Path, edit: dict):
    result = apply_patch(skill_dir, {"reasoning": "r", "edits": [edit], "changelog": "c"})
    assert result.rejected == [], result.rejected
    assert len(result.applied) == 1
    return result


def test_insert_after_puts_lines_after_anchor_line(skill):
    r = apply_one(
        skill,
        {
            "op": "insert_after",
            "anchor": "Reply with exactly one action.",
            "content": "Never chain two actions in one reply.",
        },
    )
    lines = body_of(r.skill_dir).splitlines()
    i = lines.index("Reply with exactly one action. The common ones:")
    assert lines[i + 1] == "Never chain two actions in one reply."
    assert "+Never chain two actions in one reply." in r.diff


def test_insert_before_puts_lines_before_anchor_line(skill):
    r = apply_one(
        skill,
        {"op": "insert_before", "anchor": "## When stuck", "content": "## Dialogs\n\nClose cookie banners first.\n"},
    )
    lines = body_of(r.skill_dir).splitlines()
    assert lines[lines.index("## When stuck") - 3 : lines.index("## When stuck")] == [
        "## Dialogs",
        "",
        "Close cookie banners first.",
    ]


def test_append_to_section_goes_before_next_heading(skill):
    r = apply_one(
        skill,
        {
            "op": "append_to_section",
            "section": "## Read the page first",
            "content": "- Menus may hide their items until hovered.",
        },
    )
    body = body_of(r.skill_dir)
    block = body.split("## Read the page first")[1].split("## One action per step")[0]
    assert block.rstrip().endswith("- Menus may hide their items until hovered.")
    assert "hovered.\n\n## One action per step" in body


def test_replace_in_section(skill):
    r = apply_one(
        skill,
        {
            "op": "replace_in_section",
            "section": "When stuck",
            "old": "The same action failed twice",
            "new": "An action failed twice",
        },
    )
    body = body_of(r.skill_dir)
    assert "- An action failed twice: change approach" in body
    assert "The same action failed twice" not in body
    assert r.diff.count("\n-- The same action failed twice") == 1


def test_add_section_at_end_and_after_section(skill):
    r = apply_one(skill, {"op": "add_section", "heading": "Logging in", "content": "Never guess passwords."})
    assert body_of(r.skill_dir).endswith("\n\n## Logging in\n\nNever guess passwords.\n")
    r2 = apply_one(
        skill,
        {
            "op": "add_section",
            "heading": "## Tabs",
            "content": "Use tab_focus(index).",
            "after_section": "## Read the page first",
        },
    )
    body = body_of(r2.skill_dir)
    assert body.index("## Read the page first") < body.index("## Tabs") < body.index("## One action per step")
    assert "## Tabs\n\nUse tab_focus(index).\n\n## One action per step" in body


def test_delete_section(skill):
    r = apply_one(skill, {"op": "delete_section", "section": "## When stuck"})
    body = body_of(r.skill_dir)
    assert "## When stuck" not in body and "cookie banner" not in body
    assert "## Before submitting or answering" in body


def test_create_and_delete_file(skill):
    r = apply_one(skill, {"op": "create", "file": "references/dialogs.md", "content": "# Dialogs\n"})
    assert (r.skill_dir / "references/dialogs.md").read_text() == "# Dialogs\n"
    assert "+++ b/references/dialogs.md" in r.diff and "--- /dev/null" in r.diff
    r2 = apply_one(skill, {"op": "delete_file", "path": "references/action-reference.md"})
    assert not (r2.skill_dir / "references/action-reference.md").exists()
    assert "+++ /dev/null" in r2.diff


def test_edit_in_reference_file(skill):
    r = apply_one(
        skill,
        {
            "op": "append_to_section",
            "file": "references/action-reference.md",
            "section": "## Finishing",
            "content": "- Finish only once.",
        },
    )
    assert "- Finish only once." in (r.skill_dir / "references/action-reference.md").read_text()


def test_source_snapshot_is_never_modified(skill):
    before = read_skill_files(skill)
    r = apply_patch(
        skill,
        {
            "edits": [
                {"op": "delete_section", "section": "## When stuck"},
                {"op": "delete_file", "file": "references/action-reference.md"},
            ]
        },
    )
    assert len(r.applied) == 2 and read_skill_files(skill) == before
    assert r.skill_dir != skill and r.skill_dir.name == skill.name
    with pytest.raises(ValueError, match="outside the source"):
        apply_patch(skill, Patch(), dest=skill)
    with pytest.raises(ValueError, match="already exists"):
        apply_patch(skill, Patch(), dest=r.skill_dir)


def test_invalid_ops_rejected_while_valid_ones_apply(skill):
    edits = [
        {"op": "insert_after", "anchor": "this text is not in the skill", "content": "x"},
        {"op": "append_to_section", "section": "## No Such Section", "content": "x"},
        {"op": "create", "file": "../outside.md", "content": "x"},
        {"op": "create", "file": "/tmp/abs.md", "content": "x"},
        {"op": "insert_after", "anchor": "description: General procedure", "content": "name: hijacked"},
        {"op": "replace_in_section", "section": "## When stuck", "old": "twice", "new": "thrice"},
        {"op": "insert_after", "anchor": "- ", "content": "ambiguous"},
        {"op": "delete_file", "file": "SKILL.md"},
        {"op": "create", "file": "references/action-reference.md", "content": "overwrite"},
        {"op": "add_section", "heading": "## When stuck", "content": "dup"},
        {"op": "replace_in_section", "section": "## When stuck", "old": "thrice", "new": "thrice"},
        {"op": "teleport", "anchor": "x"},
        {"op": "append_to_section", "section": "## When stuck"},
        {"op": "append_to_section", "section": "## When stuck", "content": "- Reload the page once."},
    ]
    r = apply_patch(skill, json.dumps({"reasoning": "r", "edits": edits, "changelog": "c"}))
    assert [type(e).__name__ for e in r.applied] == ["ReplaceInSection", "AppendToSection"]
    reasons = [reason for _, reason in r.rejected]
    assert len(reasons) == len(edits) - 2
    expected = [
        "unknown op 'teleport'",
        "invalid append_to_section edit: content: Field required",  # parsing
        "not found",
        "section '## No Such Section' not found",
        "escapes the skill folder",
        "absolute",
        "front-matter 'name'",
        "occurs",
        "cannot be deleted",
        "already exists",
        "already exists",
        "changes nothing",
    ]
    for reason, fragment in zip(reasons, expected, strict=True):
        assert fragment in reason, (reason, fragment)
    assert not (skill.parent / "outside.md").exists()
    assert parse_skill_md((r.skill_dir / "SKILL.md").read_text()).front_matter["name"] == "web-navigation"
    assert validate_skill(r.skill_dir) == []


@pytest.mark.parametrize(
    "text",
    [
        "I think we should add a tip.",
        '```json\n{"reasoning": "x", "edits": [ {"op": "insert_after",, }]}\n```',
        '{"reasoning": "no edits key"}',
        "",
        "\x00\x00",
    ],
)
def test_invalid_json_rejected_without_crash(skill, text):
    patch, rejections = parse_patch(text)
    assert patch.edits == [] and len(rejections) == 1
    assert "invalid patch JSON" in rejections[0].reason
    r = apply_patch(skill, text)
    assert r.applied == [] and len(r.rejected) == 1 and r.diff == ""


def test_parse_patch_from_prose_and_fences():
    obj = {
        "reasoning": "agents forgot to verify",
        "changelog": "add a check",
        "edits": [{"op": "append_to_section", "section": "## Tips", "content": "- check"}],
    }
    fenced = f"Here is my patch:\n```json\n{json.dumps(obj, indent=1)}\n```\nHope it helps."
    bare = f"Analysis done. {json.dumps(obj)} That's all."
    listed = json.dumps(obj["edits"])
    for text in (fenced, bare, listed, json.dumps(obj).replace("{", "{\x00", 1)):
        patch, rejections = parse_patch(text)
        assert rejections == [] and patch.edits == [
            AppendToSection(op="append_to_section", section="## Tips", content="- check")
        ]
    assert parse_patch(fenced)[0].reasoning == "agents forgot to verify"


def test_parse_edit_aliases_and_errors():
    e = parse_edit({"op": "CREATE", "path": "references/x.md", "content": "x"})
    assert isinstance(e, CreateFile) and e.file == "references/x.md"
    e = parse_edit({"op": "replace_in_section", "heading": "Tips", "old_text": "a", "new_text": "b"})
    assert (e.section, e.old, e.new, e.file) == ("Tips", "a", "b", "SKILL.md")
    assert isinstance(parse_edit({"op": "insert_after", "anchor": "a", "content": "b", "why": "x"}), InsertAfter)
    with pytest.raises(ValueError, match="anchor"):
        parse_edit({"op": "insert_after", "content": "b"})
    with pytest.raises(ValueError, match="expected a JSON object"):
        parse_edit("not a dict")
    with pytest.raises(ValueError, match="unknown op None"):
        parse_edit({"anchor": "a"})


def test_apply_and_validate_reports_violations(skill):
    new_dir, result, violations = apply_and_validate(
        skill,
        {
            "edits": [
                {
                    "op": "append_to_section",
                    "section": "## When stuck",
                    "content": "See [dialogs](references/dialogs.md).",
                }
            ]
        },
    )
    assert len(result.applied) == 1
    assert [v.field for v in violations] == ["body"] and "references/dialogs.md" in violations[0].message
    _, fix, violations = apply_and_validate(
        new_dir,
        {"edits": [{"op": "create", "file": "references/dialogs.md", "content": "# Dialogs\nClose them first.\n"}]},
    )
    assert violations == [] and len(fix.applied) == 1


def test_edits_echoed_from_the_format_example_are_rejected():
    from coevo.skills.patch import parse_patch

    text = (
        '{"reasoning": "r", "edits": ['
        '{"op": "create", "file": "references/new-file.md", "content": "file text"},'
        '{"op": "insert_after", "anchor": "exact existing text", "content": "new lines"},'
        '{"op": "create", "file": "references/tips.md", "content": "Click the element id, not its text."}],'
        '"changelog": "c"}'
    )
    patch, rejected = parse_patch(text)
    assert [e.file for e in patch.edits] == ["references/tips.md"]
    assert len(rejected) == 2 and all("format example" in r.reason for r in rejected)
