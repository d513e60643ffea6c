"""AHD evaluation through the real sandbox (subprocess worker) and the ``coevo heuristics`` CLI."""

from __future__ import annotations

import json

import pytest

from coevo.ahd import load_eoh_tsp_npz, load_problem
from coevo.ahd.cli import add_parser
from coevo.ahd.evaluate import evaluate_heuristic, evaluate_many
from coevo.sandbox.runner import Sandbox, SandboxLimits

VISITS_DEPOT = (
    "def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):\n"
    "    return destination_node\n"
)


pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxLimits(timeout_s=60))


def test_evaluate_seed_and_invalid_heuristics_in_sandbox(shared_data, sandbox):
    tsp = load_problem("tsp_construct")
    inst = load_eoh_tsp_npz(shared_data / "tsp" / "eoh_test_20.npz", count=8)
    good = evaluate_heuristic(tsp, tsp.seed_heuristic_code(), inst, sandbox=sandbox)
    assert good.valid, good.error
    assert good.score == pytest.approx(-good.objective) and 4.0 < good.objective < 5.0
    assert "LKH" in good.metrics["reference"] and good.metrics["gap_percent"] > 0
    assert good.metrics["n_invalid"] == 0 and len(good.metrics["objectives"]) == 8
    bad, syntax, missing = evaluate_many(
        tsp, [VISITS_DEPOT, "def select_next_node(:\n", "def other():\n    return 0\n"], inst, sandbox=sandbox
    )
    assert (bad.valid, bad.error_kind, bad.score) == (False, "infeasible", None)
    assert "already visited" in bad.error and bad.metrics["reference"]
    assert syntax.error_kind == "syntax" and missing.error_kind == "parse"


def test_bpp_priority_alias_and_nan_priority_in_sandbox(shared_data, sandbox):
    bpp = load_problem("bpp_online")
    path = shared_data / "bpp_online" / "or3.json"
    alias = "import numpy as np\ndef priority(item, bins):\n    return -(bins - item).astype(float)\n"
    res = evaluate_heuristic(bpp, alias, bpp.load_instances(path).subset(3), sandbox=sandbox)
    assert res.valid and res.metrics["reference"].startswith("L1")
    nan = "import numpy as np\ndef score(item, bins):\n    return np.full(len(bins), np.nan)\n"
    res = evaluate_heuristic(bpp, nan, path, sandbox=sandbox, with_reference=False)
    assert res.error_kind == "return_type" and "NaN" in res.error


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    import argparse

    parser = argparse.ArgumentParser(prog="coevo")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code = args.func(args)
    return code, capsys.readouterr().out


def test_cli_eval_json_and_text(tmp_path, capsys, shared_data):
    tsp = load_problem("tsp_construct")
    seed = tmp_path / "nn.py"
    seed.write_text(tsp.seed_heuristic_code())
    rc, out = run_cli(
        [
            "heuristics",
            "eval",
            "tsp_construct",
            str(seed),
            "--instances",
            str(shared_data / "tsp" / "eoh_test_20.npz"),
            "--count",
            "64",
            "--json",
            "--no-reference",
        ],
        capsys,
    )
    doc = json.loads(out)
    assert rc == 0 and doc["mean_objective"] == pytest.approx(4.4900, abs=5e-5)
    assert {"mean_objective", "gap_percent", "reference", "n_instances", "n_invalid", "invalid_reasons"} <= set(doc)
    assert (doc["n_instances"], doc["n_invalid"], doc["invalid_reasons"]) == (64, 0, {})

    half_bad = tmp_path / "half.py"  # valid on instances whose node 1 is nearer than node 2, else revisits
    half_bad.write_text(
        "import numpy as np\n"
        "def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):\n"
        "    if len(unvisited_nodes) == len(distance_matrix) - 1 and "
        "distance_matrix[0, 1] > distance_matrix[0, 2]:\n"
        "        return 0\n"
        "    return int(unvisited_nodes[np.argmin(distance_matrix[current_node, unvisited_nodes])])\n"
    )
    rc, out = run_cli(
        ["heuristics", "eval", "tsp_construct", str(half_bad), "--size", "12", "--count", "10", "--seed", "1"], capsys
    )
    assert rc == 3 and "gap:" in out and "LKH" in out and "verdict: invalid heuristic (exit status 3)" in out
    n_bad = int(out.split("invalid: ")[1].split(" of ")[0])
    assert 0 < n_bad < 10 and "infeasible: InfeasibleSolution" in out

    rc, out = run_cli(["heuristics", "eval", "tsp_construct", str(seed), "--size", "0"], capsys)
    assert rc == 2
