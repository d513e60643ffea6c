"""ESEvolver on a tiny random Qwen2: learning, member tagging, history, sigma = 0, replay / export CLI,
bit-identical resume (clean stop and crash mid-generation), budget stop, config errors, configs/es/tiny.yaml."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import torch
import yaml
from pydantic import Field

from coevo.backends.base import PolicyError
from coevo.backends.hf import HFPolicy
from coevo.cli import main as coevo_main
from coevo.config import ConfigError, load_config, parse_config
from coevo.es import ESParams, select_params
from coevo.es.checkpoint import list_snapshots, load_snapshot, read_snapshot_meta
from coevo.loop import CoEvolutionLoop
from coevo.rollouts.logprob import LogProbConfig, TargetLogProbRollout
from coevo.store import TrajectoryStore

ROOT = Path(__file__).resolve().parents[1]


class FlakyConfig(LogProbConfig):
    type: str = "test_es_evolver:FlakyLogProbRollout"
    log_file: str = Field(description="one JSON line per run() call: generation, member index, split")
    fail_at: list[int] | None = Field(None, description="[generation, member index] whose rollout fails once")


class FlakyLogProbRollout(TargetLogProbRollout):
    """target_logprob that logs each call and raises PolicyError (as a dying backend does) once at ``fail_at``."""

    Config = FlakyConfig

    def run_call(self, policy, call):
        cfg = self.config
        log = Path(cfg.log_file)
        index = None if call.member is None else call.member.index
        with log.open("a") as fh:
            fh.write(json.dumps({"generation": call.generation, "index": index, "split": call.split}) + "\n")
        failed = log.with_suffix(".failed")
        if cfg.fail_at == [call.generation, index] and not failed.exists():
            failed.write_text("1")
            raise PolicyError("backend died in the middle of a member's rollout")
        return super().run_call(policy, call)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def es_config(model_dir, *, dtype="float32", max_rounds=20, max_samples=None, **es):
    params = {
        "population_size": 8,
        "sigma": 0.05,
        "sigma_final": 0.0,
        "schedule": "cosine",
        "total_generations": 8,
        "alpha": 0.06,
        "scope": "full",
        "eval_every": 4,
        "checkpoint_every": 3,
        "weight_snapshots": "full",  # these tests check the snapshot files (the default keeps none)
        "rollout": {"type": "target_logprob"},
        **es,
    }
    return {
        "run": {"name": "es", "seed": 3},
        "model": {"name": str(model_dir), "backend": "hf", "dtype": dtype},
        "budget": {"max_rounds": max_rounds, "max_samples": max_samples},
        "evolvers": [{"name": "es", "type": "es", **params}],
        "report": {"plots": False},
    }


def run_loop(run_dir: Path, data: dict, resume: bool = False):
    run_dir.mkdir(parents=True, exist_ok=True)
    loop = CoEvolutionLoop(
        parse_config(data), run_dir, raw_config=None if resume else data, resume=resume, progress=False
    )
    return loop, loop.run()


def history(run_dir: Path) -> list[dict]:
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        return s.es_history(run_dir.name, "es")


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    """One 8-generation ES run (N=8 antithetic, cosine sigma 0.05 -> 0, full scope), shared by several tests."""
    run_dir = tmp_path_factory.mktemp("es") / "run"
    _, summary = run_loop(run_dir, es_config(tiny_model_dir))
    return run_dir, summary


def test_es_raises_held_out_reward(trained):
    run_dir, summary = trained
    assert "completed its 8 generations" in summary.stop_reason or "round budget" in summary.stop_reason
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        centre = s.query(run_id="run", evolver="es", order_by="id")
        evals = {}
        for t in centre:
            if t.member is None:
                evals.setdefault(t.generation, []).append(t.reward)
    assert sorted(evals) == [0, 4, 8]  # eval_every 4, plus after the last generation
    before, after = (sum(evals[g]) / len(evals[g]) for g in (0, 8))
    assert after > before + 0.25, (before, after)  # nats per target token on the held-out prompt


def test_trajectories_are_tagged_and_history_rows_complete(trained):
    run_dir, _ = trained
    rows = history(run_dir)
    assert [r["generation"] for r in rows] == list(range(8))
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        for r in rows:
            assert len(r["seeds"]) == len(r["signs"]) == len(r["rewards"]) == len(r["coeffs"]) == 8
            assert r["signs"] == [1, -1] * 4 and r["seeds"][0::2] == r["seeds"][1::2]  # antithetic pairs
            assert all(0 <= seed < 2**63 for seed in r["seeds"])
            assert r["model_id"] and r["scope"]["scope"] == "full" and r["alpha"] == 0.06
            assert len(r["weight_hash_after"]) == 64 and r["master_dtype"] == "float32"
            ts = s.query(run_id="run", evolver="es", generation=r["generation"])
            members = [t for t in ts if t.member is not None]
            assert len(members) == 8 * 3  # 3 train prompts per member
            for t in members:
                m = t.member
                assert (m.seed, m.sign) == (r["seeds"][m.index], r["signs"][m.index])
                assert m.sigma == r["sigma"] and t.space == "parameter"
            for i in range(8):  # R_i = mean over the member's trajectories
                mine = [t.reward for t in members if t.member.index == i]
                assert r["rewards"][i] == pytest.approx(sum(mine) / 3, abs=1e-12)
    assert rows[0]["sigma"] == 0.05 and rows[-1]["sigma"] == 0.0


def test_no_update_at_sigma_zero(trained):
    rows = history(trained[0])
    last = rows[-1]
    assert last["sigma"] == 0.0 and last["skipped"] and last["update"]["skipped"]
    assert last["weight_hash_after"] == last["weight_hash_before"] == rows[-2]["weight_hash_after"]
    assert all(r["weight_hash_after"] != r["weight_hash_before"] for r in rows[:-1])


def test_report_tables_have_matching_header_and_delimiter_cells(trained):
    """Each Markdown table row has as many cells as the delimiter row (a `|x|` header cell split the ES table)."""
    run_dir, _ = trained
    lines = (run_dir / "report.md").read_text().splitlines()
    tables = [i for i, ln in enumerate(lines) if ln.startswith("|---")]
    assert any("‖update‖" in lines[i - 1] for i in tables)  # the ES generations table is in the report
    for i in tables:
        width = lines[i].count("|") - 1
        j = i - 1
        while j < len(lines) and lines[j].startswith("|"):
            assert lines[j].replace("\\|", "").count("|") - 1 == width, (lines[i - 1], lines[j])
            j = j + 2 if j == i - 1 else j + 1


def test_snapshots_and_replay_cli(trained, tmp_path, capsys):
    run_dir, _ = trained
    rows = history(run_dir)
    assert [g for g, _ in list_snapshots(run_dir)] == [3, 6, 8]  # every K=3 generations and at close()
    meta = read_snapshot_meta(run_dir / "weights" / "gen-00008.safetensors")
    assert meta["weights_hash"] == rows[-1]["weight_hash_after"]

    assert coevo_main(["es", "replay", str(run_dir), "--check"]) == 0
    out = capsys.readouterr().out
    assert f"trained weights hash:  {rows[-1]['weight_hash_after']}" in out
    assert f"replayed weights hash: {rows[-1]['weight_hash_after']}" in out and "check: OK" in out

    tampered = tmp_path / "run"  # same folder name = same run id
    shutil.copytree(run_dir, tampered)
    row = dict(rows[2])
    row["coeffs"] = [c * 1.001 for c in row["coeffs"]]
    with sqlite3.connect(tampered / "store.sqlite") as conn:
        conn.execute("UPDATE es_history SET row = ? WHERE generation = 2", (json.dumps(row),))
    assert coevo_main(["es", "replay", str(tampered), "--check"]) == 3  # the check failed (1 is for bugs)
    captured = capsys.readouterr()
    assert "check: MISMATCH" in captured.out and "first mismatching generation: 2" in captured.err
    hashes = [ln.split()[-1] for ln in captured.out.splitlines() if "weights hash" in ln]
    assert len(hashes) == 2 and hashes[0] != hashes[1]


def test_export_loads_in_transformers_with_identical_logits(trained, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    run_dir, _ = trained
    trained_policy = HFPolicy(tiny_model_dir)  # base model + the snapshot the training process wrote at close()
    params = ESParams(select_params(trained_policy.named_parameters(), "full"), master_dtype=torch.float32)
    load_snapshot(run_dir / "weights" / "gen-00008.safetensors", params)
    ids = torch.tensor([[5, 17, 42, 99, 7, 300, 12]])
    with torch.no_grad():
        ref = trained_policy.model(input_ids=ids).logits
        base = HFPolicy(tiny_model_dir).model(input_ids=ids).logits
    assert not torch.equal(ref, base)
    for flag in ([], ["--replay"]):  # from the snapshot, and from the full history alone
        out = tmp_path / f"export{len(flag)}"
        assert coevo_main(["es", "export", str(run_dir), str(out), *flag]) == 0
        model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
        with torch.no_grad():
            assert torch.equal(model(input_ids=ids).logits, ref)
        assert (
            json.loads((out / "coevo-es.json").read_text())["weights_hash"] == history(run_dir)[-1]["weight_hash_after"]
        )
        assert (out / "tokenizer.json").is_file()
    assert coevo_main(["es", "export", str(run_dir), str(tmp_path / "export0")]) == 2  # refuses a non-empty folder


def _resume_config(model_dir, log_file, max_rounds, fail_at=None):
    return es_config(
        model_dir,
        dtype="bfloat16",
        max_rounds=max_rounds,
        population_size=4,
        total_generations=6,
        sigma=0.02,
        sigma_final=0.01,
        alpha=0.05,
        scope="all_linear",
        checkpoint_every=2,
        eval_every=3,
        rollout={"type": "test_es_evolver:FlakyLogProbRollout", "log_file": str(log_file), "fail_at": fail_at},
    )


@pytest.fixture(scope="module")
def resume_ref(tiny_model_dir, tmp_path_factory):
    """An uninterrupted 6-generation bf16 run (float32 masters) to compare resumed runs with."""
    root = tmp_path_factory.mktemp("resume_ref")
    run_loop(root / "ref", _resume_config(tiny_model_dir, root / "ref.log", 6))
    return root / "ref"


def test_resume_gives_bit_identical_weights(tiny_model_dir, tmp_path, resume_ref):
    ref_dir = resume_ref
    ref = history(ref_dir)
    assert len(ref) == 6 and ref[0]["dtype"] == "torch.bfloat16"

    # clean interruption after 3 generations; the end-of-run snapshot is lost as in a crash, so the resume
    # loads gen-00002 (bf16 weights + float32 masters) and replays generation 2 from the history
    run_dir = tmp_path / "ref2"
    run_loop(run_dir, _resume_config(tiny_model_dir, tmp_path / "b.log", 3))
    assert [g for g, _ in list_snapshots(run_dir)] == [2, 3]
    (run_dir / "weights" / "gen-00003.safetensors").unlink()
    run_loop(run_dir, _resume_config(tiny_model_dir, tmp_path / "b.log", 6), resume=True)
    got = history(run_dir)
    assert [r["weight_hash_after"] for r in got] == [r["weight_hash_after"] for r in ref]
    assert [r["rewards"] for r in got] == [r["rewards"] for r in ref]
    with TrajectoryStore(ref_dir / "store.sqlite") as a, TrajectoryStore(run_dir / "store.sqlite") as b:
        assert a.count_llm_calls("ref") == b.count_llm_calls("ref2") == 6 * 4 * 3 + 3 * 1


def test_crash_mid_generation_restores_weights_and_resume_reuses_members(tiny_model_dir, tmp_path, resume_ref):
    ref_dir = resume_ref
    run_dir, log = tmp_path / "run", tmp_path / "crash.log"
    data = _resume_config(tiny_model_dir, log, 6, fail_at=[3, 2])
    run_dir.mkdir()
    loop = CoEvolutionLoop(parse_config(data), run_dir, raw_config=data, progress=False)
    with pytest.raises(PolicyError, match="backend died"):
        loop.run()
    es = loop.evolvers["es"]
    assert not es.replica.active  # the failed member's perturbation was undone
    assert es.replica.weights_hash() == history(run_dir)[2]["weight_hash_after"] == es.weights_hash
    loop.store.close()

    run_loop(run_dir, data, resume=True)
    assert [r["weight_hash_after"] for r in history(run_dir)] == [r["weight_hash_after"] for r in history(ref_dir)]
    calls = [json.loads(ln) for ln in log.read_text().splitlines()]
    gen3 = [c["index"] for c in calls if c["generation"] == 3 and c["split"] == "train"]
    assert gen3 == [0, 1, 2, 2, 3]  # members 0 and 1 were stored before the crash and not rolled out again
    with TrajectoryStore(run_dir / "store.sqlite") as s:
        assert s.count_llm_calls("run") == 6 * 4 * 3 + 3 * 1


def test_budget_stop_before_a_partial_population(tiny_model_dir, tmp_path):
    data = es_config(tiny_model_dir, max_samples=20, population_size=4, eval_every=0)  # 12 samples per generation
    _, summary = run_loop(tmp_path / "run", data)
    assert "cannot cover ES generation 1" in summary.stop_reason and "12 samples" in summary.stop_reason
    assert summary.samples == 12 and len(history(tmp_path / "run")) == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"population_size": 5}, "population_size must be even"),
        ({"rollout": {"type": "no_such_rollout"}}, "unknown rollout type 'no_such_rollout'"),
        ({"rollout": {"type": "target_logprob", "prompt": "x"}}, "evolvers.es.rollout"),
        ({"warmup": 8}, "warmup (8) must be < total_generations (8)"),
        ({"scope": "lora"}, "evolvers.es.scope"),
    ],
)
def test_config_errors_name_the_field(tiny_model_dir, change, message):
    with pytest.raises(ConfigError) as err:
        parse_config(es_config(tiny_model_dir, **change))
    assert message in str(err.value)


def test_tiny_yaml_config_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    cfg, raw = load_config(ROOT / "configs" / "es" / "tiny.yaml", ["report.plots=false"])
    assert cfg.model.name.startswith("tiny:")
    (tmp_path / "run").mkdir()
    loop = CoEvolutionLoop(cfg, tmp_path / "run", raw_config=raw, progress=False)
    summary = loop.run()
    rows = history(tmp_path / "run")
    assert (
        len(rows)
        == yaml.safe_load((ROOT / "configs" / "es" / "tiny.yaml").read_text())["evolvers"][0]["total_generations"]
    )
    with TrajectoryStore(tmp_path / "run" / "store.sqlite", readonly=True) as s:
        evals = [t for t in s.query(run_id="run", evolver="es") if t.member is None]
    first, last = min(t.generation for t in evals), max(t.generation for t in evals)
    mean = {
        g: sum(t.reward for t in evals if t.generation == g) / sum(t.generation == g for t in evals)
        for g in (first, last)
    }
    assert mean[last] > mean[first] + 0.1, mean
    assert "completed its 10 generations" in summary.stop_reason or "round budget" in summary.stop_reason
