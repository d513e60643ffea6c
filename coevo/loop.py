"""CoEvolutionLoop: alternates parameter-space and context-space evolver steps over one trajectory store.

Each round runs the scheduled evolvers in order (``schedule`` in the run config: e.g. an ES step then an
EoH step every round, or a skill step every k ES generations). All evolvers read and write the same
:class:`~coevo.store.TrajectoryStore`, so each space sees the trajectories the other produced (pooled
trajectories). After every evolver step the loop writes a checkpoint (:mod:`coevo.checkpoint`): a run killed
at any moment resumes from the last completed step with ``--resume RUN_DIR``; the interrupted step is re-run
and finds its already stored trajectories by their deterministic keys, so nothing is lost or duplicated.

Budgets (:class:`~coevo.budget.Budget`) are checked before every step (LLM samples, failed ones included;
rounds; wall clock) and the wall clock also before every LLM call inside a step (the run context's sample
boundary, :meth:`~coevo.evolvers.base.RunContext.sample_boundary`) and inside every call: each step runs under
:func:`~coevo.backends.base.decode_deadline` with the budget's deadline, so the backends stop decoding there
(plain ``policy.generate`` batches and low-rank ES population batches alike). A step cut short by the
wall-clock budget keeps the samples it finished in the store; the batch that was being decoded is discarded
(no trajectory, not charged to the sample budget) and recorded as cut (artifact ``step_cut``, with the stop
line); the step is re-run, finding the finished samples and drawing the cut batch again with the same seeds,
when the run is resumed (after raising ``budget.max_wall_s`` in the run folder's ``config.yaml``).

Run identity: a new run's id is its folder's name at creation, recorded in its store (``run_identity``
artifact); a resumed run takes the recorded id, so a run folder that was copied or renamed keeps its id (its
keys, seeds and ES history stay one run's).

Wiring: every evolver is constructed (``ctx.evolvers`` is filled after the last one), then each one's
``setup()`` runs, then checkpoints are restored.

Run lifecycle (:meth:`CoEvolutionLoop.run`):

* **one owner**: the loop holds an exclusive lock on the run folder (:class:`~coevo.lock.RunLock`) from
  construction to the end of the run; a second process gets :class:`~coevo.errors.RunLockedError`;
* **interrupts** (``run(handle_signals=True)``, as ``coevo run`` does): the first SIGINT / SIGTERM asks the
  run to stop; it stops before the next step or, inside a step, before its next LLM call (the step is
  dropped, not checkpointed, and re-run on resume); a second signal aborts the current step at once. The
  summary then says what was saved (:attr:`RunSummary.interrupted`), nothing else is written;
* **progress** per batch of LLM samples and per recorded trajectory (:class:`~coevo.progress.RunProgress`),
  and the run folder's ``run.log`` (progress lines, step results, warnings of every ``coevo`` logger).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from coevo.artifacts import LOOP_STEP as STEP_KIND
from coevo.artifacts import RUN_IDENTITY, STEP_CUT
from coevo.backends.base import decode_deadline
from coevo.budget import Budget
from coevo.checkpoint import CheckpointDir
from coevo.config import (
    PLUGINS_FILE,
    RunConfig,
    load_yaml_text,
    parse_config,
    plugin_origins,
    read_plugin_origins,
    yaml_error_line,
)
from coevo.errors import (
    BudgetExhausted,
    ConfigError,
    DeadlineReached,
    PluginError,
    RunFolderError,
    RunInterrupted,
    UserError,
    unreadable_store,
)
from coevo.evolvers.base import (
    Evolver,
    RunContext,
    StepReport,
    plugin_label,
    record_report_sections,
    resolve_evolver,
    step_report_problem,
)
from coevo.lock import RunLock
from coevo.placement import check_placement, choose_placement
from coevo.progress import RunProgress
from coevo.rollouts.base import resolve_rollout
from coevo.store import TrajectoryStore
from coevo.tables import step_line
from coevo.tracking import RunTracker

log = logging.getLogger(__name__)

#: the run folder's own log (appended to by every session of the run)
RUN_LOG = "run.log"


@dataclass
class RunSummary:
    """What a finished (or stopped) run did.

    Attributes:
        interrupted: the signal number when the session was interrupted (SIGINT 2, SIGTERM 15), else None;
            ``stop_reason`` then says what was saved and how to resume, and nothing but checkpoints and
            trajectories was written (no summary.json, no report).
    """

    run_dir: Path
    rounds_completed: int
    steps: int
    samples: int
    stop_reason: str
    best_reward: dict[str, float | None] = field(default_factory=dict)
    interrupted: int | None = None
    #: wall-clock seconds the run has used, over all its sessions (``budget.max_wall_s`` counts these)
    wall_s: float | None = None


def new_run_dir(cfg: RunConfig, out: str | Path | None = None) -> Path:
    """A fresh run folder: ``out`` if given (must not hold a run), else ``<out_dir>/<name>-<UTC time>``.

    Raises:
        RunFolderError: ``out`` already holds a run, or the folder cannot be created.
    """
    try:
        if out is not None:
            path = Path(out)
            if (path / "store.sqlite").exists():
                raise RunFolderError(f"{path} already holds a run; use --resume {path} to continue it")
            path.mkdir(parents=True, exist_ok=True)
            return path
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        root = Path(cfg.run.out_dir)
        root.mkdir(parents=True, exist_ok=True)
        n = 1
        while True:  # mkdir without exist_ok: two runs started in the same second get different folders
            path = root / (f"{cfg.run.name}-{stamp}" + (f"-{n}" if n > 1 else ""))
            try:
                path.mkdir()
                return path
            except FileExistsError:
                n += 1
    except RunFolderError:
        raise
    except OSError as exc:
        raise RunFolderError(f"cannot create the run folder: {exc}") from None


def load_run_config(run_dir: Path) -> RunConfig:
    """The validated config saved in a run folder.

    Raises:
        RunFolderError: no ``config.yaml`` in ``run_dir``. ConfigError: it is not valid YAML or not valid.
    """
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise RunFolderError(f"{run_dir} holds no run (config.yaml missing)")
    try:
        data = load_yaml_text(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_error_line(path, exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config ({exc})") from None
    return parse_config(data, str(path), origins=read_plugin_origins(run_dir))


@contextmanager
def plugin_call(name: str, cls: type, method: str):
    """Run a call of evolver ``name``'s ``method``: an exception from a plugin's class (defined outside coevo,
    :func:`~coevo.evolvers.base.plugin_label`) becomes one :class:`~coevo.errors.PluginError` line naming the
    evolver, the plugin, its file and the method (the original is chained: ``-v`` shows its traceback); user
    errors, run stops and coevo's own exceptions pass unchanged."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        label = plugin_label(cls)
        if label is None:
            raise
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        detail = f"{type(exc).__name__}: {first[:300]}" if first else type(exc).__name__
        raise PluginError(f"evolvers.{name}: plugin {label}: {method}() raised {detail}") from exc


