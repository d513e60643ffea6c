"""GRPO and DPO as parameter-space evolvers of the heuristic-design loop (``grpo_ahd``, ``dpo_ahd``) on the tiny
random Qwen2: CALM's typed rewards, real updates through TRL on a PEFT LoRA adapter (the weights change and the
next samples come from the trained adapter), adapter folders as ``model.name``, resume after ``kill -9`` equal to an
uninterrupted run, and bad input as one line (out-of-range settings, an adapter of another model, groups that all
score alike, a store without pairs: the run goes on with the model as it is).

The tiny model's own answers are all alike, so the runs that must update use :mod:`sampler_doubles`' output-only
double (real generation, a share of the rows replaced by scripted heuristics); the fallback tests use the tiny model
as it is.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import one_step_trajectory

pytest.importorskip("trl")
pytest.importorskip("peft")

from sampler_doubles import SCRIPTS

from coevo.artifacts import REPORT_SECTION, SAMPLER_UPDATE
from coevo.backends.adapters import AdapterError
from coevo.backends.base import SamplingParams, request_seed
from coevo.config import ConfigError, load_config, parse_config
from coevo.loop import CoEvolutionLoop
from coevo.store import TrajectoryStore
from coevo.training.ahd_rewards import messages_from_observation, typed_reward
from coevo.types import Trajectory

ROOT = Path(__file__).resolve().parents[1]
GRPO_TINY = ROOT / "configs" / "ahd" / "grpo" / "tsp_construct_tiny.yaml"
DPO_TINY = ROOT / "configs" / "ahd" / "dpo" / "tsp_construct_tiny.yaml"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_data(path: Path, model_dir: Path, **evolver) -> dict:
    """A shipped tiny config as data, on ``model_dir``, with the training evolver's fields updated."""
    data = yaml.safe_load(path.read_text())
    data["model"]["name"] = str(model_dir)
    data["evolvers"][1].update(evolver)
    return data


def run(run_dir: Path, data: dict, resume: bool = False):
    cfg = parse_config(data)
    loop = CoEvolutionLoop(cfg, run_dir, raw_config=data, progress=False, resume=resume)
    return loop.run()


def updates(run_dir: Path, evolver: str) -> list[dict]:
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        rows = [a.content for a in s.list_artifacts(SAMPLER_UPDATE) if a.content["evolver"] == evolver]
    return sorted(rows, key=lambda r: r["update"])


def lora_b_norm(folder: Path) -> float:
    from safetensors.torch import load_file

    return float(
        sum(t.float().norm() for k, t in load_file(str(folder / "adapter_model.safetensors")).items() if "lora_B" in k)
    )


# ------------------------------------------------------------------------------------------ typed rewards
def _answer(valid=True, reward=None, failure=None, parent=None, reference=None, key="k") -> Trajectory:
    meta = {"parent_score": parent, "reference_score": reference}
    return one_step_trajectory(
        key=key, evolver="grpo", space="context", reward=reward, valid=valid, failure=failure, meta=meta
    )


def test_typed_rewards_order_invalid_copy_worse_better():
    """CALM's order: every failure < a copy < a valid answer not better than its best parent < a better one; the
    failure kinds keep CALM's own penalties (no code -0.95, no function -0.90, runtime -0.85, wrong answer -0.75)."""
    kinds = {
        k: typed_reward(_answer(False, failure=k)) for k in ("llm_error", "parse", "syntax", "runtime", "infeasible")
    }
    assert kinds == {"llm_error": -1.0, "parse": -0.95, "syntax": -0.90, "runtime": -0.85, "infeasible": -0.75}
    copy = typed_reward(_answer(False, failure="behavioural_duplicate"))
    worse = typed_reward(_answer(reward=-7.5, parent=-7.0))  # a longer tour than its parent's (score = -length)
    equal = typed_reward(_answer(reward=-7.0, parent=-7.0))
    better = typed_reward(_answer(reward=-6.65, parent=-7.0))  # 5 % shorter: half-way to the 10 % saturation
    assert max(kinds.values()) < copy == -0.6 < worse < equal == 0.0 < better
    assert worse == pytest.approx(-0.5 * (0.5 / 7.0) / 0.1) and better == pytest.approx(0.75)
    assert typed_reward(_answer(reward=-6.0, parent=-7.0)) == 1.0  # saturates
    assert typed_reward(_answer(reward=-8.0, reference=-7.5)) < 0 < typed_reward(_answer(reward=-7.0, reference=-7.5))
    assert typed_reward(_answer(reward=-8.0)) == 0.5  # no parent, no reference: any valid heuristic is progress
    with pytest.raises(ValueError, match="improvement_scale"):
        typed_reward(_answer(reward=1.0), improvement_scale=0)


