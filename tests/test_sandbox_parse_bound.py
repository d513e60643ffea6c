"""Issue 27, item 4: candidate code parsed on the trusted side never raises there.

A 3000-deep expression of a few tokens makes ``ast.parse`` raise ``RecursionError`` (or ``MemoryError``)
in the process that parses it. Every trusted-side parse goes through
:func:`coevo.sandbox.extract.parse_bounded`; the candidate becomes an invalid sample (kind ``syntax``),
never a traceback. Before the change, each of these tests raised ``RecursionError``.
"""

from __future__ import annotations

import json

import pytest

from coevo.ahd import load_problem
from coevo.ahd.evaluate import evaluate_heuristic
from coevo.cli import main
from coevo.rollouts.countdown import check_countdown
from coevo.sandbox.extract import CandidateParseError, extract_code, parse_bounded, strip_docstrings
from coevo.sandbox.isolation import bwrap_status
from coevo.skills.library import parse_skill_call

#: ``-`` 3000 times: 3 lines, a few tokens, 3000 nested UnaryOp nodes
DEEP = "import numpy as np\n\ndef score(item, bins):\n    return " + "-" * 3000 + "bins.astype(np.float64)\n"
DEEP_FORMS = {
    "unary": "x = " + "-" * 3000 + "1",
    "not": "x = " + "not " * 3000 + "1",
    "sum": "x = " + "+".join(["1"] * 3000),
    "attribute": "x = a" + ".b" * 3000,
    "calls": "x = f" + "()" * 3000,
    "power": "x = " + "**".join(["2"] * 3000),
    "lambda": "x = " + "lambda: " * 3000 + "1",
    "brackets": "x = " + "(" * 3000 + "1" + ")" * 3000,
}

pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.mark.parametrize("form", sorted(DEEP_FORMS))
def test_parse_bounded_refuses_every_deep_form(form):
    with pytest.raises(CandidateParseError) as info:
        parse_bounded(DEEP_FORMS[form])
    assert "/" not in str(info.value)  # no host path in what is recorded


def test_function_name_resolver_and_docstring_stripper_survive_deep_code():
    bpp = load_problem("bpp_online")
    assert bpp.resolve_function_name(DEEP) == "score"
    assert strip_docstrings(DEEP) is None


def test_extracting_deep_code_from_an_answer_is_a_recorded_failure():
    out = extract_code(f"Here it is:\n```python\n{DEEP}```\n", "score")
    assert out.code is None and out.error in ("parse", "syntax")


def test_llm_text_parsed_by_other_components_is_bounded():
    assert check_countdown("-" * 3000 + "1", [1], 1) == (False, False)
    call = parse_skill_call("load_skill(" + "-" * 3000 + "'x')")
    assert call is not None and call.error


@pytest.mark.skipif(not bwrap_status()[0], reason="bubblewrap is not usable here")
def test_deep_candidate_is_an_invalid_sample_in_evaluation_and_cli(tmp_path, capsys):
    bpp = load_problem("bpp_online")
    inst = bpp.generate(50, 2, seed=3)
    res = evaluate_heuristic(bpp, DEEP, inst, with_reference=False)
    assert not res.valid and res.error_kind == "syntax"
    path = tmp_path / "deep.py"
    path.write_text(DEEP)
    rc = main(["heuristics", "eval", "bpp_online", str(path), "--size", "50", "--count", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 3 and out["valid"] is False and out["n_invalid"] == 2
    assert out["error_kind"] == "syntax"
