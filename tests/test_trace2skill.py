"""Trace2Skill evolver, driven by the real CoEvolutionLoop over a real SQLite store and real skill folders.

The model is replaced by :class:`ScriptedPolicy`, a :class:`~coevo.backends.base.Policy` subclass that returns
canned analyst / patch / merge / fix answers chosen from the prompt: a test double for the model only.
Everything else is real: the pooled trajectories (written by the toy agent evolver :class:`PoolWriter`),
patch parsing and application, spec validation, the stored skill versions, the gate rollout
(:class:`SkillTextRollout`, whose score depends on the skill text it is given through ``ctx.shared``).
The last test runs the real tiny random Qwen2.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import pytest

from coevo.backends.base import Completion, Policy
from coevo.config import ConfigError, parse_config
from coevo.evolvers.base import Evolver, EvolverConfig, StepReport
from coevo.loop import CoEvolutionLoop
from coevo.report.writer import step_records
from coevo.rollouts.base import Rollout, RolloutConfig
from coevo.skills import parse_patch, validate_skill
from coevo.skills.prompts import HIDDEN, ROLE_TITLES, ground_truth_values, parse_analysis, patch_json, redact
from coevo.store import TrajectoryStore
from coevo.types import ContextRef, Step, Trajectory

SECRET = "SECRET-4242"
SKILL_MD = """---
name: form-filling
description: Fill web forms. Use when a task asks to enter values into fields and submit them.
---

# Form filling

## Steps
1. Read the goal.
2. Fill each field.

