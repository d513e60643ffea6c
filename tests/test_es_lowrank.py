"""Low-rank (EGGROLL) ES: factors, population-batched forward on a tiny Qwen2, the exact update, stochastic
rounding, antithetic cancellation and replay."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_es_models import tiny_qwen2

from coevo.backends.base import SamplingParams
from coevo.backends.hf import HFPolicy
from coevo.es import ESParams, GenerationRecord, ScopeSpec, normalize_rewards, replay, select_params
from coevo.es.lowrank import (
    LOWRANK_SPEC,
    FactorBank,
    dense_perturbation,
    draw_factors,
    lowrank_update,
    round_seed,
    stochastic_round,
)
from coevo.es.noise import generate_noise
from coevo.es.replica import ESReplica, Population
from coevo.types import ESMember

CONVS = [[{"role": "user", "content": t}] for t in ("Say hello.", "Add 2 and 3.", "def f(x):")]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return HFPolicy(tiny_model_dir, batch_size=4)


# ------------------------------------------------------------------------------------------- factors
def test_factors_are_the_documented_keyed_streams_and_nest_over_rank():
    a, b = draw_factors(7, "m.q_proj.weight", (12, 5), rank=3)
    assert a.shape == (12, 3) and b.shape == (5, 3) and a.dtype == torch.float32
    assert torch.equal(a[:, 2], generate_noise(7, "m.q_proj.weight#lowrank.A2", (12,)))
    assert torch.equal(b[:, 0], generate_noise(7, "m.q_proj.weight#lowrank.B0", (5,)))
    a1, b1 = draw_factors(7, "m.q_proj.weight", (12, 5), rank=1)
    assert torch.equal(a1[:, 0], a[:, 0]) and torch.equal(b1[:, 0], b[:, 0])  # rank-1 factors = first columns
    a2, _ = draw_factors(7, "m.k_proj.weight", (12, 5), rank=3)
    assert not torch.equal(a2, a)  # another tensor name, another stream
    e = dense_perturbation(7, "m.q_proj.weight", (12, 5), 3)
    assert torch.allclose(e, a @ b.t() / math.sqrt(3), atol=1e-6)
    with pytest.raises(ValueError, match="2-D"):
        draw_factors(7, "m.bias", (12,), 1)


# ------------------------------------------------------------------------------------------- forward
@pytest.mark.parametrize(("dtype", "atol"), [("float32", 1e-4), ("bfloat16", 6e-2)])
def test_lowrank_forward_equals_explicit_dense_perturbation(tiny_model_dir, dtype, atol):
    """A member's logits through the hooks == logits of a model whose weights are W + sign sigma E_i."""
    policy = HFPolicy(tiny_model_dir, dtype=dtype)
    replica = policy.es_replica(ScopeSpec("all_linear"), master_weights=False)
    assert isinstance(replica, ESReplica)
    member, sigma, rank = ESMember(seed=31, sigma=0.05, sign=-1, index=1), 0.05, 2
    targets = ["Hello, world!"] * len(CONVS)
    base = policy.logprob(CONVS, targets)
    with replica.population([ESMember(seed=30, sigma=sigma, sign=1, index=0), member], rank) as pop:
        assert isinstance(pop, Population)
        got = pop.logprob([(member, c) for c in CONVS], targets)
        centre = pop.logprob([(None, c) for c in CONVS], targets)
    assert torch.equal(centre, base)  # centre rows (scale 0) are the unperturbed model
    dense = HFPolicy(tiny_model_dir, dtype="float32")
    with torch.no_grad():
        for name, t in select_params(dense.named_parameters(), "all_linear"):
            t.add_(-sigma * dense_perturbation(31, name, t.shape, rank))
    want = dense.logprob(CONVS, targets)
    assert not torch.allclose(got, base, atol=atol)  # the perturbation matters at this scale...
    assert torch.allclose(got, want, atol=atol * max(1.0, float(want.abs().max()))), (got, want)  # ...and is E_i
    assert replica.weights_hash() == policy.es_replica(ScopeSpec("all_linear")).weights_hash()  # no weight pass


