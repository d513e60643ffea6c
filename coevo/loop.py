"""CoEvolutionLoop: alternates parameter-space and context-space evolver steps over one trajectory store.

Each round runs the scheduled evolvers in order (``schedule`` in the run config: e.g. an ES step then an
EoH step every round, or a skill step every k ES generations). All evolvers read and write the same
:class:`~coevo.store.TrajectoryStore`, so each space sees the trajectories the other produced (pooled
trajectories). After every evolver step the loop writes a checkpoint (:mod:`coevo.checkpoint`): a run killed
at any moment resumes from the last completed step with ``--resume RUN_DIR``; the interrupted step is re-run
and finds its already stored trajectories by their deterministic keys, so nothing is lost or duplicated.

Budgets (:class:`~coevo.budget.Budget`) are checked before every step: LLM samples (failed ones included),
rounds and wall clock.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from coevo.artifacts import LOOP_STEP as STEP_KIND
from coevo.budget import Budget
from coevo.checkpoint import CheckpointDir
from coevo.config import RunConfig, parse_config
from coevo.evolvers.base import Evolver, RunContext, StepReport, record_report_sections, resolve_evolver
from coevo.store import TrajectoryStore

log = logging.getLogger(__name__)




@dataclass
class RunSummary:
    """What a finished (or stopped) run did."""

    run_dir: Path
    rounds_completed: int
    steps: int
    samples: int
    stop_reason: str
    best_reward: dict[str, float | None] = field(default_factory=dict)


def new_run_dir(cfg: RunConfig, out: str | Path | None = None) -> Path:
    """A fresh run folder: ``out`` if given (must not hold a run), else ``<out_dir>/<name>-<UTC time>``."""
    if out is not None:
        path = Path(out)
        if (path / "store.sqlite").exists():
            raise FileExistsError(f"{path} already holds a run; use --resume {path} to continue it")
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        path = Path(cfg.run.out_dir) / f"{cfg.run.name}-{stamp}"
        n = 1
        while path.exists():
            n += 1
            path = Path(cfg.run.out_dir) / f"{cfg.run.name}-{stamp}-{n}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def load_run_config(run_dir: Path) -> RunConfig:
    """The validated config saved in a run folder."""
    data = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    return parse_config(data, str(Path(run_dir) / "config.yaml"))


class CoEvolutionLoop:
    """Runs the rounds of a co-evolution run.

    Args:
        config: the validated run config.
        run_dir: the run folder (created by :func:`new_run_dir`, or an existing one to resume).
        raw_config: the config mapping to save as ``config.yaml`` (new runs only).
        resume: continue from the newest checkpoint in ``run_dir``.
        progress: show rich progress bars.
        policy_factory: overrides how the policy is built (tests); default from ``config.model``.

    Raises:
        FileNotFoundError: ``resume`` without a run in ``run_dir``.
    """

    def __init__(
        self,
        config: RunConfig,
        run_dir: Path,
        *,
        raw_config: dict[str, Any] | None = None,
        resume: bool = False,
        progress: bool = True,
        policy_factory=None,
    ):
        self.config = config
        self.run_dir = Path(run_dir)
        self.console = Console(stderr=True)
        self.show_progress = progress
        if resume and not (self.run_dir / "config.yaml").exists():
            raise FileNotFoundError(f"no run to resume in {self.run_dir} (config.yaml missing)")
        if not resume:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        if not resume and raw_config is not None:
            (self.run_dir / "config.yaml").write_text(yaml.safe_dump(raw_config, sort_keys=False))
        self.run_id = self.run_dir.name
        self.store = TrajectoryStore(self.run_dir / "store.sqlite")
        self.checkpoints = CheckpointDir(self.run_dir / "checkpoints")
        b = config.budget
        self.budget = Budget(self.store, self.run_id, b.max_samples, b.max_rounds, b.max_wall_s)
        if policy_factory is None and config.model is not None:
            from coevo.backends.factory import make_policy_factory

            policy_factory = make_policy_factory(config.model)
        self.ctx = RunContext(
            run_id=self.run_id,
            run_dir=self.run_dir,
            store=self.store,
            budget=self.budget,
            policy_factory=policy_factory,
            seed=config.run.seed,
            sampling=config.sampling,
        )
        self.evolvers: dict[str, Evolver] = {}
        for spec in config.evolvers:
            cls = resolve_evolver(spec.type)
            self.evolvers[spec.name] = cls(spec.name, spec.params, self.ctx)
        self.ctx.evolvers = self.evolvers
        self.schedule = config.resolved_schedule()
        self.round = 0
        self.slot = 0
        self.steps_done = 0
        if resume:
            self._restore()

    # ------------------------------------------------------------------ checkpointing
    def _restore(self) -> None:
        loaded = self.checkpoints.load()
        if loaded is None:
            log.info("no checkpoint in %s: starting the run from its first step", self.run_dir)
            return
        path, state = loaded
        self.round, self.slot, self.steps_done = state["round"], state["slot"], state["steps_done"]
        self.budget.wall_used_s = state["wall_used_s"]
        self.ctx.shared.update(state["shared"])
        for name, ev in self.evolvers.items():
            ev.load_state_dict(state["evolvers"].get(name, {}))
            sub = path / name
            if sub.exists():
                ev.load_checkpoint(sub)
        self.console.print(
            f"[bold]resumed[/] {self.run_dir} at round {self.round}, slot {self.slot} "
            f"({self.budget.samples_used()} samples already used)"
        )

    def _checkpoint(self) -> None:
        path = self.checkpoints.begin()
        for name, ev in self.evolvers.items():
            sub = path / name
            sub.mkdir()
            ev.save_checkpoint(sub)
        state = {
            "round": self.round,
            "slot": self.slot,
            "steps_done": self.steps_done,
            "wall_used_s": self.budget.wall_elapsed(),
            "shared": self.ctx.shared,
            "evolvers": {name: ev.state_dict() for name, ev in self.evolvers.items()},
        }
        self.checkpoints.commit(path, state)

    # ------------------------------------------------------------------ running
    def _due(self, round_index: int) -> list[str]:
        return [e.evolver for e in self.schedule if e.due(round_index)]

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

    def run(self) -> RunSummary:
        """Run until a budget is reached or an evolver asks to stop; then write the report."""
        stop_reason: str | None = None
        max_samples = self.config.budget.max_samples
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not self.show_progress,
            transient=False,
        ) as progress:
            rounds_bar = progress.add_task("rounds", total=self.config.budget.max_rounds, info="", completed=self.round)
            samples_bar = progress.add_task(
                "LLM samples", total=max_samples, info="", completed=self.budget.samples_used()
            )
            best: dict[str, float | None] = {}
            while True:
                due = self._due(self.round)
                stop_reason = self.budget.exhausted(next_round=self.round if self.slot == 0 else None)
                if stop_reason:
                    break
                if self.slot >= len(due):
                    self.round, self.slot = self.round + 1, 0
                    progress.update(rounds_bar, completed=self.round)
                    continue
                name = due[self.slot]
                evolver = self.evolvers[name]
                self.ctx.round = self.round
                progress.update(rounds_bar, info=f"round {self.round} · {name} ({evolver.space})")
                started = time.time()
                report = evolver.step(self.round)
                self._record_step(name, report, started)
                if report.best_reward is not None:
                    prev = best.get(name)
                    best[name] = report.best_reward if prev is None else max(prev, report.best_reward)
                self.slot += 1
                self.steps_done += 1
                self._checkpoint()
                info = " ".join(f"{k}={v:.4g}" for k, v in best.items() if v is not None)
                progress.update(samples_bar, completed=self.budget.samples_used(), info=f"best {info}")
                log.info("round %d %s: %s", self.round, name, report)
                if report.stop:
                    stop_reason = f"{name} stopped the run: {report.stop_reason}"
                    break
        self.console.print(f"[bold]stopped:[/] {stop_reason}")
        summary = RunSummary(
            run_dir=self.run_dir,
            rounds_completed=self.round,
            steps=self.steps_done,
            samples=self.budget.samples_used(),
            stop_reason=stop_reason,
            best_reward={n: self.store_best(n) for n in self.evolvers},
        )
        self._finish(summary)
        return summary

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
        for ev in self.evolvers.values():
            ev.close()
        if self.ctx._policy is not None:
            self.ctx._policy.close()
        self.store.close()
