"""The heuristic-design problem base class, the problem registry, and the sandbox target.

A problem (one folder ``heuristics/<name>/`` with a ``problem.py``) says what function a candidate heuristic
must define, with which interface (kept identical to EoH / LLM4AD / ReEvo / FunSearch so their heuristics
port unchanged), how instances are generated and loaded, how a constructive solution is built by calling
the heuristic step by step, what counts as infeasible, and which reference the gap is measured against.

Objective direction: each problem states ``direction`` ("minimize" for tour length, route length and bins;
"maximize" for knapsack value). The conversion to coevo's reward happens once, in
:func:`coevo.ahd.evaluate.evaluate_heuristic`: ``score = -objective`` (minimise) or ``objective`` (maximise).

Failure conventions while building a solution (raised from :meth:`HeuristicProblem.solve_instance`):

- :class:`~coevo.sandbox.errors.InvalidReturn` (kind ``return_type``): the heuristic returned something that
  is not a value of the declared type: a float or string instead of an int index, an index out of range, a
  priority array of the wrong length, a scalar priority, or NaN.
- :class:`~coevo.sandbox.errors.InfeasibleSolution` (kind ``infeasible``): a well-typed choice that breaks a
  constraint: a TSP node already visited, a knapsack item that does not fit or is already taken, a CVRP
  customer whose demand exceeds the remaining load.

Input protection: every instance gets fresh read-only copies of its arrays (``setflags(write=False)``), and
objectives are always computed from the evaluator's own private arrays, so a heuristic that writes into
(or un-protects and writes into) ``distance_matrix`` affects neither the score nor later instances.
"""

from __future__ import annotations

import ast
import importlib.util
import operator
import os
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from coevo.ahd.instances import InstanceSet, NotAnInstanceSetError, load_eoh_tsp_npz
from coevo.ahd.references import cached_reference
from coevo.registry import Registry
from coevo.sandbox.errors import InvalidReturn

_LOADED: dict[str, HeuristicProblem] = {}


def register_problem(cls: type[HeuristicProblem]) -> type[HeuristicProblem]:
    """Class decorator: register a problem class under ``cls.name`` (:data:`PROBLEMS`).

    Raises:
        ValueError: ``name`` is not set, or another class is registered under it.
        TypeError: ``cls`` does not subclass :class:`HeuristicProblem`.
    """
    if not getattr(cls, "name", None):
        raise ValueError(f"{cls.__name__}.name must be set before registration")
    return PROBLEMS.add(cls.name, cls)


def heuristics_root() -> Path:
    """Folder holding one sub-folder per problem: ``$COEVO_HEURISTICS_DIR`` or the repository's
    ``heuristics/`` (found relative to the ``coevo`` package)."""
    env = os.environ.get("COEVO_HEURISTICS_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "heuristics"


def available_problems(root: Path | None = None) -> list[str]:
    """Names of the folders under ``root`` (default :func:`heuristics_root`) that hold a ``problem.py``."""
    root = root or heuristics_root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "problem.py").is_file())


