"""``coevo runs serve``: the read-only dashboard over a run's store.

Two real runs are made once per module with the real CLI on tiny random Qwen2 models (``tiny:micro``):
the ES config ``configs/es/tiny.yaml`` cut to 3 generations, and EoH + ES on TSP
(``configs/ahd/eoh_es/tsp_construct.yaml`` at test size; the tiny model's outputs are garbage, so every
sampled heuristic is an invalid sample and the problem's seed heuristic is the only valid one). The
dashboard is started as a real ``coevo runs serve`` process and read in real headless Chromium
(Playwright with the system Chromium, as in ``coevo.envs.browser``); expected values come from the store,
read independently with :class:`~coevo.store.TrajectoryStore`. The live test serves a run while another
process writes trajectories and skill versions into it (with a zero busy timeout, so a reader that blocked
the writer would fail the write) and watches the new rows appear without a reload.
"""

from __future__ import annotations

import os
import select
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support import chromium_missing, run_cli

from coevo.dashboard.reader import DashboardError, heuristic_id, is_heuristic, open_run
from coevo.store import SCHEMA_VERSION, TrajectoryStore

pytestmark = [
    pytest.mark.heavy,
    pytest.mark.slow,
]  # two real tiny-model runs per module and Chromium (~140 s on 2 cores)

ROOT = Path(__file__).resolve().parents[1]
AHD_SETS = [
    "model.name=tiny:micro",
    "model.dtype=float32",
    "sampling.max_new_tokens=4",
    "report.plots=false",
    "budget.max_wall_s=null",
    "budget.max_samples=28",
    "evolvers.eoh.train_size=8",
    "evolvers.eoh.train_count=2",
    "evolvers.eoh.test_sizes=[8,10]",
    "evolvers.eoh.test_count=2",
    "evolvers.eoh.eval_timeout_s=10",
    "evolvers.eoh.eval_memory_mb=1024",
    "evolvers.eoh.include_seed_heuristic=true",
    "evolvers.es.population_size=4",
]
ES_SETS = ["evolvers.es.total_generations=3", "report.plots=false"]


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "COEVO_CACHE": str(cache), "PYTHONPATH": str(ROOT)}


