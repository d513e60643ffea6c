"""The ``web`` rollout: episode draws, config errors and skill context without a browser; on real MiniWoB++
pages in real headless Chromium with the scripted test-double model (model only) and with a tiny random Qwen2.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError
from support import WEB_SMOKE_ROLLOUT, chromium_missing

from coevo.agents.scripted import ScriptedPolicy
from coevo.backends.base import SamplingParams
from coevo.budget import Budget
from coevo.config import SamplingConfig
from coevo.envs.miniwob import MINIWOB_TASKSETS
from coevo.evolvers.base import RunContext
from coevo.rollouts.base import build_rollout
from coevo.rollouts.web import WebRollout
from coevo.skills import SHIPPED_SKILLS_DIR
from coevo.store import TrajectoryStore
from coevo.types import ContextRef, ESMember, Trajectory

CHROMIUM_MISSING = chromium_missing()
browser = pytest.mark.skipif(CHROMIUM_MISSING is not None, reason=CHROMIUM_MISSING or "")
MARKER = "Marker line of skill version 3: match the whole button name."


@pytest.fixture
def ctx(tmp_path):
    store = TrajectoryStore(tmp_path / "store.sqlite")
    yield RunContext(
        run_id="run1",
        run_dir=tmp_path,
        store=store,
        budget=Budget(store, "run1"),
        sampling=SamplingConfig(max_new_tokens=40, temperature=0.0),
    )
    store.close()


@pytest.fixture
def deployment(monkeypatch, tmp_path):
    """A WebArena-Lite user's settings minus the sites (nothing is contacted): WA_* URLs, the judge's key
    variable and an NLTK data folder with a (stand-in, empty) punkt_tab that validation finds."""
    from coevo.envs.webarena_lite import SITE_ENV_VARS

    for var in SITE_ENV_VARS.values():
        monkeypatch.setenv(var, f"http://{var.lower()}.example.invalid")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")
    (tmp_path / "nltk" / "tokenizers" / "punkt_tab").mkdir(parents=True)
    monkeypatch.setenv("NLTK_DATA", str(tmp_path / "nltk"))
    return monkeypatch


def published_skill(tmp_path, version: int = 3) -> dict:
    """A copy of the shipped miniwob-forms skill with one added line, as a skill evolver publishes it."""
    dest = tmp_path / "skills" / f"v{version}" / "miniwob-forms"
    shutil.copytree(SHIPPED_SKILLS_DIR / "miniwob-forms", dest)
    md = dest / "SKILL.md"
    md.write_text(md.read_text() + f"\n## Learned\n- {MARKER}\n")
    return {"name": "miniwob-forms", "version": version, "path": str(dest)}


def click_button_solver(conversation: list[dict]) -> str:
    """Reads the goal and the axtree of the prompt and clicks the asked-for button."""
    user = conversation[-1]["content"]
    label = re.search(r'Click on the "(.+?)" button', user).group(1)
    bid = re.search(r"\[(\d+)\] button '" + re.escape(label) + "'", user).group(1)
    return f"```\nclick('{bid}')\n```"


# -- without a browser -------------------------------------------------------------------------------------
def test_train_episodes_are_deterministic_shared_and_stratified():
    ro = build_rollout({"type": "web", "taskset": "miniwob10", "episodes_per_member": 10, "seed": 5}, None)
    ts = MINIWOB_TASKSETS["miniwob10"]
    a, b = ESMember(11, 1e-3, 1, 0), ESMember(99, 1e-3, -1, 3)
    g0 = ro.episodes("train", 0, a)
    assert g0 == ro.episodes("train", 0, b) == ro.episodes("train", 0, None)  # same for every member
    assert g0 == build_rollout(
        {"type": "web", "taskset": "miniwob10", "episodes_per_member": 10, "seed": 5}, None
    ).episodes("train", 0, a)  # reproducible from (seed, generation)
    assert g0 != ro.episodes("train", 1, a)
    assert sorted(t for t, _ in g0) == sorted(ts.tasks)  # 10 episodes over 10 tasks: each task once
    assert all(s in ts.train_seeds for _, s in g0)
    assert ro.n_cases("train") == 10


def test_per_member_episodes_keep_antithetic_pairs_together():
    ro = build_rollout(
        {"type": "web", "taskset": "miniwob10", "episodes_per_member": 6, "same_episodes_for_all_members": False}, None
    )
    plus, minus, other = ESMember(7, 1e-3, 1, 0), ESMember(7, 1e-3, -1, 1), ESMember(8, 1e-3, 1, 2)
    assert ro.episodes("train", 2, plus) == ro.episodes("train", 2, minus)
    assert ro.episodes("train", 2, plus) != ro.episodes("train", 2, other)


def test_test_episodes_use_fixed_heldout_seeds():
    ro = build_rollout({"type": "web", "taskset": "miniwob10", "test_episodes": 25}, None)
    ts = MINIWOB_TASKSETS["miniwob10"]
    eps = ro.episodes("test", 0)
    assert eps == ro.episodes("test", 7) and len(eps) == 25 == ro.n_cases("test")
    assert all(s in ts.heldout_seeds for _, s in eps) and len(set(eps)) == 25
    assert {t for t, _ in eps} == set(ts.tasks)
    small = build_rollout({"type": "web", "taskset": "miniwob_smoke", "test_episodes": 50}, None)
    assert small.episodes("test") == [
        ("click-test", 100),
        ("click-button", 100),
        ("click-test", 101),
        ("click-button", 101),
    ]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"taskset": "nope"}, "taskset"),
        ({"tasks": ["click-button", "not-a-task"]}, "tasks"),
        ({"actions": ["click", "teleport"]}, "actions"),
        ({"task_ids": [27]}, "task_ids"),
        ({"episodes_per_member": 0}, "episodes_per_member"),
        ({"skill_mode": "inline"}, "skill_mode"),
        ({"sampling": {"temperatur": 0.5}}, "temperatur"),
        ({"n_env": 2}, "n_env"),
    ],
)
def test_bad_config_names_the_field(spec, field):
    with pytest.raises((ValidationError, ValueError), match=field):
        build_rollout({"type": "web", **spec}, None)


def test_missing_skill_folder_is_named():
    with pytest.raises(ValueError, match="skill_dirs: no skill folder"):
        build_rollout({"type": "web", "use_skills": True, "skill_dirs": ["skills/does-not-exist"]}, None)


def test_webarena_split_is_disjoint_and_checked(deployment):
    ro = build_rollout(
        {
            "type": "web",
            "benchmark": "webarena_lite",
            "sites": ["shopping"],
            "episodes_per_member": 8,
            "test_episodes": 5,
        },
        None,
    )
    assert len(ro.test_tasks) == 5 and not set(ro.tasks) & set(ro.test_tasks)
    train = ro.episodes("train", 0)
    assert len(train) == 8 and all(t in ro.tasks and s == 0 for t, s in train)
    assert ro.episodes("train", 0) == train != ro.episodes("train", 1)
    fixed = build_rollout(
        {"type": "web", "benchmark": "webarena_lite", "task_ids": [4, 7, 23], "test_task_ids": [23]}, None
    )
    assert fixed.episodes("test") == [("23", 0)] and set(fixed.tasks) == {"4", "7"}
    with pytest.raises(ValueError, match="test_task_ids"):
        build_rollout({"type": "web", "benchmark": "webarena_lite", "task_ids": [4, 7], "test_task_ids": [5]}, None)
    with pytest.raises(ValueError, match="unknown WebArena-Lite task ids"):
        build_rollout({"type": "web", "benchmark": "webarena_lite", "task_ids": [999999]}, None)


def test_skill_context_follows_the_published_skill(ctx, tmp_path):
    spec = {"type": "web", "use_skills": True}
    ro = build_rollout(spec, ctx)
    library, text, context, meta = ro.skill_context()
    # initial folders = skill version 0, nothing published on the context channel (key version 0)
    assert context == ContextRef(skill_name="miniwob-forms", skill_version=0, versions={"skill": 0})
    assert set(library.names()) == {"web-navigation", "miniwob-forms"}
    assert "## Skill miniwob-forms (already loaded)" in text and MARKER not in text
    ctx.publish("skill", published_skill(tmp_path), evolver="t2s")
    library, text, context, meta = ro.skill_context()
    assert context == ContextRef(skill_name="miniwob-forms", skill_version=3, versions={"skill": 1})
    assert MARKER in text and meta["skill_path"] == ctx.context("skill").value["path"]
    assert MARKER in library.activate("miniwob-forms") and "web-navigation" in library.names()
    catalog = build_rollout({**spec, "skill_mode": "catalog"}, ctx).skill_context()[1]
    assert MARKER not in catalog and "- miniwob-forms:" in catalog
    assert build_rollout({"type": "web"}, ctx).skill_context() == (None, None, ContextRef(versions={"skill": 1}), {})
    with pytest.raises(ValueError, match="skill_name"):
        build_rollout({**spec, "skill_name": "webarena-sites"}, ctx).skill_context()


def test_sampling_merges_run_defaults_and_is_shared_by_members(ctx):
    ro = build_rollout({"type": "web", "sampling": {"temperature": 0.7}, "seed": 3}, ctx)
    p = ro.sampling_params("train", 4)
    assert (p.max_new_tokens, p.temperature) == (40, 0.7)
    assert p.seed == ro.sampling_params("train", 4).seed != ro.sampling_params("train", 5).seed
    assert ro.sampling_params("test", 4).seed == ro.sampling_params("test", 0).seed != p.seed  # fixed held-out
    alone = build_rollout({"type": "web", "sampling": {"max_new_tokens": 9}}, None).sampling_params("train", 0)
    assert isinstance(alone, SamplingParams) and alone.max_new_tokens == 9


def test_member_reward_leaves_out_browser_failures():
    ro = build_rollout({"type": "web"}, None)
    ok = Trajectory(key="a", run_id="r", evolver="es", space="parameter", reward=1.0)
    lost = Trajectory(key="b", run_id="r", evolver="es", space="parameter", reward=0.0)
    crash = Trajectory(
        key="c", run_id="r", evolver="es", space="parameter", reward=None, valid=False, failure="runtime"
    )
    llm = Trajectory(
        key="d", run_id="r", evolver="es", space="parameter", reward=None, valid=False, failure="llm_error"
    )
    assert ro.member_reward([ok, lost, crash]) == 0.5
    assert ro.member_reward([ok, llm]) == 0.5
    assert ro.member_reward([crash]) == 0.0 and ro.member_reward([]) == 0.0


# -- real browser ------------------------------------------------------------------------------------------
@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
@pytest.mark.browser
@browser
def test_web_rollout_on_click_button(ctx, tmp_path):
    ctx.publish("skill", published_skill(tmp_path), evolver="t2s")
    ro = build_rollout(
        {
            "type": "web",
            "taskset": "miniwob_smoke",
            "tasks": ["click-button"],
            "episodes_per_member": 2,
            "test_episodes": 2,
            "max_steps": 2,
            "n_envs": 2,
            "actions": ["click"],
            "use_skills": True,
            "skill_dirs": ["skills/miniwob-forms"],
        },
        ctx,
    )
    assert isinstance(ro, WebRollout)
    policy = ScriptedPolicy(click_button_solver)
    member = ESMember(seed=7, sigma=1e-3, sign=-1, index=1)
    try:
        ts = ro.run(policy, generation=3, member=member, key_prefix="run1/es/g00003/m001", round_index=2)
        envs = list(ro._envs)
        assert [t.key for t in ts] == ["run1/es/g00003/m001/train/0", "run1/es/g00003/m001/train/1"]
        assert [(t.meta["task"], t.meta["seed"]) for t in ts] == ro.episodes("train", 3, member)
        for t in ts:
            assert t.member == member and t.space == "parameter" and (t.round, t.generation) == (2, 3)
            assert t.context == ContextRef(skill_name="miniwob-forms", skill_version=3, versions={"skill": 1})
            assert t.valid and t.reward == 1.0 and t.meta["raw_reward"] == 1.0 and t.llm_calls == 1
            assert t.meta["split"] == "train" and t.meta["seed"] in MINIWOB_TASKSETS["miniwob_smoke"].train_seeds
        assert ro.member_reward(ts) == 1.0
        system = policy.conversations[0][0]["content"]
        assert MARKER in system and "click(bid: str" in system and "fill(bid: str" not in system  # only `click`
        stored = [s for s, inserted in ctx.store.add_trajectories(ts) if inserted]
        assert ctx.store.get_by_key(ts[0].key).context.skill_version == 3 and len(stored) == 2

        test = ro.run(policy, generation=3, member=None, key_prefix="run1/es/g00003/centre", split="test")
        assert [(t.meta["task"], t.meta["seed"]) for t in test] == [("click-button", 100), ("click-button", 101)]
        assert all(t.member is None and t.reward == 1.0 and t.meta["split"] == "test" for t in test)
        assert ro._envs == envs and len(envs) == 2  # browsers reused across calls
    finally:
        ro.close()
    assert ro._envs == []


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
@pytest.mark.browser
@browser
def test_tiny_qwen2_member_gets_recorded_zero_rewards(ctx, tiny_model_dir):
    from coevo.backends.hf import HFPolicy

    ro = build_rollout(dict(WEB_SMOKE_ROLLOUT), ctx)
    try:
        ts = ro.run(HFPolicy(tiny_model_dir), generation=0, member=ESMember(1, 1e-3, 1, 0), key_prefix="k")
    finally:
        ro.close()
    (t,) = ts
    assert t.valid and t.reward == 0.0 and len(t.steps) == 1 and t.steps[0].model_output is not None
    assert t.context == ContextRef(versions={"skill": 0}) and ro.member_reward(ts) == 0.0


# -- the report section ------------------------------------------------------------------------------------
def _web_traj(
    key: str,
    *,
    gen: int,
    task: str,
    seed: int,
    reward: float | None,
    split: str = "train",
    member: ESMember | None = None,
    version: int = 0,
    evolver: str = "es",
    **kw,
) -> Trajectory:
    meta = {"rollout": "web", "benchmark": "miniwob", "task": task, "seed": seed, "split": split, **kw.pop("meta", {})}
    return Trajectory(
        key=key,
        run_id="run1",
        evolver=evolver,
        space="parameter",
        generation=gen,
        task_id=f"{task}:{seed}",
        reward=reward,
        member=member,
        meta=meta,
        llm_calls=1,
        context=ContextRef(skill_name="miniwob-forms", skill_version=version),
        **kw,
    )


def test_web_report_rates_diffs_and_plots(ctx, tmp_path):
    from coevo.report.web import PLOT_NAMES, web_report
    from coevo.skills import skill_diff, write_skill_version

    store = ctx.store
    assert web_report(tmp_path, store, "run1") is None  # no web trajectories yet
    m0, m1 = ESMember(5, 1e-3, 1, 0), ESMember(5, 1e-3, -1, 1)
    ts = [
        # generation 0 (skill v0): click-button 1/2, click-test 0/2; one browser failure left out
        _web_traj("g0a", gen=0, task="click-button", seed=1, reward=1.0, member=m0),
        _web_traj("g0b", gen=0, task="click-test", seed=2, reward=0.0, member=m0),
        _web_traj("g0c", gen=0, task="click-button", seed=1, reward=0.0, member=m1),
        _web_traj("g0d", gen=0, task="click-test", seed=2, reward=0.0, member=m1),
        _web_traj("g0e", gen=0, task="click-test", seed=3, reward=None, member=m1, valid=False, failure="runtime"),
        # generation 1 (skill v1): 3/4
        _web_traj("g1a", gen=1, task="click-button", seed=0, reward=1.0, member=m0, version=1),
        _web_traj("g1b", gen=1, task="click-test", seed=3, reward=1.0, member=m0, version=1),
        _web_traj("g1c", gen=1, task="click-button", seed=0, reward=0.0, member=m1, version=1),
        _web_traj("g1d", gen=1, task="click-test", seed=3, reward=1.0, member=m1, version=1),
        # held-out centre before (gen 0, v0) 1/2 and after (gen 2, v1) 2/2; a Trace2Skill gate episode
        _web_traj("t0a", gen=0, task="click-button", seed=100, reward=0.0, split="test"),
        _web_traj("t0b", gen=0, task="click-test", seed=100, reward=1.0, split="test"),
        _web_traj("t2a", gen=2, task="click-button", seed=100, reward=1.0, split="test", version=1),
        _web_traj("t2b", gen=2, task="click-test", seed=100, reward=1.0, split="test", version=1),
        _web_traj(
            "gate",
            gen=0,
            task="click-test",
            seed=100,
            reward=1.0,
            split="test",
            version=1,
            evolver="skills",
            meta={"t2s_role": "gate"},
        ),
        Trajectory(key="other", run_id="run1", evolver="skills", space="context", reward=None, valid=False),
    ]
    stored = [s for s, _ in store.add_trajectories(ts)]
    skill = published_skill(tmp_path, version=1)["path"]
    # as Trace2Skill stores it: version 1, derived from the source folder (version 0, not an artifact)
    write_skill_version(
        store,
        "run1",
        skill,
        {"changelog": "match whole button names", "round": 0},
        diff=skill_diff(SHIPPED_SKILLS_DIR / "miniwob-forms", skill),
        trajectory_ids=[stored[1].id],
    )
    # ES history: generation 0 changed the weights, generation 1 did not (e.g. sigma 0)
    store.add_es_history("run1", "es", 0, {"generation": 0, "weight_hash_before": "a", "weight_hash_after": "b"})
    store.add_es_history("run1", "es", 1, {"generation": 1, "weight_hash_before": "b", "weight_hash_after": "b"})
    md = web_report(tmp_path, store, "run1")
    assert md.startswith("## Web agent")
    assert "| es | 0 | none | 0 | v0 | 50% (1/2) |" in md and "| es | 2 | 1 | 0 | v1 | 100% (2/2) |" in md
    assert "| es | 0 | 0 | v0 | 25% (1/4, 1 browser failures) | 2 | 0.5 | 0 |" in md
    assert "| es | 1 | 0 | v1 | 75% (3/4) | 2 | 1 | 0.5 |" in md
    assert "| click-test | 0% (0/2, 1 browser failures) | 100% (2/2) | +100 pts |" in md
    assert "Held-out before → after: 50% (1/2) (generation 0, skill v0) → 100% (2/2) (generation 2, skill v1)." in md
    assert "| miniwob-forms | v1 | preloaded | 75% (3/4) | 100% (2/2) | 100% (1/1) |" in md
    assert "| miniwob-forms | 1 | 0 | 0 | 1 | match whole button names |" in md
    assert f"+- {MARKER}" in md and "```diff" in md and "Diff of `miniwob-forms` v1 (from v0)" in md
    for name in PLOT_NAMES:
        assert (tmp_path / "plots" / name).stat().st_size > 1000 and f"(plots/{name})" in md


def test_web_report_shows_skill_use_per_condition(ctx, tmp_path):
    """Issue 48: per condition, the skills listed, load calls, successful loads and episodes solved with and
    without a loaded skill; a catalog episode is labelled by its library, never by the evolving skill alone."""
    from coevo.report.web import web_report

    lib = {"skill_mode": "catalog", "skills_listed": ["click-target", "fill-and-submit"]}

    ts = [
        # no skills: 1 of 2 solved
        _web_traj("n1", gen=0, task="click-link", seed=1, reward=1.0, split="test", evolver="none"),
        _web_traj("n2", gen=0, task="click-link", seed=2, reward=0.0, split="test", evolver="none"),
    ]
    for t in ts:
        t.context = ContextRef()
    for key, reward, loads, calls in (("c1", 1.0, 1, 1), ("c2", 1.0, 1, 2), ("c3", 0.0, 0, 1), ("c4", 0.0, 0, 0)):
        t = _web_traj(key, gen=0, task="click-link", seed=1, reward=reward, split="test", evolver="lib", meta=dict(lib))
        t.meta.update(skills_loaded=loads, skill_load_calls=calls)
        ts.append(t)
    ctx.store.add_trajectories(ts)
    md = web_report(tmp_path, ctx.store, "run1", plots=False)
    label = "library (2 skills: click-target, fill-and-submit; miniwob-forms v0 evolving)"
    assert "### Skill use per condition" in md
    assert "| none | test | no skills | 50% (1/2) | 0 | 0 | 0 | – | 50% (1/2) |" in md
    assert f"| lib | test | {label} | 50% (2/4) | 2 | 4 | 2 | 100% (2/2) | 0% (0/2) |" in md
    assert (
        f"- lib, test, {label}: a skill was loaded in 2 of 4 episodes (2 successful loads of 4 load_skill calls); "
        "those episodes succeeded 100% (2/2), the others 0% (0/2)."
    ) in md
    assert "| miniwob-forms | v0 | in a library (catalog) |" in md


# -- attaching a user's skill library (issue 14.1, 14.6, 14.7) --------------------------------------------------
def user_skill(root, name: str = "miniwob-forms", description: str | None = None) -> str:
    """A user's own skill folder ``root/<name>``: the shipped miniwob-forms text plus the marker line."""
    dest = root / name
    shutil.copytree(SHIPPED_SKILLS_DIR / "miniwob-forms", dest)
    md = dest / "SKILL.md"
    text = md.read_text().replace("name: miniwob-forms", f"name: {name}", 1)
    if description is not None:
        text = re.sub(r"(?m)^description:.*$", f"description: {description!r}", text, count=1)
    md.write_text(text + f"\n## Mine\n- {MARKER}\n")
    return str(dest)


