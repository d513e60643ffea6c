"""Where coevo's own files are on disk: the folder holding the ``coevo`` package, and the folders shipped
with it (``heuristics/``, the heuristic-design problems, and ``skills/``, the starter Agent Skills).

The repository keeps ``heuristics/`` and ``skills/`` at its top level. A wheel (``pip install .``,
``pip wheel``) carries them as package data under ``coevo/_shipped/`` (the mapping is in ``setup.py``). This
module finds them in either layout through :func:`importlib.resources.files`:

1. installed from a wheel: ``<site-packages>/coevo/_shipped/<name>``;
2. a source checkout (run from the repository, or an editable install): ``<repository>/<name>``, recognised
   by the ``pyproject.toml`` beside the ``coevo`` package folder.

Only file-system installs are supported: problems are imported from their ``problem.py`` by path and the
sandbox binds their folders, so a zipped ``coevo`` raises :class:`ShippedResourceError`.

This module imports nothing from coevo; any part may use it.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Literal

#: The shipped folders, by their name in the repository (and under ``coevo/_shipped/`` in a wheel).
SHIPPED_FOLDERS = ("heuristics", "skills")

#: Folder inside the installed ``coevo`` package that holds the shipped folders in a wheel.
INSTALLED_SUBDIR = "_shipped"

ShippedFolder = Literal["heuristics", "skills"]


class ShippedResourceError(FileNotFoundError):
    """coevo's package folder or one of its shipped folders is not on the file system where expected."""


def package_dir() -> Path:
    """The installed ``coevo`` package folder (``.../coevo``), as an absolute path.

    Raises:
        ShippedResourceError: coevo is not imported from a file-system folder (e.g. from a zip archive).
    """
    root = importlib.resources.files("coevo")
    if not isinstance(root, Path):
        raise ShippedResourceError(f"coevo is imported from {root!r}, not from a folder; install it unzipped")
    return root.resolve()


def package_parent() -> Path:
    """The folder holding the ``coevo`` package: ``site-packages`` for an install, the repository root for a
    source checkout. Putting it on ``sys.path`` makes ``import coevo`` find this copy."""
    return package_dir().parent


def shipped_candidates(name: ShippedFolder) -> list[Path]:
    """The places searched for shipped folder ``name``, in order (see the module docstring)."""
    if name not in SHIPPED_FOLDERS:
        raise ValueError(f"unknown shipped folder {name!r}; expected one of {SHIPPED_FOLDERS}")
    pkg = package_dir()
    candidates = [pkg / INSTALLED_SUBDIR / name]
    if (pkg.parent / "pyproject.toml").is_file():  # a source checkout, not site-packages
        candidates.append(pkg.parent / name)
    return candidates


def shipped_dir(name: ShippedFolder) -> Path:
    """Absolute path of the shipped folder ``name`` (``"heuristics"`` or ``"skills"``).

    Raises:
        ValueError: ``name`` is not a shipped folder.
        ShippedResourceError: the folder is in none of :func:`shipped_candidates` (a broken install).
    """
    candidates = shipped_candidates(name)
    for path in candidates:
        if path.is_dir():
            return path
    raise ShippedResourceError(
        f"coevo's shipped {name}/ folder not found (looked in {', '.join(map(str, candidates))}); reinstall coevo"
    )


def shipped_root() -> Path:
    """The folder holding the shipped folders: ``coevo/_shipped`` in a wheel install, the repository root in a
    source checkout. Paths such as ``skills/web-navigation`` resolve against it in both layouts.

    Raises:
        ShippedResourceError: as :func:`shipped_dir`.
    """
    return shipped_dir("skills").parent