def plugin_problem(name: str, cls: type, method: str, problem: str) -> None:
    """Raise for a contract ``problem`` of evolver ``name``'s ``method``: :class:`~coevo.errors.PluginError` for
    a plugin's class, RuntimeError (a bug) for coevo's own."""
    label = plugin_label(cls)
    if label is None:
        raise RuntimeError(f"evolvers.{name}: {cls.__qualname__}.{method}() {problem}")
    raise PluginError(f"evolvers.{name}: plugin {label}: {method}() {problem}")


def check_runnable(config: RunConfig, policy_factory=None) -> None:
    """What :func:`~coevo.config.parse_config` cannot check alone, before any model loads: a parameter-space
    evolver needs a policy, from the config's ``model`` or passed in code; every rollout of the config (an
    evolver's ``rollout:``, a gate's) finds what it needs outside the config (:meth:`Rollout.check_ready`, e.g.
    the web rollout's browser).

    Raises:
        ConfigError: a parameter-space evolver, no ``model`` section and no ``policy_factory``; a placement this
            machine cannot give (:func:`coevo.placement.check_placement`: Ray missing, too few cores or GPUs).
        UserError: a rollout's check failed (e.g. :class:`~coevo.envs.browser.BrowserSetupError`: no Chromium).
    """
    if policy_factory is None and config.model is None:
        weightful = [s.name for s in config.evolvers if resolve_evolver(s.type).space == "parameter"]
        if weightful:
            raise ConfigError(
                f"evolvers.{weightful[0]}.type: a parameter-space evolver evolves the model's "
                "weights, but the config has no `model` section; add one (backend hf or vllm)"
            )
    check_placement(config.evolvers, config.model)
    seen: set[tuple[str, str]] = set()
    for spec in config.evolvers:
        for rollout in _rollout_specs(spec.params.model_dump()):
            cls = resolve_rollout(rollout["type"])
            key = (rollout["type"], repr(sorted(rollout.items())))
            if key not in seen:
                seen.add(key)
                cls.check_ready(cls.Config.model_validate(rollout))


