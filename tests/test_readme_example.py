"""The custom-evolver example of docs/extending.md (linked from the README) is real code: extract it, register it,
run it through the loop."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from coevo.config import parse_config
from coevo.evolvers.base import EVOLVERS
from coevo.loop import CoEvolutionLoop
from coevo.store import TrajectoryStore

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def _blocks():
    text = DOC.read_text()
    start = text.index("<!-- example: custom-evolver")
    py = re.search(r"```python\n(.*?)```", text[start:], re.DOTALL).group(1)
    yml = re.search(r"```yaml\n(.*?)```", text[start:], re.DOTALL).group(1)
    return py, yaml.safe_load(yml)


def test_docs_custom_evolver_runs_and_climbs(tmp_path):
    code, data = _blocks()
    EVOLVERS.remove("hill-climb")
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - the docs example is our own code
    assert EVOLVERS.get("hill-climb") is namespace["HillClimb"]
    cfg = parse_config(data)
    summary = CoEvolutionLoop(cfg, tmp_path / "climb", raw_config=data, progress=False).run()
    assert summary.samples == 60  # max_samples reached exactly (15 rounds x 4 candidates)
    with TrajectoryStore(tmp_path / "climb" / "store.sqlite") as store:
        best = store.top_k(1, run_id="climb")[0]
    assert best.reward > -0.05  # x got close to the target 3.0 from 0.0 (initial reward -9)
    assert "climber" in (tmp_path / "climb" / "report.md").read_text()
