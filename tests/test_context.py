"""The context channel (publish / read / record), typed pool queries, wiring checks and the run identity."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from coevo.budget import Budget
from coevo.config import parse_config
from coevo.context import ContextValue, RunContext
from coevo.errors import ConfigError
from coevo.rollouts.base import build_rollout, validate_rollout_spec
from coevo.store import TrajectoryStore
from coevo.store.schema import SCHEMA_V1, _split_sql
from coevo.types import ESMember, Trajectory

TESTS = Path(__file__).parent


@pytest.fixture
def ctx(tmp_path):
    store = TrajectoryStore(tmp_path / "store.sqlite")
    yield RunContext(run_id="r", run_dir=tmp_path, store=store, budget=Budget(store, "r", None, 10, None))
    store.close()


def test_publish_versions_values_idempotently(ctx):
    assert ctx.context("system_prompt") == ContextValue("system_prompt", 0, None)
    v1 = ctx.publish("system_prompt", "Be brief.", evolver="p")
    assert (v1.version, v1.value) == (1, "Be brief.")
    assert ctx.publish("system_prompt", "Be brief.", evolver="p") == v1  # the current value again: no-op
    v2 = ctx.publish("system_prompt", "Think step by step.", evolver="p", meta={"score": 0.5})
    assert v2.version == 2 and ctx.context("system_prompt") == v2
    arts = ctx.store.list_artifacts(kind="context", name="system_prompt")
    assert [(a.version, a.parent_version, a.content["value"]) for a in arts] == [
        (1, None, "Be brief."),
        (2, 1, "Think step by step."),
    ]
    # a step re-run after a crash: the checkpoint still says version 1; republishing the same value gives the
    # stored version 2, nothing new is written
    ctx.shared["context"]["system_prompt"] = 1
    ctx._context_values.clear()
    assert ctx.publish("system_prompt", "Think step by step.", evolver="p") == v2
    assert len(ctx.store.list_artifacts(kind="context")) == 2
    # the same value after another one is a new version (A, B, A)
    assert ctx.publish("system_prompt", "Be brief.", evolver="p").version == 3
    with pytest.raises(ValueError, match="cannot be None"):
        ctx.publish("k", None, evolver="p")
    with pytest.raises(TypeError, match="not JSON"):
        ctx.publish("k", {1, 2}, evolver="p")


def test_rollouts_read_the_published_prompt_and_record_its_version(ctx, tiny_model_dir):
    from coevo.backends.hf import HFPolicy

    policy = HFPolicy(str(tiny_model_dir), dtype="float32")
    ro = build_rollout({"type": "target_logprob", "system_prompt": "Default.", "prompts": ["Hi."]}, ctx)
    (t0,) = ro.run(policy, generation=0, member=None, key_prefix="r/es/g0", evolver="es")
    assert t0.context.versions == {"system_prompt": 0, "instruction": 0} and t0.context.prompt == "Default."
    ctx.publish("system_prompt", "Greet warmly.", evolver="p")
    (t1,) = ro.run(policy, generation=0, member=None, key_prefix="r/es/g0b", evolver="es")
    assert t1.context.versions["system_prompt"] == 1 and t1.context.prompt == "Greet warmly."
    assert t1.reward != t0.reward  # the prompt reached the model
    # a pinned value (what a Ray job carries) wins over the run context's current one, and is restored after
    with ro.pinned_context({"system_prompt": ContextValue("system_prompt", 0, None)}):
        (t2,) = ro.run(policy, generation=0, member=None, key_prefix="r/es/g0c", evolver="es")
    assert t2.reward == t0.reward and t2.context.versions["system_prompt"] == 0
    assert ro.current_context().versions["system_prompt"] == 1
    # the instruction template wraps each case's question
    ctx.publish("instruction", "Q: {prompt}\nA:", evolver="p")
    conv = ro.conversation({"prompt": "Hi."}, ro.current_context())
    assert conv == [{"role": "system", "content": "Greet warmly."}, {"role": "user", "content": "Q: Hi.\nA:"}]
    # a renamed slot reads another key
    other = build_rollout({"type": "countdown", "context_keys": {"system_prompt": "math_prompt"}}, ctx)
    assert other.declared_context() == ["math_prompt", "instruction"]
    with pytest.raises(ValueError, match=r"rollout.context_keys: \['nope'\] are not context slots"):
        validate_rollout_spec({"type": "countdown", "context_keys": {"nope": "x"}})


def _traj(key, **kw):
    return Trajectory(**{"key": key, "run_id": "r", "evolver": "es", "space": "parameter", "llm_calls": 1, **kw})


def test_pool_queries_keep_the_held_out_split_out(ctx):
    m = lambda i: ESMember(seed=i, sigma=0.1, index=i)
    rows = [
        _traj("a", generation=3, member=m(0), reward=0.2, task_id="t1", meta={"split": "train"}),
        _traj("b", generation=3, member=m(1), reward=0.9, task_id="t1", meta={"split": "train"}),
        _traj("c", generation=3, member=m(1), reward=0.5, task_id="t2", meta={"split": "train"}),
        _traj("d", generation=3, member=m(2), reward=None, valid=False, failure="parse", meta={"split": "train"}),
        # the centre's held-out evaluation carries the same generation as the members' train rollouts
        _traj("held", generation=3, reward=1.0, task_id="secret", meta={"split": "test"}),
        _traj("prop", evolver="p", generation=3, meta={}, reward=None),  # a context evolver's own call
    ]
    ctx.store.add_trajectories(rows)
    assert "held" in {t.key for t in ctx.store.query(run_id="r", generation=3)}  # the leak a plain query has
    keys = lambda ts: [t.key for t in ts]
    assert keys(ctx.pool(generation=3)) == ["a", "b", "c", "d"]
    assert keys(ctx.pool(generation=3, split="test")) == ["held"]
    assert keys(ctx.pool(generation=3, split=None)) == ["a", "b", "c", "d", "held", "prop"]
    assert keys(ctx.pool(split=None, members_only=True)) == ["a", "b", "c", "d"]
    assert keys(ctx.pool(top_k=2)) == ["b", "c"] and keys(ctx.pool(bottom_k=2)) == ["a", "c"]
    assert keys(ctx.pool(top_k=5, distinct_task=True)) == ["b", "c"]  # the best per task
    assert keys(ctx.pool(bottom_k=1, distinct_task=True)) == ["a"]
    assert keys(ctx.pool(valid=False)) == ["d"] and keys(ctx.pool(evolver="p", split=None)) == ["prop"]
    with pytest.raises(ValueError, match="not both"):
        ctx.pool(top_k=1, bottom_k=1)
    with pytest.raises(ValueError, match="split must be one of"):
        ctx.pool(split="dev")


def test_a_version_1_store_is_migrated_and_readable(tmp_path):
    db = tmp_path / "old.sqlite"
    conn = sqlite3.connect(db, isolation_level=None)
    for statement in _split_sql(SCHEMA_V1):
        conn.execute(statement)
    conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (1, 0)")
    conn.close()
    with TrajectoryStore(db, readonly=True) as ro:  # an older file is readable as it is
        assert ro.query() == []
    with TrajectoryStore(db) as store:
        store.add_trajectory(_traj("x", reward=1.0))
        assert store.get_by_key("x").context.versions == {}
        store.add_trajectory(_traj("y", reward=1.0, context=_ref({"system_prompt": 2})))
        assert store.get_by_key("y").context.versions == {"system_prompt": 2}
        with pytest.raises(ValueError, match=r"context.versions\['k'\] must be >= -1"):
            store.add_trajectory(_traj("z", context=_ref({"k": -2})))


def _ref(versions):
    from coevo.types import ContextRef

    return ContextRef(versions=versions)


def _cfg(*evolvers, plugins=None):
    data = {
        "run": {"name": "w"},
        "model": {"name": "tiny:micro", "backend": "hf", "dtype": "float32"},
        "evolvers": list(evolvers),
    }
    if plugins:
        data["plugins"] = plugins
    return data


ES = {"name": "es", "type": "es", "population_size": 2, "rollout": {"type": "target_logprob"}}
PROMPTER = {"name": "prompter", "type": "prompt-evolver", "evolver": "es"}


def test_types_resolve_independently_of_order_and_plugins_import_modules(monkeypatch):
    from coevo.evolvers.base import EVOLVERS

    EVOLVERS.remove("prompt-evolver")
    monkeypatch.delitem(sys.modules, "coevo.examples.prompt_evolver", raising=False)
    with pytest.raises(ConfigError, match="evolvers.prompter.type: unknown evolver type 'prompt-evolver'"):
        parse_config(_cfg(PROMPTER, ES))
    parse_config(_cfg(PROMPTER, ES, plugins=["coevo.examples.prompt_evolver"]))  # listed before es: fine
    with pytest.raises(ConfigError, match="plugins.0: cannot import 'no_such_module_xyz'"):
        parse_config(_cfg(ES, plugins=["no_such_module_xyz"]))
    # a registered name defined by a module that a later dotted-path type imports
    EVOLVERS.remove("prompt-evolver")
    monkeypatch.delitem(sys.modules, "coevo.examples.prompt_evolver", raising=False)
    dotted = {**PROMPTER, "name": "p2", "type": "coevo.examples.prompt_evolver:PromptEvolver"}
    parse_config(_cfg(PROMPTER, dotted, ES))
    # references to other evolvers are checked at validation
    with pytest.raises(ConfigError, match="evolvers.prompter.evolver: unknown 'sе'"):
        parse_config(_cfg(ES, {**PROMPTER, "evolver": "sе"}))


def test_setup_checks_wiring_before_any_step(tmp_path):
    from coevo.loop import CoEvolutionLoop

    data = _cfg(ES, {**PROMPTER, "key": "not_read"}, plugins=["coevo.examples.prompt_evolver"])
    with pytest.raises(ConfigError, match="evolvers.prompter.key: the rollout of 'es' does not read it"):
        CoEvolutionLoop(parse_config(data), tmp_path / "run", raw_config=data, progress=False)
    assert not (tmp_path / "run" / "checkpoints" / "LATEST").exists()