def coevo_config(skill_dirs: list[str], **trace2skill) -> dict:
    rollout = {
        "type": "web",
        "taskset": "miniwob_smoke",
        "tasks": ["click-button"],
        "episodes_per_member": 1,
        "test_episodes": 1,
        "max_steps": 1,
        "n_envs": 1,
        "actions": ["click"],
        "use_skills": True,
        "skill_dirs": skill_dirs,
        "skill_name": "miniwob-forms",
    }
    return {
        "run": {"name": "t"},
        "evolvers": [
            {"name": "es", "type": "es", "population_size": 2, "total_generations": 1, "rollout": rollout},
            {"name": "skills", "type": "trace2skill", "skill": "miniwob-forms", "evolvers": ["es"], **trace2skill},
        ],
    }


def test_a_conflict_between_skill_dirs_and_skills_dir_names_both(tmp_path):
    from coevo.config import ConfigError, parse_config

    mine = user_skill(tmp_path / "mine")
    with pytest.raises(ConfigError) as err:
        parse_config(coevo_config([mine], skills_dir=str(SHIPPED_SKILLS_DIR)))
    msg = str(err.value)
    assert "evolvers.skills.skills_dir" in msg and "evolvers.es.rollout.skill_dirs" in msg
    assert str(SHIPPED_SKILLS_DIR / "miniwob-forms") in msg and mine in msg
    same = parse_config(coevo_config([mine], skills_dir=str(tmp_path / "mine")))  # both name one folder: fine
    assert same.evolvers[1].params.source_dir() == (tmp_path / "mine" / "miniwob-forms").resolve()


