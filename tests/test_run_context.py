"""RunContext: the sample boundary in front of every LLM call of the run's policy (progress, stop, wall budget)."""

from __future__ import annotations

import time

import pytest

from coevo.backends.hf import HFPolicy
from coevo.budget import Budget
from coevo.errors import BudgetExhausted, ConfigError, RunInterrupted
from coevo.evolvers.base import RunContext
from coevo.store import TrajectoryStore
from coevo.types import Trajectory


@pytest.fixture
def ctx(tmp_path, tiny_model_dir):
    store = TrajectoryStore(tmp_path / "store.sqlite")
    built = []

    def factory():
        built.append(HFPolicy(tiny_model_dir, dtype="float32"))
        return built[-1]

    c = RunContext(run_id="r", run_dir=tmp_path, store=store, budget=Budget(store, "r"), policy_factory=factory)
    c.events = []
    c.progress = lambda kind, n: c.events.append((kind, n))
    yield c
    c.close_policy()
    store.close()


CONVS = [[{"role": "user", "content": "Say hello."}], [{"role": "user", "content": "Greet."}]]


def test_the_run_policy_reports_each_batch_and_stays_an_hf_policy(ctx):
    assert not ctx.policy_loaded
    policy = ctx.policy
    assert isinstance(policy, HFPolicy) and ctx.policy_loaded and ctx.observe(policy) is policy
    out = policy.generate(CONVS, ctx.sampling_params(max_new_tokens=3, temperature=0.0))
    assert len(out) == 2
    policy.logprob(CONVS[:1], ["Hello"])
    assert ctx.events[:2] == [("loading", 1), ("loaded", 1)]  # the policy's creation is said
    boundary = [e for e in ctx.events if e[0] in ("sampling", "samples")]
    assert boundary == [("sampling", 2), ("samples", 2), ("sampling", 1), ("samples", 1)]
    decoding = [e for e in ctx.events if e[0] in ("batch", "tokens", "rows")]  # HF decoding, through the streamer
    assert decoding[0] == ("batch", 2) and sum(n for k, n in decoding if k == "rows") == 2
    assert sum(n for k, n in decoding if k == "tokens") == sum(c.completion_tokens for c in out)
    n = len(ctx.events)
    ctx.record(Trajectory(key="k", run_id="r", evolver="e", space="context", round=0, llm_calls=1))
    ctx.record(Trajectory(key="k", run_id="r", evolver="e", space="context", round=0, llm_calls=1))  # cached
    assert ctx.events[-1] == ("trajectories", 1) and len(ctx.events) == n + 1
    ctx.close_policy()
    assert not ctx.policy_loaded


def test_a_stop_request_ends_the_step_before_the_next_llm_call(ctx):
    policy = ctx.policy
    ctx.events.clear()  # ("loading", 1), ("loaded", 1)
    ctx.request_stop("interrupted by SIGINT", 2)
    ctx.request_stop("interrupted by SIGTERM", 15)  # the first request wins
    with pytest.raises(RunInterrupted) as exc:
        policy.generate(CONVS, ctx.sampling_params(max_new_tokens=2))
    assert exc.value.signum == 2 and exc.value.reason == "interrupted by SIGINT"
    assert ctx.events == []  # raised before drawing: nothing sampled
    assert not isinstance(exc.value, Exception)  # evolver code catching Exception cannot record it as a sample


def test_the_wall_budget_is_checked_before_each_call(ctx):
    ctx.budget.max_wall_s = 0.2
    ctx.policy.logprob(CONVS[:1], ["Hi"])  # budget left: runs
    time.sleep(0.25)
    with pytest.raises(BudgetExhausted, match="wall-clock budget reached"):
        ctx.policy.logprob(CONVS[:1], ["Hi"])
    assert [e for e in ctx.events if e[0] == "samples"] == [("samples", 1)]


def test_no_model_is_a_config_error(tmp_path):
    store = TrajectoryStore(tmp_path / "s.sqlite")
    c = RunContext(run_id="r", run_dir=tmp_path, store=store, budget=Budget(store, "r"))
    with pytest.raises(ConfigError, match="no model configured"):
        _ = c.policy
    store.close()


def test_a_policy_shared_by_two_run_contexts_answers_to_the_newest(ctx, tmp_path):
    policy = ctx.policy
    ctx.budget.max_wall_s = 1e-9  # the first context's budget is spent
    store = TrajectoryStore(tmp_path / "other.sqlite")
    other = RunContext(
        run_id="o", run_dir=tmp_path, store=store, budget=Budget(store, "o"), policy_factory=lambda: policy
    )
    assert other.policy is policy
    assert len(policy.logprob(CONVS[:1], ["Hi"])) == 1  # only the new context's (unlimited) budget applies
    store.close()
