"""Progress that shows life (issue 29 item 2): a line while the model is created, library progress bars kept off
the lines, tokens and rows moving during a long batch, and a first SIGINT acknowledged at once. Real `coevo run`
processes (a toy evolver; the main config on the tiny random Qwen2 model), a real tqdm bar and real HF decoding."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from coevo.backends.base import SamplingParams
from coevo.backends.hf import HFPolicy
from coevo.progress import RunProgress

TESTS = Path(__file__).parent
ROOT = TESTS.parent
ENV = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _lines_until(proc: subprocess.Popen, pattern: str, timeout: float) -> tuple[list[str], float]:
    """stderr lines of ``proc`` up to the first matching ``pattern``; and when that line arrived (monotonic)."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line.rstrip("\n"))
        if re.search(pattern, line):
            return seen, time.monotonic()
    raise AssertionError(f"no line matching {pattern!r} in {timeout} s: {seen[-10:]}")


def test_a_first_sigint_during_a_long_sample_is_acknowledged_at_once(tmp_path):
    data = {
        "run": {"name": "t"},
        "budget": {"max_rounds": 3},
        "evolvers": [{"name": "a", "type": "toy_evolvers:Counter", "samples_per_step": 2, "sleep_s": 4.0}],
    }
    cfg = tmp_path / "slow.yaml"
    cfg.write_text(yaml.safe_dump(data))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "coevo.cli",
            "run",
            str(cfg),
            "--out",
            str(tmp_path / "run"),
            "--progress-interval",
            "0.3",
        ],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _lines_until(proc, r"this step: 0 samples, 0 trajectories, drawing 1", 120)  # a 4 s sample has begun
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, acked = _lines_until(proc, r"SIGINT received: stopping before the next batch", 30)
        proc.communicate(timeout=60)
        done = time.monotonic()
    finally:
        proc.kill()
    assert acked - sent < 1.5, acked - sent  # at once, while the sample still runs
    assert done - acked > 1.0 and proc.returncode == 130  # the sample finished first, then the run stopped


@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
def test_the_model_load_and_a_long_batch_show_life(tmp_path, private_cache):
    sets = {
        "model.name": "tiny:micro",
        "sampling.max_new_tokens": 64,
        "sampling.stop": "[]",  # rows run to max_new_tokens: one long batch
        "budget.max_wall_s": "null",
        "budget.max_samples": 8,
        "report.plots": "false",
        "evolvers.eoh.train_size": 8,
        "evolvers.eoh.train_count": 2,
        "evolvers.eoh.test_sizes": "[8]",
        "evolvers.eoh.test_count": 2,
        "evolvers.eoh.parse_retries": 0,
    }
    argv = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    proc = subprocess.run(
        [sys.executable, "-m", "coevo.cli", "run", str(ROOT / "configs/ahd/tsp_construct.yaml"), *argv]
        + ["--out", str(tmp_path / "run"), "--progress-interval", "0.05"],
        capture_output=True,
        text=True,
        env={**ENV, "COEVO_CACHE": str(private_cache), "OMP_NUM_THREADS": "1"},
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert any("LLM samples 0/8 · loading model tiny:micro · elapsed" in line for line in lines), lines[:20]
    tokens = {
        int(m.group(1)) for line in lines if (m := re.search(r"batch of 8 rows: \d+ finished, (\d+) tokens", line))
    }
    assert len(tokens) >= 3 and max(tokens) <= 8 * 64, sorted(tokens)  # moved during the batch
    assert "\r" not in proc.stderr and "it/s" not in proc.stderr  # no library bar interleaved


def test_library_bars_while_loading_are_kept_off_the_lines_and_warnings_pass(capsys):
    from tqdm.auto import tqdm

    stream = io.StringIO()
    progress = RunProgress("lines", stream=stream, interval_s=60, model="my-model")
    progress.start(0, 0)
    real = sys.stderr
    try:
        progress.event("loading")
        for _ in tqdm(range(50), desc="Converting and de-quantizing GGUF tensors...", mininterval=0):
            pass
        print("a warning while loading", file=sys.stderr)
        status = progress.status()
        progress.event("loaded")
    finally:
        progress.close()
    assert sys.stderr is real
    assert "loading model my-model (Converting and de-quantizing GGUF tensors...: 100% 50/50 [" in status
    assert "\r" not in stream.getvalue() and "loading model my-model" in stream.getvalue()
    err = capsys.readouterr().err
    assert "a warning while loading" in err and "Converting" not in err


def test_hf_decoding_reports_tokens_and_finished_rows(tiny_model_dir):
    policy = HFPolicy(tiny_model_dir, batch_size=4)
    events: list[tuple[str, int]] = []
    policy.progress = lambda kind, n: events.append((kind, n))
    convs = [[{"role": "user", "content": f"count to {i}"}] for i in range(6)]
    out = policy.generate(convs, SamplingParams(max_new_tokens=7, temperature=0.0))
    assert [n for k, n in events if k == "batch"] == [4, 2]  # two model batches (batch_size 4)
    assert sum(n for k, n in events if k == "rows") == 6
    tokens = sum(n for k, n in events if k == "tokens")
    assert tokens == sum(c.completion_tokens for c in out)  # one per decoded token of each row, EOS included
    assert max(n for k, n in events if k == "tokens") <= 4
