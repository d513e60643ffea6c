"""Smoke tests of benchmarks/es_overhead.py: a real run on a tiny random Qwen2, its JSON lines, its helpers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from support import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "es_overhead.py"
METRICS = {
    "es_throughput_ratio_inference_mode": ">= 0.95",
    "es_throughput_ratio_exact_mode": ">= 0.95",
    "es_throughput_ratio_with_update_exact_mode": ">= 0.95",
    "es_peak_memory_ratio_inference_mode": "<= 1.05",
    "es_peak_memory_ratio_exact_mode": "<= 1.05",
    "es_vs_backprop_peak_memory_ratio": "<= 0.15",
    "es_exact_vs_backprop_peak_memory_ratio": "<= 0.15",
    "lowrank_throughput_ratio": ">= 0.95",
    "lowrank_throughput_ratio_with_update": ">= 0.95",
    "lowrank_vs_full_sequential_speedup": ">= 3",
    "lowrank_peak_memory_ratio": "<= 1.05",
}


def _bench():
    return load_script(SCRIPT, "es_overhead")


def _met(value: float, goal: str) -> bool:
    op, bound = goal.split()
    return value >= float(bound) if op == ">=" else value <= float(bound)


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
def test_tiny_run_prints_table_and_metric_lines():
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--model",
        "tiny:micro",
        "--batch",
        "2",
        "--max-new-tokens",
        "4",
        "--members",
        "2",
        "--threads",
        "1",
    ]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    table = [ln for ln in lines if not ln.startswith("{")]
    # the defaults are the measured configuration: float32, the whole low-rank generation (2 x 2 rows) in one batch
    assert table[0].startswith("model tiny:micro (float32), batch 2, 4 new tokens, 2 members")
    assert table[0].endswith("low-rank rows per model batch 4")
    for variant in ("inference", "es-inference", "es-exact", "backprop", "es-lowrank"):
        assert any(ln.split()[0] == variant for ln in table[1:] if ln.strip()), variant
    rows = [json.loads(ln) for ln in lines if ln.startswith("{")]
    assert [r["metric"] for r in rows] == list(METRICS)
    for r in rows:
        assert set(r) == {"metric", "value", "goal", "met"}
        assert r["goal"] == METRICS[r["metric"]]
        assert isinstance(r["value"], float) and math.isfinite(r["value"]) and r["value"] > 0
        assert r["met"] is _met(r["value"], r["goal"])
    by = {r["metric"]: r["value"] for r in rows}
    # same tiny model in every process: peak RSS is dominated by the interpreter and libraries
    assert 0.8 < by["es_peak_memory_ratio_inference_mode"] < 1.25
    assert 0.8 < by["es_peak_memory_ratio_exact_mode"] < 1.25
    # backprop builds the autograd graph and optimizer states on top of the same model: never less memory
    assert 0.5 < by["es_vs_backprop_peak_memory_ratio"] <= 1.02
    assert 0.01 < by["es_throughput_ratio_inference_mode"] < 100
    assert 0.8 < by["lowrank_peak_memory_ratio"] < 1.25 and 0.01 < by["lowrank_throughput_ratio"] < 100


def test_metrics_arithmetic_and_goals():
    bench = _bench()
    es = {"plain_tokens": 100, "plain_s": 10.0, "es_tokens": 100, "es_s": 12.5, "update_s": 2.5, "peak_rss": 1100}
    lowrank = {"plain_tokens": 100, "plain_s": 10.0, "es_tokens": 100, "es_s": 4.0, "update_s": 1.0, "peak_rss": 1030}
    res = {
        "inference": {"peak_rss": 1000},
        "es-inference": dict(es, peak_rss=1040),
        "es-exact": dict(es, peak_rss=2000),
        "backprop": {"peak_rss": 8000},
        "es-lowrank": lowrank,
    }
    by = {m["metric"]: m for m in bench.metrics(res)}
    assert by["es_throughput_ratio_inference_mode"]["value"] == 0.8  # (100/12.5) / (100/10)
    assert by["es_throughput_ratio_with_update_exact_mode"]["value"] == round(10 / 15, 4)
    assert by["es_peak_memory_ratio_inference_mode"] == {
        "metric": "es_peak_memory_ratio_inference_mode",
        "value": 1.04,
        "goal": "<= 1.05",
        "met": True,
    }
    assert by["es_peak_memory_ratio_exact_mode"]["met"] is False
    assert by["es_vs_backprop_peak_memory_ratio"]["value"] == 0.13
    assert by["es_vs_backprop_peak_memory_ratio"]["met"] is True
    assert by["es_exact_vs_backprop_peak_memory_ratio"]["value"] == 0.25
    assert by["lowrank_throughput_ratio"]["value"] == 2.5 and by["lowrank_throughput_ratio_with_update"]["value"] == 2.0
    assert by["lowrank_vs_full_sequential_speedup"]["value"] == 3.0 and by["lowrank_vs_full_sequential_speedup"]["met"]
    assert by["lowrank_peak_memory_ratio"]["value"] == 1.03


def test_peak_rss_tracks_an_allocation():
    bench = _bench()
    before = bench.peak_rss_bytes()
    assert before >= bench.rss_bytes() > 0
    block = bytearray(64 * 1024 * 1024)  # touched (zero-filled) pages count in RSS
    assert bench.rss_bytes() >= 60 * 1024 * 1024
    assert bench.peak_rss_bytes() >= bench.rss_bytes() - 4096
    del block


@pytest.mark.parametrize("flag", ["--batch", "--members", "--max-new-tokens"])
def test_bad_sizes_name_the_flag(flag, capsys):
    with pytest.raises(SystemExit) as exc:
        _bench().parse_args([flag, "0"])
    assert exc.value.code == 2
    assert f"{flag} must be >= 1, got 0" in capsys.readouterr().err


def test_member_seeds_are_antithetic_pairs():
    seeds = _bench().member_seeds(5)
    assert [g for _, g in seeds] == [1, -1, 1, -1, 1]
    assert seeds[0][0] == seeds[1][0] != seeds[2][0] == seeds[3][0]