## Tips
- Check the values before submitting.
"""


# ---------------------------------------------------------------------------------------------- test parts
class PoolWriterConfig(EvolverConfig):
    pass


class PoolWriter(Evolver):
    """A toy agent evolver: per step two failed web-like episodes (one with a reference answer in meta that
    also shows up in its observation and failure detail) and one success."""

    space = "parameter"
    Config = PoolWriterConfig

    def step(self, round_index: int) -> StepReport:
        episodes = [
            ("task-a", 0.0, {}, "[3] textbox 'Full name'", "fill('3', 'bob')", "value too short", None),
            (
                "task-b",
                0.0,
                {"reference_answer": SECRET, "case": {"answer": "Paris"}},
                f"[5] StaticText 'Code: {SECRET}' [6] StaticText 'Capital: Paris'",
                "send_msg_to_user('1234')",
                "wrong answer",
                f"expected {SECRET}",
            ),
            ("task-c", 1.0, {}, "[7] button 'Submit'", "click('7')", "form submitted", None),
        ]
        made = []
        for i, (task, reward, meta, obs, action, feedback, detail) in enumerate(episodes):
            steps = [
                Step(observation=obs, model_output=f"I act.\n{action}", action=action, tool_result=feedback),
                Step(observation=obs + " (after)", model_output="noop()", action="noop()"),
            ]
            made.append(
                self.ctx.record(
                    Trajectory(
                        key=self.ctx.traj_key(self.name, round_index, i),
                        run_id=self.ctx.run_id,
                        evolver=self.name,
                        space="parameter",
                        round=round_index,
                        task_id=task,
                        steps=steps,
                        reward=reward,
                        failure_detail=detail,
                        llm_calls=len(steps),
                        meta=meta,
                        context=ContextRef(
                            **{
                                k: (self.ctx.context("skill").value or {}).get(k2)
                                for k, k2 in (("skill_name", "name"), ("skill_version", "version"))
                            }
                        ),
                    )
                )
            )
        return StepReport(samples=sum(t.llm_calls for t in made), trajectories=len(made))


class SkillTextRolloutConfig(RolloutConfig):
    cases: int = 3
    good: str | None = None
    bad: str | None = None


class SkillTextRollout(Rollout):
    """Held-out score from the skill it reads in context slot ``skill``: 0.5, +0.5 if the SKILL.md holds
    ``good``, -0.5 if it holds ``bad``; one trajectory per case, no model calls."""

    Config = SkillTextRolloutConfig
    context_slots: ClassVar[dict[str, str]] = {"skill": "the skill {name, version, path}"}

    def run(self, policy, *, generation, member, key_prefix, split="train", evolver="es", round_index=0):
        skill = self.current_context().values["skill"]
        text = (Path(skill["path"]) / "SKILL.md").read_text()
        c = self.config
        reward = 0.5 + 0.5 * bool(c.good and c.good in text) - 0.5 * bool(c.bad and c.bad in text)
        return [
            Trajectory(
                key=f"{key_prefix}/{i}",
                run_id=self.ctx.run_id,
                evolver=evolver,
                space="context",
                round=round_index,
                generation=generation,
                task_id=f"{split}-{i}",
                reward=reward,
                steps=[Step(observation=skill["path"])],
                context=ContextRef(skill_name=skill["name"], skill_version=skill["version"]),
            )
            for i in range(c.cases)
        ]

    def n_cases(self, split="train"):
        return self.config.cases


class ScriptedPolicy(Policy):
    """Canned answers per role (told apart by the system prompt's title); records every prompt it gets."""

    def __init__(self, **answers: Callable[[str], str]):
        self.answers = {**DEFAULT_ANSWERS, **answers}
        self.calls: list[tuple[str, str]] = []

    def generate(self, conversations, params):
        out = []
        for conv in conversations:
            role = next(r for r, title in ROLE_TITLES.items() if conv[0]["content"].startswith(title))
            text = "\n".join(m["content"] for m in conv)
            self.calls.append((role, text))
            out.append(Completion(text=self.answers[role](text), prompt_tokens=len(text) // 4, completion_tokens=9))
        return out


def _analyst(text: str) -> str:
    if "Task: task-a" in text:
        return (
            '```json\n{"root_cause": "short name", "minimal_fix": "type the full name", '
            '"lessons": ["L-A: type the full name exactly as the goal gives it."]}\n```'
        )
    if "Task: task-b" in text:  # the second lesson quotes the hidden answer: it must be dropped
        return json.dumps(
            {
                "root_cause": "guessed",
                "lessons": ["L-B: read the code on the page before answering.", f"The code is {SECRET}."],
            }
        )
    return "Lean path: click Submit.\nLessons:\n- L-C: submit once, after every field is filled."


#: the edit lesson L-A proposes (a tip) and the one L-C's patch applies (a step; its other edit misses its anchor)
TIP_A = {"op": "append_to_section", "section": "## Tips", "content": "- L-A: type names in full."}
STEP_C = {"op": "insert_after", "anchor": "2. Fill each field.", "content": "3. L-C: submit once."}


def _patch(text: str) -> str:
    if "L-A" in text:
        return json.dumps({"reasoning": "L-A", "changelog": "tip on names", "edits": [TIP_A]})
    if "L-B" in text:
        return "I would add a tip about reading codes, { but this is not JSON."
    missed = {"op": "insert_after", "anchor": "This anchor is not in the skill", "content": "x"}
    return json.dumps({"reasoning": "L-C", "changelog": "submit once", "edits": [missed, STEP_C]})


def _merge(text: str) -> str:
    return json.dumps({"reasoning": "both", "changelog": "names in full; submit once", "edits": [TIP_A, STEP_C]})


DEFAULT_ANSWERS = {"analyst": _analyst, "patch": _patch, "merge": _merge, "fix": lambda text: "no idea"}


@pytest.fixture
def skills_dir(tmp_path: Path) -> Path:
    (tmp_path / "skills" / "form-filling").mkdir(parents=True)
    (tmp_path / "skills" / "form-filling" / "SKILL.md").write_text(SKILL_MD)
    return tmp_path / "skills"


def _config(skills_dir: Path, max_samples: int | None = None, **t2s) -> dict:
    return {
        "run": {"name": "t2s", "seed": 3},
        "budget": {"max_rounds": 1, "max_samples": max_samples},
        "report": {"plots": False},
        "evolvers": [
            {"name": "agent", "type": "test_trace2skill:PoolWriter"},
            {
                "name": "t2s",
                "type": "trace2skill",
                "skill": "form-filling",
                "skills_dir": str(skills_dir),
                "lessons_per_patch": 1,
                **t2s,
            },
        ],
    }


def _run(run_dir: Path, data: dict, policy: Policy | None, resume: bool = False) -> CoEvolutionLoop:
    loop = CoEvolutionLoop(
        parse_config(data),
        run_dir,
        raw_config=data,
        progress=False,
        resume=resume,
        policy_factory=None if policy is None else lambda: policy,
    )
    loop.run()
    return loop


def _published_version(loop: CoEvolutionLoop) -> int:
    """The skill version Trace2Skill published on the context channel (0: none yet, the initial folder)."""
    value = loop.ctx.context("skill").value
    assert value is None or value["version"] == loop.ctx.context("skill").version  # one version per new skill
    return 0 if value is None else value["version"]


def _t2s_metrics(store: TrajectoryStore, run_id: str) -> dict:
    return [s for s in step_records(store, run_id) if s["evolver"] == "t2s"][-1]["metrics"]


# ---------------------------------------------------------------------------------------------- tests
def test_new_version_from_pooled_trajectories(tmp_path, skills_dir):
    policy = ScriptedPolicy()
    run_dir = tmp_path / "run"
    loop = _run(run_dir, _config(skills_dir), policy)
    v1 = run_dir / "skills" / "form-filling" / "v1" / "form-filling"
    assert {k: v for k, v in loop.ctx.context("skill").value.items() if k != "source"} == {
        "name": "form-filling",
        "version": 1,
        "path": str(v1),
    }
    assert loop.ctx.context("skill").value["source"].endswith("form-filling")  # the folder version 0 was copied from
    assert (run_dir / "skills" / "form-filling" / "v0" / "form-filling" / "SKILL.md").read_text() == SKILL_MD
    assert validate_skill(v1) == []
    text = (v1 / "SKILL.md").read_text()
    assert "- L-A: type names in full." in text and "2. Fill each field.\n3. L-C: submit once." in text
    assert SECRET not in text
    roles = [r for r, _ in policy.calls]
    assert roles == ["analyst"] * 3 + ["patch"] * 3 + ["merge"]
    with TrajectoryStore(run_dir / "store.sqlite") as store:
        art = store.get_artifact("skill", "form-filling")
        assert art.version == 1 and "+- L-A: type names in full." in art.content["diff"]
        pooled = {t.task_id: t.id for t in store.query(run_id="run", evolver="agent")}
        # task-b's patch was invalid JSON, so only a and c caused the version
        assert sorted(art.content["trajectory_ids"]) == sorted([pooled["task-a"], pooled["task-c"]])
        assert art.meta["changelog"] == "names in full; submit once" and art.meta["edits"] == 2
        calls = store.query(run_id="run", evolver="t2s")
        assert len(calls) == len(policy.calls) == 7 and all(t.llm_calls == 1 and t.space == "context" for t in calls)
        bad = [t for t in calls if t.meta["t2s_role"] == "patch" and not t.valid]
        assert len(bad) == 1 and bad[0].failure == "parse" and "invalid patch JSON" in bad[0].failure_detail
        anchor = [t for t in calls if t.meta["t2s_role"] == "patch" and t.valid and t.meta["rejected"]]
        assert len(anchor) == 1 and "not found" in anchor[0].meta["rejected"][0]
        # every call counts against the budget, next to the agent's own calls
        assert store.count_llm_calls("run") == 3 * 2 + len(policy.calls)
        m = _t2s_metrics(store, "run")
    assert m["analysed"] == 3 and m["patches_valid"] == 2 and m["patches_invalid"] == 1
    assert m["edits_applied"] == 2 and m["edits_rejected"] == 2 and m["lessons_dropped"] == 1
    assert m["version"] == 1 and m["merge_calls"] == 1 and m["merge_fallbacks"] == 0
    report = (run_dir / "report.md").read_text()
    assert "Skill `form-filling`: current version 1" in report and "```diff" in report
    assert "| 0 | 3 | 3 | 2/3 | 2 | 2 | new version v1 |" in report
    assert "| t2s | context | 7 | 7 | 85.7% |" in report  # 6 of its 7 calls valid, though none has a reward


def test_second_step_reads_only_new_trajectories_and_builds_on_the_last_version(tmp_path, skills_dir):
    policy = ScriptedPolicy()
    data = _config(skills_dir)
    data["budget"]["max_rounds"] = 2
    loop = _run(tmp_path / "run", data, policy)
    assert [r for r, _ in policy.calls].count("analyst") == 6  # 3 per round, none analysed twice
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        _, v2 = store.list_artifacts("skill", "form-filling")
        new_ids = {t.id for t in store.query(run_id="run", evolver="agent", round=1)}
        assert v2.parent_version == 1 and set(v2.content["trajectory_ids"]) <= new_ids
        assert v2.content["files"]["SKILL.md"].count("- L-A: type names in full.") == 2
        assert v2.content["diff"].count("\n+- L-A") == 1  # the diff is against v1, not v0
    assert _published_version(loop) == 2
    assert loop.evolvers["t2s"].state_dict()["cursor"] == max(new_ids)


def test_ground_truth_never_reaches_the_analyst(tmp_path, skills_dir):
    policy = ScriptedPolicy()
    _run(tmp_path / "run", _config(skills_dir), policy)
    prompts = [text for role, text in policy.calls if role == "analyst"]
    assert len(prompts) == 3
    for text in prompts:
        assert SECRET.lower() not in text.lower() and "paris" not in text.lower()
    task_b = next(t for t in prompts if "Task: task-b" in t)
    assert f"Code: {HIDDEN}" in task_b and f"expected {HIDDEN}" in task_b
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        analyst_b = next(t for t in store.query(run_id="run", evolver="t2s") if "task-b" in t.task_id)
    assert analyst_b.valid and SECRET not in analyst_b.steps[0].action
    assert "quotes a hidden value" in analyst_b.meta["rejected"][0]


def test_budget_cuts_calls_and_the_step_goes_on(tmp_path, skills_dir):
    policy = ScriptedPolicy()
    data = _config(skills_dir, max_samples=3 * 2 + 2)  # the agent's 6 calls, then 2 for trace2skill
    loop = _run(tmp_path / "run", data, policy)
    assert [r for r, _ in policy.calls] == ["analyst", "analyst"]
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        assert store.count_llm_calls("run") == 8
        assert store.get_artifact("skill", "form-filling") is None
        assert _t2s_metrics(store, "run")["analysed"] == 2
    assert _published_version(loop) == 0


def test_merge_falls_back_to_programmatic_merger(tmp_path, skills_dir):
    policy = ScriptedPolicy(merge=lambda text: "Here is the merged patch: edits A and C.")
    _run(tmp_path / "run", _config(skills_dir), policy)
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        m = _t2s_metrics(store, "run")
        text = store.get_artifact("skill", "form-filling").content["files"]["SKILL.md"]
    assert m["merge_calls"] == 1 and m["merge_fallbacks"] == 1 and m["edits_applied"] == 2
    assert "L-A: type names in full." in text and "3. L-C: submit once." in text


@pytest.mark.parametrize("fixed", [True, False])
def test_fix_rounds_repair_or_discard(tmp_path, skills_dir, fixed):
    def patch(text):
        return json.dumps(
            {
                "edits": [
                    {
                        "op": "append_to_section",
                        "section": "Tips",
                        "content": "- See [name rules](references/names.md).",
                    }
                ]
            }
        )

    def fix(text):
        assert "references/names.md" in text and "does not exist" in text
        return (
            json.dumps({"edits": [{"op": "create", "file": "references/names.md", "content": "Full names.\n"}]})
            if fixed
            else "```json\n{broken\n```"
        )

    policy = ScriptedPolicy(patch=patch, fix=fix, merge=lambda text: "not json")
    loop = _run(tmp_path / "run", _config(skills_dir, fix_rounds=2), policy)
    assert [r for r, _ in policy.calls].count("fix") == (1 if fixed else 2)
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        art = store.get_artifact("skill", "form-filling")
        assert _t2s_metrics(store, "run")["fix_calls"] == (1 if fixed else 2)
    if fixed:
        assert art.content["files"]["references/names.md"] == "Full names.\n"
        assert validate_skill(loop.evolvers["t2s"].path) == []
    else:
        assert art is None and _published_version(loop) == 0
        report = (tmp_path / "run" / "report.md").read_text()
        assert "no new version: the patched skill violates the spec after 2 fix call(s) (" in report


@pytest.mark.parametrize(("gate", "kept"), [({"bad": "L-C"}, False), ({"good": "L-A"}, True)])
def test_gate_keeps_only_versions_that_do_not_lower_the_held_out_score(tmp_path, skills_dir, gate, kept):
    rollout = {"type": "test_trace2skill:SkillTextRollout", "cases": 3, **gate}
    policy = ScriptedPolicy()
    loop = _run(tmp_path / "run", _config(skills_dir, gate={"rollout": rollout, "split": "test"}), policy)
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        m = _t2s_metrics(store, "run")
        art = store.get_artifact("skill", "form-filling")
        gated = [t for t in store.query(run_id="run", evolver="t2s") if "/gate/" in t.key]
        scores = sorted(store.list_artifacts(kind="context_score"), key=lambda a: a.id)
    assert m["gate_current"] == 0.5 and m["gate_candidate"] == (1.0 if kept else 0.0)
    # 3 cases under v0, then 3 under the candidate (pinned as context `skill` while the gate scores it)
    assert [t.context.skill_version for t in gated] == [0, 0, 0, 1, 1, 1]
    assert [s.content["versions"] for s in scores] == [{"skill": 0}, {"skill": -1}]  # -1: a candidate
    assert _published_version(loop) == (1 if kept else 0)
    assert (art is not None) == kept
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| 0 | – | – | 0.5 |" in report
    assert ("| new version v1 |" in report) == kept
    assert ("no new version: the gate kept v0: candidate 0 < current 0.5 + min_delta 0 |" in report) == (not kept)
    if kept:
        assert art.meta["gate_candidate"] == 1.0 and art.meta["gate_current"] == 0.5


def test_resume_reuses_cached_calls(tmp_path, skills_dir):
    run_dir = tmp_path / "run"
    data = _config(skills_dir)
    first = ScriptedPolicy()
    _run(run_dir, data, first)
    with TrajectoryStore(run_dir / "store.sqlite") as store:
        used, m1 = store.count_llm_calls("run"), _t2s_metrics(store, "run")
    shutil.rmtree(run_dir / "checkpoints")  # as if killed before the step's checkpoint: the step re-runs
    second = ScriptedPolicy()
    loop = _run(run_dir, data, second, resume=True)
    assert second.calls == []
    with TrajectoryStore(run_dir / "store.sqlite") as store:
        assert store.count_llm_calls("run") == used
        assert [a.version for a in store.list_artifacts("skill", "form-filling")] == [1]
        m2 = _t2s_metrics(store, "run")
    assert {k: m2[k] for k in m1} == m1
    assert _published_version(loop) == 1


def test_config_errors_name_the_field(tmp_path, skills_dir):
    with pytest.raises(ConfigError, match="evolvers.t2s.skill"):
        parse_config(_config(skills_dir, skill="Bad_Name"))
    with pytest.raises(ConfigError, match="evolvers.t2s.batch_size"):
        parse_config(_config(skills_dir, batch_size=1))
    with pytest.raises(ConfigError, match="evolvers.t2s.model: .*base_url"):
        parse_config(_config(skills_dir, model={"name": "m", "backend": "openai"}))
    data = _config(skills_dir, gate={"rollout": {"type": "test_trace2skill:SkillTextRollout", "cases": 0.5}})
    with pytest.raises(ValueError, match="evolvers.t2s.gate.rollout.cases: Input should be a valid integer"):
        CoEvolutionLoop(parse_config(data), tmp_path / "run", raw_config=data, progress=False)
    data = _config(skills_dir, evolvers=["agnt"])
    with pytest.raises(ValueError, match=r"evolvers.t2s.evolvers: unknown \['agnt'\]"):
        _run(tmp_path / "run2", data, ScriptedPolicy())
    data = _config(skills_dir, skill="no-such-skill")
    with pytest.raises(ValueError, match="evolvers.t2s.skill: no skill folder"):
        CoEvolutionLoop(parse_config(data), tmp_path / "run", raw_config=data, progress=False)


def test_prompt_helpers():
    meta = {"task": "t", "eval": {"reference_answers": {"must_include": ["Bob Smith", 42]}}, "case": {"answer": 7}}
    assert ground_truth_values(meta) == ["Bob Smith", "42", "7"]
    assert (
        redact("bob smith paid 42 of 420 (7)", ["Bob Smith", "42", "7"]) == f"{HIDDEN} paid {HIDDEN} of 420 ({HIDDEN})"
    )
    patch, _ = parse_patch(
        {
            "edits": [
                {"op": "create", "file": "references/a.md", "content": "x"},
                {"op": "append_to_section", "section": "Tips", "content": "- y"},
            ]
        }
    )
    assert parse_patch(patch_json(patch)) == (patch, [])
    a = parse_analysis("Root cause: x\nLessons learned:\n1. Read first.\n- Check twice.\nnot a bullet")
    assert a.lessons == ["Read first.", "Check twice."]
    with pytest.raises(ValueError, match="no lessons"):
        parse_analysis('{"root_cause": "x"}')


def test_nothing_to_analyse_is_a_quiet_step(tmp_path, skills_dir):
    data = _config(skills_dir)
    data["evolvers"] = data["evolvers"][1:]  # no agent: an empty pool
    policy = ScriptedPolicy()
    loop = _run(tmp_path / "run", data, policy)
    assert policy.calls == [] and _published_version(loop) == 0
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        assert _t2s_metrics(store, "run")["analysed"] == 0
    assert (
        "no new version: no new trajectories of the watched evolvers to analyse"
        in (tmp_path / "run" / "report.md").read_text()
    )


def test_tiny_qwen2_analyst_model_garbage_is_rejected_without_a_new_version(tmp_path, skills_dir, tiny_model_dir):
    """The real tiny random Qwen2 as the ``model:`` sub-config (the run itself has no model)."""
    model = {"name": str(tiny_model_dir), "backend": "hf", "dtype": "float32"}
    data = _config(skills_dir, model=model, max_new_tokens=12, patch_max_new_tokens=12, max_step_chars=200)
    loop = _run(tmp_path / "run", data, None)
    with TrajectoryStore(tmp_path / "run" / "store.sqlite") as store:
        calls = store.query(run_id="run", evolver="t2s")
        assert len(calls) == 3 and all(not t.valid and t.failure == "parse" for t in calls)
        assert all(t.steps[0].model_output is not None and t.completion_tokens > 0 for t in calls)
        assert store.count_llm_calls("run") == 3 * 2 + 3
        assert store.get_artifact("skill", "form-filling") is None
        assert _t2s_metrics(store, "run")["patches_valid"] == 0
    assert _published_version(loop) == 0 and loop.ctx._policy is None
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| no new version: no usable analysis in 3 analyst call(s) (" in report
    assert "| t2s | context | 3 | 3 | 0.0% |" in report  # none of its calls was valid
