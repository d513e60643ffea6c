"""The built-in ``reevo`` evolver (coevo/evolvers/reevo.py) and the free-text calls it is built on
(``HeuristicSampler.text`` / ``texts``): ReEvo's loop on a scripted model (test double: the model's answers are
fixed so the search's logic is checked), every LLM call counted, reflections recorded as text and kept out of the
valid rate, the long-term reflection published and reported, bad text answers recorded as what they are, and a
run stopped and resumed on the tiny random Qwen2 ending where an uninterrupted one does."""

from __future__ import annotations

import json
import logging
import re
import time
from collections import Counter
from pathlib import Path

import pytest

from coevo.backends.base import Completion
from coevo.config import parse_config
from coevo.evolvers.reevo import REFLECTOR_SYSTEM
from coevo.loop import CoEvolutionLoop
from coevo.store import TrajectoryStore
from coevo.store.export import context_path, export_context_jsonl
from coevo.types import is_text
from tests.test_eoh import FARTHEST, NN_SAME_OBJECTIVE, SMALL, TOWARD_HOME, ScriptedPolicy, _ctx, reply

pytestmark = pytest.mark.usefixtures("private_cache")

SHORT = "Weigh the distance back home."
LONG = "Prefer near cities; weigh the way back home; keep the rule simple."
HEURISTICS = [reply("near, home", TOWARD_HOME), reply("farthest", FARTHEST), reply("nearest", NN_SAME_OBJECTIVE)]


class ReflectingScript(ScriptedPolicy):
    """Test double for the model: answers reflection prompts (ReEvo's reflector system prompt) with ``short`` /
    ``long`` texts, every other prompt from the heuristic script; logs the prompts."""

    def __init__(self, short=SHORT, long=LONG, script=HEURISTICS):
        super().__init__(script)
        self.short, self.long = short, long
        self.kinds: list[str] = []

    def generate(self, conversations, params):
        out = []
        for conv in conversations:
            if conv[0]["content"] == REFLECTOR_SYSTEM:
                lt = "long-term reflection" in conv[-1]["content"]
                self.kinds.append("lt" if lt else "st")
                self.prompts.append(conv[-1]["content"])
                out.append(Completion(text=self.long if lt else self.short, prompt_tokens=100, completion_tokens=12))
            else:
                self.kinds.append("h")
                out.extend(super().generate([conv], params))
        return out


def _config(rounds: int, max_samples: int | None = None, model: dict | None = None, **over) -> dict:
    reevo = {
        "name": "reevo",
        "type": "reevo",
        **SMALL,
        "population_size": 2,
        "init_population_size": 3,
        "mutation_rate": 1.0,
        "include_seed_heuristic": True,
        "reject_same_behaviour": False,
        "reject_duplicates": False,  # three scripted heuristics: copies stay valid, so pairs can be drawn
        **over,
    }
    data = {
        "run": {"name": "reevo", "seed": 7},
        "budget": {"max_rounds": rounds, **({"max_samples": max_samples} if max_samples else {})},
        "evolvers": [reevo],
        "report": {"plots": False},
    }
    if model:
        data["model"] = model
    return data


def _run(run_dir: Path, data: dict, policy=None, resume: bool = False) -> CoEvolutionLoop:
    loop = CoEvolutionLoop(
        parse_config(data),
        run_dir,
        raw_config=data,
        resume=resume,
        progress=False,
        policy_factory=(lambda: policy) if policy is not None else None,
    )
    loop.run()
    return loop


def _trajectories(run_dir: Path) -> list[tuple]:
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        return [
            (t.key, t.reward, t.failure, t.llm_calls, t.steps[0].model_output)
            for t in s.query(run_id="run", order_by="id")
        ]