def _rollout_specs(node: Any) -> list[dict[str, Any]]:
    """Every ``rollout: {type: ...}`` mapping under an evolver's params (its own rollout, a gate's)."""
    out: list[dict[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "rollout" and isinstance(value, dict) and isinstance(value.get("type"), str):
                out.append(value)
            else:
                out.extend(_rollout_specs(value))
    elif isinstance(node, list):
        for value in node:
            out.extend(_rollout_specs(value))
    return out


@contextmanager
def signal_handlers(handler):
    """``handler(signum, frame)`` for SIGINT and SIGTERM inside the block; the previous handlers after."""
    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def resume_command(run_dir: Path) -> str:
    """The shell command that resumes ``run_dir``."""
    import shlex

    return f"coevo run --resume {shlex.quote(str(run_dir))}"


class CoEvolutionLoop:
    """Runs the rounds of a co-evolution run.

    Args:
        config: the validated run config.
        run_dir: the run folder (created by :func:`new_run_dir`, or an existing one to resume).
        raw_config: the config mapping to save as ``config.yaml`` (new runs only).
        resume: continue from the newest checkpoint in ``run_dir``.
        progress: ``True`` / "auto" (a bar on a terminal, timestamped lines otherwise), "bar", "lines", or
            ``False`` / "off" (see :class:`~coevo.progress.RunProgress`).
        policy_factory: overrides how the policy is built (tests); default from ``config.model``.
        progress_interval_s: minimum seconds between two progress lines (lines mode and ``run.log``).
        quiet: print nothing but warnings (progress off, no "resumed" / "stopped" lines).
        log_file: a file that gets the same lines as ``run.log`` (appended).

    The loop owns the run folder from construction on (exclusive lock, :mod:`coevo.lock`) until
    :meth:`run` returns or :meth:`close` is called.

    Raises:
        RunFolderError: ``resume`` without a run in ``run_dir``, a new run in a folder that holds one, or an
            unreadable store. RunLockedError: another process owns the folder.
    """

    def __init__(
        self,
        config: RunConfig,
        run_dir: Path,
        *,
        raw_config: dict[str, Any] | None = None,
        resume: bool = False,
        progress: bool | str = True,
        policy_factory=None,
        progress_interval_s: float = 10.0,
        quiet: bool = False,
        log_file: str | Path | None = None,
    ):
        self.config = config
        self.run_dir = Path(run_dir)
        self.quiet = quiet
        self.progress_mode = "off" if quiet or progress is False else ("auto" if progress is True else str(progress))
        self.progress_interval_s = progress_interval_s
        self.log_file = Path(log_file) if log_file is not None else None
        if resume and not (self.run_dir / "config.yaml").exists():
            raise RunFolderError(f"no run to resume in {self.run_dir} (config.yaml missing)")
        if not resume:
            try:
                self.run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise RunFolderError(f"cannot create the run folder {self.run_dir}: {exc}") from None
        self.lock = RunLock(self.run_dir).acquire()
        try:
            self._open(config, raw_config, resume, policy_factory)
        except BaseException:
            self.close()
            raise

    def _open(self, config: RunConfig, raw_config, resume: bool, policy_factory) -> None:
        try:
            self.store = TrajectoryStore(self.run_dir / "store.sqlite")
        except sqlite3.DatabaseError as exc:
            raise unreadable_store(self.run_dir / "store.sqlite", exc) from None
        # checked again under the lock: another process may have run here since the caller looked
        if not resume and (self.store.count() or (self.run_dir / "checkpoints" / "LATEST").exists()):
            raise RunFolderError(f"{self.run_dir} already holds a run; use --resume {self.run_dir} to continue it")
        self.run_id = self.store.run_identity(self.run_dir.name) if resume else self.run_dir.name
        self.store.put_artifact(
            self.run_id,
            RUN_IDENTITY,
            "run",
            {"run_id": self.run_id, "folder": self.run_dir.name},
            key=f"run_identity/{self.run_id}",
        )
        if policy_factory is None and config.model is not None:
            from coevo.backends.factory import resolve_engine

            # `auto` is decided once, here, and written into config.yaml: resume, es replay and export use it
            resolved = resolve_engine(config.model)  # the same object when nothing is `auto`
            if resolved is not config.model:
                config = config.model_copy(update={"model": resolved})
                self.config = config
                if raw_config is not None:
                    model = dict(raw_config.get("model") or {})
                    model.update(backend=resolved.backend, dtype=resolved.dtype)
                    raw_config = {**raw_config, "model": model}
        if not resume and raw_config is not None:
            (self.run_dir / "config.yaml").write_text(yaml.safe_dump(raw_config, sort_keys=False))
        if not resume and (origins := plugin_origins(config)):  # resume / replay find them from any folder
            (self.run_dir / PLUGINS_FILE).write_text(json.dumps(origins, indent=1, sort_keys=True))
        self.checkpoints = CheckpointDir(self.run_dir / "checkpoints")
        b = config.budget
        self.budget = Budget(self.store, self.run_id, b.max_samples, b.max_rounds, b.max_wall_s)
        #: where the model replicas live, decided once here (coevo.placement); closed by close()
        self.placement = choose_placement(config.evolvers, config.model, policy_factory)
        self.ctx = RunContext(
            run_id=self.run_id,
            run_dir=self.run_dir,
            store=self.store,
            budget=self.budget,
            policy_factory=self.placement.policy_factory,
            placement=self.placement,
            seed=config.run.seed,
            sampling=config.sampling,
        )
        self.evolvers: dict[str, Evolver] = {}
        for spec in config.evolvers:
            cls = resolve_evolver(spec.type)
            with plugin_call(spec.name, cls, "__init__"):
                self.evolvers[spec.name] = cls(spec.name, spec.params, self.ctx)
        self.ctx.evolvers = self.evolvers
        for name, ev in self.evolvers.items():
            with plugin_call(name, type(ev), "setup"):
                ev.setup()
        self.schedule = config.resolved_schedule()
        self.round = 0
        self.slot = 0
        self.steps_done = 0
        self.resumed: str | None = None
        self.checkpoint_note: str | None = None
        self.last_checkpoint: str | None = None
        self._stopping = False
        if resume:
            self._restore()
        self.tracker = RunTracker(
            config.tracking,
            self.run_dir,
            self.run_id,
            config.run.name,
            config.model_dump(mode="json", exclude_none=True),
            self.store,
        )

    def close(self) -> None:
        """Release the policy, the store and the run folder's lock (idempotent; :meth:`run` calls it)."""
        for ev in getattr(self, "evolvers", {}).values():
            ev.release()  # the processes it started stop also after an interrupt or an error
        ctx = getattr(self, "ctx", None)
        if ctx is not None:
            ctx.close_policy()
        placement = getattr(self, "placement", None)
        if placement is not None:
            placement.close()  # its Ray actors and engines stop also after an interrupt or an error
        store = getattr(self, "store", None)
        if store is not None:
            store.close()
        self.lock.release()

    # ------------------------------------------------------------------ checkpointing
    def _restore(self) -> None:
        loaded = self.checkpoints.load()
        self.checkpoint_note = self.checkpoints.note
        if self.checkpoint_note:
            log.warning("%s", self.checkpoint_note)
        self.budget.wall_used_s = self._cut_wall_s()  # a cut session's wall time counts (module docstring)
        if loaded is None:
            log.info("no checkpoint in %s: starting the run from its first step", self.run_dir)
            self.resumed = (
                f"resumed {self.run_dir} from its first step ({self.budget.samples_used()} samples already used)"
            )
            return
        path, state, _note = loaded
        self.round, self.slot, self.steps_done = state["round"], state["slot"], state["steps_done"]
        self.budget.wall_used_s = max(state["wall_used_s"], self.budget.wall_used_s)
        self.ctx.shared.update(state["shared"])
        for name, ev in self.evolvers.items():
            with plugin_call(name, type(ev), "load_state_dict"):
                ev.load_state_dict(state["evolvers"].get(name, {}))
            sub = path / name
            if sub.exists():
                with plugin_call(name, type(ev), "load_checkpoint"):
                    ev.load_checkpoint(sub)
        self.last_checkpoint = path.name
        self.resumed = (
            f"resumed {self.run_dir} at round {self.round}, slot {self.slot} "
            f"({self.budget.samples_used()} samples already used)"
        )

    def _evolver_state(self, name: str, ev: Evolver) -> dict[str, Any]:
        """``ev.state_dict()``, checked to be a JSON mapping (:func:`plugin_problem` otherwise)."""
        with plugin_call(name, type(ev), "state_dict"):
            state = ev.state_dict()
        if not isinstance(state, dict):
            plugin_problem(name, type(ev), "state_dict", f"returned {type(state).__name__}, not a dict")
        try:
            json.dumps(state)
        except (TypeError, ValueError) as exc:
            plugin_problem(name, type(ev), "state_dict", f"returned a state that is not JSON ({exc})")
        return state

    def _checkpoint(self) -> None:
        # states first: a broken one leaves the last checkpoint as it was (nothing half-written)
        states = {name: self._evolver_state(name, ev) for name, ev in self.evolvers.items()}
        path = self.checkpoints.begin()
        for name, ev in self.evolvers.items():
            sub = path / name
            sub.mkdir()
            with plugin_call(name, type(ev), "save_checkpoint"):
                ev.save_checkpoint(sub)
        state = {
            "round": self.round,
            "slot": self.slot,
            "steps_done": self.steps_done,
            "wall_used_s": self.budget.wall_elapsed(),
            "shared": self.ctx.shared,
            "evolvers": states,
        }
        self.checkpoints.commit(path, state)
        self.last_checkpoint = path.name

    # ------------------------------------------------------------------ running
    def _due(self, round_index: int) -> list[str]:
        return [e.evolver for e in self.schedule if e.due(round_index)]

    def _rounds_completed(self) -> int:
        """Rounds whose every due step ran (or was passed over by the budget): the current round counts once the
        slot is past its last step (a run that stops right after a round's last step completed that round)."""
        finished = self.slot > 0 and self.slot >= len(self._due(self.round))
        return self.round + (1 if finished else 0)

    def _record_step(self, name: str, report: StepReport, started: float) -> None:
        content = asdict(report)
        content.update(
            round=self.round,
            evolver=name,
            space=self.evolvers[name].space,
            samples_total=self.budget.samples_used(),
            wall_s=time.time() - started,
        )
        self.store.put_artifact(
            self.run_id, STEP_KIND, name, content, key=f"{self.run_id}/step/{self.round}/{self.slot}/{name}"
        )
        self.tracker.on_step(content, self.steps_done)

    @contextmanager
    def _signals(self, enabled: bool):
        """SIGINT / SIGTERM: the first asks the run to stop at the next safe point, a second aborts the step."""
        if not enabled:
            yield
            return

        def handler(signum, _frame):
            if self._stopping:  # already cleaning up: let it finish
                return
            name = signal.Signals(signum).name
            if self.ctx.stop_requested is None:
                self.ctx.request_stop(f"interrupted by {name}", signum)
                again = "Ctrl-C" if signum == signal.SIGINT else name
                self.progress.acknowledge(
                    f"{name} received: stopping before the next batch of LLM samples (the current one finishes; "
                    f"the unfinished step re-runs on resume); {again} again stops at once"
                )
            else:
                raise RunInterrupted(f"interrupted by {name} (second signal: step aborted)", signum)

        with signal_handlers(handler):
            yield

    @contextmanager
    def _run_log(self):
        """Append the ``coevo`` loggers' INFO+ records to ``run.log`` (and ``log_file``) during the run."""
        logger = logging.getLogger("coevo")
        fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S")
        handlers = []
        for path in (self.run_dir / RUN_LOG, self.log_file):
            if path is not None:
                h = logging.FileHandler(path, mode="a", encoding="utf-8")
                h.setLevel(logging.INFO)
                h.setFormatter(fmt)
                logger.addHandler(h)
                handlers.append(h)
        old_level = logger.level
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
        try:
            yield
        finally:
            logger.setLevel(old_level)
            for h in handlers:
                logger.removeHandler(h)
                h.close()

    def run(self, *, handle_signals: bool = False) -> RunSummary:
        """Run until a budget is reached, an evolver asks to stop, or (with ``handle_signals``) a SIGINT /
        SIGTERM arrives; then write the report (not after an interrupt) and release the run folder.

        Args:
            handle_signals: install SIGINT / SIGTERM handlers for the run (main thread only), see the
                module docstring; without them a Ctrl-C raises KeyboardInterrupt as usual.
        """
        self.progress = RunProgress(
            self.progress_mode,
            interval_s=self.progress_interval_s,
            max_rounds=self.config.budget.max_rounds,
            max_samples=self.config.budget.max_samples,
            quiet=self.quiet,
            model=self.config.model.name if self.config.model is not None else None,
        )
        self.ctx.progress = self.progress.event
        self._current: tuple[int, str] | None = None
        try:
            with self._run_log(), self._signals(handle_signals):
                log.info(
                    "session start: pid %d, %s, argv %s",
                    os.getpid(),
                    "resume" if self.resumed else "new run",
                    " ".join(sys.argv),
                )
                self.progress.start(
                    self.round,
                    self.budget.samples_used(),
                    text_calls=self.budget.text_calls_used(),
                    elapsed_s=self.budget.wall_used_s,
                )
                if self.resumed:
                    self.progress.note(self.resumed)
                steps_before = self.steps_done
                try:
                    stop_reason = self._rounds()
                except BudgetExhausted as stop:
                    stop_reason = self._cut(stop)
                except RunInterrupted as stop:
                    self._stopping = True
                    return self._interrupted(stop)
                self._stopping = True
                self.progress.close()
                if self.steps_done == steps_before:
                    stop_reason = self._earlier_stop(stop_reason)
                self.progress.note(f"stopped: {stop_reason}")
                summary = RunSummary(
                    run_dir=self.run_dir,
                    rounds_completed=self._rounds_completed(),
                    steps=self.steps_done,
                    samples=self.budget.samples_used(),
                    stop_reason=stop_reason,
                    best_reward={n: self.store_best(n) for n in self.evolvers},
                    wall_s=round(self.budget.wall_elapsed(), 1),
                )
                self._finish(summary)
                return summary
        finally:
            self.progress.close()
            self.ctx.progress = None
            self.close()

    def _rounds(self) -> str:
        """The round loop; returns the stop reason (raises RunStop from inside a step)."""
        best: dict[str, float | None] = {}
        while True:
            if self.ctx.stop_requested is not None:  # a safe point: the last step is checkpointed
                raise RunInterrupted(*self.ctx.stop_requested)
            due = self._due(self.round)
            stop_reason = self.budget.exhausted(next_round=self.round if self.slot == 0 else None)
            if stop_reason:
                # the sample budget ends the LLM steps only: token-free steps (e.g. ``tune``) still due in this
                # round run on what the LLM steps made, then the run stops
                if stop_reason != self.budget.sample_exhausted():
                    return stop_reason
                while self.slot < len(due) and getattr(self.evolvers[due[self.slot]], "uses_llm", True):
                    self.slot += 1
                if self.slot >= len(due):
                    return stop_reason
            if self.slot >= len(due):
                self.round, self.slot = self.round + 1, 0
                self.progress.round_changed(self.round)
                continue
            name = due[self.slot]
            evolver = self.evolvers[name]
            self.ctx.round = self.round
            self._current = (self.round, name)
            self.progress.step_started(self.round, name, evolver.space, self.budget.samples_used())
            started = time.time()
            with decode_deadline(self.budget.deadline()), plugin_call(name, type(evolver), "step"):
                report = evolver.step(self.round)
            problem = step_report_problem(report)
            if problem is not None:
                plugin_problem(name, type(evolver), "step", problem)
            self._record_step(name, report, started)
            if report.best_reward is not None:
                prev = best.get(name)
                best[name] = report.best_reward if prev is None else max(prev, report.best_reward)
            self.slot += 1
            self.steps_done += 1
            self._checkpoint()
            self._current = None
            self.progress.step_finished(self.budget.samples_used(), best)
            log.info("round %d %s: %s", self.round, name, step_line(asdict(report)))
            if report.stop:
                return f"{name} stopped the run: {report.stop_reason}"

    def _cut(self, stop: BudgetExhausted) -> str:
        """Record the step the wall-clock budget cut (artifact ``step_cut``) and return the stop line."""
        r, name = self._current or (self.round, "?")
        reason = self.budget.wall_exhausted() or stop.reason
        batch = stop.to_dict() if isinstance(stop, DeadlineReached) else None
        samples = self.budget.samples_used()
        wall = self.budget.wall_elapsed()
        self.store.put_artifact(
            self.run_id,
            STEP_CUT,
            name,
            {
                "round": r,
                "slot": self.slot,
                "evolver": name,
                "space": self.evolvers[name].space if name in self.evolvers else None,
                "reason": reason,
                "wall_s": wall,
                "max_wall_s": self.budget.max_wall_s,
                "samples_total": samples,
                "cut_batch": batch,
            },
            key=f"{self.run_id}/step_cut/{r}/{self.slot}/{name}/{wall:.3f}",
        )
        where = f"{reason} inside round {r}, step {name}"
        if batch is not None:
            where += (
                f": decoding stopped at the deadline, a call of {batch['rows']} samples cut after "
                f"{batch['decode_s']:.0f} s (recorded as cut, not charged to the sample budget)"
            )
        return f"{where}; the samples the step finished are stored, the step re-runs on resume"

    def _cut_wall_s(self) -> float:
        """The largest wall time recorded by a cut step of this run (0.0 if none)."""
        cuts = self.store.list_artifacts(kind=STEP_CUT, run_id=self.run_id)
        return max((float(a.content.get("wall_s") or 0.0) for a in cuts), default=0.0)

    def _earlier_stop(self, stop_reason: str) -> str:
        """The stop reason of a resumed session that ran no step: the one its ``summary.json`` recorded when the run
        had already stopped (resuming a finished run keeps "ES completed its 10 generations"), else ``stop_reason``."""
        path = self.run_dir / "summary.json"
        if not self.resumed or not path.is_file():
            return stop_reason
        try:
            before = json.loads(path.read_text()).get("stop_reason")
        except (OSError, ValueError, AttributeError):
            return stop_reason
        if not isinstance(before, str) or not before or before == stop_reason:
            return stop_reason
        self.progress.note(
            f"the run had already stopped ({before}) and no step ran now ({stop_reason}); to continue, raise the "
            f"limits that stopped it in {self.run_dir / 'config.yaml'}"
        )
        return before

    def _interrupted(self, stop: RunInterrupted) -> RunSummary:
        """Summary of an interrupted session: what is saved and how to resume (nothing else is written)."""
        self.progress.close()
        n_traj = self.store.count(run_id=self.run_id)
        where = (
            f"during round {self._current[0]}, step {self._current[1]} (dropped; it re-runs on resume)"
            if self._current
            else "between steps"
        )
        saved = (
            f"checkpoint {self.last_checkpoint} (round {self.round}, slot {self.slot})"
            if self.last_checkpoint
            else "no checkpoint yet"
        )
        reason = (
            f"{stop.reason} {where}; saved: {saved}, {n_traj} trajectories and {self.budget.samples_used()} LLM samples in "
            f"{self.run_dir / 'store.sqlite'}; resume with: {resume_command(self.run_dir)}"
        )
        log.info("%s", reason)
        return RunSummary(
            run_dir=self.run_dir,
            rounds_completed=self._rounds_completed(),
            steps=self.steps_done,
            samples=self.budget.samples_used(),
            stop_reason=reason,
            interrupted=stop.signum,
        )

    def store_best(self, evolver: str) -> float | None:
        top = self.store.top_k(1, run_id=self.run_id, evolver=evolver)
        return top[0].reward if top else None

    def _finish(self, summary: RunSummary) -> None:
        from coevo.report import write_report

        (self.run_dir / "summary.json").write_text(
            json.dumps({**asdict(summary), "run_dir": str(summary.run_dir)}, indent=1)
        )
        record_report_sections(self.store, self.run_id, self.evolvers)
        write_report(self.run_dir, self.store, self.run_id, plots=self.config.report.plots)
        self.tracker.close({"stop_reason": summary.stop_reason, "samples": summary.samples})
        for ev in self.evolvers.values():
            ev.close()