def test_rows_of_different_members_in_one_batch_equal_each_member_alone(policy):
    replica = policy.es_replica(ScopeSpec("all_linear"), master_weights=False)
    members = [
        ESMember(seed=5, sigma=0.2, sign=1, index=0),
        ESMember(seed=5, sigma=0.2, sign=-1, index=1),
        ESMember(seed=9, sigma=0.2, sign=1, index=2),
    ]
    before = replica.weights_hash()
    for params in (
        SamplingParams(max_new_tokens=6, temperature=0.0),
        SamplingParams(max_new_tokens=6, temperature=1.0, top_p=0.9, seed=17),
    ):
        with replica.population(members, 1) as pop:
            rows = [(m, c) for c in CONVS for m in members]  # interleaved members, split over 3 model batches
            mixed = pop.generate(rows, params)
            alone = {m.index: pop.member_policy(m).generate(CONVS, params) for m in members}
            mixed_lp = pop.logprob(rows, ["Hi"] * len(rows))
            alone_lp = {m.index: pop.member_policy(m).logprob(CONVS, ["Hi"] * 3) for m in members}
        for k, ((m, _), out) in enumerate(zip(rows, mixed, strict=True)):
            assert out.text == alone[m.index][k // len(members)].text
            assert mixed_lp[k] == pytest.approx(float(alone_lp[m.index][k // len(members)]), abs=1e-5)
        texts = {m.index: [o.text for o in alone[m.index]] for m in members}
        assert texts[0] != texts[1] or texts[0] != texts[2]  # members do differ
    assert replica.weights_hash() == before


def test_shared_prefix_is_prefilled_once_per_member_and_changes_no_output(tiny_model_dir):
    """A population batch whose rows share a long system message prefills it once per member in the batch (not
    once per row, never across members) and gives the outputs of the same rows without prefix sharing."""
    policy = HFPolicy(tiny_model_dir, batch_size=6)
    replica = policy.es_replica(ScopeSpec("all_linear"), master_weights=False)
    members = [ESMember(seed=5, sigma=0.2, sign=g, index=i) for i, g in enumerate((1, -1))]
    system = {"role": "system", "content": "You solve small puzzles. Think briefly, then answer in one line. " * 3}
    convs = [[system, c[0]] for c in CONVS]
    rows = [(m, c) for c in convs for m in members]  # 6 rows, 2 members, one model batch
    shapes: list[tuple[int, ...]] = []  # input shapes of the embedding layer: one per model forward
    handle = policy.model.get_input_embeddings().register_forward_pre_hook(
        lambda m, a: shapes.append(tuple(a[0].shape))
    )
    for params in (
        SamplingParams(max_new_tokens=6, temperature=0.0),
        SamplingParams(max_new_tokens=6, temperature=1.0, top_p=0.9, seed=11),
    ):
        with replica.population(members, 1) as pop:
            shapes.clear()
            shared = pop.generate(rows, params)
            prefill = shapes[0]
            positions = [0, 1] * 3
            seeds = None if params.seed is None else _row_seeds(params.seed, positions)
            shapes.clear()
            unshared = policy.generate_rows(
                [c for _, c in rows], params, row_seeds=seeds, batch_hook=pop._batch_hook(positions)
            )
        assert prefill[0] == 2 and prefill[1] >= policy.min_shared_prefix  # the prefix: one row per member
        assert shapes[0][0] == 6 and shapes[0][1] > prefill[1]  # without groups: every row's whole prompt
        assert [o.text for o in shared] == [o.text for o in unshared]
        assert shared[0].text != shared[1].text or shared[2].text != shared[3].text  # the members differ
    handle.remove()


def _row_seeds(seed, positions):
    from coevo.backends.base import request_seed
    from coevo.es.replica import member_row_indices

    return [request_seed(seed, k) for k in member_row_indices(positions)]


def test_seeded_sampling_is_per_row_whatever_the_batch_split(policy, tiny_model_dir):
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_k=50, seed=3)
    one_by_one = HFPolicy(tiny_model_dir, batch_size=1).generate(CONVS * 2, params)
    together = policy.generate(CONVS * 2, params)
    assert [o.text for o in one_by_one] == [o.text for o in together]
    assert together[0].text != together[3].text  # equal prompts, different rows: independent samples


def test_population_refuses_non_matrices_and_active_perturbations(policy):
    full = policy.es_replica(ScopeSpec("full"))
    with pytest.raises(ValueError, match="matrices only"), full.population([ESMember(seed=1, sigma=0.1)], 1):
        pass
    replica = policy.es_replica(ScopeSpec("all_linear"), master_weights=False)
    with (
        replica.perturbed(ESMember(seed=1, sigma=0.1)),
        pytest.raises(RuntimeError, match="active"),
        replica.population([ESMember(seed=1, sigma=0.1)], 1),
    ):
        pass
    bank = FactorBank(replica.params, [ESMember(seed=3, sigma=0.1, sign=1), ESMember(seed=3, sigma=0.1, sign=-1)], 2)
    assert bank.slots == [0, 0] and bank.scales == [
        pytest.approx(0.1 / math.sqrt(2)),
        pytest.approx(-0.1 / math.sqrt(2)),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_delta_equals_output_plus_the_rows_term(dtype):
    """The hook's fused add (in place for float32) equals ``output + delta`` for prefill and decode shapes."""
    members = [ESMember(seed=s, sigma=0.3, sign=g) for s in (4, 9) for g in (1, -1)]
    bank = FactorBank([("w", torch.zeros(6, 5))], members, 2)
    slots, scales = bank.row_tables([0, 3, None, 1, 2])
    for tokens in (7, 1):
        x = torch.randn(5, tokens, 5).to(dtype)
        output = torch.randn(5, tokens, 6).to(dtype)
        want = output + bank.delta("w", x, slots, scales).to(dtype)
        got = bank.add_delta("w", x, output.clone(), slots, scales)
        assert got.shape == output.shape and got.dtype == dtype
        torch.testing.assert_close(
            got, want, atol=1e-6 if dtype == torch.float32 else 0, rtol=1e-6 if dtype == torch.float32 else 0
        )
        assert torch.equal(got[2], output[2])  # the centre's row is untouched


# ------------------------------------------------------------------------------------------- update
def test_update_is_the_documented_rank1_float32_sum():
    w = torch.randn(40, 30, generator=torch.Generator().manual_seed(2))
    orig = w.clone()
    seeds, signs, coeffs, alpha, rank = [11, 11, 12], [1, -1, 1], [0.7, -0.2, 1.5], 3e-3, 2
    stats = lowrank_update([("l.weight", w)], seeds, signs, coeffs, alpha, sigma=1e-3, rank=rank, generation=4)
    acc = torch.zeros(40, 30)
    for seed, k in ((11, 0.7 + 0.2), (12, 1.5)):
        a_j = float(torch.tensor(alpha * k / (3 * math.sqrt(rank)), dtype=torch.float32))
        fa, fb = draw_factors(seed, "l.weight", (40, 30), rank)
        for c in range(rank):
            acc += fa[:, c].mul(a_j)[:, None] * fb[None, :, c]
    assert torch.equal(w, orig + acc)
    assert not stats.skipped and stats.n_noise_streams == 2 and stats.changed_fraction > 0.99
    expect = orig.double() + alpha / 3 * (
        0.9 * dense_perturbation(11, "l.weight", (40, 30), 2).double()
        + 1.5 * dense_perturbation(12, "l.weight", (40, 30), 2).double()
    )
    assert torch.allclose(w.double(), expect, atol=1e-7)


def test_antithetic_pairs_with_equal_rewards_cancel_exactly():
    model = tiny_qwen2(torch.bfloat16, seed=3)
    params = ESParams(select_params(model, "all_linear"))
    before = params.weights_hash()
    stats = lowrank_update(params, [4, 4, 9, 9], [1, -1, 1, -1], [0.5, 0.5, -1.0, -1.0], 1e-2, 1e-3, 1, 0)
    assert params.weights_hash() == before and stats.n_noise_streams == 0 and stats.update_norm == 0.0
    # a cancelled pair contributes exactly nothing next to a live one (float32: no rounding step)
    c = tiny_qwen2(torch.float32, seed=3)
    d = tiny_qwen2(torch.float32, seed=3)
    pc, pd = ESParams(select_params(c, "all_linear")), ESParams(select_params(d, "all_linear"))
    lowrank_update(pc, [4, 4, 9, 9], [1, -1, 1, -1], [0.5, 0.5, 1.0, -1.0], 1e-2, 1e-3, 1, 0)
    lowrank_update(pd, [9, 9, 9, 9], [1, -1, 1, -1], [1.0, -1.0, 0.0, 0.0], 1e-2, 1e-3, 1, 0)
    assert (
        pc.weights_hash()
        == pd.weights_hash()
        != ESParams(select_params(tiny_qwen2(seed=3), "all_linear")).weights_hash()
    )
    # from rewards: a pair with equal raw rewards gets equal shaped coefficients under every normalisation
    centre = ESParams(select_params(tiny_qwen2(torch.float32, seed=3), "all_linear")).weights_hash()
    for method in ("zscore", "centered_rank", "none"):
        c = normalize_rewards([0.3, 0.3, 1.0, -1.0], method).tolist()
        assert c[0] == c[1] and c[2] != c[3]
        pc, pd = (ESParams(select_params(tiny_qwen2(torch.float32, seed=3), "all_linear")) for _ in range(2))
        lowrank_update(pc, [4, 4, 9, 9], [1, -1, 1, -1], c, 1e-2, 1e-3, 1, 0)
        lowrank_update(pd, [9, 9, 9, 9], [1, -1, 1, -1], [c[2], c[3], 0.0, 0.0], 1e-2, 1e-3, 1, 0)
        assert pc.weights_hash() == pd.weights_hash() != centre, method  # the tied pair adds exactly nothing


def test_stochastic_rounding_is_deterministic_unbiased_and_keeps_small_steps():
    x = torch.full((200_000,), 1.0 + 2**-10)  # 1/8 of the way from bf16 1.0 to 1.0078125
    r1, r2 = stochastic_round(x, torch.bfloat16, 5, "w", 0), stochastic_round(x, torch.bfloat16, 5, "w", 0)
    assert torch.equal(r1, r2) and not torch.equal(r1, stochastic_round(x, torch.bfloat16, 5, "w", 1))
    assert set(r1.float().unique().tolist()) == {1.0, 1.0078125}
    assert float(r1.float().mean()) == pytest.approx(1.0 + 2**-10, abs=2e-5)
    neg = stochastic_round(-x, torch.bfloat16, 5, "w", 0)
    assert torch.equal(neg, -r1)  # rounds the magnitude: symmetric
    h = stochastic_round(torch.full((100_000,), 1.0 + 2**-13), torch.float16, 1, "w", 0)
    assert float(h.float().mean()) == pytest.approx(1.0 + 2**-13, abs=2e-6)
    # bf16 weights of 1.0 and 40 equal steps of 2e-4 E (E = A B^T, |step| mostly far below half an ulp,
    # 2e-3 / 3.9e-3): round-to-nearest would leave ~all weights at 1.0; stochastic rounding moves them by
    # 40 * step in expectation (regression slope ~1 on the exact sum)
    w = torch.ones(64, 256, dtype=torch.bfloat16)
    for g in range(40):
        lowrank_update([("l.weight", w)], [1], [1], [1.0], alpha=2e-4, sigma=1.0, rank=1, generation=g)
    exact = 40 * 2e-4 * dense_perturbation(1, "l.weight", (64, 256), 1).reshape(-1)
    moved = w.float().reshape(-1) - 1.0
    assert float((exact.abs() < 2e-3 / 40).float().mean()) > 0.0 and float((moved != 0).float().mean()) > 0.3
    slope = float(moved @ exact / (exact @ exact))
    assert 0.9 < slope < 1.1, slope
    with pytest.raises(ValueError, match="float32"):
        stochastic_round(x.double(), torch.bfloat16, 1, "w", 0)


@pytest.mark.parametrize(("dtype", "master"), [(torch.bfloat16, False), (torch.bfloat16, True), (torch.float32, False)])
def test_lowrank_records_replay_bit_identically(dtype, master):
    model = tiny_qwen2(dtype, seed=7)
    scope = ScopeSpec("all_linear")
    params = ESParams(select_params(model, scope), master_dtype=torch.float32 if master else None)
    records = []
    for g in range(3):
        seeds = [100 + g, 100 + g, 200 + g, 200 + g]
        rec = GenerationRecord(
            generation=g,
            seeds=seeds,
            signs=[1, -1, 1, -1],
            rewards=[0.3, 0.1, -0.2, 0.4],
            coeffs=[1.0, 0.2, -1.3, 0.1],
            sigma=1e-3,
            alpha=2e-3,
            scope=scope.to_dict(),
            master_dtype="float32" if master else None,
            perturbation="lowrank",
            rank=2,
        )
        stats = rec.apply(params)
        assert stats.changed_fraction > 0.0
        rec.weight_hash_after = params.weights_hash()
        records.append(rec.to_dict())
    records = json.loads(json.dumps(records))
    assert records[0]["noise_spec"] == LOWRANK_SPEC and records[0]["perturbation"] == "lowrank"
    assert GenerationRecord.from_dict(records[1]).to_dict() == records[1]
    assert replay(tiny_qwen2(dtype, seed=7), records).weights_hash() == records[-1]["weight_hash_after"]
    with pytest.raises(ValueError, match="rank"):
        GenerationRecord.from_dict(records[0] | {"rank": 0})
    with pytest.raises(ValueError, match="perturbation"):
        GenerationRecord.from_dict(records[0] | {"perturbation": "sparse"})
    assert round_seed(0, [1, 2]) != round_seed(1, [1, 2]) != round_seed(0, [2, 1])