def test_reevo_iteration_reflects_crosses_over_publishes_and_mutates_the_elitist(tmp_path):
    policy = ReflectingScript()
    loop = _run(tmp_path / "run", _config(3), policy)
    ev = loop.evolvers["reevo"]
    with TrajectoryStore(tmp_path / "run" / "store.sqlite", readonly=True) as s:
        trajs = s.query(run_id="run", order_by="id")
        ctx_values = s.list_artifacts(kind="context", run_id="run")
    ops = Counter(t.meta.get("kind") if is_text(t) else t.meta["operator"] for t in trajs)
    # init 3; then two iterations of 2 short-term reflections, 2 crossovers, 1 long-term reflection, 2 mutations
    assert ops == {"init": 3, "short_term_reflection": 4, "crossover": 4, "long_term_reflection": 2, "mutation": 4}
    assert sum(t.llm_calls for t in trajs) == policy.calls + policy.kinds.count("st") + policy.kinds.count("lt")
    st = [t for t in trajs if t.meta.get("kind") == "short_term_reflection"]
    assert all(t.meta["text"] == SHORT and t.reward is None and t.valid for t in st)
    # each pair goes worse first, better second, as ReEvo's prompt says
    objective = {t.key.split("/", 1)[1]: t.meta["objective"] for t in trajs if t.valid and not is_text(t)}
    objective["seed"] = ev.sampler.seed_individual().objective
    pairs = [t.meta["parent_ids"] for t in st]
    assert all(objective[w] > objective[b] for w, b in pairs)  # minimisation: the worse one has the longer tour
    crossover = [p for p in policy.prompts if "[Improved code] Heuristic 2 performs better" in p]
    assert crossover and all(f"[Reflection]\n{SHORT}" in p for p in crossover)
    mutation = [p for p in policy.prompts if "Write a mutated heuristic" in p]
    assert mutation and all(f"[Prior reflection]\n{LONG}" in p for p in mutation)
    assert not any("A note from comparing" in p for p in policy.prompts)  # the caller's labels, not EoH's
    assert [a.content["value"] for a in ctx_values] == [LONG] and ctx_values[0].name == "reevo/long_term_reflection"
    assert ev.long_term == LONG and [i for i, _ in ev.long_term_history] == [1, 2]
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Published context" in report and "reevo/long_term_reflection" in report
    assert "Long-term reflections (each replaces the one before)" in report
    made = [t for t in trajs if not is_text(t)]
    valid_pct = f"{100 * sum(t.valid for t in made) / len(made):.1f}%"
    text_tokens = sum(t.prompt_tokens + t.completion_tokens for t in trajs if is_text(t))
    row = next(line for line in report.splitlines() if line.startswith("| reevo |"))
    assert f"| {valid_pct} | 6 | {text_tokens} |" in row  # valid % over heuristics only; 6 text calls apart
    assert "(6 of them free-text calls)" in report
    out = tmp_path / "export.jsonl"
    with TrajectoryStore(tmp_path / "run" / "store.sqlite", readonly=True) as s:
        assert export_context_jsonl(s, context_path(out), run_id="run") == 1
    (line,) = context_path(out).read_text().splitlines()
    assert json.loads(line)["value"] == LONG and json.loads(line)["key"] == "reevo/long_term_reflection"


def test_a_stopped_and_resumed_scripted_reevo_ends_where_an_uninterrupted_one_does(tmp_path):
    ref = _run(tmp_path / "ref" / "run", _config(3), ReflectingScript())
    policy = ReflectingScript()
    _run(tmp_path / "cut" / "run", _config(2), policy)
    resumed = _run(tmp_path / "cut" / "run", _config(3), policy, resume=True)
    assert _trajectories(tmp_path / "cut" / "run") == _trajectories(tmp_path / "ref" / "run")
    assert resumed.evolvers["reevo"].state_dict() == ref.evolvers["reevo"].state_dict()


def test_a_stopped_and_resumed_reevo_on_the_tiny_model_ends_where_an_uninterrupted_one_does(tmp_path, tiny_model_dir):
    """The real backend (tiny random Qwen2: every answer is garbage, so iterations mutate the seed elitist)."""
    model = {"name": str(tiny_model_dir), "dtype": "float32"}
    data = _config(3, max_samples=9, model=model, max_new_tokens=16, init_population_size=2)
    _run(tmp_path / "ref" / "run", data)
    _run(tmp_path / "cut" / "run", {**data, "budget": {"max_rounds": 2, "max_samples": 9}})
    _run(tmp_path / "cut" / "run", data, resume=True)
    cut, ref = _trajectories(tmp_path / "cut" / "run"), _trajectories(tmp_path / "ref" / "run")
    assert cut == ref and sum(t[3] for t in ref) == len(ref) >= 4


