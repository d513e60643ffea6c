"""Browser set-up, MiniWoB++ task sets, WebArena-Lite configuration and the WebEnv wrapper.

Browser tests run real headless Chromium through BrowserGym/Playwright on MiniWoB++ pages (offline).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support import chromium_missing

from coevo.envs import browser
from coevo.envs.browser import (
    BrowserSetupError,
    build_playwright_shim,
    ensure_browser_env,
)
from coevo.envs.miniwob import (
    MINIWOB_TASKSETS,
    MiniWoBEnv,
    MiniWoBTaskSet,
    get_taskset,
    miniwob_task_names,
)
from coevo.envs.web import WebEnv
from coevo.envs.webarena_lite import (
    SITE_ENV_VARS,
    WebArenaConfigError,
    WebArenaLiteEnv,
    check_webarena_config,
    select_webarena_lite_tasks,
    webarena_lite_tasks,
)

REPO = Path(__file__).resolve().parents[1]


CHROMIUM_MISSING = chromium_missing()


@pytest.fixture()
def fake_exe(tmp_path: Path) -> Path:
    """An executable file standing in for the Chromium binary in tests of the shim's file layout only."""
    exe = tmp_path / "bin" / "chromium"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def _unset(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Unset variables so that monkeypatch restores them afterwards even when they were absent
    (``delenv(raising=False)`` on an absent name records nothing, so values set by the code under test leak)."""
    for name in names:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def _expected_chrome(root: Path) -> Path:
    entry = next(b for b in browser.playwright_browsers_json() if b["name"] == "chromium")
    return root / f"chromium-{entry['revision']}" / "chrome-linux" / "chrome"


# -- browser set-up ------------------------------------------------------------------------------------
def test_shim_links_the_chromium_playwright_expects_and_is_idempotent(tmp_path, fake_exe):
    root = build_playwright_shim(tmp_path / "pw", fake_exe)
    chrome = _expected_chrome(root)
    assert chrome.is_symlink() and chrome.resolve() == fake_exe.resolve()
    # a stale link (e.g. an older Chromium) is replaced, a second run changes nothing
    chrome.unlink()
    chrome.symlink_to(sys.executable)
    build_playwright_shim(root, fake_exe)
    build_playwright_shim(root, fake_exe)
    assert chrome.resolve() == fake_exe.resolve()
    assert not [p for p in chrome.parent.iterdir() if p.name.endswith(".tmp")]


def test_missing_chromium_error_says_how_to_fix(monkeypatch, tmp_path):
    monkeypatch.delenv("COEVO_CHROMIUM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BrowserSetupError, match="setup_browser.sh"):
        browser.find_chromium()
    _unset(monkeypatch, "PLAYWRIGHT_BROWSERS_PATH")
    with pytest.raises(BrowserSetupError, match="no Chromium found"):
        ensure_browser_env(tmp_path / "pw")
    monkeypatch.setenv("COEVO_CHROMIUM", str(tmp_path / "nope"))
    with pytest.raises(BrowserSetupError, match="COEVO_CHROMIUM"):
        browser.find_chromium()


def _coevo_run(tmp_path: Path, args: list[str], hide: tuple[str, ...] = (), path: str | None = None):
    """``coevo run ARGS`` in a child interpreter where the modules ``hide`` are absent (``sys.modules[name] =
    None``: what Python reports for a package that is not installed) and PATH is ``path`` (default unchanged)."""
    code = (
        "import sys\n"
        f"for name in {list(hide)!r}:\n    sys.modules[name] = None\n"
        "from coevo.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PLAYWRIGHT_BROWSERS_PATH", None)
    env.pop("COEVO_CHROMIUM", None)
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, "-c", code, "run", *args], capture_output=True, text=True, env=env, timeout=240, check=False
    )


@pytest.mark.parametrize(
    ("hide", "no_chromium", "expected"),
    [
        ((), True, "no Chromium found on PATH .*; fix: sudo scripts/setup_browser.sh"),
        (("playwright",), False, r"the `playwright` package is not installed; fix: .*pip install -e '\.\[web\]'"),
        (
            ("browsergym.miniwob", "miniwob"),
            False,
            r"needs the Python package\(s\) browsergym.miniwob, miniwob, .*; fix: .*pip install -e '\.\[web\]'",
        ),
    ],
)
def test_web_run_without_browser_pieces_is_one_line_before_the_model_loads(tmp_path, hide, no_chromium, expected):
    """The main-job install has neither the web extra nor Chromium: ``coevo run --check`` and ``coevo run`` of a
    web config say so in one line naming the fix, exit 2, and no run folder is made (nothing was loaded)."""
    config = str(REPO / "configs" / "web" / "miniwob_skills_only.yaml")
    path = str(tmp_path) if no_chromium else None  # an empty PATH folder: no chromium on it
    runs = [["--check", config]] + ([[config, "--out", str(tmp_path / "run")]] if not hide else [])
    for args in runs:  # the run itself once: it checks with the same code as --check
        proc = _coevo_run(tmp_path, args, hide, path)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert re.search(expected, lines[0]), lines[0]
        assert "run folder:" not in proc.stdout and not (tmp_path / "run").exists()


def test_ensure_browser_env_sets_only_missing_variables(monkeypatch, tmp_path, fake_exe):
    monkeypatch.setenv("COEVO_CHROMIUM", str(fake_exe))
    _unset(monkeypatch, "PLAYWRIGHT_BROWSERS_PATH", "MINIWOB_URL")
    info = ensure_browser_env(tmp_path / "pw")
    assert os.environ["PLAYWRIGHT_BROWSERS_PATH"] == info.playwright_browsers_path == str(tmp_path / "pw")
    assert _expected_chrome(tmp_path / "pw").resolve() == fake_exe.resolve()
    url = os.environ["MINIWOB_URL"]
    assert url.startswith("file://") and url.endswith("/miniwob/")
    assert (Path(url[len("file://") :]) / "click-button.html").is_file()
    # values the user set are kept
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", "/somewhere/else")
    monkeypatch.setenv("MINIWOB_URL", "http://localhost:8000/miniwob/")
    info = ensure_browser_env(tmp_path / "other")
    assert (info.playwright_browsers_path, info.miniwob_url) == ("/somewhere/else", "http://localhost:8000/miniwob/")
    assert info.chromium is None and not (tmp_path / "other").exists()


def test_setup_script_builds_shim_and_prints_exports(tmp_path, fake_exe):
    env = {
        **os.environ,
        "COEVO_CACHE": str(tmp_path / "cache"),
        "COEVO_CHROMIUM": str(fake_exe),
        "PYTHON": sys.executable,
    }
    for _ in range(2):  # idempotent
        out = subprocess.run(
            [str(REPO / "scripts" / "setup_browser.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    root = tmp_path / "cache" / "ms-playwright"
    assert f"export PLAYWRIGHT_BROWSERS_PATH={root}" in out
    assert "export MINIWOB_URL=file://" in out
    assert _expected_chrome(root).resolve() == fake_exe.resolve()


def test_setup_script_checks_the_python_packages_before_apt(tmp_path):
    """After the main-job install (no web extra) the script stops at once naming the pip command, before it
    would install Chromium with apt-get. ``sitecustomize`` makes playwright absent in the script's Python."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['playwright'] = None\n")
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}
    env.pop("COEVO_CHROMIUM", None)
    proc = subprocess.run(
        [str(REPO / "scripts" / "setup_browser.sh")], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert "error: the `playwright` package is not installed; fix: " in proc.stderr and "pip install" in proc.stderr
    assert "apt-get" not in proc.stderr and "installing chromium" not in proc.stderr


# -- MiniWoB++ task sets ---------------------------------------------------------------------------------
def test_tasksets_are_registered_tasks_with_disjoint_seeds():
    known = set(miniwob_task_names())
    ts = get_taskset("miniwob10")
    assert len(ts.tasks) == 10 and len(set(ts.tasks)) == 10
    for taskset in MINIWOB_TASKSETS.values():
        assert set(taskset.tasks) <= known, taskset.name
        assert not set(taskset.train_seeds) & set(taskset.heldout_seeds)
    assert ts.episodes("heldout")[:2] == [("click-button", 10_000), ("click-button", 10_001)]
    assert len(ts.episodes("train")) == 10 * len(ts.train_seeds)
    with pytest.raises(ValueError, match="split"):
        ts.seeds("test")
    with pytest.raises(KeyError, match="miniwob10"):
        get_taskset("miniwob11")
    with pytest.raises(ValueError, match="share"):
        MiniWoBTaskSet("bad", ("click-test",), (1, 2), (2, 3))


def test_bad_task_and_arguments_are_named():
    env = MiniWoBEnv(setup_browser=False)
    with pytest.raises(ValueError, match="click-buton"):
        env.reset("click-buton", 0)
    with pytest.raises(ValueError, match="seed"):
        env.reset("click-button", -1)
    with pytest.raises(ValueError, match="timeout_ms"):
        WebEnv("miniwob", timeout_ms=0)
    with pytest.raises(RuntimeError, match="before reset"):
        env.step("noop()")


# -- WebArena-Lite configuration ------------------------------------------------------------------------
def test_webarena_lite_task_selection():
    tasks = webarena_lite_tasks()
    assert len(tasks) == 165
    assert len(select_webarena_lite_tasks(sites=["shopping"])) == 45
    assert len(select_webarena_lite_tasks(sites=["map", "wikipedia"])) == 26 + 4
    assert [t.task_id for t in select_webarena_lite_tasks(task_ids=[7, 4])] == [7, 4]
    with pytest.raises(ValueError, match=r"123456"):
        select_webarena_lite_tasks(task_ids=[4, 123456])
    with pytest.raises(ValueError, match="shoping"):
        select_webarena_lite_tasks(sites=["shoping"])


def test_webarena_missing_site_variable_is_named_before_anything_launches(monkeypatch):
    gitlab_reddit = [t for t in webarena_lite_tasks() if set(t.sites) == {"gitlab", "reddit"}]
    with pytest.raises(WebArenaConfigError) as err:
        check_webarena_config(gitlab_reddit, {"WA_GITLAB": "http://localhost:8023"})
    assert "WA_REDDIT" in str(err.value) and "WA_GITLAB" not in str(err.value)
    assert check_webarena_config(gitlab_reddit, {"WA_GITLAB": "http://g", "WA_REDDIT": "http://r"}) == {
        "WA_GITLAB": "http://g",
        "WA_REDDIT": "http://r",
    }
    with pytest.raises(WebArenaConfigError, match="WA_HOMEPAGE"):
        check_webarena_config(gitlab_reddit, {"WA_GITLAB": "g", "WA_REDDIT": "r"}, homepage=True)

    _unset(monkeypatch, *SITE_ENV_VARS.values())
    monkeypatch.setenv("WA_SHOPPING", "  ")  # blank counts as missing
    with pytest.raises(WebArenaConfigError, match="WA_SHOPPING") as err:
        WebArenaLiteEnv(sites=["shopping"])
    assert "needed by tasks" in str(err.value)
    assert "browsergym.webarenalite" not in sys.modules  # nothing imported, nothing launched

    monkeypatch.setenv("WA_SHOPPING", "http://localhost:7770")
    env = WebArenaLiteEnv(sites=["shopping"], setup_browser=False)
    assert env.site_urls == {"WA_SHOPPING": "http://localhost:7770"}
    with pytest.raises(ValueError, match="not in this WebArena-Lite subset"):
        env.reset("27", 0)  # a reddit task


# -- the wrapper on a real browser -----------------------------------------------------------------------
@pytest.mark.heavy  # over 10 s on 2 cores: CI's second command (docs/guide.md, Tests)
@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM_MISSING is not None, reason=CHROMIUM_MISSING or "")
def test_webenv_reset_and_step_in_headless_chromium(tmp_path_factory):
    if not os.environ.get("PLAYWRIGHT_BROWSERS_PATH"):
        ensure_browser_env(tmp_path_factory.mktemp("pw"))
    with MiniWoBEnv() as env:
        obs = env.reset("click-button", 0)
        assert set(obs) >= {"task_id", "goal", "axtree", "url", "last_action_error"}
        assert obs["task_id"] == "click-button:0" and obs["url"].endswith("click-button.html")
        assert obs["goal"].startswith("Click on the") and "button" in obs["axtree"]
        obs, reward, done, _ = env.step("click('99999')")  # no such element
        assert obs["last_action_error"] and reward == 0.0 and not done
        # clicking a wrong button ends the episode with reward 0
        label = obs["goal"].split('"')[1]
        wrong = next(line for line in obs["axtree"].splitlines() if "] button '" in line and f"'{label}'" not in line)
        bid = wrong.split("[", 1)[1].split("]", 1)[0]
        obs, reward, done, _ = env.step(f"click('{bid}')")
        assert (reward, done, obs["last_action_error"]) == (0.0, True, "")
    assert env._env is None  # the context manager closed the browser
    env.close()  # idempotent