def test_the_meter_sees_the_peak_of_its_window_only():
    """In a fresh interpreter: a long test session's allocator reuses freed pages, so RSS there need not grow."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import numpy as np
        from coevo.training.meter import measure

        big = np.ones(64 * 2**20 // 8)  # 64 MiB touched before the window, freed
        del big
        with measure() as usage:
            small = np.ones(2**20 // 8)
        assert usage.wall_s > 0 and usage.peak_scope == "window", usage
        assert usage.peak_rss_mib < usage.rss_before_mib + 32, usage  # the 64 MiB before is not its peak
        with measure() as usage:
            big = np.ones(96 * 2**20 // 8)
            del big
        assert usage.peak_rss_mib >= usage.rss_before_mib + 90 and small.sum() > 0, usage
        """
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_messages_read_back_from_the_recorded_prompt():
    from coevo.ahd.sampler import _messages_text

    msgs = [
        {"role": "system", "content": "You design heuristics.\n\nBe brief."},
        {"role": "user", "content": "Write select_next_node.\n\n[not a role]"},
        {"role": "assistant", "content": "```python\ndef select_next_node(a):\n    # idea:"},
    ]
    assert messages_from_observation(_messages_text(msgs)) == msgs
    assert messages_from_observation("no roles here") is None


def test_a_saved_adapter_names_the_run_model_not_the_local_folder_it_was_loaded_from(tmp_path, tiny_model_dir):
    """Before: PEFT renamed the base to the loaded folder, so a GRPO adapter of the embedded model named
    ``/root/.cache/coevo/models/...`` (this machine's cache) instead of ``qwen2.5-coder-0.5b-instruct``."""
    import json
    import warnings

    from transformers import AutoModelForCausalLM

    from coevo.training.lora import LoRASettings, attach_lora, save_adapter

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft_model = attach_lora(model, LoRASettings(r=2, alpha=4), "qwen2.5-coder-0.5b-instruct", seed=1)
    with warnings.catch_warnings():  # and saving does not look that name up on the Hugging Face Hub
        warnings.filterwarnings("error", message="(Could not find a config file|Unable to fetch remote file)")
        save_adapter(peft_model, tmp_path / "round-00001")
    conf = json.loads((tmp_path / "round-00001" / "adapter_config.json").read_text())
    assert conf["base_model_name_or_path"] == "qwen2.5-coder-0.5b-instruct"


