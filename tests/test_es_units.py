"""Schedules, reward normalisation, parameter scopes and the weights hash."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from test_es_models import tiny_qwen2

from coevo.es import Schedule, ScopeSpec, normalize_rewards, select_params, weights_hash


def test_cosine_schedule_first_middle_last():
    s = Schedule("cosine", start=1e-3, end=2.5e-4, total=101)
    assert s(0) == 1e-3 and s(100) == 2.5e-4
    assert s(50) == pytest.approx((1e-3 + 2.5e-4) / 2, rel=1e-12)
    assert s(25) == pytest.approx(2.5e-4 + 7.5e-4 * (1 + math.cos(math.pi / 4)) / 2, rel=1e-12)
    values = s.values()
    assert all(a >= b for a, b in itertools.pairwise(values))
    assert Schedule("cosine", 1e-3, 0.0, total=25)(24) == 0.0  # test-time search decays to exactly 0


def test_linear_constant_warmup_and_single_step():
    lin = Schedule("linear", 1.0, 0.0, total=5)
    assert lin.values() == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert Schedule("constant", 1.5e-3, total=3).values() == [1.5e-3] * 3
    warm = Schedule("cosine", 1.0, 0.5, total=8, warmup=3)
    assert warm.values()[:4] == [0.25, 0.5, 0.75, 1.0] and warm(7) == 0.5
    assert Schedule("cosine", 2.0, 1.0, total=1)(0) == 2.0
    assert Schedule.from_dict(warm.to_dict()) == warm


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"kind": "exp"}, "kind"),
        ({"start": -1.0}, "start"),
        ({"end": float("nan")}, "end"),
        ({"total": 0}, "total"),
        ({"warmup": 5}, "warmup"),
    ],
)
def test_schedule_rejects_bad_fields(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Schedule(**({"kind": "cosine", "start": 1.0, "end": 0.0, "total": 5} | kwargs))


def test_schedule_rejects_out_of_range_generation():
    with pytest.raises(ValueError, match="generation t"):
        Schedule("cosine", 1.0, 0.0, total=5)(5)
    with pytest.raises(ValueError, match="unknown schedule keys"):
        Schedule.from_dict({"kind": "cosine", "sigma0": 1.0})


def test_zscore_uses_population_std():
    z = normalize_rewards([1.0, 2.0, 3.0, 4.0])
    assert z.dtype == np.float64
    np.testing.assert_allclose(z, np.array([-1.5, -0.5, 0.5, 1.5]) / math.sqrt(1.25), rtol=1e-7)
    assert np.array_equal(normalize_rewards([0.1, 0.1, 0.1]), np.zeros(3))
    assert np.array_equal(normalize_rewards([7.0]), np.zeros(1))


def test_centered_rank_and_none():
    np.testing.assert_array_equal(normalize_rewards([10.0, 30.0, 20.0], "centered_rank"), [-0.5, 0.5, 0.0])
    np.testing.assert_array_equal(normalize_rewards([1.0, 1.0, 2.0], "centered_rank"), [-0.25, -0.25, 0.5])
    np.testing.assert_array_equal(
        normalize_rewards([-3.0, 5.0, -3.0, 0.0, 9.0], "centered_rank"), [-0.375, 0.25, -0.375, 0.0, 0.5]
    )
    np.testing.assert_array_equal(normalize_rewards([3.0, -1.0], "none"), [3.0, -1.0])


@pytest.mark.parametrize(
    ("rewards", "method", "match"),
    [
        ([], "zscore", "non-empty"),
        ([1.0, float("nan")], "zscore", "finite"),
        ([1.0], "rank", "method"),
        ([[1.0, 2.0]], "zscore", "1-D"),
    ],
)
def test_normalize_rejects_bad_input(rewards, method, match):
    with pytest.raises(ValueError, match=match):
        normalize_rewards(rewards, method)


def test_all_linear_scope_on_qwen2():
    model = tiny_qwen2()
    names = [n for n, _ in select_params(model, "all_linear")]
    assert names == sorted(names) and len(names) == 2 * 7
    assert all(n.endswith("_proj.weight") for n in names)
    full = select_params(model, "full")
    assert len(full) == len(list(model.parameters()))
    assert any("embed_tokens" in n for n, _ in full) and any("norm" in n for n, _ in full)
    assert any(n.endswith("q_proj.bias") for n, _ in full)  # Qwen2 has q/k/v biases


def test_include_exclude_globs_and_regex():
    model = tiny_qwen2()
    attn = select_params(model, ScopeSpec("all_linear", include=("*.self_attn.*",), exclude=("re:o_proj",)))
    assert [n.split(".")[-2] for n, _ in attn] == ["k_proj", "q_proj", "v_proj"] * 2
    layer1 = select_params(model, {"scope": "full", "include": ["re:^model\\.layers\\.1\\."]})
    assert layer1 and all(n.startswith("model.layers.1.") for n, _ in layer1)
    tensors = dict(model.named_parameters())
    assert all(t is tensors[n] for n, t in layer1)  # originals, not copies


def test_empty_or_bad_scope_raises():
    model = tiny_qwen2()
    with pytest.raises(ValueError, match="selects no tensors"):
        select_params(model, ScopeSpec("all_linear", include=("*.nothing",)))
    with pytest.raises(ValueError, match="scope must be one of"):
        ScopeSpec("lora")
    with pytest.raises(ValueError, match="not a valid regex"):
        ScopeSpec("full", exclude=("re:(",))
    with pytest.raises(ValueError, match="include"):
        ScopeSpec("full", include="*.weight")
    with pytest.raises(ValueError, match="duplicate tensor name"):
        select_params([("a", torch.zeros(2)), ("a", torch.ones(2))], "full")


def test_tied_weights_are_selected_once():
    model = tiny_qwen2(tie=True)
    state = list(model.state_dict(keep_vars=True).items())  # lists the tied tensor twice
    names = [n for n, _ in select_params(state, "full")]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names


def test_weights_hash_tracks_names_dtypes_and_bits():
    model = tiny_qwen2()
    pairs = select_params(model, "full")
    h = weights_hash(pairs)
    assert len(h) == 64 and h == weights_hash(list(reversed(pairs))) == weights_hash(model)
    copy = [(n, t.detach().clone()) for n, t in pairs]
    assert weights_hash(copy) == h
    w = copy[0][1]
    w.view(-1)[0] = torch.nextafter(w.view(-1)[0], torch.tensor(1.0))  # one ulp
    assert weights_hash(copy) != h
    assert weights_hash([(n, t.to(torch.float64)) for n, t in pairs]) != h
    assert weights_hash([("x" + n, t) for n, t in pairs]) != h
    with pytest.raises(ValueError, match="duplicate"):
        weights_hash([("a", torch.zeros(1)), ("a", torch.zeros(1))])