def _sets(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def coevo(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return run_cli(*args, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """{"es": run folder, "ahd": run folder, "cache": COEVO_CACHE}, made by two real `coevo run` processes."""
    base = tmp_path_factory.mktemp("dash_runs")
    env = _env(base / "cache")
    first = coevo(
        "run", str(ROOT / "configs/es/tiny.yaml"), "--out", str(base / "es"), "--no-progress", *_sets(ES_SETS), env=env
    )
    assert first.returncode == 0, first.stderr[-3000:]
    second = coevo(
        "run",
        str(ROOT / "configs/ahd/eoh_es/tsp_construct.yaml"),
        "--out",
        str(base / "ahd"),
        "--no-progress",
        *_sets(AHD_SETS),
        env=env,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    return {"es": base / "es", "ahd": base / "ahd", "cache": base / "cache"}


# ------------------------------------------------------------------------------------------ bad input
def _serve_fails(run_dir: Path, env: dict[str, str]) -> str:
    proc = coevo("runs", "serve", str(run_dir), "--port", "0", env=env, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr and len(err.splitlines()) == 1, proc.stderr
    assert err.startswith("coevo runs serve: ")
    return err


def test_bad_input_is_one_message_and_exit_2(tmp_path, runs):
    env = _env(runs["cache"])
    assert "missing does not exist; give a run folder" in _serve_fails(tmp_path / "missing", env)
    assert "is not a run folder (no store.sqlite in it)" in _serve_fails(tmp_path, env)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "store.sqlite").write_bytes(b"this is not a database at all, just text" * 40)
    assert "cannot be read as an SQLite database" in _serve_fails(tmp_path / "junk", env)
    (tmp_path / "other").mkdir()
    sqlite3.connect(tmp_path / "other" / "store.sqlite").execute("CREATE TABLE t (x)").connection.close()
    assert "not a coevo trajectory store" in _serve_fails(tmp_path / "other", env)

    newer = tmp_path / "newer"
    shutil.copytree(runs["es"], newer)
    with sqlite3.connect(newer / "store.sqlite") as conn:
        conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, 0)", (SCHEMA_VERSION + 1,))
    expected = f"schema version {SCHEMA_VERSION + 1}, newer than this coevo's ({SCHEMA_VERSION}); upgrade coevo"
    assert expected in _serve_fails(newer, env)

    busy = tmp_path / "busy"
    shutil.copytree(runs["es"], busy)
    holder = sqlite3.connect(busy / "store.sqlite", isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")  # a writer that keeps every reader out
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("INSERT INTO schema_version (version, applied_at) VALUES (1, 0)")
    try:
        assert "is busy: another process holds an exclusive lock" in _serve_fails(busy, env)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with pytest.raises(DashboardError, match="newer than this coevo"):
        open_run(newer)


def test_serve_never_writes_the_store(runs, tmp_path):
    copy = tmp_path / "ro"
    shutil.copytree(runs["es"], copy)
    before = (copy / "store.sqlite").read_bytes()
    reader = open_run(copy)
    try:
        reader.overview(), reader.heuristics(), reader.trajectory_rows(), reader.skill_versions()
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader.store.conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (9, 0)")
    finally:
        reader.close()
    assert (copy / "store.sqlite").read_bytes() == before


# ------------------------------------------------------------------------------------- reader rows
def test_reader_rows_match_the_store(runs):
    with TrajectoryStore(runs["ahd"] / "store.sqlite", readonly=True) as store:
        trajs = store.query(run_id="ahd", with_steps=False)
        hist = store.es_history("ahd", "es")
    reader = open_run(runs["ahd"])
    try:
        o = reader.overview()
        assert o["trajectories"] == len(trajs) and o["samples"] == sum(t.llm_calls for t in trajs) == 28
        assert o["max_samples"] == 28 and o["stop_reason"].startswith("sample budget reached")
        rows = reader.heuristics()
        assert [r["id"] for r in rows] == ["seed"] + [heuristic_id(t) for t in trajs if is_heuristic(t)]
        assert rows[0]["valid"] and "def select_next_node" in rows[0]["code"]
        assert all(not r["valid"] and r["failure"] for r in rows[1:])
        gens = reader.es_generations("es")
        assert [g["generation"] for g in gens] == [h["generation"] for h in hist]
        assert [g["sigma"] for g in gens] == [h["sigma"] for h in hist]
        assert [g["coeffs"] for g in gens] == [h["coeffs"] for h in hist]
        only, n = reader.trajectory_rows(member="1")
        assert n == sum(1 for t in trajs if t.member is not None and t.member.index == 1) == len(only) > 0
        rows_none, n = reader.trajectory_rows(member="none", valid=False)
        assert len(rows_none) == n == sum(1 for t in trajs if t.member is None and not t.valid)
        assert "seed objective" in reader.report_sections()["eoh"]
    finally:
        reader.close()


# ------------------------------------------------------------------------------------------- browser
class Served:
    """A `coevo runs serve` process on a free port; ``url`` once it listens."""

    def __init__(self, run_dir: Path, env: dict[str, str], refresh: float = 0.5) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "coevo.cli",
                "runs",
                "serve",
                str(run_dir),
                "--port",
                "0",
                "--refresh",
                str(refresh),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        deadline = time.time() + 120
        line = ""
        while time.time() < deadline and self.proc.poll() is None:
            ready, _, _ = select.select([self.proc.stdout], [], [], 1.0)
            if ready:
                line = self.proc.stdout.readline()
                break
        assert line.startswith("serving http://127.0.0.1:"), (
            line,
            self.proc.poll(),
            self.proc.stderr.read() if self.proc.poll() is not None else "",
        )
        self.url = line.split()[1]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def browser():
    missing = chromium_missing(playwright=True)
    if missing:
        pytest.skip(missing)
    pytest.importorskip("dash", reason="the dashboard needs the dash extra (pip install 'coevo[dash]')")
    from playwright.sync_api import sync_playwright

    from coevo.envs.browser import build_playwright_shim

    if not os.environ.get("PLAYWRIGHT_BROWSERS_PATH"):
        os.environ["PLAYWRIGHT_BROWSERS_PATH"] = str(build_playwright_shim())
    with sync_playwright() as p:
        b = p.chromium.launch(headless=True)
        yield b
        b.close()


def _page(browser, base_url: str):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(60_000)
    page.outside = []  # requests to anything but the dashboard's own server
    page.errors = []
    page.on("request", lambda r: r.url.startswith(base_url) or r.url.startswith("data:") or page.outside.append(r.url))
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    return page


def _rows(page, table_id: str) -> list[str]:
    return page.eval_on_selector_all(f"#{table_id} tbody tr", "rs => rs.map(r => r.getAttribute('data-id'))")


@pytest.mark.browser
def test_pages_of_an_ahd_run_in_chromium(runs, browser, tmp_path):
    with TrajectoryStore(runs["ahd"] / "store.sqlite", readonly=True) as store:
        trajs = store.query(run_id="ahd")
        hist = store.es_history("ahd", "es")
    served = Served(runs["ahd"], _env(runs["cache"]))
    page = _page(browser, served.url)
    try:
        page.goto(served.url)
        page.wait_for_selector("#ov-trajectories")
        assert page.inner_text("#ov-trajectories") == str(len(trajs))
        assert page.inner_text("#ov-samples") == "28 / 28"
        assert page.inner_text("#ov-stop").startswith("sample budget reached")
        assert page.locator("#ov-evolvers tbody tr").count() == 2
        page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)

        # heuristic design: the lineage lists every stored heuristic (and the seed they derive from)
        page.click("#nav-heuristic")
        page.wait_for_selector("#lineage-table")
        expected = ["seed"] + [heuristic_id(t) for t in trajs if is_heuristic(t)]
        assert _rows(page, "lineage-table") == expected and len(expected) == 29
        assert page.locator("#lineage-graph .scatterlayer .point").count() == len(expected)
        page.click("#lineage-table tr[data-id='seed'] a")
        page.wait_for_selector("#h-code")
        assert "def select_next_node" in page.inner_text("#h-code")
        child = expected[5]
        page.click(f"#lineage-table tr[data-id='{child}'] a")
        page.wait_for_function(
            f"document.querySelector('h3 code') && document.querySelector('h3 code').innerText == '{child}'"
        )
        detail = page.inner_text("#heur-detail")  # a thought without code: no_code (parse before issue 43)
        assert "invalid (no_code)" in detail or "invalid (parse)" in detail, detail
        # a click on a marker of the lineage graph opens that heuristic (invalid trace: every row but the seed)
        box = page.locator("#lineage-graph .scatterlayer .trace").nth(2).locator(".point").nth(3).bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_function(f"document.querySelector('h3 code')?.innerText == '{expected[4]}'")
        assert "seed objective" in page.inner_text("#h-heldout")
        page.screenshot(path=str(tmp_path / "heuristics.png"), full_page=True)

        # ES: one row per generation, sigma and hashes as stored
        page.click("#nav-es")
        page.wait_for_selector("#es-table")
        cells = page.eval_on_selector_all("#es-table tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.innerText))")
        assert [int(c[0]) for c in cells] == [h["generation"] for h in hist]
        assert [c[9] for c in cells] == [h["weight_hash_after"][:16] for h in hist]
        assert [c[8] for c in cells] == ["skipped" if h["skipped"] else "applied" for h in hist]

        # trajectories: filters, then one trajectory's steps
        page.click("#nav-trajectories")
        page.wait_for_selector("#traj-table")
        assert page.inner_text("#t-count").startswith(f"{len(trajs)} trajectories match")
        page.click("#f-member")
        page.get_by_text("member #2", exact=True).click()
        want = [str(t.id) for t in reversed(trajs) if t.member is not None and t.member.index == 2]
        page.wait_for_function(f"document.querySelector('#t-count').innerText.startsWith('{len(want)} trajectories')")
        assert _rows(page, "traj-table") == want
        t = trajs[3]
        page.goto(f"{served.url}trajectory/{t.id}")
        page.wait_for_selector("#t-steps .step")
        assert page.locator("#t-steps .step").count() == len(t.steps) == 1
        assert page.inner_text("#t-steps .step-observation").strip() == t.steps[0].observation.strip()
        assert page.inner_text("#t-steps .step-model-output").strip() == t.steps[0].model_output.strip()
        assert t.key in page.inner_text("#t-fields")
        page.screenshot(path=str(tmp_path / "trajectory.png"), full_page=True)
        assert (tmp_path / "trajectory.png").stat().st_size > 10_000
        assert page.outside == [] and page.errors == []
    finally:
        page.close()
        served.stop()


WRITER = textwrap.dedent("""
    import shutil, sys
    from pathlib import Path
    from coevo.skills.versions import write_skill_version
    from coevo.store import TrajectoryStore
    from coevo.types import Step, Trajectory
    db, run_id, skill_src, work = sys.argv[1:5]
    store = TrajectoryStore(db, busy_timeout_s=0)  # never waits for a lock: a blocking reader would fail it
    skill = Path(work) / "web-navigation"
    shutil.copytree(skill_src, skill)
    n, version = 0, None
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, arg = line.split()
        if cmd == "traj":
            ids = []
            for _ in range(int(arg)):
                n += 1
                t = Trajectory(key=f"{run_id}/live/{n}", run_id=run_id, evolver="live", space="context",
                               steps=[Step(observation=f"live obs {n}", action="click(1)", reward=1.0)], reward=1.0,
                               llm_calls=1)
                ids.append(store.add_trajectory(t)[0].id)
            print("ok", *ids, flush=True)
        elif cmd == "skill":
            md = skill / "SKILL.md"
            md.write_text(md.read_text() + f"\\n## Lesson {arg}\\nCheck the page after every click.\\n")
            ids = [r[0] for r in store.conn.execute("SELECT id FROM trajectories WHERE evolver = 'live'")]
            art = write_skill_version(store, run_id, skill, {"evolver": "live", "round": 0, "changelog": f"lesson {arg}"},
                                      trajectory_ids=ids, parent_version=version)
            version = art.version
            print("ok", version, flush=True)
    store.close()
""")


@pytest.mark.browser
def test_live_refresh_while_another_process_writes(runs, browser, tmp_path):
    run = tmp_path / "es"
    shutil.copytree(runs["es"], run)
    with TrajectoryStore(run / "store.sqlite", readonly=True) as store:
        n0 = store.count(run_id="es")
    env = _env(runs["cache"])
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            WRITER,
            str(run / "store.sqlite"),
            "es",
            str(ROOT / "skills" / "web-navigation"),
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert writer.stdout.readline().strip() == "ready", writer.stderr.read()

    def tell(cmd: str) -> list[str]:
        writer.stdin.write(cmd + "\n")
        writer.stdin.flush()
        out = writer.stdout.readline().split()
        assert out and out[0] == "ok", writer.stderr.read()
        return out[1:]

    served = Served(run, env, refresh=0.5)
    page = _page(browser, served.url)
    try:
        page.goto(served.url + "trajectories")
        page.wait_for_function(f"document.querySelector('#t-count')?.innerText.startsWith('{n0} trajectories')")
        for round_ in range(3):  # each batch shows up without a reload, while the dashboard keeps polling
            new_ids = tell("traj 2")
            total = n0 + 2 * (round_ + 1)
            page.wait_for_function(
                f"document.querySelector('#t-count').innerText.startsWith('{total} trajectories')", timeout=30_000
            )
            assert _rows(page, "traj-table")[:2] == new_ids[::-1]
        page.click("#nav-skills")
        page.wait_for_selector("#s-none")
        tell("skill 1")
        tell("skill 2")
        page.wait_for_function("document.querySelector('#s-count')?.innerText == '2 skill versions'", timeout=30_000)
        v2 = page.locator(".skill-version[data-version='2']")
        assert "web-navigation v2 (from v1)" in v2.inner_text()
        assert "+## Lesson 2" in v2.locator(".diff .add").all_inner_texts()
        assert v2.locator("table a").count() == 6  # the six live trajectories that caused it, as links
        v2.locator("table a").first.click()
        page.wait_for_selector("#t-steps .step")
        assert page.inner_text("#t-steps .step-observation").startswith("live obs")
        page.goto(served.url)
        page.wait_for_selector("#ov-trajectories")
        assert page.inner_text("#ov-trajectories") == str(n0 + 6)
        page.goto(served.url + "skills")
        page.wait_for_selector("#s-count")
        page.screenshot(path=str(tmp_path / "skills.png"), full_page=True)
        assert page.outside == [] and page.errors == []
    finally:
        page.close()
        served.stop()
        writer.stdin.close()
        writer.wait(timeout=30)
    assert writer.returncode == 0, writer.stderr.read()


@pytest.mark.browser
def test_es_run_pages(runs, browser):
    with TrajectoryStore(runs["es"] / "store.sqlite", readonly=True) as store:
        hist = store.es_history("es", "es")
        held = [t for t in store.query(run_id="es", with_steps=False) if t.member is None]
    served = Served(runs["es"], _env(runs["cache"]))
    page = _page(browser, served.url)
    try:
        page.goto(served.url + "es")
        page.wait_for_selector("#es-table")
        cells = page.eval_on_selector_all("#es-table tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.innerText))")
        assert len(hist) == 3 and [int(c[0]) for c in cells] == [0, 1, 2, 3]  # + the centre after the last update
        assert [float(c[1]) for c in cells[:3]] == pytest.approx([h["sigma"] for h in hist], rel=1e-3)
        assert {t.generation for t in held} == {0, 3}
        assert float(cells[3][10]) == pytest.approx(held[-1].reward, rel=1e-3)
        page.wait_for_selector("#es-graph .main-svg")  # plotly.js, served by the dashboard itself, drew it
        page.goto(served.url + "heuristics")
        page.wait_for_selector("#h-none")
        assert page.outside == [] and page.errors == []
    finally:
        page.close()
        served.stop()