def load_problem(name_or_dir: str | os.PathLike) -> HeuristicProblem:
    """Load a problem by name (a folder under :func:`heuristics_root`) or by folder path.

    The folder's ``problem.py`` is imported with ``importlib.util.spec_from_file_location`` (as module
    ``coevo_heuristics.<name>``) and must register a :class:`HeuristicProblem` subclass whose ``name``
    equals the folder name. Loaded problems are cached per folder.

    Raises:
        ValueError: no such problem (the message lists the available ones), ``problem.py`` registers
            no problem of that name, or a problem of that name was already loaded from another folder.
    """
    given = Path(name_or_dir)
    folder = given if (given / "problem.py").is_file() else heuristics_root() / str(name_or_dir)
    if not (folder / "problem.py").is_file():
        raise ValueError(f"unknown heuristic problem {str(name_or_dir)!r}; available in {heuristics_root()}: "
                         f"{', '.join(available_problems()) or '(none)'} (or pass a folder with a problem.py)")
    folder = folder.resolve()
    key = str(folder)
    if key in _LOADED:
        return _LOADED[key]
    other = next((p for p in _LOADED.values() if p.name == folder.name), None)
    if other is not None:
        raise ValueError(f"problem {folder.name!r} is already loaded from {other.root}; {folder} defines "
                         "another problem of the same name (rename one of the folders)")
    mod_name = f"coevo_heuristics.{folder.name}"
    spec = importlib.util.spec_from_file_location(mod_name, folder / "problem.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # the importlib recipe: dataclasses and pickle look classes up by module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    cls = PROBLEMS.get(folder.name)
    if cls is None or cls.__module__ != mod_name:
        raise ValueError(f"{folder / 'problem.py'} does not register a problem named {folder.name!r} "
                         "(decorate a HeuristicProblem subclass with @register_problem and set name)")
    problem = cls(root=folder)
    _LOADED[key] = problem
    return problem


def as_index(value: Any, what: str, upper: int) -> int:
    """Check that a heuristic's return value is an integer index in [0, upper).

    Accepts Python ints, numpy integers and 0-d integer arrays; rejects bools, floats and anything else.

    Raises:
        InvalidReturn: naming ``what`` and the offending value.
    """
    if isinstance(value, (bool, np.bool_)):
        raise InvalidReturn(f"{what} returned a bool ({value!r}); expected an int index")
    try:
        idx = operator.index(value)
    except TypeError:
        raise InvalidReturn(f"{what} returned {value!r} of type {type(value).__name__}; expected an int index") \
            from None
    if not 0 <= idx < upper:
        raise InvalidReturn(f"{what} returned index {idx}, outside [0, {upper})")
    return idx


def read_only(arr: np.ndarray, dtype: Any = None) -> np.ndarray:
    """A fresh copy of ``arr`` (optionally cast) with ``WRITEABLE`` cleared."""
    out = np.array(arr, dtype=dtype, copy=True)
    out.setflags(write=False)
    return out


class HeuristicProblem(ABC):
    """A constructive (or online) heuristic-design problem.

    Class attributes set by subclasses:
        name: registry name, equal to the folder name (e.g. ``"tsp_construct"``).
        function_name: the function a candidate must define (e.g. ``"select_next_node"``).
        function_aliases: other accepted names (e.g. BPP ``"priority"`` for FunSearch code).
        direction: ``"minimize"`` or ``"maximize"`` (of the objective).
        objective_name: what the objective measures, with units (e.g. ``"tour length"``).
        task_description: the task text given to the LLM (EoH's "task" prompt part).
        func_inputs, func_outputs: argument / return names (EoH prompt parts).
        sizes: the usual instance sizes; default_size, default_count: the CLI defaults.
        reference_name: the reference used for generated instances (shown with every gap).

    Args:
        root: the problem folder (where ``seed_heuristic.py`` and ``README.md`` live).
    """

    name: ClassVar[str] = ""
    function_name: ClassVar[str] = ""
    function_aliases: ClassVar[tuple[str, ...]] = ()
    direction: ClassVar[str] = "minimize"
    objective_name: ClassVar[str] = ""
    task_description: ClassVar[str] = ""
    func_inputs: ClassVar[tuple[str, ...]] = ()
    func_outputs: ClassVar[tuple[str, ...]] = ()
    sizes: ClassVar[tuple[int, ...]] = ()
    default_size: ClassVar[int] = 0
    default_count: ClassVar[int] = 64
    reference_name: ClassVar[str] = ""
    instance_fields: ClassVar[tuple[str, ...]] = ()
    max_count: ClassVar[int] = 100_000
    max_cells: ClassVar[int] = 100_000_000  # array entries over all generated instances (800 MB as float64)

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = Path(root) if root is not None else heuristics_root() / self.name

    # --- what subclasses implement -------------------------------------------------------------------
    @abstractmethod
    def generate(self, size: int, count: int, seed: int) -> InstanceSet:
        """``count`` random instances of ``size`` from ``seed`` (deterministic). ValueError on bad input."""

    @abstractmethod
    def solve_instance(self, fn: Any, arrays: dict[str, np.ndarray]) -> float:
        """Build one solution by calling ``fn`` step by step; return its objective.

        ``arrays`` are the evaluator's private arrays (never handed to ``fn`` directly).
        Raises InvalidReturn / InfeasibleSolution as described in the module docstring.
        """

    @abstractmethod
    def reference_one(self, arrays: dict[str, np.ndarray]) -> float:
        """The reference objective of one instance (solver named by ``reference_name``)."""

    def reference_solver_id(self) -> str:
        """Cache key part naming the reference solver and its settings."""
        return self.reference_name.lower().replace(" ", "-")

    # --- shared machinery -----------------------------------------------------------------------------
    def check_args(self, size: int, count: int, seed: int, min_size: int = 1,
                   cells_per_instance: int | None = None) -> None:
        """ValueError naming the field when size/count/seed are out of range, before anything is allocated.

        Bounds: ``size >= min_size``, ``1 <= count <= max_count``, ``seed >= 0``, and
        ``count * cells_per_instance <= max_cells`` (``cells_per_instance`` = array entries of one
        instance, default ``size``; e.g. ``size**2`` for a distance matrix).
        """
        for field_name, value, low in (("size", size, min_size), ("count", count, 1), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{self.name}: {field_name} must be an int >= {low}, got {value!r}")
        if count > self.max_count:
            raise ValueError(f"{self.name}: count must be <= {self.max_count}, got {count}")
        cells = int(count) * int(size if cells_per_instance is None else cells_per_instance)
        if cells > self.max_cells:
            raise ValueError(f"{self.name}: size {size} x count {count} needs {cells:,} array entries, more "
                             f"than the limit {self.max_cells:,}; lower size or count")

    def check_instances(self, instances: InstanceSet) -> InstanceSet:
        """Check ``instances`` before any heuristic runs; returns them.

        Raises:
            ValueError: naming the source (file) and the field: instances of another problem, an instance
                without one of ``instance_fields``, or arrays that break :meth:`InstanceSet.validate`
                (NaN, negative distances, mismatched shapes, ...).
        """
        src = instances.source or "<instances>"
        if instances.problem != self.name:
            raise ValueError(f"{src}: instances are for {instances.problem!r}, not {self.name!r}")
        for name, inst in zip(instances.names, instances.arrays):
            missing = [f for f in self.instance_fields if f not in inst]
            if missing:
                raise ValueError(f"{src}: instance {name!r} lacks field(s) {missing} "
                                 f"(a {self.name} instance needs {list(self.instance_fields)})")
        return instances.validate()

    def run_heuristic(self, fn: Any, instances: InstanceSet, keep_going: bool = False) -> dict[str, Any]:
        """Run ``fn`` on every instance (this is what the sandbox target calls).

        Args:
            fn: the candidate heuristic.
            instances: the instances.
            keep_going: False (search): stop at the first failing instance by raising. True (diagnosis,
                e.g. the CLI): record each instance's failure and go on.

        Returns:
            ``{"objectives": [float per instance], "names": [str]}``; with ``keep_going`` also
            ``"failures": [None or {"kind": failure kind, "error": detail}]`` and ``None`` objectives for
            failed instances.

        Raises:
            InvalidReturn, InfeasibleSolution: (not keep_going) on the first instance where ``fn``
            misbehaves; any exception ``fn`` raises propagates (a runtime failure).
        """
        if not callable(fn):
            raise InvalidReturn(f"{self.function_name} is not callable (got {type(fn).__name__})")
        if not keep_going:
            objectives = [float(self.solve_instance(fn, inst)) for inst in instances]
            return {"objectives": objectives, "names": list(instances.names)}
        from coevo.sandbox.worker import classify

        objectives, failures = [], []
        for inst in instances:
            try:
                objectives.append(float(self.solve_instance(fn, inst)))
                failures.append(None)
            except Exception as exc:  # noqa: BLE001 -- keep_going records any per-instance failure
                objectives.append(None)
                failures.append({"kind": classify(exc), "error": f"{type(exc).__name__}: {exc}"[:500]})
        return {"objectives": objectives, "names": list(instances.names), "failures": failures}

    def references(self, instances: InstanceSet) -> tuple[np.ndarray, str]:
        """Per-instance reference objectives (B,) and the reference's name.

        Known references carried by the set (e.g. TSPLIB optima) win; otherwise the problem's solver runs,
        cached on disk (:func:`coevo.ahd.references.cached_reference`).
        """
        if instances.known_reference is not None:
            return instances.known_reference, instances.known_reference_name or "known reference"
        values = cached_reference(instances, self.reference_solver_id(), self.reference_one)
        return values, self.reference_name

    def load_instances(self, path: str | os.PathLike) -> InstanceSet:
        """Load instances from a file: an InstanceSet ``.npz`` (any problem), or a format the problem
        knows (see subclasses), checked by :meth:`check_instances`.

        Raises:
            FileNotFoundError: no such file.
            ValueError: naming the file: not a readable ``.npz``, instances of another problem, or invalid
                arrays (see :meth:`check_instances`).
        """
        path = Path(path)
        if path.suffix == ".npz":
            try:
                inst = InstanceSet.load(path)
            except NotAnInstanceSetError:
                inst = load_eoh_tsp_npz(path)
            return self.check_instances(inst)
        raise ValueError(f"{self.name}: cannot read instances from {path} (suffix {path.suffix!r}); "
                         "use an InstanceSet .npz")

    def resolve_function_name(self, code: str) -> str:
        """The name under which ``code`` defines the heuristic: ``function_name`` or one of its aliases
        (the first defined at top level); ``function_name`` when none is found or the code does not parse
        (the sandbox then reports the missing function or the syntax error)."""
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError):
            return self.function_name
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for candidate in (self.function_name, *self.function_aliases):
            if candidate in defined:
                return candidate
        return self.function_name

    def seed_heuristic_code(self) -> str:
        """Source of ``<root>/seed_heuristic.py`` (the classic baseline heuristic the reports compare with)."""
        return (self.root / "seed_heuristic.py").read_text()

    def template_code(self) -> str:
        """The function template shown to the LLM: ``<root>/template.py`` (the exact signature and docstring
        with a naive valid body, as LLM4AD's template programs), else the seed heuristic. Showing the strong
        seed heuristic instead makes a small model copy it verbatim, so the search starts with no diversity."""
        path = self.root / "template.py"
        return path.read_text() if path.is_file() else self.seed_heuristic_code()

    def prompt_spec(self) -> dict[str, Any]:
        """The parts EoH-style prompts are built from."""
        return {
            "task": self.task_description,
            "function_name": self.function_name,
            "inputs": list(self.func_inputs),
            "outputs": list(self.func_outputs),
            "template": self.template_code(),
            "direction": self.direction,
            "objective": self.objective_name,
        }


#: every problem class loaded so far, by name (folders are imported by :func:`load_problem`)
PROBLEMS: Registry[HeuristicProblem] = Registry("heuristic problem", HeuristicProblem)


def run_target(fn: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Sandbox target ``coevo.ahd.problem:run_target``.

    Args:
        fn: the candidate's heuristic function.
        payload: ``{"problem": problem folder or name, "instances_path": InstanceSet .npz path,
            "keep_going": bool (optional, default False)}``.

    Returns:
        ``{"objectives": [...], "names": [...]}`` (+ ``"failures"`` with keep_going; JSON-able).

    Raises:
        ValueError: a payload field is missing. InvalidReturn / InfeasibleSolution from the run.
    """
    for key in ("problem", "instances_path"):
        if key not in payload:
            raise ValueError(f"payload is missing {key!r}")
    problem = load_problem(payload["problem"])
    return problem.run_heuristic(fn, InstanceSet.load(payload["instances_path"]),
                                 keep_going=bool(payload.get("keep_going", False)))
