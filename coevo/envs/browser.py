"""Make BrowserGym's Playwright use the system Chromium, and point MiniWoB++ at its bundled HTML.

Playwright (the browser driver under BrowserGym) only launches its own pinned browser build, found at
``$PLAYWRIGHT_BROWSERS_PATH/<dir>/<layout>/<exe>`` where ``<dir>`` is ``<name with _ for ->-<revision>`` from
the ``browsers.json`` shipped inside the installed ``playwright`` package (for playwright 1.44:
``chromium-1117/chrome-linux/chrome``; newer releases add ``chromium_headless_shell-<rev>``). On machines
without access to Playwright's CDN we build that folder as a *shim*: the expected executable paths are
symlinks to the system Chromium (Debian ``/usr/bin/chromium``).

MiniWoB++ tasks are static HTML pages shipped in the ``miniwob`` PyPI package; BrowserGym reads their base
URL from ``MINIWOB_URL`` (``file://<miniwob package>/html/miniwob/``), so no web server is needed.

``python -m coevo.envs.browser`` builds the shim and prints the ``export`` lines (used by
``scripts/setup_browser.sh``); :func:`ensure_browser_env` does the same from Python.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from coevo.errors import UserError

#: binaries searched on PATH, in order, when ``COEVO_CHROMIUM`` is not set
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")

#: executable locations (relative to the browser folder) each Playwright release may expect on Linux;
#: every layout is linked so that one shim serves old and new Playwright versions alike
LINUX_LAYOUTS: dict[str, tuple[tuple[str, ...], ...]] = {
    "chromium": (("chrome-linux", "chrome"), ("chrome-linux64", "chrome")),
    "chromium-headless-shell": (
        ("chrome-linux", "headless_shell"),
        ("chrome-headless-shell-linux64", "chrome-headless-shell"),
    ),
}


#: the command that installs the web extra into the repository's venv (the main-job install leaves it out)
FIX_PACKAGES = ".venv/bin/python -m pip install -e '.[web]'  (or: bash scripts/install.sh --dev)"
#: the command that installs Chromium and builds the Playwright shim
FIX_CHROMIUM = "sudo scripts/setup_browser.sh  (or set COEVO_CHROMIUM to a Chromium binary)"


class BrowserSetupError(UserError, RuntimeError):
    """The browser environment cannot be prepared (no Chromium, no playwright / BrowserGym / miniwob package).

    A :class:`~coevo.errors.UserError`: the ``coevo`` command prints its message, which names the command that
    fixes it, as one line and exits with status 2.
    """


@dataclass(frozen=True)
class BrowserEnvInfo:
    """Where the browser pieces are.

    Attributes:
        chromium: absolute path of the Chromium binary the shim links to (``None`` when the user's own
            ``PLAYWRIGHT_BROWSERS_PATH`` is used untouched).
        playwright_browsers_path: value of ``PLAYWRIGHT_BROWSERS_PATH``.
        miniwob_url: value of ``MINIWOB_URL`` (ends with ``/``).
    """

    chromium: str | None
    playwright_browsers_path: str
    miniwob_url: str

    def exports(self) -> str:
        """Shell ``export`` lines for both variables (shell-quoted)."""
        return (
            f"export PLAYWRIGHT_BROWSERS_PATH={shlex.quote(self.playwright_browsers_path)}\n"
            f"export MINIWOB_URL={shlex.quote(self.miniwob_url)}\n"
        )


def default_shim_dir() -> Path:
    """``$COEVO_CACHE/ms-playwright`` if ``COEVO_CACHE`` is set, else ``~/.cache/coevo/ms-playwright``."""
    base = os.environ.get("COEVO_CACHE")
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "coevo"
    return root / "ms-playwright"


def find_chromium() -> Path:
    """Locate a Chromium (or Chrome) binary: ``$COEVO_CHROMIUM``, else the first of ``CHROMIUM_NAMES`` on PATH.

    Raises:
        BrowserSetupError: when none is found or ``COEVO_CHROMIUM`` does not name an executable file.
    """
    override = os.environ.get("COEVO_CHROMIUM")
    if override:
        path = Path(override).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BrowserSetupError(f"COEVO_CHROMIUM={override!r} is not an executable file")
        return path.resolve()
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return Path(found).resolve()
    raise BrowserSetupError(
        "no Chromium found on PATH (looked for " + ", ".join(CHROMIUM_NAMES) + f"); fix: {FIX_CHROMIUM}"
    )


def playwright_browsers_json() -> list[dict]:
    """The ``browsers`` list of the installed playwright package's ``driver/package/browsers.json``.

    Raises:
        BrowserSetupError: when playwright is not installed or the file is missing / malformed.
    """
    spec = importlib.util.find_spec("playwright")
    if spec is None or not spec.submodule_search_locations:
        raise BrowserSetupError(f"the `playwright` package is not installed; fix: {FIX_PACKAGES}")
    path = Path(spec.submodule_search_locations[0]) / "driver" / "package" / "browsers.json"
    try:
        browsers = json.loads(path.read_text())["browsers"]
    except (OSError, ValueError, KeyError) as exc:
        raise BrowserSetupError(f"cannot read playwright's browser list {path}: {exc}") from exc
    return list(browsers)


def shim_executables(browsers: list[dict], root: Path) -> list[Path]:
    """Executable paths Playwright may look for under ``root`` for the Chromium entries of ``browsers``.

    The folder name follows Playwright's registry rule ``name.replace('-', '_') + '-' + revision``.
    """
    paths = []
    for entry in browsers:
        layouts = LINUX_LAYOUTS.get(entry.get("name", ""))
        if not layouts:
            continue
        folder = root / f"{entry['name'].replace('-', '_')}-{entry['revision']}"
        paths.extend(folder.joinpath(*layout) for layout in layouts)
    return paths


def _link(target: Path, link: Path) -> None:
    """Make ``link`` a symlink to ``target`` atomically (safe when several processes build the shim)."""
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)


def build_playwright_shim(root: str | Path | None = None, chromium: str | Path | None = None) -> Path:
    """Create (or refresh) the Playwright browser folder whose Chromium executables link to the system one.

    Idempotent. Args: ``root`` (default :func:`default_shim_dir`), ``chromium`` (default :func:`find_chromium`).
    Returns the folder (absolute).

    Raises:
        BrowserSetupError: no Chromium, no playwright, or no Chromium entry in playwright's browsers.json.
    """
    chromium_path = Path(chromium).resolve() if chromium else find_chromium()
    folder = Path(root).expanduser().resolve() if root else default_shim_dir().resolve()
    executables = shim_executables(playwright_browsers_json(), folder)
    if not executables:
        raise BrowserSetupError("playwright's browsers.json lists no Chromium build to shim")
    for exe in executables:
        _link(chromium_path, exe)
    return folder


def miniwob_html_url() -> str:
    """``file://`` URL of the MiniWoB++ task pages shipped in the ``miniwob`` package (ends with ``/``).

    Raises:
        BrowserSetupError: when the package or its ``html/miniwob`` folder is missing.
    """
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise BrowserSetupError(f"the `miniwob` package is not installed; fix: {FIX_PACKAGES}")
    html = Path(spec.submodule_search_locations[0]).resolve() / "html" / "miniwob"
    if not (html / "click-test.html").is_file():
        raise BrowserSetupError(f"MiniWoB++ HTML not found at {html}")
    return html.as_uri() + "/"


#: Python packages (import names) each BrowserGym benchmark needs besides playwright and browsergym.core
BENCHMARK_PACKAGES: dict[str, tuple[str, ...]] = {
    "miniwob": ("browsergym.miniwob", "miniwob"),
    "webarena_lite": ("browsergym.webarenalite",),
    "openended": (),
}


def check_browser_ready(benchmark: str = "miniwob") -> None:
    """Check, without starting a browser or importing BrowserGym, that a web run of ``benchmark`` can start:
    the ``playwright`` package (and its browser list), BrowserGym (``browsergym.core`` and the benchmark's
    packages, :data:`BENCHMARK_PACKAGES`), and a Chromium (unless ``PLAYWRIGHT_BROWSERS_PATH`` is set: then
    the user's own Playwright browsers are used, as :func:`ensure_browser_env` does). Python packages are
    checked first, so the message names the first step to take.

    Raises:
        BrowserSetupError: the first missing piece, one line naming the command that fixes it.
    """
    playwright_browsers_json()
    missing = [name for name in ("browsergym.core", *BENCHMARK_PACKAGES.get(benchmark, ())) if not _importable(name)]
    if missing:
        raise BrowserSetupError(
            f"web benchmark {benchmark!r} needs the Python package(s) {', '.join(missing)}, which are not "
            f"installed; fix: {FIX_PACKAGES}"
        )
    if not os.environ.get("PLAYWRIGHT_BROWSERS_PATH"):
        find_chromium()


def _importable(module: str) -> bool:
    """Whether ``module`` can be found (its parent packages are imported, the module itself is not)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def ensure_browser_env(shim_root: str | Path | None = None) -> BrowserEnvInfo:
    """Set ``PLAYWRIGHT_BROWSERS_PATH`` and ``MINIWOB_URL`` in ``os.environ`` when they are not set.

    ``PLAYWRIGHT_BROWSERS_PATH`` gets the shim of :func:`build_playwright_shim` (built at ``shim_root``,
    default :func:`default_shim_dir`); values the user already set are kept as they are.

    Raises:
        BrowserSetupError: when Chromium, playwright or miniwob is missing (the message says how to fix it).
    """
    chromium: str | None = None
    browsers_path = os.environ.get("PLAYWRIGHT_BROWSERS_PATH")
    if not browsers_path:
        chromium_path = find_chromium()
        browsers_path = str(build_playwright_shim(shim_root, chromium_path))
        chromium = str(chromium_path)
        os.environ["PLAYWRIGHT_BROWSERS_PATH"] = browsers_path
    miniwob_url = os.environ.get("MINIWOB_URL")
    if not miniwob_url:
        miniwob_url = miniwob_html_url()
        os.environ["MINIWOB_URL"] = miniwob_url
    return BrowserEnvInfo(chromium=chromium, playwright_browsers_path=browsers_path, miniwob_url=miniwob_url)


def main(argv: list[str] | None = None) -> int:
    """CLI: build the shim under ``--root`` and print the export lines; exit 1 with the reason (and the command
    that fixes it) on failure."""
    parser = argparse.ArgumentParser(prog="python -m coevo.envs.browser", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--root", default=None, help="shim folder (default: $COEVO_CACHE/ms-playwright or ~/.cache/coevo/ms-playwright)"
    )
    args = parser.parse_args(argv)
    try:
        root = build_playwright_shim(args.root)
        info = BrowserEnvInfo(
            chromium=str(find_chromium()), playwright_browsers_path=str(root), miniwob_url=miniwob_html_url()
        )
    except BrowserSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"# chromium: {info.chromium}", file=sys.stderr)
    sys.stdout.write(info.exports())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
