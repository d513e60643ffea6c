"""Helpers shared by several test modules (imported as ``from support import ...``; pytest puts ``tests/`` on
``sys.path``): whether headless Chromium is there, loading a benchmark script as a module, and finding live
processes by their command line."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def chromium_missing(playwright: bool = False) -> str | None:
    """Why browser tests cannot run here (``"headless Chromium unavailable: ..."``), or None when
    :func:`coevo.envs.browser.find_chromium` finds Chromium (and, with ``playwright``, the ``playwright``
    package imports)."""
    from coevo.envs.browser import BrowserSetupError, find_chromium

    try:
        find_chromium()
        if playwright:
            import playwright as _  # noqa: F401
    except (BrowserSetupError, ImportError) as exc:
        return f"headless Chromium unavailable: {exc}"
    return None


def load_script(path: str | Path, name: str) -> ModuleType:
    """The Python file ``path`` (relative to the repository root, e.g. ``benchmarks/es_overhead.py``) executed as
    module ``name``, registered in ``sys.modules`` (dataclasses look their module up there).

    Raises:
        FileNotFoundError: no such file. Whatever the script raises at import.
    """
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def pids_with_cmdline(token: str) -> list[int]:
    """Host pids whose command line (``/proc/<pid>/cmdline``) contains ``token``; zombies, whose command line is
    empty, and processes that end while being read are left out."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    if token.encode() in fh.read():
                        found.append(int(name))
            except OSError:
                continue
    return found
