"""benchmarks/horizon_scaling.py: equal episode budgets, the summary table and the plot (the child runs themselves
are the ES loop and the GRPO baseline, covered by test_sudoku.py and test_grpo.py)."""

from __future__ import annotations

import os

import pytest
from support import load_script


@pytest.fixture(scope="module")
def hs():
    return load_script("benchmarks/horizon_scaling.py", "horizon_scaling")


def test_budgets_are_equal(hs):
    for preset in hs.PRESETS:
        a = hs.parse_args(["--preset", preset, "--out", "x"])
        assert hs.grpo_steps(a) * a.grpo_prompts * a.grpo_group == hs.es_episodes(a)
    a = hs.parse_args(["--preset", "paper", "--out", "x"])
    assert (a.size, a.horizons, a.population, a.generations, a.puzzles_per_member) == (9, [5, 10, 15], 32, 100, 32)
    assert (a.sigma, a.sigma_final, a.alpha) == (1e-3, 2.5e-4, 5e-4) and hs.es_episodes(a) == 102_400
    with pytest.raises(SystemExit, match="multiple"):
        hs.grpo_steps(hs.parse_args(["--out", "x", "--grpo-group", "3"]))
    spec = hs.rollout_spec(a, 10, 2)
    assert spec["context"] == "history" and spec["horizon"] == 10 and spec["seed"] == 2


def test_summary_table_and_plot(hs, tmp_path):
    rows = []
    for h, (b, e, g) in {1: (0.5, 0.75, 0.5), 2: (0.25, 0.5, 0.25)}.items():
        for seed in (0, 1):
            rows.append(
                {
                    "horizon": h,
                    "seed": seed,
                    "method": "es",
                    "base": b,
                    "final": e + 0.05 * seed,
                    "episodes": 8,
                    "peak_rss_mib": 1000.0,
                    "peak_cuda_mib": None,
                }
            )
            rows.append(
                {
                    "horizon": h,
                    "seed": seed,
                    "method": "grpo",
                    "final": g,
                    "episodes": 8,
                    "peak_rss_mib": 4000.0,
                    "peak_cuda_mib": None,
                }
            )
    table, summary = hs.summarise(rows)
    assert summary[1]["es"] == (pytest.approx(0.775), pytest.approx(0.0353553, rel=1e-4))
    assert summary[2]["base"] == (0.25, 0.0) and summary[1]["rss_ratio"] == 0.25 and summary[1]["cuda_ratio"] is None
    assert "| 1 | 2 | 0.500 ± 0.000 | 0.775 ± 0.035 | 0.500 ± 0.000 | 8 / 8 | 1000 | 4000 | 0.250 |" in table
    hs.plot(summary, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_presets_pick_the_es_perturbation_and_a_rerun_with_other_settings_is_refused(hs, tmp_path):
    assert hs.parse_args(["--preset", "cpu", "--out", "x"]).perturbation == "lowrank"
    assert hs.parse_args(["--preset", "paper", "--out", "x"]).perturbation == "full"  # the paper's ES
    a = hs.parse_args(["--preset", "cpu", "--out", "x", "--perturbation", "full"])
    assert a.perturbation == "full" and a.rank == 1
    (tmp_path / "settings.json").write_text('{"model": "another", "rank": 1}')
    with pytest.raises(SystemExit, match=r"other settings \(.*model"):
        hs.main(["--preset", "tiny", "--out", str(tmp_path), "--methods", "es"])
    assert not (tmp_path / "results.jsonl").exists()


def test_a_pair_is_claimed_by_one_process_and_a_dead_claim_is_taken_over(hs, tmp_path):
    import subprocess
    import sys

    work = tmp_path / "h1_s0"
    assert hs.claim(work) and not hs.claim(work)  # held by this (live) process
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (work / "claim").write_text(str(dead.pid))
    assert hs.claim(work) and (work / "claim").read_text() == str(os.getpid())