def test_bad_text_answers_are_recorded_as_what_they_are_and_the_run_goes_on(tmp_path, caplog):
    ctx = _ctx(tmp_path, max_samples=4, policy=ReflectingScript())
    from coevo.evolvers.reevo import ReEvoConfig, ReEvoEvolver

    ev = ReEvoEvolver("reevo", ReEvoConfig(**SMALL), ctx)
    s = ev.sampler
    msgs = [{"role": "system", "content": REFLECTOR_SYSTEM}, {"role": "user", "content": "long-term reflection?"}]

    class Answers(ScriptedPolicy):
        def __init__(self, comps):
            super().__init__()
            self.comps = comps

        def generate(self, conversations, params):
            return [self.comps.pop(0) for _ in conversations]

    bad = Answers(
        [
            Completion(text="", finish_reason="error", error="connection reset"),
            Completion(text="   "),
            Completion(text="x" * 50, completion_tokens=9),
        ]
    )
    keys = [s.key("t", i) for i in range(3)]
    got = [s.text(msgs, key=k, kind="critique", round_index=0, generation=0, max_chars=20, policy=bad) for k in keys]
    assert got == [None, None, "x" * 20]
    failed, empty, long = (ctx.store.get_by_key(k) for k in keys)
    assert failed.failure == "llm_error" and failed.failure_detail == "connection reset" and failed.llm_calls == 1
    assert empty.failure == "parse" and empty.failure_detail == "empty answer"
    assert long.valid and long.meta["cut_from_chars"] == 50 and long.steps[0].model_output == "x" * 50
    assert all(is_text(t) and t.task_id.endswith("/critique") for t in (failed, empty, long))
    # a stored call is not made again (resume): the same text, no new sample
    assert s.text(msgs, key=keys[2], kind="critique", round_index=0, generation=0, policy=bad) == "x" * 20
    # past the budget (4 samples, 3 used): the second call of the batch is not made, not recorded, and said once
    from coevo.ahd.sampler import TextCall

    more = Answers([Completion(text="ok")])
    with caplog.at_level(logging.WARNING):
        out = s.texts(
            [TextCall(s.key("m", 0), msgs, "critique"), TextCall(s.key("m", 1), msgs, "critique")],
            round_index=0,
            generation=0,
            policy=more,
        )
    assert out == ["ok", None] and ctx.store.get_by_key(s.key("m", 1)) is None
    assert "reevo: the sample budget is spent" in caplog.text and s.key("m", 1) in caplog.text
    # text under a heuristic kind: one line naming the evolver
    with pytest.raises(ValueError, match=r"evolver 'reevo': text call .* kind 'm1', a heuristic kind"):
        s.text(msgs, key=s.key("h"), kind="m1", round_index=0, generation=0, policy=more)


def test_progress_counts_text_calls_apart_and_elapsed_counts_from_the_run_start():
    import io

    from coevo.progress import RunProgress

    progress = RunProgress("lines", stream=io.StringIO(), interval_s=60, max_samples=32)
    progress.start(1, 9, text_calls=3, elapsed_s=3725)  # a resumed run: 9 samples (3 text), 1 h 2 min 5 s before
    try:
        progress.step_started(1, "reevo", "context", 9)
        progress.event("samples", 4)
        progress.event("trajectories", 4)
        progress.event("text", 4)
        status = progress.status()
    finally:
        progress.close()
    assert "LLM samples 13/32 (7 text calls)" in status
    assert "this step: 4 samples (4 text calls), 4 trajectories" in status
    assert re.search(r"elapsed 1:02:0[5-9]", status), status


def test_a_resumed_run_reports_text_calls_and_its_whole_elapsed_time(tmp_path):
    """Through the loop: the scripted ReEvo run resumed; ``run.log``'s first progress line of the second session
    counts the first session's text calls and does not restart ``elapsed`` at 0."""

    class SlowScript(ReflectingScript):  # a first session long enough (>1 s) for its wall time to be seen
        def generate(self, conversations, params):
            time.sleep(0.3)
            return super().generate(conversations, params)

    policy = SlowScript()
    _run(tmp_path / "run", _config(2), policy)
    log1 = (tmp_path / "run" / "run.log").read_text()
    loop = CoEvolutionLoop(
        parse_config(_config(3)),
        tmp_path / "run",
        raw_config=_config(3),
        resume=True,
        progress="lines",
        policy_factory=lambda: policy,
    )
    wall_before = loop.budget.wall_used_s
    loop.run()
    later = (tmp_path / "run" / "run.log").read_text()[len(log1) :]
    first = next(line for line in later.splitlines() if "LLM samples" in line)
    assert "text calls)" in first, first
    h, m, sec = map(int, re.search(r"elapsed (\d+):(\d\d):(\d\d)", first).groups())
    assert wall_before > 1 and h * 3600 + m * 60 + sec >= int(wall_before)


def test_reevo_beside_es_on_the_tiny_model_pools_member_children_and_replays(tmp_path, tiny_model_dir):
    """ES members write m1 variants for ReEvo's search (rollout ``eoh_children``) under perturbed weights; the
    run's ES history replays (``coevo es replay --check``)."""
    from coevo.cli import main as coevo_main

    data = _config(4, max_samples=12, model={"name": str(tiny_model_dir), "dtype": "float32"})
    data["evolvers"][0].update(max_new_tokens=16, init_population_size=2)
    data["evolvers"].append(
        {
            "name": "es",
            "type": "es",
            "population_size": 2,
            "total_generations": 2,
            "eval_every": 0,
            "rollout": {"type": "eoh_children", "evolver": "reevo"},
        }
    )
    data["schedule"] = [{"evolver": "reevo", "every": 1}, {"evolver": "es", "every": 1, "start": 1}]
    _run(tmp_path / "run", data)
    with TrajectoryStore(tmp_path / "run" / "store.sqlite", readonly=True) as s:
        kids = s.query(run_id="run", evolver="es")
        assert kids and all(t.meta["sampler"] == "reevo" and t.member is not None for t in kids)
        assert {t.meta["operator"] for t in kids} == {"m1"}
        assert s.count_llm_calls("run") <= 12
    assert coevo_main(["es", "replay", str(tmp_path / "run"), "--check"]) == 0
