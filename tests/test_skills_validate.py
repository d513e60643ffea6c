"""Agent Skills spec: parsing, validator rules, the shipped skills and the `skills validate` CLI."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from coevo.skills import SHIPPED_SKILLS_DIR, validate_skill
from coevo.skills.cli import main, run_validate
from coevo.skills.spec import (
    BODY_LINE_LIMIT,
    BODY_TOKEN_LIMIT,
    SkillFormatError,
    estimate_tokens,
    find_skill_dirs,
    load_skill,
    parse_skill_md,
    render_skill_md,
    resolve_inside,
    write_skill,
)

SHIPPED = ("web-navigation", "miniwob-forms", "webarena-sites")
BODY = "# Demo\n\nSee [the notes](references/notes.md).\n"


def make_skill(
    parent: Path, folder: str = "demo-skill", body: str = BODY, files: dict | None = None, **front_matter
) -> Path:
    fm = {"name": folder, "description": "A demo skill used by the tests."}
    fm.update(front_matter)
    fm = {k: v for k, v in fm.items() if v is not None}
    files = {"references/notes.md": "notes\n"} if files is None else files
    return write_skill(parent / folder, fm, body, files)


def fields(violations) -> list[str]:
    return [v.field for v in violations]


def test_valid_skill_has_no_violations(tmp_path):
    d = make_skill(
        tmp_path,
        license="MIT",
        compatibility="Python 3.11",
        metadata={"version": "1"},
        **{"allowed-tools": "Bash Read"},
    )
    assert validate_skill(d) == []
    skill = load_skill(d)
    assert skill.name == "demo-skill" and skill.files == ["references/notes.md"]
    assert skill.body == BODY


def test_parse_and_render_round_trip():
    text = render_skill_md({"name": "x-y", "description": "d: with colon"}, "# T\nbody\n")
    doc = parse_skill_md(text)
    assert doc.front_matter == {"name": "x-y", "description": "d: with colon"}
    assert doc.body == "# T\nbody\n"
    assert text.splitlines()[doc.body_line_offset] == "# T"


@pytest.mark.parametrize(
    "text, reason",
    [
        ("# no front matter\n", "must start with"),
        ("---\nname: [unclosed\n---\nbody\n", "invalid YAML"),
        ("---\n- a\n- b\n---\nbody\n", "must be a YAML map"),
    ],
)
def test_malformed_front_matter_raises_named_error(text, reason):
    with pytest.raises(SkillFormatError, match=reason) as info:
        parse_skill_md(text)
    assert info.value.field == "front-matter"


def test_uppercase_name(tmp_path):
    d = make_skill(tmp_path, folder="Demo-Skill")
    msgs = [v.message for v in validate_skill(d) if v.field == "name"]
    assert len(msgs) == 1 and "lowercase" in msgs[0]


@pytest.mark.parametrize("name", ["-demo", "demo-", "de--mo", "de_mo", "a" * 65, ""])
def test_bad_name_forms(tmp_path, name):
    d = make_skill(tmp_path, folder="demo", name=name)
    assert "name" in fields(validate_skill(d))


def test_name_must_equal_folder(tmp_path):
    d = make_skill(tmp_path, folder="demo-skill", name="other-skill")
    (v,) = validate_skill(d)
    assert (v.field, v.file) == ("name", str(d / "SKILL.md"))
    assert "folder name" in v.message


def test_description_too_long(tmp_path):
    d = make_skill(tmp_path, description="x" * 1025)
    (v,) = validate_skill(d)
    assert v.field == "description" and "1024" in v.message
    assert validate_skill(make_skill(tmp_path, folder="ok-skill", description="x" * 1024)) == []


@pytest.mark.parametrize("desc", ["Use <b>bold</b> hints", "a -> b"])
def test_angle_bracket_in_description(tmp_path, desc):
    (v,) = validate_skill(make_skill(tmp_path, description=desc))
    assert v.field == "description" and "'<' or '>'" in v.message


def test_missing_description_and_empty_description(tmp_path):
    assert fields(validate_skill(make_skill(tmp_path, description=None))) == ["description"]
    assert fields(validate_skill(make_skill(tmp_path, folder="e-skill", description="  "))) == ["description"]


def test_unknown_key(tmp_path):
    (v,) = validate_skill(make_skill(tmp_path, version="1.0"))
    assert v.field == "version" and "unknown front-matter key" in v.message


def test_optional_field_types(tmp_path):
    d = make_skill(tmp_path, compatibility="c" * 501, metadata={"n": 3}, license=5, **{"allowed-tools": ["Bash"]})
    assert sorted(fields(validate_skill(d))) == ["allowed-tools", "compatibility", "license", "metadata"]


def test_missing_skill_md(tmp_path):
    d = tmp_path / "empty-skill"
    d.mkdir()
    (v,) = validate_skill(d)
    assert v.field == "SKILL.md" and "missing" in v.message
    (v,) = validate_skill(tmp_path / "nowhere")
    assert v.field == "folder"


def test_body_too_many_lines(tmp_path):
    body = "# Long\n" + "line\n" * BODY_LINE_LIMIT
    (v,) = validate_skill(make_skill(tmp_path, body=body, files={}))
    assert v.field == "body" and "lines" in v.message
    short = "# Short\n" + "line\n" * (BODY_LINE_LIMIT - 2)
    assert validate_skill(make_skill(tmp_path, folder="short-skill", body=short, files={})) == []


def test_body_too_many_tokens(tmp_path):
    body = "# Wide\n" + ("word " * 900 + "\n") * 5  # 22.5k chars -> ~5.6k tokens by len/4, only 6 lines
    (v,) = validate_skill(make_skill(tmp_path, body=body, files={}))
    assert v.field == "body" and "tokens" in v.message
    assert estimate_tokens("abcdefgh") == 2 and estimate_tokens("abcdefghi") == 3
    assert estimate_tokens("x" * 4 * BODY_TOKEN_LIMIT) == BODY_TOKEN_LIMIT


def test_body_token_count_with_real_tokenizer(tmp_path):
    class WordTokenizer:  # a real, if simple, tokenizer: whitespace splitting
        def encode(self, text):
            return list(range(len(text.split())))

    body = "# Wide\n" + "w " * 5000
    d = make_skill(tmp_path, body=body, files={})
    assert "body" in fields(validate_skill(d, tokenizer=WordTokenizer()))
    assert (
        validate_skill(make_skill(tmp_path, folder="few-words", body="# a\nb c\n", files={}), tokenizer=WordTokenizer())
        == []
    )


def test_missing_referenced_file(tmp_path):
    body = BODY + "Run `scripts/check.py` first. Docs: https://example.org/x.md, [top](#demo).\n"
    violations = validate_skill(make_skill(tmp_path, body=body))
    assert [v.field for v in violations] == ["body"]
    assert "scripts/check.py" in violations[0].message
    assert "references/notes.md" not in violations[0].message


def test_reference_escaping_folder_and_code_blocks(tmp_path):
    body = "# T\n[up](../secret.md)\n\n```\nreferences/only-in-code.md\n```\n"
    (v,) = validate_skill(make_skill(tmp_path, body=body, files={}))
    assert v.field == "body" and "refused" in v.message


def test_resolve_inside_refuses_escapes(tmp_path):
    root = tmp_path / "s"
    root.mkdir()
    (root / "link").symlink_to(tmp_path)
    for bad in ["../x", "/etc/passwd", "a/../../x", "link/x", ""]:
        with pytest.raises(ValueError):
            resolve_inside(root, bad)
    assert resolve_inside(root, "references/a.md") == (root / "references/a.md").resolve()


def test_shipped_skills_validate():
    found = [d.name for d in find_skill_dirs(SHIPPED_SKILLS_DIR)]
    assert set(SHIPPED) <= set(found)
    for name in SHIPPED:
        d = SHIPPED_SKILLS_DIR / name
        assert validate_skill(d) == [], name
        skill = load_skill(d)
        assert any(f.startswith("references/") for f in skill.files), name


def test_cli_exit_codes(tmp_path, capsys):
    assert main(["skills", "validate", str(SHIPPED_SKILLS_DIR)]) == 0
    out = capsys.readouterr().out
    assert "0 violation(s)" in out
    bad = make_skill(tmp_path, folder="Bad-Skill", description="has <tag>")
    assert main(["skills", "validate", str(SHIPPED_SKILLS_DIR / "web-navigation"), str(bad)]) == 3
    out = capsys.readouterr().out
    assert f"{bad / 'SKILL.md'}: name:" in out and f"{bad / 'SKILL.md'}: description:" in out
    with pytest.raises(SystemExit) as info:
        main(["skills", "validate"])
    assert info.value.code == 2
    capsys.readouterr()
    # a folder that does not exist is bad input (exit 2, one line), not a failed check (3)
    from coevo.cli import main as coevo_main

    assert coevo_main(["skills", "validate", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"coevo skills validate: error: {tmp_path / 'nope'}: no such folder (give a skill folder or a folder of skills)"
    )


def test_cli_folder_of_skills(tmp_path):
    make_skill(tmp_path, folder="one-skill")
    make_skill(tmp_path, folder="two-skill", name="wrong-name")
    buf = io.StringIO()
    assert run_validate([str(tmp_path)], out=buf) == 3
    text = buf.getvalue()
    assert "one-skill: ok" in text and "two-skill" in text and "2 skill(s) checked, 1 invalid" in text
    shutil.rmtree(tmp_path / "two-skill")
    assert run_validate([str(tmp_path)], out=io.StringIO()) == 0


def test_folder_of_skills_reports_subfolders_without_skill_md(tmp_path):
    make_skill(tmp_path, folder="good-skill")
    lower = tmp_path / "lower-skill"
    lower.mkdir()
    (lower / "skill.md").write_text("---\nname: lower-skill\ndescription: misnamed file.\n---\n# Body\n")
    (tmp_path / "notes").mkdir()
    (tmp_path / ".git").mkdir()  # hidden folders are not skills and are not reported
    buf = io.StringIO()
    assert run_validate([str(tmp_path)], out=buf) == 3
    text = buf.getvalue()
    assert f"{lower / 'SKILL.md'}: SKILL.md: missing: found skill.md; the file must be named SKILL.md" in text
    assert f"{tmp_path / 'notes' / 'SKILL.md'}: SKILL.md: missing" in text and ".git" not in text
    assert "good-skill: ok" in text and "3 skill(s) checked, 2 invalid" in text
    (v,) = validate_skill(lower)  # the single folder gets the same hint
    assert v.field == "SKILL.md" and "found skill.md" in v.message
