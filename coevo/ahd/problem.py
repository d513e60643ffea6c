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

Trust: :meth:`HeuristicProblem.run_heuristic` is the sandbox's target and runs on the TRUSTED side
(:mod:`coevo.sandbox.runner`): the candidate's process only answers each step's question (which node, item,
bin priorities), every answer is checked here against the evaluator's own copy of the instance, and the
objective is computed here. Inputs: every call gets fresh writable copies of its arguments
(:mod:`coevo.sandbox.calls`, as ReEvo's ``distance_matrix.copy()`` and FunSearch's ``bins[valid]``), so a
heuristic may edit them in place; neither the score nor later steps or instances can change. Arrays the
problem passes read-only are the instance's unchanging data (sent to the candidate once per process).

Time: per-instance wall time is measured and returned (``times_s``); ``instance_timeout_s`` bounds each
instance separately, so a heuristic that is valid but slow on large instances fails only where it runs out
of time. :meth:`HeuristicProblem.work` (size ** ``time_exponent`` summed over instances) scales a time limit
set for one instance set to another (:func:`coevo.ahd.evaluate.scaled_timeout`).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from coevo.ahd.instances import InstanceSet, NotAnInstanceSetError, load_eoh_tsp_npz
from coevo.ahd.references import cached_reference
from coevo.registry import Registry
from coevo.resources import shipped_dir
from coevo.sandbox.calls import heuristic_call
from coevo.sandbox.errors import CandidateFailure, InvalidReturn, failure_kind
from coevo.sandbox.extract import CandidateParseError, function_docstring, parse_bounded

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
    """Folder holding one sub-folder per problem: ``$COEVO_HEURISTICS_DIR`` or the shipped ``heuristics/``
    (the repository's folder, or its copy inside an installed wheel; see :mod:`coevo.resources`)."""
    env = os.environ.get("COEVO_HEURISTICS_DIR")
    return Path(env) if env else shipped_dir("heuristics")


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
        raise ValueError(
            f"unknown heuristic problem {str(name_or_dir)!r}; available in {heuristics_root()}: "
            f"{', '.join(available_problems()) or '(none)'} (or pass a folder with a problem.py)"
        )
    folder = folder.resolve()
    key = str(folder)
    if key in _LOADED:
        return _LOADED[key]
    other = next((p for p in _LOADED.values() if p.name == folder.name), None)
    if other is not None:
        raise ValueError(
            f"problem {folder.name!r} is already loaded from {other.root}; {folder} defines "
            "another problem of the same name (rename one of the folders)"
        )
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
        raise ValueError(
            f"{folder / 'problem.py'} does not register a problem named {folder.name!r} "
            "(decorate a HeuristicProblem subclass with @register_problem and set name)"
        )
    problem = cls(root=folder)
    _LOADED[key] = problem
    return problem


def int_sequence(solution: Any, what: str, upper: int, max_len: int) -> list[int]:
    """An untrusted solution as a list of ints in [0, upper) of length <= max_len (JSON ints or an integer
    array; bools, floats and anything else refused).

    Raises:
        InfeasibleSolution: naming ``what`` and the problem.
    """
    from coevo.sandbox.errors import InfeasibleSolution

    if isinstance(solution, np.ndarray):
        if solution.ndim != 1 or solution.dtype.kind not in "iu":
            raise InfeasibleSolution(f"{what}: expected a 1-d integer array, got {solution.dtype} {solution.shape}")
        solution = solution.tolist()
    if not isinstance(solution, list) or len(solution) > max_len:
        raise InfeasibleSolution(f"{what}: expected a list of at most {max_len} indices, got {type(solution).__name__}")
    if not all(type(v) is int and 0 <= v < upper for v in solution):
        bad = next(v for v in solution if not (type(v) is int and 0 <= v < upper))
        raise InfeasibleSolution(f"{what}: {bad!r:.40} is not an index in [0, {upper})")
    return solution


#: The statement by which a construction loop takes the shared prelude (:mod:`coevo.ahd.construct_prelude`).
PRELUDE_IMPORT = "from coevo.ahd.construct_prelude import "


def with_prelude(source: str) -> str:
    """``source`` (a construction loop) with its first ``from coevo.ahd.construct_prelude import ...``
    statement (one line, or parenthesised over several) replaced by the prelude's own text; unchanged when
    it has none."""
    lines = source.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith(PRELUDE_IMPORT)), None)
    if start is None:
        return source
    end = start
    if "(" in lines[start]:
        while ")" not in lines[end]:
            end += 1
    prelude = (Path(__file__).resolve().parent / "construct_prelude.py").read_text()
    return "".join(lines[:start]) + prelude + "".join(lines[end + 1 :])


