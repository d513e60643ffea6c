"""Skill versions stored as artifacts in a real SQLite trajectory store, and written back out."""

from __future__ import annotations

import shutil

import pytest

from coevo.skills import SHIPPED_SKILLS_DIR, SKILL_ARTIFACT_KIND, apply_patch, materialize, write_skill_version
from coevo.skills.apply import read_skill_files
from coevo.skills.versions import snapshot_skill
from coevo.store import TrajectoryStore
from coevo.types import Trajectory


@pytest.fixture(autouse=True)
def _temp_dirs_in_tmp_path(tmp_path, monkeypatch):
    """apply_patch without ``dest`` copies into a new temp dir the caller owns: keep those under tmp_path."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


@pytest.fixture()
def store(tmp_path):
    s = TrajectoryStore(tmp_path / "run.sqlite")
    yield s
    s.close()


@pytest.fixture()
def skill(tmp_path):
    dest = tmp_path / "src" / "webarena-sites"
    shutil.copytree(SHIPPED_SKILLS_DIR / "webarena-sites", dest)
    (dest / "assets").mkdir()
    (dest / "assets" / "icon.bin").write_bytes(bytes(range(256)))
    return dest


def test_version_round_trip_with_diff_and_trajectories(store, skill, tmp_path):
    v1 = write_skill_version(store, "run-1", skill, {"changelog": "initial"})
    assert (v1.kind, v1.name, v1.version, v1.parent_version) == (SKILL_ARTIFACT_KIND, "webarena-sites", 1, None)
    assert "+++ b/SKILL.md" in v1.content["diff"] and "Binary file assets/icon.bin differs" in v1.content["diff"]
    assert v1.meta["changelog"] == "initial" and v1.meta["n_files"] == 3

    stored = [
        store.add_trajectory(
            Trajectory(key=f"k{i}", run_id="run-1", evolver="web", space="parameter", reward=float(i))
        )[0]
        for i in range(2)
    ]
    ids = [t.id for t in stored]
    result = apply_patch(
        skill,
        {
            "edits": [
                {
                    "op": "append_to_section",
                    "section": "## Answers",
                    "content": "- Dates: copy them as the site shows them.",
                }
            ]
        },
        dest=tmp_path / "new" / "webarena-sites",
    )
    v2 = write_skill_version(
        store,
        "run-1",
        result.skill_dir,
        {"changelog": "dates"},
        trajectory_ids=ids,
        parent_version=1,
        key="run-1:trace2skill:r0",
    )
    assert v2.version == 2 and v2.parent_version == 1 and v2.content["trajectory_ids"] == ids
    diff = v2.content["diff"]
    assert "+- Dates: copy them as the site shows them." in diff and "assets/icon.bin" not in diff
    assert diff == result.diff
    again = write_skill_version(
        store, "run-1", result.skill_dir, trajectory_ids=ids, parent_version=1, key="run-1:trace2skill:r0"
    )
    assert again.id == v2.id  # idempotent on key

    latest = store.get_artifact(SKILL_ARTIFACT_KIND, "webarena-sites")
    out = materialize(latest, tmp_path / "restored")
    assert out == tmp_path / "restored" / "webarena-sites"
    assert read_skill_files(out) == read_skill_files(result.skill_dir)
    assert (out / "assets" / "icon.bin").read_bytes() == bytes(range(256))
    with pytest.raises(FileExistsError):
        materialize(latest, tmp_path / "restored")
    first = materialize(
        store.get_artifact(SKILL_ARTIFACT_KIND, "webarena-sites", 1), tmp_path / "restored", overwrite=True
    )
    assert "Dates: copy them" not in (first / "SKILL.md").read_text()


def test_bad_inputs_are_named(store, skill, tmp_path):
    with pytest.raises(ValueError, match="trajectory_ids"):
        write_skill_version(store, "run-1", skill, trajectory_ids=["abc"])
    with pytest.raises(ValueError, match="parent_version 7"):
        write_skill_version(store, "run-1", skill, parent_version=7)
    content = snapshot_skill(skill)
    with pytest.raises(ValueError, match="escapes"):
        materialize({**content, "files": {**content["files"], "../evil.md": "x"}}, tmp_path / "out")
    assert not (tmp_path / "out" / "webarena-sites").exists() and not (tmp_path / "evil.md").exists()
    with pytest.raises(ValueError, match="no valid skill name"):
        materialize({**content, "name": "../x"}, tmp_path / "out")
    with pytest.raises(ValueError, match="SKILL.md"):
        materialize({**content, "files": {}}, tmp_path / "out")