def test_skill_settings_are_checked_with_the_skills_validator(tmp_path):
    with pytest.raises(ValidationError, match="skill_dirs: set but use_skills is false"):
        build_rollout({"type": "web", "skill_dirs": ["skills/miniwob-forms"]}, None)
    with pytest.raises(ValidationError, match="skill_name, skill_mode: set but use_skills is false"):
        build_rollout({"type": "web", "skill_mode": "catalog", "skill_name": "miniwob-forms"}, None)
    bad = user_skill(tmp_path / "bad", description="")
    with pytest.raises(ValidationError, match=r"coevo skills validate.*description: must not be empty"):
        build_rollout({"type": "web", "use_skills": True, "skill_dirs": [bad]}, None)
    library = tmp_path / "library"  # a folder of skill folders, as `coevo skills validate` takes
    user_skill(library)
    user_skill(library, "form-tricks")
    ro = build_rollout({"type": "web", "use_skills": True, "skill_dirs": [str(library)]}, None)
    assert [p.name for p in ro.initial_skill_dirs] == ["form-tricks", "miniwob-forms"]
    (library / "notes").mkdir()  # a subfolder without SKILL.md is reported, as by `coevo skills validate`
    with pytest.raises(ValidationError, match="notes/SKILL.md: SKILL.md"):
        build_rollout({"type": "web", "use_skills": True, "skill_dirs": [str(library)]}, None)


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
@pytest.mark.browser
@browser
def test_the_users_skill_is_the_one_trace2skill_evolves_and_the_agent_sees(ctx, tmp_path):
    """14.1: Trace2Skill without skills_dir takes the folder the rollout attaches; version 0 the agent runs under
    is the user's text (not the shipped skill of the same name), as the stored system prompt shows (14.9)."""
    from coevo.config import parse_config
    from coevo.evolvers.trace2skill import Trace2SkillEvolver

    mine = user_skill(tmp_path / "mine")
    cfg = parse_config(coevo_config([mine]))
    t2s = Trace2SkillEvolver("skills", cfg.evolvers[1].params, ctx)
    assert t2s.source == Path(mine).resolve() and MARKER in (t2s.path / "SKILL.md").read_text()
    ro = build_rollout(cfg.evolvers[0].params.rollout, ctx)
    try:
        [traj] = ro.run(ScriptedPolicy(click_button_solver), generation=0, member=None, key_prefix="k", split="test")
    finally:
        ro.close()
    assert traj.reward == 1.0 and traj.context == ContextRef(
        skill_name="miniwob-forms", skill_version=0, versions={"skill": 0}
    )
    assert MARKER in traj.steps[0].meta["system_prompt"]
    # version 0 is published by nobody: the agent reads the user's folder itself, whose text Trace2Skill's v0
    # working copy holds (a published version k > 0 points the rollout at Trace2Skill's copy instead)
    assert Path(traj.meta["skill_path"]).resolve() == Path(mine).resolve() and "skill_source" not in traj.meta
    assert (t2s.path / "SKILL.md").read_text() == (Path(mine) / "SKILL.md").read_text()


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
@pytest.mark.browser
@browser
def test_a_loaded_skill_is_shown_once_and_whole(ctx):
    """14.7: in catalog mode the loaded skill's body (longer than max_obs_chars) appears once, uncut; with
    max_skill_chars it is cut with a note naming read_skill_file."""
    from coevo.skills import SkillLibrary

    body = SkillLibrary([SHIPPED_SKILLS_DIR / "miniwob-forms"]).activate("miniwob-forms").strip()
    assert len(body) > 1500
    spec = {
        "type": "web",
        "taskset": "miniwob_smoke",
        "tasks": ["click-button"],
        "test_episodes": 1,
        "max_steps": 2,
        "n_envs": 1,
        "max_obs_chars": 1500,
        "use_skills": True,
        "skill_mode": "catalog",
        "skill_dirs": ["skills/miniwob-forms"],
    }
    for extra, whole in (({}, True), ({"max_skill_chars": 400}, False)):
        ro = build_rollout({**spec, **extra}, ctx)
        policy = ScriptedPolicy(['load_skill("miniwob-forms")', click_button_solver])
        try:
            [traj] = ro.run(policy, generation=0, member=None, key_prefix="k", split="test")
        finally:
            ro.close()
        second = policy.conversations[1][1]["content"]
        assert traj.reward == 1.0 and traj.meta["skills_loaded"] == 1
        assert second.count("# Loaded skill: miniwob-forms") == 1 and second.count(body[:200]) == 1
        assert (body in second) is whole
        assert ("read the rest with read_skill_file('miniwob-forms', 'SKILL.md')" in second) is not whole
        assert body[:200] not in traj.steps[0].tool_result  # the step's feedback only says it was loaded
