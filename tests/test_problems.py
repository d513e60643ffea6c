"""AHD problem library: published baselines, feasibility rules, references, instances (run in-process)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from coevo.ahd import (
    InstanceSet,
    available_problems,
    load_bpp_json,
    load_eoh_tsp_npz,
    load_problem,
    load_tsplib,
    run_target,
)
from coevo.ahd.evaluate import summarize
from coevo.ahd.references import gap_percent, tour_length
from coevo.sandbox.errors import InfeasibleSolution, InvalidReturn
from coevo.types import EvalResult

pytestmark = pytest.mark.usefixtures("private_cache")


def compile_fn(code: str, name: str):
    namespace: dict = {}
    exec(compile(code, "<heuristic>", "exec"), namespace)  # noqa: S102 -- trusted seed code and test lambdas
    return namespace[name]


def seed_fn(problem):
    return compile_fn(problem.seed_heuristic_code(), problem.function_name)


def test_all_problems_registered_with_seed_and_readme():
    names = available_problems()
    assert {"tsp_construct", "kp_construct", "cvrp_construct", "bpp_online"} <= set(names)
    for name in names:
        p = load_problem(name)
        assert p.name == name and p.root.name == name
        assert (p.root / "README.md").is_file()
        spec = p.prompt_spec()
        assert p.function_name in spec["template"] and spec["inputs"] and p.reference_name


def test_nearest_neighbour_matches_eoh_baselines(shared_data):
    tsp = load_problem("tsp_construct")
    nn = seed_fn(tsp)
    for n, expected in ((20, 4.4900), (50, 7.0066)):
        inst = load_eoh_tsp_npz(shared_data / "tsp" / f"eoh_test_{n}.npz", count=64)
        assert len(inst) == 64
        assert np.mean(tsp.run_heuristic(nn, inst)["objectives"]) == pytest.approx(expected, abs=5e-5)


def test_best_fit_matches_funsearch_excess(shared_data):
    bpp = load_problem("bpp_online")
    best_fit = seed_fn(bpp)
    for fname, bins, excess in (("or3.json", 212.0, 5.37), ("weibull_5k.json", 2067.0, 3.98)):
        inst = bpp.load_instances(shared_data / "bpp_online" / fname)
        mean = np.mean(bpp.run_heuristic(best_fit, inst)["objectives"])
        refs, ref_name = bpp.references(inst)
        assert mean == pytest.approx(bins)
        assert round(gap_percent(mean, refs.mean(), "minimize"), 2) == excess
        assert ref_name.startswith("L1")


def test_tsplib_eil51_parsing_optimum_and_nn(shared_data):
    tsp = load_problem("tsp_construct")
    inst = tsp.load_instances(shared_data / "tsplib" / "eil51.tsp")
    d = inst.arrays[0]["distances"]
    assert d.shape == (51, 51) and np.array_equal(d, np.rint(d)) and np.array_equal(d, d.T)
    assert d[0, 1] == 12.0  # nint(sqrt((37-49)^2 + (52-49)^2)) = nint(12.37)
    import tsplib95

    parsed = tsplib95.load(str(shared_data / "tsplib" / "eil51.tsp"))
    assert all(d[i - 1, j - 1] == parsed.get_weight(i, j) for i in range(1, 52) for j in range(1, 52) if i != j)
    refs, name = tsp.references(inst)
    assert refs.tolist() == [426.0] and name == "TSPLIB optimum"
    nn = tsp.run_heuristic(seed_fn(tsp), inst)["objectives"][0]
    assert nn == 511.0  # nearest neighbour from node 1 (TSPLIB numbering): 20% above the optimum
    folder = load_tsplib(
        [shared_data / "tsplib" / "eil51.tsp", shared_data / "tsplib" / "rat99.tsp"], tsp.root / "tsplib_optima.json"
    )
    assert folder.known_reference.tolist() == [426.0, 1211.0] and len(folder.arrays[1]["coords"]) == 99


def test_lkh_reference_on_tsp20_is_near_optimal_and_cached(shared_data):
    tsp = load_problem("tsp_construct")
    inst = load_eoh_tsp_npz(shared_data / "tsp" / "eoh_test_20.npz", count=6)
    refs, name = tsp.references(inst)
    assert "LKH" in name and 3.5 < refs.mean() < 4.2
    nn = np.array(tsp.run_heuristic(seed_fn(tsp), inst)["objectives"])
    assert np.all(refs <= nn + 1e-9) and np.any(refs < nn - 1e-3)
    cached = list((Path(os.environ["COEVO_CACHE"]) / "references" / "tsp_construct").glob("lkh-*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["values"] == refs.tolist()
    t0 = time.perf_counter()
    again, _ = tsp.references(inst)
    assert np.array_equal(again, refs) and time.perf_counter() - t0 < 0.5


def test_tsp_visited_node_is_infeasible_and_bad_types_invalid():
    tsp = load_problem("tsp_construct")
    inst = tsp.generate(12, 2, seed=3)
    with pytest.raises(InfeasibleSolution, match="already visited"):
        tsp.run_heuristic(lambda cur, dest, unvisited, d: dest, inst)
    with pytest.raises(InvalidReturn, match="float"):
        tsp.run_heuristic(lambda cur, dest, unvisited, d: float(unvisited[0]), inst)
    with pytest.raises(InvalidReturn, match="outside"):
        tsp.run_heuristic(lambda cur, dest, unvisited, d: 99, inst)
    with pytest.raises(InvalidReturn, match="bool"):
        tsp.run_heuristic(lambda cur, dest, unvisited, d: True, inst)
    first = tsp.run_heuristic(lambda cur, dest, unvisited, d: unvisited[0], inst)["objectives"]
    assert first[0] == pytest.approx(tour_length(inst.arrays[0]["distances"], list(range(12)) + [0]))


def test_each_call_gets_fresh_writable_inputs_and_edits_change_nothing():
    """Upstream hands each call fresh writable copies (ReEvo tsp_constructive/eval.py: ``dist_mat.copy()``;
    FunSearch online_binpack: ``bins[valid_bin_indices]``), so a heuristic editing its argument in place is
    valid; coevo does the same, and the edit reaches neither the score, the next call, nor later instances."""
    tsp = load_problem("tsp_construct")
    inst = tsp.generate(15, 3, seed=7)
    before = [a["distances"].copy() for a in inst]
    seen_dirty = []

    def vandal(current, destination, unvisited, distance_matrix):
        seen_dirty.append(bool((distance_matrix == 0).sum() > len(distance_matrix)))  # only the diagonal is 0
        choice = int(unvisited[np.argmin(distance_matrix[current, unvisited])])
        distance_matrix[:] = 0.0  # in place, on a writable array
        unvisited[:] = -1
        return choice

    out = tsp.run_heuristic(vandal, inst)
    nn = tsp.run_heuristic(seed_fn(tsp), inst)
    assert out["objectives"] == nn["objectives"] and min(out["objectives"]) > 1.0  # as if it edited nothing
    assert not any(seen_dirty) and len(seen_dirty) == 3 * 14
    assert all(np.array_equal(a["distances"], b) for a, b in zip(inst, before))
    assert len(out["times_s"]) == 3 and all(t >= 0 for t in out["times_s"])
    bpp = load_problem("bpp_online")
    binst = bpp.generate(300, 1, seed=0, distribution="uniform")

    def best_fit_in_place(item, bins):
        bins -= item  # FunSearch-style code may reuse its argument as scratch space
        return -bins.astype(float)

    assert (
        bpp.run_heuristic(best_fit_in_place, binst)["objectives"]
        == bpp.run_heuristic(seed_fn(bpp), binst)["objectives"]
    )


def test_kp_greedy_below_exact_and_empty_knapsack_scores_worst():
    kp = load_problem("kp_construct")
    inst = kp.generate(50, 6, seed=11)
    greedy = np.array(kp.run_heuristic(seed_fn(kp), inst)["objectives"])
    exact, name = kp.references(inst)
    assert "exact" in name
    assert np.all(exact >= greedy - 1e-9)
    gap = gap_percent(greedy.mean(), exact.mean(), kp.direction)
    assert 0.0 < gap < 5.0
    empty = kp.run_heuristic(lambda cap, w, v: -1, inst)
    none = kp.run_heuristic(lambda cap, w, v: None, inst)
    assert empty["objectives"] == none["objectives"] == [0.0] * 6
    s_greedy = summarize(kp, inst, EvalResult(valid=True, metrics=kp.run_heuristic(seed_fn(kp), inst)))
    s_empty = summarize(kp, inst, EvalResult(valid=True, metrics=empty))
    assert s_greedy.score > s_empty.score  # the sign bug of the reference frameworks cannot happen
    assert s_greedy.metrics["gap_percent"] == pytest.approx(gap) and s_empty.metrics["gap_percent"] == 100.0


def test_kp_item_that_does_not_fit_is_infeasible():
    kp = load_problem("kp_construct")
    inst = kp.generate(50, 1, seed=2, capacity=0.5)
    with pytest.raises(InfeasibleSolution, match="exceeds the remaining capacity"):
        kp.run_heuristic(lambda cap, w, v: int(np.argmax(w)), inst)
    with pytest.raises(InvalidReturn):
        kp.run_heuristic(lambda cap, w, v: "0", inst)


def test_cvrp_capacity_is_checked_and_seed_is_feasible():
    cvrp = load_problem("cvrp_construct")
    inst = cvrp.generate(20, 2, seed=5)

    def ignores_capacity(current, depot, unvisited, rest, demands, dist):
        return int(unvisited[np.argmin(dist[current, unvisited])])

    with pytest.raises(InfeasibleSolution, match="capacity violated"):
        cvrp.run_heuristic(ignores_capacity, inst)
    with pytest.raises(InvalidReturn, match="depot while at the depot"):
        cvrp.run_heuristic(lambda c, depot, u, r, q, d: depot, inst)
    seed = np.array(cvrp.run_heuristic(seed_fn(cvrp), inst)["objectives"])
    refs, name = cvrp.references(inst)
    assert "not optimal" in name and np.all(refs <= seed + 1e-9) and np.all(refs > 0)
    # going back to the depot after every customer is feasible and longer than capacity-aware NN
    star = np.array(
        cvrp.run_heuristic(lambda c, depot, u, r, q, d: depot if c != depot else int(u[0]), inst)["objectives"]
    )
    assert np.allclose(star, [2 * a["distances"][0, 1:].sum() for a in inst]) and np.all(star > seed)


def test_bpp_scalar_nan_and_wrong_length_priorities_are_invalid():
    bpp = load_problem("bpp_online")
    inst = bpp.generate(200, 1, seed=0, distribution="uniform")
    with pytest.raises(InvalidReturn, match="scalar"):
        bpp.run_heuristic(lambda item, bins: 1.0, inst)
    with pytest.raises(InvalidReturn, match="NaN for all"):
        bpp.run_heuristic(lambda item, bins: np.full(len(bins), np.nan), inst)
    with pytest.raises(InvalidReturn, match="shape"):
        bpp.run_heuristic(lambda item, bins: np.zeros(len(bins) + 1), inst)
    with pytest.raises(InvalidReturn, match="dtype"):
        bpp.run_heuristic(lambda item, bins: np.array(["a"] * len(bins)), inst)
    code = "import numpy as np\ndef priority(item, bins):\n    return -(bins - item)\n"
    assert bpp.resolve_function_name(code) == "priority"
    assert bpp.resolve_function_name("def score(item, bins):\n    return bins\n") == "score"


def test_generators_are_seeded_and_follow_the_stated_distributions():
    tsp, kp, cvrp, bpp = (load_problem(n) for n in ("tsp_construct", "kp_construct", "cvrp_construct", "bpp_online"))
    a, b = tsp.generate(20, 3, seed=1), tsp.generate(20, 3, seed=1)
    assert a.content_hash() == b.content_hash() != tsp.generate(20, 3, seed=2).content_hash()
    assert a.arrays[0]["coords"].shape == (20, 2) and a.arrays[0]["coords"].max() < 1.0
    assert [float(x["capacity"]) for x in (kp.generate(n, 1, 0).arrays[0] for n in (50, 100, 200))] == [
        12.5,
        25.0,
        25.0,
    ]
    c = cvrp.generate(50, 2, seed=0).arrays[0]
    assert int(c["capacity"]) == 40 and c["demands"][0] == 0 and set(c["demands"][1:]) <= set(range(1, 10))
    assert int(cvrp.generate(20, 1, 0).arrays[0]["capacity"]) == 30
    w = bpp.generate(5000, 1, seed=0).arrays[0]["items"]
    assert int(bpp.generate(10, 1, 0).arrays[0]["capacity"]) == 100 and 1 <= w.min() and w.max() <= 100
    assert 38 < w.mean() < 42  # Weibull(k=3) * 45 has mean 45 * Gamma(4/3) = 40.2
    u = bpp.generate(500, 1, seed=0, distribution="uniform").arrays[0]
    assert int(u["capacity"]) == 150 and u["items"].min() >= 20 and u["items"].max() <= 100


def test_bad_generator_inputs_name_the_field():
    with pytest.raises(ValueError, match="size"):
        load_problem("tsp_construct").generate(0, 4, 0)
    with pytest.raises(ValueError, match="count"):
        load_problem("tsp_construct").generate(10, 0, 0)
    with pytest.raises(ValueError, match="capacity"):
        load_problem("kp_construct").generate(37, 1, 0)
    with pytest.raises(ValueError, match="distribution"):
        load_problem("bpp_online").generate(10, 1, 0, distribution="normal")


def test_instance_npz_roundtrip_without_pickle_and_run_target(tmp_path, shared_data):
    tsp = load_problem("tsp_construct")
    mixed = load_tsplib(
        [shared_data / "tsplib" / "eil51.tsp", shared_data / "tsplib" / "rat99.tsp"], tsp.root / "tsplib_optima.json"
    )
    path = mixed.save(tmp_path / "mixed.npz")
    with np.load(path, allow_pickle=False) as raw:
        assert all(raw[k].dtype != object for k in raw.files)
    back = InstanceSet.load(path)
    assert back.names == ["eil51", "rat99"] and back.content_hash() == mixed.content_hash()
    assert back.known_reference.tolist() == [426.0, 1211.0] and back.known_reference_name == "TSPLIB optimum"
    out = run_target(seed_fn(tsp), {"problem": str(tsp.root), "instances_path": str(path)})
    assert out["names"] == ["eil51", "rat99"] and out["objectives"][0] == 511.0
    with pytest.raises(ValueError, match="instances_path"):
        run_target(seed_fn(tsp), {"problem": "tsp_construct"})
    with pytest.raises(ValueError, match="not 'bpp_online'"):
        load_problem("bpp_online").load_instances(path)
    bpp = load_bpp_json(shared_data / "bpp_online" / "or3.json", count=2)
    assert [len(a["items"]) for a in bpp] == [500, 500] and int(bpp.arrays[0]["capacity"]) == 150


def test_cvrplib_file_loads_through_vrplib(tmp_path):
    vrp = tmp_path / "tiny.vrp"
    vrp.write_text(
        "NAME : tiny\nTYPE : CVRP\nDIMENSION : 5\nEDGE_WEIGHT_TYPE : EUC_2D\nCAPACITY : 10\n"
        "NODE_COORD_SECTION\n1 0 0\n2 0 3\n3 4 0\n4 0 -3\n5 -4 0\n"
        "DEMAND_SECTION\n1 0\n2 6\n3 5\n4 4\n5 5\nDEPOT_SECTION\n1\n-1\nEOF\n"
    )
    cvrp = load_problem("cvrp_construct")
    inst = cvrp.load_instances(vrp)
    a = inst.arrays[0]
    assert inst.names == ["tiny"] and int(a["capacity"]) == 10 and a["demands"].tolist() == [0, 6, 5, 4, 5]
    assert a["distances"][0, 1] == pytest.approx(3.0) and a["distances"][1, 2] == pytest.approx(5.0)
    # capacity-aware NN (first on ties): 0-1(6)-3(4)-0 = 3+6+3, then 0-2(5)-4(5)-0 = 4+8+4: 28
    assert cvrp.run_heuristic(seed_fn(cvrp), inst)["objectives"] == [pytest.approx(28.0)]


def test_load_problem_unknown_and_custom_root(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="available.*tsp_construct"):
        load_problem("no_such_problem")
    folder = tmp_path / "heur" / "tsp_tiny"
    folder.mkdir(parents=True)
    real_tsp = load_problem("tsp_construct").root
    (folder / "problem.py").write_text(
        "from coevo.ahd import load_problem, register_problem\n"
        f"Base = type(load_problem({str(real_tsp)!r}))\n"
        "@register_problem\n"
        "class TinyTSP(Base):\n"
        "    name = 'tsp_tiny'\n"
        "    sizes = (5,)\n"
    )
    (folder / "seed_heuristic.py").write_text(load_problem("tsp_construct").seed_heuristic_code())
    monkeypatch.setenv("COEVO_HEURISTICS_DIR", str(tmp_path / "heur"))
    assert available_problems() == ["tsp_tiny"]
    tiny = load_problem("tsp_tiny")
    assert tiny.name == "tsp_tiny" and tiny.root == folder.resolve()
    assert len(tiny.run_heuristic(seed_fn(tiny), tiny.generate(5, 2, 0))["objectives"]) == 2
    (tmp_path / "heur" / "broken").mkdir()
    (tmp_path / "heur" / "broken" / "problem.py").write_text("X = 1\n")
    with pytest.raises(ValueError, match="does not register"):
        load_problem("broken")


TSP_HEAD = "NAME: t\nTYPE: TSP\nDIMENSION: {n}\nEDGE_WEIGHT_TYPE: {w}\nNODE_COORD_SECTION\n"


def _tsp_file(folder: Path, name: str, coords: list[str], n: int | None = None, wtype: str = "EUC_2D") -> Path:
    path = folder / name
    path.write_text(
        TSP_HEAD.format(n=len(coords) if n is None else n, w=wtype)
        + "".join(f"{i + 1} {c}\n" for i, c in enumerate(coords))
        + "EOF\n"
    )
    return path


def test_bad_instance_files_are_refused_naming_file_and_field(tmp_path):
    tsp, bpp = load_problem("tsp_construct"), load_problem("bpp_online")
    coords = np.random.default_rng(0).random((2, 5, 2))
    dist = np.stack([np.sqrt(((c[:, None] - c[None]) ** 2).sum(-1)) for c in coords])
    for label, value in (("neg", -1.0), ("nan", np.nan)):
        bad = dist.copy()
        bad[1, 0, 1] = value
        np.savez(tmp_path / f"{label}.npz", coords=coords, distances=bad)
        msg = "negative" if label == "neg" else "NaN"
        with pytest.raises(ValueError, match=rf"{label}\.npz: instance '{label}_1' field 'distances'.*{msg}"):
            tsp.load_instances(tmp_path / f"{label}.npz")
    (tmp_path / "text.npz").write_text("not an archive")
    with pytest.raises(ValueError, match=r"text\.npz: not a \.npz \(zip\) archive") as err:
        tsp.load_instances(tmp_path / "text.npz")
    assert "pickle" not in str(err.value)
    ok = ["0 0", "3 4", "6 8", "1 1"]
    cases = {
        "short.tsp": (_tsp_file(tmp_path, "short.tsp", ok, n=6), "NODE_COORD_SECTION has 4 nodes but DIMENSION is 6"),
        "badnum.tsp": (_tsp_file(tmp_path, "badnum.tsp", ok[:2] + ["6 abc"]), "NODE_COORD_SECTION.*abc"),
        "nancoord.tsp": (_tsp_file(tmp_path, "nancoord.tsp", ok[:2] + ["nan 8"]), "field 'coords'.*NaN"),
        "xray.tsp": (_tsp_file(tmp_path, "xray.tsp", ok, wtype="XRAY1"), "EDGE_WEIGHT_TYPE 'XRAY1' is not supported"),
    }
    garbage = tmp_path / "garbage.tsp"
    garbage.write_text("hello, this is not TSPLIB\n")
    cases["garbage.tsp"] = (garbage, "no TYPE field")
    for fname, (path, pattern) in cases.items():
        with pytest.raises(ValueError, match=rf"{fname}: .*{pattern}"):
            tsp.load_instances(path)
    for fname, text, pattern in (
        ("syntax.json", '{"capacity": 100, "instances": {"a": [1, 2,]}}', "invalid JSON at line 1"),
        ("floatcap.json", '{"capacity": 100.5, "instances": {"a": [1, 2]}}', "field 'capacity'.*100.5"),
        ("empty.json", '{"capacity": 100, "instances": {}}', "field 'instances' must be a non-empty"),
        ("floatitem.json", '{"capacity": 100, "instances": {"a": [1.5]}}', "field 'instances.a'"),
    ):
        (tmp_path / fname).write_text(text)
        with pytest.raises(ValueError, match=rf"{fname}: {pattern}"):
            bpp.load_instances(tmp_path / fname)
    missing = InstanceSet("tsp_construct", ["a"], [{"coords": coords[0]}], source="hand.npz")
    with pytest.raises(ValueError, match=r"hand\.npz: instance 'a' lacks field\(s\) \['distances'\]"):
        tsp.check_instances(missing)


def test_tsplib_non_euclidean_types_use_tsplib95_weights(tmp_path):
    import tsplib95

    geo = ["38.24 20.42", "39.57 26.15", "40.56 25.32", "36.26 23.12"]
    for wtype in ("GEO", "ATT", "CEIL_2D", "MAN_2D"):
        path = _tsp_file(tmp_path, f"{wtype}.tsp", geo, wtype=wtype)
        dist = load_tsplib(path).arrays[0]["distances"]
        prob = tsplib95.load(str(path))
        want = [[prob.get_weight(u, v) if u != v else 0 for v in range(1, 5)] for u in range(1, 5)]
        assert dist.tolist() == want
    euc = load_tsplib(_tsp_file(tmp_path, "euc.tsp", geo)).arrays[0]["distances"]
    assert euc[0, 1] != load_tsplib(tmp_path / "GEO.tsp").arrays[0]["distances"][0, 1]


def test_generators_refuse_counts_and_sizes_beyond_the_bounds():
    tsp = load_problem("tsp_construct")
    with pytest.raises(ValueError, match=r"count must be <= 100000, got 100000000"):
        tsp.generate(50, 100_000_000, 0)
    with pytest.raises(ValueError, match=r"size 100000 x count 1 .*limit"):
        tsp.generate(100_000, 1, 0)
    with pytest.raises(ValueError, match=r"size 10000000 x count 20"):
        load_problem("bpp_online").generate(10_000_000, 20, 0)


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    import argparse

    from coevo.ahd.cli import add_parser

    parser = argparse.ArgumentParser(prog="coevo")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    rc = args.func(args)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_cli_eval_refuses_bad_files_and_flags_before_running(tmp_path, capsys):
    from coevo.ahd.cli import json_safe

    tsp = load_problem("tsp_construct")
    good = tmp_path / "nn.py"
    good.write_text(tsp.seed_heuristic_code())
    binary = tmp_path / "bin.py"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    nul = tmp_path / "nul.py"
    nul.write_bytes(b"def select_next_node(a, b, c, d):\x00\n    return 0\n")
    coords = np.random.default_rng(0).random((1, 4, 2))
    nan_dist = np.full((1, 4, 4), np.nan)
    np.savez(tmp_path / "nan.npz", coords=coords, distances=nan_dist)
    for argv, pattern in (
        ([str(tmp_path)], "is a folder"),
        ([str(binary)], r"bin\.py is not UTF-8 text"),
        ([str(nul)], r"nul\.py contains NUL bytes"),
        (
            [str(good), "--instances", str(tmp_path / "nan.npz"), "--json"],
            r"nan\.npz: instance 'nan_0' field 'distances'",
        ),
        (
            [str(good), "--instances", str(tmp_path / "nan.npz"), "--seed", "3"],
            r"--size and --seed only apply to generated instances; with --instances give only --count",
        ),
        ([str(good), "--count", "100000000"], "count must be <= 100000"),
    ):
        rc, out, err = _cli(["heuristics", "eval", "tsp_construct", *argv], capsys)
        assert rc == 2 and out == ""
        assert re.search(pattern, err), err
    doc = json_safe({"gap_percent": float("nan"), "x": [1.0, float("inf")], "n": 3})
    assert json.loads(json.dumps(doc, allow_nan=False)) == {"gap_percent": None, "x": [1.0, None], "n": 3}


def test_templates_are_naive_valid_heuristics_shown_instead_of_the_seed():
    from coevo.ahd.prompts import build_messages
    from coevo.sandbox.extract import function_docstring, strip_docstrings

    for name in available_problems():
        p = load_problem(name)
        template, seed = p.template_code(), p.seed_heuristic_code()
        assert template != seed and p.function_name in template
        ns: dict = {}
        exec(compile(template, f"{name}/template.py", "exec"), ns)  # noqa: S102 - our own shipped file
        inst = p.generate(p.default_size, 2, seed=0)
        t_obj = np.mean(p.run_heuristic(ns[p.function_name], inst)["objectives"])
        exec(compile(seed, f"{name}/seed_heuristic.py", "exec"), ns)  # noqa: S102 - our own shipped file
        s_obj = np.mean(p.run_heuristic(ns[p.function_name], inst)["objectives"])
        assert (t_obj >= s_obj) if p.direction == "minimize" else (t_obj <= s_obj)  # the seed is the stronger one
        user = build_messages("i1", p.prompt_spec())[1]["content"]
        shown = strip_docstrings(template)  # the template's code without its docstring, which is told in prose
        assert shown in user and function_docstring(template, p.function_name).strip() in user
        assert seed.strip() not in user and strip_docstrings(seed) not in user


def test_every_shipped_heuristic_has_an_idea_for_the_prompts():
    """A parent's thought in a prompt says what the heuristic does (EoH keeps one per heuristic): the seed
    heuristics' from their docstrings, the published ones' from their ``Idea`` paragraph; code without either
    has none (the sampler then falls back to naming the heuristic)."""
    for name in available_problems():
        problem = load_problem(name)
        codes = [problem.seed_heuristic_code()] + [
            problem.published_heuristic_code(p) for p in problem.published_heuristics()
        ]
        for code in codes:
            idea = problem.heuristic_idea(code)
            assert idea and "\n" not in idea and len(idea.split()) >= 6, (name, idea)
            assert not idea.lower().startswith(("source", "eoh's", "funsearch's", "the seed paper")), (name, idea)
    tsp = load_problem("tsp_construct")
    assert tsp.heuristic_idea(tsp.published_heuristic_code("eoh_ael")).startswith("Score each unvisited node")
    assert tsp.heuristic_idea(tsp.seed_heuristic_code()).startswith("Nearest neighbour")
    assert tsp.heuristic_idea("def select_next_node(a, b, c, d):\n    return c[0]\n") is None
    assert tsp.heuristic_idea("def select_next_node(:") is None