# ------------------------------------------------------------------------------------------ GRPO, updating
@pytest.fixture(scope="module")
def grpo_run(tiny_model_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("grpo") / "run"
    data = tiny_data(GRPO_TINY, tiny_model_dir, type="sampler_doubles:MixedGRPO")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COEVO_CACHE", str(tmp_path_factory.mktemp("cache")))
        summary = run(run_dir, data)
    return run_dir, data, summary


def test_grpo_updates_the_adapter_and_its_answers_join_the_search(grpo_run):
    run_dir, _, summary = grpo_run
    rows = updates(run_dir, "grpo")
    assert [r["update"] for r in rows] == [0, 1] and "grpo completed its 2 updates" in summary.stop_reason
    applied = [r for r in rows if r["skipped"] is None]
    assert applied, rows
    for r in applied:
        assert r["loss"] is not None and r["wall_s"] > 0 and r["peak_rss_mib"] > r["rss_before_mib"] * 0.5
        assert r["groups_with_signal"] >= 1 and r["answers"] == 8
    folders = [run_dir / r["adapter"] for r in rows]
    assert all((f / "adapter_config.json").is_file() and (f / "optimizer.pt").is_file() for f in folders)
    assert lora_b_norm(folders[-1]) > 0  # B starts at zero: the update moved the adapter
    assert len({r["adapter_hash"] for r in rows}) == len(applied)
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        answers = s.query(run_id=run_dir.name, evolver="grpo")
        assert len(answers) == 16 and all(t.meta["sampler"] == "eoh" and t.meta["trainer"] == "grpo" for t in answers)
        assert all(t.space == "parameter" for t in answers)
        section = s.get_artifact(REPORT_SECTION, f"{run_dir.name}/grpo")
    # the search sees them: its pooling cursor read them (EoH folds the valid ones into its population)
    assert (
        section is not None
        and "GRPO `grpo`" in section.content["markdown"]
        and "peak RSS MiB" in section.content["markdown"]
    )


def test_grpo_samples_come_from_the_trained_adapter_which_loads_as_model_name(grpo_run, tiny_model_dir):
    """The answers of update 1 (sampled after update 0) are what the adapter folder of update 0, given as
    ``model.name``, samples for the same prompts and seeds, and not what the frozen model samples."""
    from coevo.backends.hf import HFPolicy

    run_dir, _, _ = grpo_run
    first = updates(run_dir, "grpo")[0]
    assert first["skipped"] is None
    with TrajectoryStore(run_dir / "store.sqlite", readonly=True) as s:
        batch = [t for t in s.query(run_id=run_dir.name, evolver="grpo", order_by="id") if t.meta["update"] == 1]
    convs = [messages_from_observation(t.steps[0].observation) for t in batch]
    prefix = convs[0][-1]["content"]
    recorded = [t.steps[0].model_output[len(prefix) :] for t in batch]
    real = [i for i, text in enumerate(recorded) if text not in SCRIPTS]  # rows the double left to the model
    assert real
    seed = batch[0].meta["batch_seed"]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=1.0)
    seeds = [request_seed(seed, i) for i in range(len(batch))]
    cfg, _ = load_config(GRPO_TINY, [f"model.name={run_dir / first['adapter']}"])  # an adapter folder is a model
    trained = HFPolicy(cfg.model.name, dtype="float32")
    assert trained.adapters == [run_dir / first["adapter"]]
    again = trained.generate_rows(convs, params, row_seeds=seeds)
    assert [again[i].text for i in real] == [recorded[i] for i in real]
    frozen = HFPolicy(tiny_model_dir, dtype="float32").generate_rows(convs, params, row_seeds=seeds)
    assert [frozen[i].text for i in real] != [recorded[i] for i in real]


