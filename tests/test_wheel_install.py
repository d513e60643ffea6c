"""coevo installed from a wheel works outside the source tree.

Builds a wheel from a copy of the repository (``pip wheel --no-deps --no-build-isolation``), installs it with
``pip install --no-deps`` into a fresh venv, and runs the ``coevo`` script of that venv from an empty temporary
folder with no ``PYTHONPATH``: ``coevo heuristics eval`` on the shipped seed heuristic and ``coevo skills
validate`` on the shipped skills. The fresh venv sees the running interpreter's site-packages folders through
a ``.pth`` file (so torch, numpy, elkai... are not reinstalled) but never the repository: its ``coevo`` comes
from the wheel, which the test checks before anything runs.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
#: top-level entries of a checkout that are not sources (caches, environments, run outputs, build folders)
NOT_SOURCES = {".git", ".venv", "venv", "build", "dist", "runs", ".pytest_cache", ".ruff_cache"}
SHIPPED = ("heuristics", "skills")

pytestmark = [pytest.mark.wheel, pytest.mark.timeout(600)]

PROBE = """
import json, sys
import coevo, coevo.resources as r
print(json.dumps({"coevo": coevo.__file__, "heuristics": str(r.shipped_dir("heuristics")),
                  "skills": str(r.shipped_dir("skills")), "sys_path": sys.path,
                  "meta_path": [type(f).__module__ for f in sys.meta_path]}))
"""


def source_files(folder: Path) -> set[str]:
    """Files under ``folder`` (relative POSIX paths), byte-code caches left out."""
    return {
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    }


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, **kw)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Build the wheel, install it into a fresh venv; return the paths and a clean environment for it."""
    tmp = tmp_path_factory.mktemp("wheel")
    # without PYTHON* / COEVO_* / VIRTUAL_ENV: pip must not see a coevo on PYTHONPATH (the source tree) as installed
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "COEVO_", "VIRTUAL_ENV"))}
    src = tmp / "src"
    shutil.copytree(
        REPO,
        src,
        ignore=lambda d, names: [
            n
            for n in names
            if (Path(d) == REPO and n in NOT_SOURCES) or n == "__pycache__" or n.endswith((".pyc", ".egg-info"))
        ],
    )
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(tmp / "dist"),
            str(src),
        ]
    )
    (wheel,) = (tmp / "dist").glob("coevo-*.whl")

    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)]
    run(pip, env=clean)
    purelib = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    # the dependencies: this interpreter's site-packages folders (their own .pth files are not run, so an
    # editable coevo installed there stays invisible)
    deps = sorted(
        {
            p
            for p in [*site.getsitepackages(), *sys.path]
            if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p) and Path(p) != purelib
        }
    )
    (purelib / "_coevo_test_deps.pth").write_text("".join(f"{p}\n" for p in deps))

    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    env = {
        **clean,
        "PATH": f"{venv / 'bin'}{os.pathsep}{clean.get('PATH', '')}",
        "VIRTUAL_ENV": str(venv),
        "COEVO_CACHE": str(tmp / "cache"),
    }
    return {"wheel": wheel, "venv": venv, "python": python, "purelib": purelib, "cwd": elsewhere, "env": env}


def test_wheel_ships_every_package_and_the_shipped_folders(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    assert {n.split("/")[0] for n in names} == {"coevo", next(n.split("/")[0] for n in names if ".dist-info/" in n)}
    packages = {p.relative_to(REPO).as_posix() for p in (REPO / "coevo").rglob("__init__.py")}
    assert packages <= names
    for folder in SHIPPED:
        in_wheel = {
            n.removeprefix(f"coevo/_shipped/{folder}/") for n in names if n.startswith(f"coevo/_shipped/{folder}/")
        }
        assert in_wheel == source_files(REPO / folder)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_installed_coevo_does_not_see_the_source_tree(installed):
    doc = json.loads(run([str(installed["python"]), "-c", PROBE], cwd=installed["cwd"], env=installed["env"]).stdout)
    purelib = installed["purelib"]
    assert Path(doc["coevo"]) == purelib / "coevo" / "__init__.py"
    assert Path(doc["heuristics"]) == purelib / "coevo" / "_shipped" / "heuristics"
    assert Path(doc["skills"]) == purelib / "coevo" / "_shipped" / "skills"
    roots = [Path(p or installed["cwd"]).resolve() for p in doc["sys_path"]]
    assert REPO not in roots and not any(r == REPO / "tests" for r in roots)
    assert [r for r in roots if (r / "coevo" / "__init__.py").is_file()] == [purelib.resolve()]
    assert not any("__editable__" in m for m in doc["meta_path"])


def test_heuristics_eval_from_an_unrelated_folder(installed):
    from coevo.ahd import load_problem

    seed = installed["purelib"] / "coevo" / "_shipped" / "heuristics" / "tsp_construct" / "seed_heuristic.py"
    assert seed.read_text() == (REPO / "heuristics" / "tsp_construct" / "seed_heuristic.py").read_text()
    done = run(
        [
            str(installed["venv"] / "bin" / "coevo"),
            "heuristics",
            "eval",
            "tsp_construct",
            str(seed),
            "--size",
            "20",
            "--count",
            "8",
            "--seed",
            "0",
            "--json",
        ],
        cwd=installed["cwd"],
        env=installed["env"],
    )
    doc = json.loads(done.stdout)
    assert (doc["valid"], doc["n_instances"], doc["n_invalid"]) == (True, 8, 0)
    # the same seed heuristic on the same generated instances, run in-process from the source tree
    tsp = load_problem("tsp_construct")
    namespace: dict = {}
    exec(compile(tsp.seed_heuristic_code(), "<seed>", "exec"), namespace)  # noqa: S102 -- the shipped seed
    expected = float(np.mean(tsp.run_heuristic(namespace[tsp.function_name], tsp.generate(20, 8, 0))["objectives"]))
    assert doc["mean_objective"] == pytest.approx(expected, rel=1e-12)
    assert "LKH" in doc["reference"] and doc["gap_percent"] > 0


def test_skills_validate_from_an_unrelated_folder(installed):
    skills = installed["purelib"] / "coevo" / "_shipped" / "skills"
    coevo = str(installed["venv"] / "bin" / "coevo")
    one = run([coevo, "skills", "validate", str(skills / "web-navigation")], cwd=installed["cwd"], env=installed["env"])
    assert one.stdout.splitlines() == [
        f"{skills / 'web-navigation'}: ok",
        "1 skill(s) checked, 0 invalid, 0 violation(s)",
    ]
    n = sum(1 for d in (REPO / "skills").iterdir() if (d / "SKILL.md").is_file())
    every = run([coevo, "skills", "validate", str(skills)], cwd=installed["cwd"], env=installed["env"])
    assert every.stdout.splitlines()[-1] == f"{n} skill(s) checked, 0 invalid, 0 violation(s)"
