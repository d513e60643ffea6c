"""The wall-clock budget holds inside an LLM call (issue 26 item 3): decoding stops at the budget's deadline.

On the tiny random Qwen2 (greedy decoding never emits EOS there, so a long ``max_new_tokens`` keeps a batch busy
for seconds): a plain ``HFPolicy.generate`` batch and a low-rank ES population batch are cut at
:func:`coevo.backends.base.decode_deadline` and return nothing; with the deadline not reached their outputs are
unchanged. Then a real ES run through :class:`~coevo.loop.CoEvolutionLoop` whose ``budget.max_wall_s`` falls
inside its first population batch: it ends shortly after the budget, the batch is recorded as cut (artifact
``step_cut``, no trajectory, no sample charged), and ``--resume`` with a larger budget re-runs it to the same
trajectories and weights as an uncut run.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from coevo.artifacts import STEP_CUT
from coevo.backends.base import SamplingParams, current_deadline, decode_deadline
from coevo.backends.hf import HFPolicy
from coevo.config import parse_config
from coevo.errors import DeadlineReached
from coevo.es import ScopeSpec
from coevo.loop import CoEvolutionLoop
from coevo.store import TrajectoryStore
from coevo.types import ESMember

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: greedy tokens that keep one tiny-model batch decoding for several seconds (about 3 ms per token here)
LONG = SamplingParams(max_new_tokens=1500, temperature=0.0)


def _convs(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"What is {i} + {i}?"}] for i in range(n)]


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return HFPolicy(tiny_model_dir, batch_size=2)


def test_deadline_scope_nests_to_the_earlier_and_restores():
    assert current_deadline() is None
    with decode_deadline(100.0):
        with decode_deadline(200.0):
            assert current_deadline() == 100.0  # an inner block never extends the deadline
        with decode_deadline(None):
            assert current_deadline() == 100.0
        with decode_deadline(50.0):
            assert current_deadline() == 50.0
        assert current_deadline() == 100.0
    assert current_deadline() is None


def test_hf_generate_is_cut_at_the_deadline_and_unchanged_before_it(policy):
    short = SamplingParams(max_new_tokens=40, temperature=0.0)
    ref = [c.text for c in policy.generate(_convs(4), short)]
    with decode_deadline(time.monotonic() + 600):  # a deadline not reached changes nothing
        assert [c.text for c in policy.generate(_convs(4), short)] == ref

    began = time.monotonic()
    with pytest.raises(DeadlineReached) as cut, decode_deadline(began + 0.3):
        policy.generate(_convs(4), LONG)  # uncut: 2 model batches x 1500 tokens, several seconds
    took = time.monotonic() - began
    print("cut", took)
    assert took < 2.5, took  # stopped at the deadline, not at the end of the batch
    e = cut.value
    assert (e.rows, e.rows_decoded, e.backend) == (4, 0, "hf")
    assert 0 < e.new_tokens < LONG.max_new_tokens  # stopped while decoding the first model batch
    assert e.decode_s >= 0.3 and "wall-clock deadline" in e.reason

    with pytest.raises(DeadlineReached) as late, decode_deadline(time.monotonic() - 1):
        policy.generate(_convs(2), short)  # already past: nothing is decoded
    assert late.value.new_tokens == 0
    with pytest.raises(DeadlineReached), decode_deadline(time.monotonic() - 1):
        policy.logprob(_convs(2), ["4", "6"])
    assert current_deadline() is None
    assert [c.text for c in policy.generate(_convs(4), short)] == ref  # the policy is unharmed


def test_lowrank_population_batch_is_cut_at_the_deadline(policy):
    replica = policy.es_replica(ScopeSpec("all_linear"), master_weights=False)
    members = [ESMember(seed=11, sigma=0.05, sign=s, index=i) for i, s in enumerate((1, -1))]
    short = SamplingParams(max_new_tokens=30, temperature=0.0)
    rows = [(m, c) for m in members for c in _convs(2)]
    with replica.population(members, 1) as pop:
        ref = [c.text for c in pop.generate(rows, short)]
        began = time.monotonic()
        with pytest.raises(DeadlineReached) as cut, decode_deadline(began + 0.3):
            pop.generate(rows, LONG)
        assert time.monotonic() - began < 2.5
        assert cut.value.rows == 4 and 0 < cut.value.new_tokens < LONG.max_new_tokens
        assert pop._tables is None  # the batch's row tables were cleared by the hook's exit
        with decode_deadline(time.monotonic() + 600):
            assert [c.text for c in pop.generate(rows, short)] == ref
        with pytest.raises(DeadlineReached), decode_deadline(time.monotonic() - 1):
            pop.member_policy(members[0]).generate(_convs(1), short)


# ------------------------------------------------------------------------------------- a real run
def _es_run(model_dir: Path, *, wall: float | None, tokens: int) -> dict:
    """Low-rank ES (2 members, 1 generation) on countdown arithmetic with greedy answers of ``tokens`` tokens."""
    return {
        "run": {"name": "deadline", "seed": 4},
        "model": {"name": str(model_dir), "backend": "hf", "dtype": "float32", "batch_size": 4},
        "budget": {"max_rounds": 3, **({"max_wall_s": wall} if wall else {})},
        "evolvers": [
            {
                "name": "es",
                "type": "es",
                "perturbation": "lowrank",
                "rank": 1,
                "scope": "all_linear",
                "population_size": 2,
                "sigma": 0.05,
                "alpha": 0.05,
                "total_generations": 1,
                "eval_every": 0,
                "rollout": {
                    "type": "countdown",
                    "task": "arithmetic",
                    "cases_per_member": 2,
                    "test_cases": 2,
                    "max_new_tokens": tokens,
                },
            }
        ],
        "report": {"plots": False},
    }


def _loop(run_dir: Path, data: dict | None = None, *, resume: bool = False) -> CoEvolutionLoop:
    cfg = parse_config(data if data is not None else yaml.safe_load((run_dir / "config.yaml").read_text()))
    return CoEvolutionLoop(cfg, run_dir, raw_config=data, resume=resume, progress=False)


def _trajs(run_dir: Path) -> dict[str, tuple]:
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        ts = s.query(run_id=run_dir.name)
        return {t.key.split("/", 1)[1]: (t.reward, t.steps[0].model_output, t.llm_calls) for t in ts}


def _hashes(run_dir: Path) -> list[str]:
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        return [r["weight_hash_after"] for r in s.es_history(run_dir.name, "es")]


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
def test_wall_budget_cuts_a_population_batch_and_resume_reruns_it(tiny_model_dir, tmp_path):
    tokens, wall = 1800, 1.0  # the population batch (4 rows x 1800 greedy tokens): 3-4 s uncut on an AVX512 EPYC
    ref = tmp_path / "ref"
    began = time.monotonic()
    ref_summary = _loop(ref, _es_run(tiny_model_dir, wall=None, tokens=tokens)).run()
    uncut = time.monotonic() - began
    assert "completed its 1 generations" in ref_summary.stop_reason and ref_summary.samples == 4

    run = tmp_path / "cut"
    began = time.monotonic()
    summary = _loop(run, _es_run(tiny_model_dir, wall=wall, tokens=tokens)).run()
    took = time.monotonic() - began
    # ends a small margin past max_wall_s, before the batch would have ended (400 tokens took 0.7-2.4 s uncut on
    # an AVX512 EPYC, about 5 s on AVX2: hence 1800); that it was cut, not finished, is checked by its new tokens
    assert took < min(wall + 2.0, uncut), (took, uncut)
    line = summary.stop_reason
    assert line.startswith("wall-clock budget reached (") and "of budget.max_wall_s = 1 s)" in line, line
    assert "inside round 0, step es: decoding stopped at the deadline, a call of 4 samples cut" in line, line
    assert line.endswith("the step re-runs on resume"), line
    assert summary.samples == 0 and _trajs(run) == {}  # the cut batch is neither a sample nor a trajectory
    with TrajectoryStore(run / "store.sqlite", readonly=True) as s:
        (cut,) = s.list_artifacts(kind=STEP_CUT, run_id="cut")
    c = cut.content
    assert (c["round"], c["slot"], c["evolver"], c["space"], c["max_wall_s"]) == (0, 0, "es", "parameter", wall)
    assert c["samples_total"] == 0 and c["wall_s"] >= wall and c["reason"].startswith("wall-clock budget reached")
    assert c["cut_batch"]["rows"] == 4 and c["cut_batch"]["backend"] == "hf"
    assert c["cut_batch"]["new_tokens"] < tokens

    data = yaml.safe_load((run / "config.yaml").read_text())  # the user raises the budget and resumes
    data["budget"]["max_wall_s"] = 600
    (run / "config.yaml").write_text(yaml.safe_dump(data))
    resumed = _loop(run, resume=True)
    assert resumed.budget.wall_used_s == pytest.approx(c["wall_s"])  # the cut session's time is charged
    summary = resumed.run()
    assert "completed its 1 generations" in summary.stop_reason and summary.samples == 4
    assert _trajs(run) == _trajs(ref)  # the cut batch re-ran with the same seeds: nothing lost or duplicated
    assert _hashes(run) == _hashes(ref)