def test_coevo_model_merge_writes_the_adapter_merged_as_a_plain_folder(grpo_run, tmp_path, capsys):
    """``coevo model merge ADAPTER OUT``: a plain model folder (what vLLM loads) whose weights are those the hf
    backend computes with from the adapter; a non-empty OUT or a folder that is no adapter is one line, exit 2."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from coevo.backends.hf import HFPolicy
    from coevo.cli import main

    run_dir, _, _ = grpo_run
    adapter = run_dir / updates(run_dir, "grpo")[-1]["adapter"]
    out = tmp_path / "merged"
    assert main(["model", "merge", str(adapter), str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert not (out / "adapter_config.json").exists()
    info = json.loads((out / "coevo-merge.json").read_text())
    assert info["adapters"] == [str(adapter)] and info["dtype"] == "float32"
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ref = HFPolicy(str(adapter), dtype="float32")
    try:
        want = dict(ref.model.named_parameters())
        got = dict(merged.named_parameters())
        assert want.keys() == got.keys() and all(torch.equal(got[k], want[k]) for k in want)
    finally:
        ref.close()
    capsys.readouterr()  # transformers' loading lines above
    assert main(["model", "merge", str(adapter), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists and is not empty" in err
    assert main(["model", "merge", str(out), str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not an adapter folder" in err


@pytest.mark.heavy  # 77-186 s on 2 cores (a run killed mid-update, resumed, and an uninterrupted one): pytest -m heavy (CI runs it)
def test_resume_after_kill_9_mid_update_equals_uninterrupted(grpo_run, tiny_model_dir, tmp_path, private_cache):
    """``coevo run`` SIGKILLed inside GRPO update 1 (after its answers were recorded), then resumed: the same
    adapters, update by update, as the uninterrupted run."""
    ref_dir, data, _ = grpo_run
    marker = tmp_path / "killed"
    data = {
        **data,
        "evolvers": [data["evolvers"][0], {**data["evolvers"][1], "kill_at_update": 1, "marker": str(marker)}],
    }
    run_dir = tmp_path / "killed_run" / "run"
    run_dir.parent.mkdir()
    (run_dir.parent / "config.yaml").write_text(yaml.safe_dump(data))
    # one torch thread, as this process's tests (one_torch_thread): the same float summation order, the same adapters
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "coevo.cli", "run", str(run_dir.parent / "config.yaml"), "--out", str(run_dir)]
    proc = subprocess.run(
        [*cmd, "--no-progress"], check=False, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert marker.exists() and [r["update"] for r in updates(run_dir, "grpo")] == [0]
    run(run_dir, data, resume=True)
    got, ref = updates(run_dir, "grpo"), updates(ref_dir, "grpo")
    assert [r["adapter_hash"] for r in got] == [r["adapter_hash"] for r in ref]
    assert [r["mean_reward"] for r in got] == [r["mean_reward"] for r in ref]


# ------------------------------------------------------------------------------------------ fallbacks
def test_grpo_groups_that_all_score_alike_skip_the_update_and_the_run_goes_on(
    tiny_model_dir, tmp_path, caplog, private_cache
):
    data = tiny_data(GRPO_TINY, tiny_model_dir, total_updates=1)
    with caplog.at_level(logging.WARNING):
        summary = run(tmp_path / "run", data)
    (row,) = updates(tmp_path / "run", "grpo")
    assert row["skipped"].startswith("all 2 groups scored alike") and row["loss"] is None
    assert any("evolvers.grpo: all 2 groups scored alike" in r.getMessage() for r in caplog.records)
    assert lora_b_norm(tmp_path / "run" / row["adapter"]) == 0  # the sampler stays the frozen model
    assert summary.steps >= 3  # EoH went on after the skipped update


@pytest.fixture(scope="module")
def dpo_run(tiny_model_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("dpo") / "run"
    data = tiny_data(DPO_TINY, tiny_model_dir, type="sampler_doubles:MixedDPO", max_pairs=4)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COEVO_CACHE", str(tmp_path_factory.mktemp("cache")))
        return run_dir, run(run_dir, data)


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
def test_dpo_trains_on_pairs_from_the_store(dpo_run):
    run_dir, _ = dpo_run
    rows = updates(run_dir, "dpo")
    applied = [r for r in rows if r["skipped"] is None]
    assert applied and all(0 < r["pairs"] <= 4 and r["loss"] is not None and r["wall_s"] > 0 for r in applied)
    assert all(r["mean_reward_margin"] > 0 for r in applied)  # chosen answers score higher than rejected ones
    assert lora_b_norm(run_dir / rows[-1]["adapter"]) > 0
    assert not (run_dir / rows[-1]["adapter"] / "ref").exists()  # TRL's frozen reference copy is not kept


def test_dpo_without_usable_pairs_skips_with_the_reason(tiny_model_dir, tmp_path, caplog, private_cache):
    data = tiny_data(DPO_TINY, tiny_model_dir, total_updates=1, pairs="evotune")
    with caplog.at_level(logging.WARNING):
        run(tmp_path / "run", data)
    (row,) = updates(tmp_path / "run", "dpo")
    assert row["skipped"].startswith("no usable pairs in the store (pairs: evotune needs a prompt with a valid new")
    assert row["pairs"] == 0 and lora_b_norm(tmp_path / "run" / row["adapter"]) == 0


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("learning_rate", 0, "evolvers.grpo.learning_rate"),
        ("learning_rate", 3.0, "evolvers.grpo.learning_rate"),
        ("answers_per_prompt", 1, "evolvers.grpo.answers_per_prompt"),
        ("lora", {"r": 0}, "evolvers.grpo.lora.r"),
        ("micro_batch", 3, "evolvers.grpo.micro_batch: 3 must divide"),
        ("epsilon", 1.5, "evolvers.grpo.epsilon"),
        ("init_adapter", "/nonexistent/adapter", "evolvers.grpo.init_adapter"),
        ("evolver", "grpo", "evolvers.grpo.evolver: 'grpo' refers to the evolver itself"),
    ],
)
def test_out_of_range_settings_name_the_field(tiny_model_dir, field, value, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_config(tiny_data(GRPO_TINY, tiny_model_dir, **{field: value}))


def test_a_second_weight_evolver_and_a_remote_backend_are_refused(tiny_model_dir):
    data = tiny_data(GRPO_TINY, tiny_model_dir)
    data["evolvers"].append({"name": "es", "type": "es", "rollout": {"type": "eoh_children", "evolver": "eoh"}})
    with pytest.raises(ConfigError, match="evolvers.grpo.type: 'es' changes the model's weights too"):
        parse_config(data)
    data = tiny_data(DPO_TINY, tiny_model_dir)
    data["model"] = {"name": "m", "backend": "openai", "base_url": "http://127.0.0.1:1/v1"}
    with pytest.raises(ConfigError, match="set model.backend: hf"):
        parse_config(data)


def test_an_adapter_of_another_model_is_one_line(grpo_run, tmp_path, private_cache):
    """An adapter trained on the tiny model (hidden size 32) given with a base of hidden size 64: as ``model.name``
    (the policy refuses it) and as ``init_adapter`` of a run of another rank (the step refuses it), one line each."""
    import json
    import shutil

    from coevo.backends.hf import HFPolicy

    run_dir, data, _ = grpo_run
    folder = run_dir / updates(run_dir, "grpo")[0]["adapter"]
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    config = json.loads((other / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "tiny:small"}))
    with pytest.raises(AdapterError) as err:
        HFPolicy(str(other))
    assert "adapter does not fit its base model" in str(err.value) and "\n" not in str(err.value)
    bad = tiny_data(GRPO_TINY, Path(data["model"]["name"]), init_adapter=str(folder), lora={"r": 2, "alpha": 4})
    with pytest.raises(ConfigError) as err:
        run(tmp_path / "run", bad)
    assert str(err.value).startswith("evolvers.grpo.init_adapter: ") and "another base model or another rank" in str(
        err.value
    )


# ------------------------------------------------------------------------------------------ shipped configs
@pytest.mark.parametrize("method", ["grpo", "dpo"])
def test_shipped_configs_match_the_es_config_on_prompts_and_problem(method):
    """configs/ahd/{grpo,dpo}/tsp_construct.yaml: the EoH search, problem settings and decoding of
    configs/ahd/eoh_es/tsp_construct.yaml, the trainer on EoH's m1 / m2 prompts (ES members' prompts there), hf."""
    cfg, _ = load_config(ROOT / "configs" / "ahd" / method / "tsp_construct.yaml")
    es_cfg, _ = load_config(ROOT / "configs" / "ahd" / "eoh_es" / "tsp_construct.yaml")
    eoh = next(e for e in cfg.evolvers if e.type == "eoh")
    assert eoh.params == next(e for e in es_cfg.evolvers if e.type == "eoh").params
    assert cfg.sampling == es_cfg.sampling and cfg.model.backend == "hf" and cfg.model.name == es_cfg.model.name
    trainer = next(e for e in cfg.evolvers if e.type == f"{method}_ahd").params
    assert trainer.evolver == "eoh" and trainer.operators == ["m1", "m2"]
    per_update = trainer.prompts_per_step * trainer.answers_per_prompt
    init = 2 * eoh.params.population_size
    children = sum(eoh.params.operators.values()) * eoh.params.offspring_per_operator
    assert cfg.budget.max_samples == init + trainer.total_updates * (per_update + children)


def test_an_adapter_folder_naming_an_unknown_base_is_a_model_field_error(tiny_model_dir, tmp_path):
    import json

    from coevo.backends.factory import choose_engine
    from coevo.backends.models import check_model_ref, model_head_size
    from coevo.backends.spec import ModelConfig

    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "no-such-model"}))
    with pytest.raises(ValueError, match="adapter folder .* names base model 'no-such-model', which is not usable"):
        check_model_ref(folder)
    data = tiny_data(GRPO_TINY, tiny_model_dir)
    data["model"]["name"] = str(folder)
    with pytest.raises(ConfigError, match="model"):
        parse_config(data)
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tiny_model_dir)}))
    check_model_ref(folder)  # a base coevo resolves: fine
    assert model_head_size(folder) == model_head_size(tiny_model_dir) == 8
    choice = choose_engine(ModelConfig(name=str(folder), backend="auto", dtype="auto"))
    assert choice.backend == "hf" and "LoRA adapter folder" in choice.reason


def test_dpo_pairs_follow_evotune_and_the_typed_rule():
    """evotune: every failed or copied answer against a valid one (in turn), the better half of the valid ones against
    the worse half; typed: any two answers of different typed rewards. Newest prompts first, capped."""
    from types import SimpleNamespace

    from coevo.evolvers.dpo_ahd import DPOAHDConfig, DPOAHDEvolver
    from coevo.evolvers.sampler_training import Answer

    def ans(name, valid, reward, failure=None):
        t = _answer(valid, reward=1.0 if valid else None, failure=failure, key=name)
        return Answer(trajectory=t, prompt="p", completion=name, reward=reward)

    a, b, c = ans("a", True, 0.9), ans("b", True, 0.7), ans("c", True, -0.2)
    syntax, copy, runtime = ans("s", False, -0.9, "syntax"), ans("d", False, -0.6, "duplicate"), ans("r", False, -0.85)
    old_prompt = [ans("x", True, 0.6), ans("y", False, -0.95, "parse")]
    evo = SimpleNamespace(config=DPOAHDConfig(evolver="eoh"))
    pairs = DPOAHDEvolver.make_pairs(evo, [old_prompt, [a, b, c, syntax, copy]])
    names = [(p.completion, q.completion) for p, q in pairs]
    assert names == [("a", "s"), ("b", "d"), ("a", "c"), ("x", "y")]  # newest prompt first; a > c across the halves
    typed = SimpleNamespace(config=DPOAHDConfig(evolver="eoh", pairs="typed", max_pairs_per_prompt=3, max_pairs=4))
    pairs = DPOAHDEvolver.make_pairs(typed, [old_prompt, [syntax, runtime, copy]])
    assert [(p.completion, q.completion) for p, q in pairs] == [("d", "r"), ("d", "s"), ("r", "s"), ("x", "y")]
    none = SimpleNamespace(config=DPOAHDConfig(evolver="eoh"))
    assert DPOAHDEvolver.make_pairs(none, [[syntax, copy], [ans("e", True, 0.5), ans("f", True, 0.5)]]) == []
