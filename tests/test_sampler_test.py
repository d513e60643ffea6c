"""The held-out sampler test (``coevo heuristics sampler-test``, :mod:`coevo.sampler_test`).

Real parts: the committed prompt set, the shipped configs, the sandbox (parents and answers are evaluated), the
tiny random Qwen2 of the suite as MODEL (by folder, as a PEFT LoRA adapter on it), real SQLite stores and the
``coevo`` CLI. The tiny model's answers are mostly not Python: what is checked is the mechanics (same answers
for the same model and seeds, resume, the counts and intervals) and the rates on constructed answers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from coevo.ahd.population import code_key
from coevo.cli import main
from coevo.sampler_test.build import build_problem, shipped_settings, training_starts
from coevo.sampler_test.promptset import OPERATOR_CYCLE, PROBLEMS, PROMPT_SET_VERSION, load_prompt_set
from coevo.sampler_test.run import AnswerLog, score_rows, summarise, table
from coevo.sampler_test.stats import bootstrap_ratio_interval, wilson_interval

pytestmark = pytest.mark.usefixtures("private_cache")


# ---------------------------------------------------------------------------------------------- intervals
def test_wilson_interval_matches_published_values():
    # Brown, Cai & DasGupta (2001) / any Wilson table: 0 of 10 -> [0, 0.2775]; 5 of 10 -> [0.2366, 0.7634]
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-4)
    assert wilson_interval(5, 10) == pytest.approx((0.23659, 0.76341), abs=1e-4)
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_bootstrap_ratio_is_deterministic_and_brackets_the_estimate():
    tokens = [100, 200, 150, 120, 300, 90, 110, 130]
    hits = [1, 0, 1, 0, 0, 1, 0, 1]
    lo, hi = bootstrap_ratio_interval(tokens, hits)
    assert (lo, hi) == bootstrap_ratio_interval(tokens, hits)
    assert lo <= sum(tokens) / sum(hits) <= (hi if hi is not None else float("inf"))
    assert bootstrap_ratio_interval(tokens, [0] * 8) == (None, None)


# ---------------------------------------------------------------------------------------------- prompt set
def test_prompt_set_is_versioned_full_size_and_rebuilds_identically():
    ps = load_prompt_set()
    assert ps.version == PROMPT_SET_VERSION and list(ps.problems) == list(PROBLEMS)
    raw = json.loads((Path(__file__).parents[1] / "coevo/sampler_test" / f"{PROMPT_SET_VERSION}.json").read_text())
    for name, pset in ps.problems.items():
        assert len(pset.prompts) >= 128
        assert [p.operator for p in pset.prompts[:8]] == list(OPERATOR_CYCLE)
        assert {p.operator for p in pset.prompts} == {"i1", "e1", "e2", "m1", "m2"}
        # the generator writes exactly the committed entry (the set is reproducible from its sources)
        assert build_problem(name, ps.version, len(pset.prompts)) == raw["problems"][name]
        # the settings still are the shipped config's (a config change needs a new version of the set)
        assert pset.settings == shipped_settings(name)
        # batch seeds: one per batch of 8, all different
        seeds = [p.seed for p in pset.prompts]
        assert all(len(set(seeds[i : i + 8])) == 1 for i in range(0, len(seeds), 8))
        assert len(set(seeds[::8])) == len(seeds) // 8


def test_prompt_set_parents_are_disjoint_from_every_training_start():
    ps = load_prompt_set()
    for name, pset in ps.problems.items():
        starts = {code_key(c) for c in training_starts(name).values()}
        assert len(starts) >= 2  # the seed heuristic and at least one published seed of the shipped configs
        assert len(pset.parents) >= 5
        for parent in pset.parents.values():
            assert code_key(parent.code) not in starts, (name, parent.name)
            assert parent.thought  # the idea a prompt shows beside the code


# ---------------------------------------------------------------------------------------------- scoring
def _row(index, valid, behaviour=None, objective=None, baseline=10.0, tokens=100, failure=None):
    return {
        "problem": "tsp_construct", "index": index, "valid": valid, "behaviour": behaviour, "objective": objective,
        "baseline_objective": baseline, "completion_tokens": tokens, "failure": failure, "finish_reason": "stop",
        "batch_seed": 1, "batch_wall_s": 5.0,
    }  # fmt: skip


def test_new_means_a_behaviour_no_parent_and_no_earlier_answer_has():
    known = {"nn": {"objective": 10.0, "behaviour": "aaaa"}, "seed": {"objective": 11.0, "behaviour": "bbbb"}}
    rows = [
        _row(3, True, "cccc", 9.0),  # new, better (minimising: 9 < 10)
        _row(0, True, "aaaa", 10.0),  # copies parent nn: valid, not new, not better
        _row(1, False, failure="syntax"),
        _row(2, True, "dddd", 12.0),  # new, worse
        _row(4, True, "cccc", 9.0),  # copies answer 3: not new, still better
    ]
    scored = score_rows(rows, known, "minimize")
    assert [r["index"] for r in scored] == [0, 1, 2, 3, 4]
    assert [r["new"] for r in scored] == [False, False, True, True, False]
    assert [r["better"] for r in scored] == [False, False, False, True, True]
    s = summarise(scored, "tsp_construct")
    assert (s["valid"]["n"], s["valid_new"]["n"], s["better"]["n"]) == (4, 2, 2)
    assert s["valid"]["pct"] == 80.0 and s["valid"]["ci95"] == [37.6, 96.4]
    assert s["tokens_per_valid_new"] == 250.0 and s["failures"] == {"syntax": 1}
    assert "tsp_construct" in table([s]) and "250" in table([s])
    # maximising problem: better means a larger objective
    assert score_rows([_row(0, True, "x", 11.0)], {}, "maximize")[0]["better"]


def test_answer_log_resumes_whole_batches_and_refuses_another_model(tmp_path):
    path = tmp_path / "answers.jsonl"
    header = {"kind": "header", "model": "m", "version": "v", "settings": {}}
    log = AnswerLog(path, header)
    log.add([{**_row(i, False), "kind": "answer"} for i in range(8)])
    with path.open("a") as f:
        f.write('{"kind": "answer", "problem": "tsp_con')  # a batch torn by kill -9
    again = AnswerLog(path, header)
    assert again.done("tsp_construct", range(8)) and not again.done("tsp_construct", range(9))
    again.add([{**_row(8, True, "q", 1.0), "kind": "answer"}])
    assert len(AnswerLog(path, header).rows) == 9
    with pytest.raises(Exception, match="holds a test of model 'm'"):
        AnswerLog(path, {**header, "model": "other"})


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_models_are_one_line_errors(tmp_path, capsys, monkeypatch):
    from coevo.backends import models

    cases = [
        ("no-such-model", "is not a registered name"),
        (str(tmp_path), "holds no model (config.json)"),
    ]
    run = tmp_path / "run"  # a run folder whose config has no ES evolver
    run.mkdir()
    shutil.copy(Path(__file__).parents[1] / "configs/ahd/sample/tsp_construct.yaml", run / "config.yaml")
    from coevo.store import TrajectoryStore

    TrajectoryStore(run / "store.sqlite").close()
    cases.append((str(run), "has no ES evolver"))
    spec = models.ChunkedModelSpec(
        name="absent-model", chunks=(("coevo-absent-chunk-part1", "part01.bin"),), sha256="0" * 64,
        gguf_filename="absent.gguf", extra="model-absent",
    )  # fmt: skip
    monkeypatch.setitem(models.MODEL_REGISTRY, "absent-model", spec)
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    cases.append(("absent-model", "chunk package 'coevo-absent-chunk-part1' is not installed"))
    for model, message in cases:
        rc = main(["heuristics", "sampler-test", model, "--prompts", "1", "--out", str(tmp_path / "out" / "x")])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and message in err and "\n" not in err, (model, err)
    assert "pip install 'coevo[model-absent]'" in err
    rc = main(["heuristics", "sampler-test", "tiny:micro", "--prompts", "999"])
    assert rc == 2 and "--prompts must be between 1 and 128" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- end to end
def _test(model, out, **kw):
    from coevo.sampler_test.run import sampler_test

    return sampler_test(model, out=out, prompts=8, problems=["tsp_construct"], backend="hf", **kw)


@pytest.mark.heavy  # about 200 s on 2 cores (two whole tests on the tiny model): pytest -m heavy (CI runs it)
def test_tiny_model_same_answers_for_the_same_seeds_and_resume(tmp_path, tiny_model_dir, capsys):
    summaries, out = _test(str(tiny_model_dir), tmp_path / "a")
    again, _ = _test(str(tiny_model_dir), tmp_path / "b")

    def answers(folder):
        return [json.loads(line) for line in (folder / "answers.jsonl").read_text().splitlines()[1:]]

    a = [r for r in answers(out) if r["kind"] == "answer"]
    b = [r for r in answers(tmp_path / "b") if r["kind"] == "answer"]
    assert len(a) == 8 and [r["text"] for r in a] == [r["text"] for r in b]
    assert [r["request_seed"] for r in a] == [r["request_seed"] for r in b]
    assert [r["operator"] for r in a] == list(OPERATOR_CYCLE)
    assert summaries[0]["prompts"] == 8 and summaries[-1]["problem"] == "overall"
    assert [s["valid"] for s in summaries] == [s["valid"] for s in again]
    known = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines() if '"known"' in line]
    assert set(known[0]["known"]) == set(load_prompt_set().problems["tsp_construct"].parents) | {"seed"}
    # a finished test reruns from its answers alone: no model load, the same summary
    size = (out / "answers.jsonl").stat().st_size
    progress: list[str] = []
    third, _ = _test(str(tiny_model_dir), out, progress=progress.append)
    assert third == summaries and progress == [] and (out / "answers.jsonl").stat().st_size == size
    # the command line prints the table and says how many prompts ran
    rc = main(["heuristics", "sampler-test", str(tiny_model_dir), "--prompts", "8", "--problems", "tsp_construct",
               "--out", str(out), "--backend", "hf"])  # fmt: skip
    printed = capsys.readouterr().out
    assert rc == 0 and "8 prompts per problem (the full test has 128)" in printed and "overall" in printed


def test_a_lora_adapter_is_tested_merged_into_its_base(tmp_path, tiny_model_dir):
    peft = pytest.importorskip("peft")
    import torch
    from transformers import AutoModelForCausalLM

    from coevo.sampler_test.model_ref import load_model

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    cfg = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    adapted = peft.get_peft_model(base, cfg)
    adapted.save_pretrained(tmp_path / "adapter")
    conf = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    conf["base_model_name_or_path"] = str(tiny_model_dir)
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(conf))
    merged = load_model(str(tmp_path / "adapter"))
    plain = load_model(str(tiny_model_dir), backend="hf")
    try:
        assert merged.kind == "adapter" and merged.info["base_model"] == str(tiny_model_dir)
        q = "model.layers.0.self_attn.q_proj.weight"
        w_merged = dict(merged.policy.model.named_parameters())[q]
        w_plain = dict(plain.policy.model.named_parameters())[q]
        assert not torch.equal(w_merged, w_plain)  # the adapter's B A is in the weights
        assert not any("lora" in n for n, _ in merged.policy.model.named_parameters())
    finally:
        merged.policy.close()
        plain.policy.close()
    summaries, _ = _test(str(tmp_path / "adapter"), tmp_path / "out")
    assert summaries[0]["prompts"] == 8 and summaries[0]["model_kind"] == "adapter"
