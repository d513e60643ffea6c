"""SkillLibrary: progressive disclosure and the agent's skill actions."""

from __future__ import annotations

import shutil

import pytest

from coevo.skills import SHIPPED_SKILLS_DIR, SkillLibrary, load_skill, parse_skill_call
from coevo.skills.library import SkillAccessError, SkillCall


@pytest.fixture()
def library() -> SkillLibrary:
    return SkillLibrary(SHIPPED_SKILLS_DIR)


def test_catalog_lists_names_and_descriptions_not_bodies(library):
    prompt = library.catalog_prompt(with_help=True)
    plain = library.catalog_prompt()
    assert plain.splitlines() == [line for line in prompt.splitlines() if line.startswith("- ")]
    assert len(plain.splitlines()) == 3 and "load_skill" not in plain
    for name in ("web-navigation", "miniwob-forms", "webarena-sites"):
        skill = load_skill(SHIPPED_SKILLS_DIR / name)
        assert f"- {name}: " in prompt
        assert " ".join(skill.description.split()) in prompt
        # no body heading or body paragraph leaks into the catalog
        first_heading = next(line for line in skill.body.splitlines() if line.startswith("# "))
        assert first_heading not in prompt
    assert 'load_skill("skill-name")' in prompt and prompt.startswith("## Available skills")


def test_activate_returns_body(library):
    body = library.activate("miniwob-forms")
    assert body.startswith("\n# MiniWoB++ forms and widgets\n")
    assert body == (SHIPPED_SKILLS_DIR / "miniwob-forms" / "SKILL.md").read_text().split("---\n", 2)[2]
    assert "name: miniwob-forms" not in body
    with pytest.raises(SkillAccessError, match="available: "):
        library.activate("no-such-skill")


def test_read_reference_and_traversal_refused(library, tmp_path):
    text = library.read_reference("web-navigation", "references/action-reference.md")
    assert text.startswith("# BrowserGym action reference")
    assert library.read_reference("web-navigation", "references/action-reference.md", max_chars=10).startswith(
        "# BrowserG"
    )
    for bad in ["../miniwob-forms/SKILL.md", "/etc/passwd", "references/../../webarena-sites/SKILL.md"]:
        with pytest.raises(SkillAccessError, match="skill 'web-navigation'"):
            library.read_reference("web-navigation", bad)
    with pytest.raises(SkillAccessError, match="has no file"):
        library.read_reference("web-navigation", "references/missing.md")


def test_symlink_escape_refused(tmp_path):
    dest = tmp_path / "web-navigation"
    shutil.copytree(SHIPPED_SKILLS_DIR / "web-navigation", dest)
    (tmp_path / "secret.txt").write_text("secret")
    (dest / "references" / "leak.md").symlink_to(tmp_path / "secret.txt")
    lib = SkillLibrary([dest])
    with pytest.raises(SkillAccessError, match="outside"):
        lib.read_reference("web-navigation", "references/leak.md")


@pytest.mark.parametrize(
    "action, expected",
    [
        ('load_skill("web-navigation")', SkillCall("load_skill", "web-navigation")),
        ("load_skill('web-navigation');", SkillCall("load_skill", "web-navigation")),
        ("  `load_skill(name='x')`  ", SkillCall("load_skill", "x")),
        ('read_skill_file("a-b", "references/x.md")', SkillCall("read_skill_file", "a-b", "references/x.md")),
        ("click('12')", None),
        ("fill('3', 'load_skill(\"x\")')", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_skill_call(action, expected):
    assert parse_skill_call(action) == expected


@pytest.mark.parametrize(
    "action", ["load_skill(web)", 'load_skill("a", "b")', 'read_skill_file("a")', 'load_skill("x"', "load_skill(1)"]
)
def test_malformed_skill_calls_give_errors_not_exceptions(library, action):
    call = parse_skill_call(action)
    assert call is not None and call.error
    assert library.handle(action).startswith("Error: ")


def test_handle_routes_actions(library):
    out = library.handle('load_skill("webarena-sites")')
    assert out.startswith(library.activate("webarena-sites"))
    assert "references/site-guide.md" in out.split("Files in this skill")[1]
    assert library.handle('read_skill_file("webarena-sites", "references/site-guide.md")').startswith(
        "# WebArena site guide"
    )
    assert library.handle("click('12')") is None
    assert library.handle('load_skill("nope")').startswith("Error: no skill named 'nope'")
    assert library.handle('read_skill_file("webarena-sites", "../x")').startswith("Error: ")


def test_library_load_errors_and_duplicates(tmp_path):
    broken = tmp_path / "broken-skill"
    broken.mkdir()
    (broken / "SKILL.md").write_text("no front matter\n")
    shutil.copytree(SHIPPED_SKILLS_DIR / "miniwob-forms", tmp_path / "miniwob-forms")
    lib = SkillLibrary(tmp_path)
    assert lib.names() == ["miniwob-forms"]
    assert str(broken) in lib.load_errors
    with pytest.raises(ValueError, match="defined twice"):
        SkillLibrary([tmp_path / "miniwob-forms", SHIPPED_SKILLS_DIR / "miniwob-forms"])