def read_only(arr: np.ndarray, dtype: Any = None) -> np.ndarray:
    """A fresh copy of ``arr`` (optionally cast) with ``WRITEABLE`` cleared: the mark of an argument that
    stays the same for a whole instance (the heuristic still receives writable copies of it)."""
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
        candidate_packages: the third-party distributions a candidate may import (the standard library is
            always there; what they require comes along); ``None`` = all of site-packages. Default
            ``("numpy",)``: the reference solver (elkai) and every other installed package are not visible
            in the sandbox.

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
    #: the smallest instance size :meth:`generate` accepts (e.g. 3 nodes for a TSP tour)
    min_size: ClassVar[int] = 1
    default_count: ClassVar[int] = 64
    reference_name: ClassVar[str] = ""
    candidate_packages: ClassVar[tuple[str, ...] | None] = ("numpy",)
    instance_fields: ClassVar[tuple[str, ...]] = ()
    max_count: ClassVar[int] = 100_000
    max_cells: ClassVar[int] = 100_000_000  # array entries over all generated instances (800 MB as float64)
    #: How the work of one instance grows with its size (used to scale time limits): a constructive
    #: heuristic makes n steps, each O(n) to O(n^2) for the published ones (ReEvo's TSP heuristic looks
    #: at all pairs of unvisited nodes per step), so 3 by default.
    time_exponent: ClassVar[float] = 3.0

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = Path(root) if root is not None else heuristics_root() / self.name

    # --- what subclasses implement -------------------------------------------------------------------
    @abstractmethod
    def generate(self, size: int, count: int, seed: int) -> InstanceSet:
        """``count`` random instances of ``size`` from ``seed`` (deterministic). ValueError on bad input."""

    #: File in the problem folder holding the candidate-side construction loop ``construct(fn, *args,
    #: name=...)`` (numpy + stdlib only): set it for problems whose heuristic sees the whole instance
    #: anyway (TSP, CVRP, KP), so the loop runs in the candidate's process in one request per instance
    #: and only its whole solution comes back, to :meth:`score_solution`. None: override
    #: :meth:`solve_instance` and drive the steps from here (online problems, whose future stays hidden).
    construct_file: ClassVar[str | None] = None

    def solve_instance(self, fn: Any, arrays: dict[str, np.ndarray]) -> float:
        """Build one solution with ``fn`` and return its objective, computed here.

        Default: ``construct(fn, *construct_args(arrays))`` (in the candidate's process when ``fn`` is
        remote), then :meth:`score_solution` checks the solution against ``arrays`` (the evaluator's own)
        and scores it. Raises InvalidReturn / InfeasibleSolution as described in the module docstring.
        """
        if self.construct_file is None:
            raise NotImplementedError(
                f"{type(self).__name__} sets no construct_file and does not override solve_instance"
            )
        args = self.construct_args(arrays)
        if getattr(fn, "is_remote_function", False):
            solution = fn.construct(self.construct_source(), *args)
        else:
            solution = self.construct_module().construct(fn, *args, name=self.function_name)
        return float(self.score_solution(arrays, solution))

    def construct_args(self, arrays: dict[str, np.ndarray]) -> tuple:
        """The arguments of the construction loop: only what the heuristic's interface shows (read-only
        arrays: sent once, copied for every call)."""
        raise NotImplementedError

    def score_solution(self, arrays: dict[str, np.ndarray], solution: Any) -> float:
        """Check an untrusted solution against the evaluator's own instance and return its objective.

        Raises:
            InfeasibleSolution: a solution that breaks a constraint or is malformed (wrong type, length,
                indices out of range, repeated or missing nodes / items).
        """
        raise NotImplementedError

    def construct_path(self) -> Path:
        """:attr:`construct_file` in the folder of the class that set it (so a subclass in another folder
        reuses its base problem's loop)."""
        owner = next(c for c in type(self).__mro__ if "construct_file" in c.__dict__)
        module = sys.modules.get(owner.__module__)
        folder = Path(module.__file__).resolve().parent if module and getattr(module, "__file__", None) else self.root
        return folder / self.construct_file

    def construct_source(self) -> str:
        """Source text of :attr:`construct_file` as the candidate's process runs it (built once): the
        loop's ``from coevo.ahd.construct_prelude import ...`` statement, if any, replaced by the text of
        :mod:`coevo.ahd.construct_prelude` (that process has no coevo)."""
        cached = getattr(self, "_construct_source", None)
        if cached is None:
            cached = with_prelude(self.construct_path().read_text())
            self._construct_source = cached
        return cached

    def construct_module(self) -> Any:
        """:attr:`construct_file` imported in this process (for local callables)."""
        cached = getattr(self, "_construct_module", None)
        if cached is None:
            spec = importlib.util.spec_from_file_location(
                f"coevo_heuristics.{self.name}_construct", self.construct_path()
            )
            cached = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(cached)
            self._construct_module = cached
        return cached

    @abstractmethod
    def reference_one(self, arrays: dict[str, np.ndarray]) -> float:
        """The reference objective of one instance (solver named by ``reference_name``)."""

    def reference_solver_id(self) -> str:
        """Cache key part naming the reference solver and its settings."""
        return self.reference_name.lower().replace(" ", "-")

    def instance_size(self, arrays: dict[str, np.ndarray]) -> int:
        """The size of one instance (nodes, items): the length of its first ``instance_fields`` array."""
        return int(np.asarray(arrays[self.instance_fields[0]]).shape[0])

    def work(self, instances: InstanceSet) -> float:
        """Relative evaluation work of a set: sum over instances of ``size ** time_exponent``."""
        return float(sum(float(self.instance_size(a)) ** self.time_exponent for a in instances))

    # --- shared machinery -----------------------------------------------------------------------------
    def check_args(
        self, size: int, count: int, seed: int, min_size: int | None = None, cells_per_instance: int | None = None
    ) -> None:
        """ValueError naming the field when size/count/seed are out of range, before anything is allocated.

        Bounds: ``size >= min_size`` (default: the class's :attr:`min_size`), ``1 <= count <= max_count``,
        ``seed >= 0``, and
        ``count * cells_per_instance <= max_cells`` (``cells_per_instance`` = array entries of one
        instance, default ``size``; e.g. ``size**2`` for a distance matrix).
        """
        min_size = self.min_size if min_size is None else min_size
        for field_name, value, low in (("size", size, min_size), ("count", count, 1), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{self.name}: {field_name} must be an int >= {low}, got {value!r}")
        if count > self.max_count:
            raise ValueError(f"{self.name}: count must be <= {self.max_count}, got {count}")
        cells = int(count) * int(size if cells_per_instance is None else cells_per_instance)
        if cells > self.max_cells:
            raise ValueError(
                f"{self.name}: size {size} x count {count} needs {cells:,} array entries, more "
                f"than the limit {self.max_cells:,}; lower size or count"
            )

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
                raise ValueError(
                    f"{src}: instance {name!r} lacks field(s) {missing} "
                    f"(a {self.name} instance needs {list(self.instance_fields)})"
                )
        return instances.validate()

    def run_heuristic(
        self, fn: Any, instances: InstanceSet, keep_going: bool = False, instance_timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Run ``fn`` on every instance (this is what the sandbox target calls, on the trusted side).

        Args:
            fn: the candidate heuristic: a :class:`~coevo.sandbox.session.RemoteFunction` (sandbox) or a
                plain callable (wrapped by :func:`coevo.sandbox.calls.heuristic_call`).
            instances: the instances (the evaluator's own copy).
            keep_going: False (search): stop at the first failing instance by raising. True (diagnosis,
                e.g. the CLI): record each instance's failure and go on.
            instance_timeout_s: wall-clock limit of each instance (s); None = only the evaluation's limit.

        Returns:
            ``{"objectives": [float per instance], "names": [str], "times_s": [wall s per instance]}``; with
            ``keep_going`` also ``"failures": [None or {"kind": failure kind, "error": detail}]`` and
            ``None`` objectives for failed instances (instances not reached after the evaluation's own
            limit count as failed, kind ``timeout``). The first instance that times out ends the evaluation:
            the instances after it are not run and count as failed (kind ``timeout``), so an endless loop
            costs one time limit, not one per instance. ``times_s`` of the first instance a candidate
            process serves includes that process's start and the import of the candidate's code (work
            done at import time is counted).

        Raises:
            InvalidReturn, InfeasibleSolution, CandidateFailure: (not keep_going) on the first instance where
            ``fn`` misbehaves; any exception ``fn`` raises propagates (a runtime failure).
        """
        if not callable(fn):
            raise InvalidReturn(f"{self.function_name} is not callable (got {type(fn).__name__})")
        call = heuristic_call(fn)
        remote = getattr(call, "is_remote_function", False)
        if keep_going and remote:
            call.restart = True  # a fresh process for the instance after one that crashed
        objectives: list[float | None] = []
        failures: list[dict[str, str] | None] = []
        times: list[float] = []
        timed_out = None
        for inst in instances:
            if timed_out is not None:  # the first timeout ends the evaluation: the rest is not run
                objectives.append(None)
                failures.append({"kind": "timeout", "error": f"not run: {timed_out}"[:500]})
                times.append(0.0)
                continue
            start = time.perf_counter()
            try:
                with call.limit(instance_timeout_s):
                    value = float(self.solve_instance(call, inst))
                objectives.append(value)
                failures.append(None)
            except Exception as exc:
                if not keep_going:
                    raise
                objectives.append(None)
                detail = str(exc) if isinstance(exc, CandidateFailure) else f"{type(exc).__name__}: {exc}"
                kind = failure_kind(exc)
                failures.append({"kind": kind, "error": detail[:500]})
                if kind == "timeout":
                    timed_out = f"an earlier instance timed out ({detail[:200]})"
            # the import of the candidate's code (and its process start) counts for the first instance it serves
            times.append(time.perf_counter() - start + (call.take_load_s() if remote else 0.0))
        out: dict[str, Any] = {"objectives": objectives, "names": list(instances.names), "times_s": times}
        if keep_going:
            out["failures"] = failures
        return out

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
        raise ValueError(
            f"{self.name}: cannot read instances from {path} (suffix {path.suffix!r}); use an InstanceSet .npz"
        )

    def resolve_function_name(self, code: str) -> str:
        """The name under which ``code`` defines the heuristic: ``function_name`` or one of its aliases
        (the first defined at top level); ``function_name`` when none is found or the code does not parse
        (the sandbox then reports the missing function or the syntax error)."""
        try:
            tree = parse_bounded(code)
        except CandidateParseError:
            return self.function_name
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for candidate in (self.function_name, *self.function_aliases):
            if candidate in defined:
                return candidate
        return self.function_name

    def published_heuristics(self) -> list[str]:
        """Names of the published heuristics shipped in ``<root>/published/`` (``<name>.py``), sorted."""
        folder = self.root / "published"
        return sorted(p.stem for p in folder.glob("*.py") if not p.name.startswith("_")) if folder.is_dir() else []

    def published_heuristic_code(self, name: str) -> str:
        """Source of ``<root>/published/<name>.py``: a heuristic an LLM search published, quoted with its source.

        Raises:
            ValueError: no such file (the message lists the published heuristics of this problem).
        """
        if name not in self.published_heuristics():
            known = ", ".join(self.published_heuristics()) or "none"
            raise ValueError(f"{self.name} has no published heuristic {name!r} (published: {known})")
        return (self.root / "published" / f"{name}.py").read_text()

    def seed_heuristic_code(self) -> str:
        """Source of ``<root>/seed_heuristic.py`` (the classic baseline heuristic the reports compare with)."""
        return (self.root / "seed_heuristic.py").read_text()

    def heuristic_idea(self, code: str) -> str | None:
        """The one-sentence idea (EoH's *thought*) of a shipped heuristic's source ``code``, for the prompts that
        show it as a parent: the paragraph after a module-docstring line starting with ``Idea`` and ending with
        ``:`` (the published heuristics), else the first paragraph of the function's docstring (the seed
        heuristics), joined on one line; None when ``code`` has neither (or does not parse).

        EoH keeps a thought with every heuristic and shows it beside the code; a placeholder such as "published
        seed heuristic" gives the model nothing to build on, and the embedded 0.5B model copied it into its own
        ``# idea:`` line, at low temperature over and over until the token cap (2026-12-07, 32 prompts per problem).
        """
        try:
            tree = parse_bounded(code)
        except CandidateParseError:
            return None
        module_doc = ast.get_docstring(tree) or ""
        lines = module_doc.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("Idea") and line.rstrip().endswith(":"):
                para = []
                for rest in lines[i + 1 :]:
                    if not rest.strip():
                        break
                    para.append(rest.strip())
                if para:
                    return " ".join(para)
        doc = (function_docstring(code, self.function_name) or "").strip()
        return " ".join(x.strip() for x in doc.split("\n\n")[0].splitlines()) if doc else None

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
    """Sandbox target ``coevo.ahd.problem:run_target`` (runs on the trusted side).

    Args:
        fn: the candidate's heuristic function (remote or local).
        payload: ``{"problem": problem folder or name, "instances_path": InstanceSet .npz path (written and
            read by the evaluator; the candidate's process never sees it), "keep_going": bool (optional,
            default False), "instance_timeout_s": float (optional)}``.

    Returns:
        ``{"objectives": [...], "names": [...], "times_s": [...]}`` (+ ``"failures"`` with keep_going).

    Raises:
        ValueError: a payload field is missing. InvalidReturn / InfeasibleSolution from the run.
    """
    for key in ("problem", "instances_path"):
        if key not in payload:
            raise ValueError(f"payload is missing {key!r}")
    problem = load_problem(payload["problem"])
    return problem.run_heuristic(
        fn,
        InstanceSet.load(payload["instances_path"]),
        keep_going=bool(payload.get("keep_going", False)),
        instance_timeout_s=payload.get("instance_timeout_s"),
    )
