"""Mirror a run's metrics to the experiment trackers researchers use: TensorBoard, MLflow, Weights & Biases.

Optional and off by default: the run config's ``tracking:`` section (:class:`TrackingConfig`) turns each
tracker on::

    tracking: {tensorboard: true, mlflow: true, wandb: true}   # files under <run_dir>/tracking/

The loop owns one :class:`RunTracker` (an observer) and calls :meth:`RunTracker.on_step` after every
evolver step with the step's record (the ``loop_step`` artifact content: round, evolver, space, samples,
trajectories, best_reward, metrics, samples_total, wall_s) and :meth:`RunTracker.close` at the end.
What is logged, per tracker:

- per evolver step, at step = the loop's step index (0, 1, ... over the whole run, resumes included):
  ``<evolver>/step/<metric>`` for ``samples``, ``trajectories``, ``best_reward``, ``wall_s`` and every
  number of the step's ``metrics``; ``run/samples_total``, ``run/round`` and ``run/best_reward/<evolver>``
  (best so far);
- per ES generation (read from the store's ES history after a parameter-space step), at step = the
  generation: ``<evolver>/generation/{sigma, alpha, reward_mean, reward_max, reward_min, update_norm,
  changed_fraction, test_reward_before}`` and, on TensorBoard, histograms of the member rewards and of the
  normalised coefficients (``<evolver>/generation/member_rewards``, ``.../coeffs``). W&B needs one
  increasing step, so there generation rows are logged at the loop's step with ``<evolver>/generation/index``
  as their x axis (``define_metric``).

Only finite numbers are logged (``None``, NaN and infinities are dropped). Where each tracker writes:
TensorBoard event files in ``<dir>/tensorboard`` (``torch.utils.tensorboard``, needs the ``tensorboard``
package); MLflow, by default a local file store ``<dir>/mlruns`` (experiment = ``experiment`` or the run
name, MLflow run named after the run id, resumed on ``--resume``) or any ``mlflow_tracking_uri``; W&B in
offline mode in ``<dir>/wandb`` when the ``wandb`` package is installed (``wandb sync`` uploads it later).
``<dir>`` is ``tracking.dir`` or ``<run_dir>/tracking``. Install with ``pip install 'coevo[tracking]'``.

Failure policy: a tracker that cannot start, or raises while logging or closing, logs one warning naming it
and is switched off for the rest of the run; the run itself never stops because of a tracker.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field

from coevo.schema import ConfigModel

log = logging.getLogger(__name__)

#: fields of an ES history row (``coevo.evolvers.es``) mirrored per generation, and their logged names
ES_FIELDS = {"sigma": "sigma", "alpha": "alpha", "test_reward_before": "test_reward_before"}
UPDATE_FIELDS = ("update_norm", "changed_fraction")


class TrackingConfig(ConfigModel):
    """The ``tracking:`` section of a run config (every tracker off by default)."""

    model_config = ConfigDict(extra="forbid")
    tensorboard: bool = Field(False, description="write TensorBoard event files to <dir>/tensorboard")
    mlflow: bool = Field(False, description="log to MLflow (default: a local file store in <dir>/mlruns)")
    wandb: bool = Field(False, description="log to Weights & Biases in offline mode (<dir>/wandb), if installed")
    dir: str | None = Field(None, description="folder of the trackers' files (default <run_dir>/tracking)")
    mlflow_tracking_uri: str | None = Field(None, description="MLflow tracking URI (default file store <dir>/mlruns)")
    experiment: str | None = Field(None, description="MLflow experiment / W&B project (default: run.name)")

    @property
    def enabled(self) -> bool:
        return self.tensorboard or self.mlflow or self.wandb


def _finite(x: Any) -> float | None:
    if isinstance(x, bool):
        return float(x)
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _scalars(items: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in ((k, _finite(v)) for k, v in items.items()) if v is not None}


def flatten_params(config: dict[str, Any], prefix: str = "", limit: int = 500) -> dict[str, str]:
    """A nested config as ``{"a.b.c": "value"}`` strings (lists kept as their text, cut to ``limit`` chars),
    for trackers' parameter tables. Evolver entries are keyed by their ``name``."""
    out: dict[str, str] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if key == "evolvers" and isinstance(value, list):
            for i, ev in enumerate(value):
                name = ev.get("name", str(i)) if isinstance(ev, dict) else str(i)
                out.update(
                    flatten_params(ev, f"{path}.{name}.", limit)
                    if isinstance(ev, dict)
                    else {f"{path}.{i}": str(ev)[:limit]}
                )
        elif isinstance(value, dict):
            out.update(flatten_params(value, f"{path}.", limit))
        else:
            out[path] = str(value)[:limit]
    return out


# --------------------------------------------------------------------------------------------- backends
class _TensorBoard:
    name = "tensorboard"

    def __init__(self, folder: Path, params: dict[str, str]) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package

        self.writer = SummaryWriter(log_dir=str(folder / "tensorboard"))
        self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in sorted(params.items())), 0)

    def log(self, scalars: dict[str, float], step: int, histograms: dict[str, list[float]] | None = None) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        for key, values in (histograms or {}).items():
            finite = [v for v in values if math.isfinite(v)]
            if finite:
                import numpy as np

                self.writer.add_histogram(key, np.asarray(finite, dtype=np.float64), step)
        self.writer.flush()

    def close(self, summary: dict[str, Any] | None) -> None:
        if summary and summary.get("stop_reason"):
            self.writer.add_text("stop_reason", str(summary["stop_reason"]), 0)
        self.writer.close()


class _MLflow:
    name = "mlflow"

    def __init__(self, folder: Path, params: dict[str, str], run_id: str, experiment: str, uri: str | None) -> None:
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # no usage reports from offline machines
        if uri is None:
            # MLflow 3 keeps the file store in maintenance mode and refuses it unless opted in; it is the
            # dependency-free local store (a SQLite store needs SQLAlchemy and Alembic).
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (folder / "mlruns").resolve().as_uri()
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        self.uri = uri
        id_file = folder / "mlflow_run_id"
        known = id_file.read_text().strip() if id_file.is_file() else None
        if known:
            self.run_id = known
            self.client.update_run(known, status="RUNNING")
        else:
            exp = self.client.get_experiment_by_name(experiment)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(experiment)
            self.run_id = self.client.create_run(exp_id, run_name=run_id, tags={"coevo.run_id": run_id}).info.run_id
            id_file.write_text(self.run_id)
            from mlflow.entities import Param

            items = [Param(k[:250], v) for k, v in sorted(params.items())]
            for i in range(0, len(items), 100):
                self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log(self, scalars: dict[str, float], step: int, histograms: dict[str, list[float]] | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in scalars.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def close(self, summary: dict[str, Any] | None) -> None:
        if summary and summary.get("stop_reason"):
            self.client.set_tag(self.run_id, "coevo.stop_reason", str(summary["stop_reason"])[:5000])
        self.client.set_terminated(self.run_id, status="FINISHED")


class _WandB:
    name = "wandb"

    def __init__(self, folder: Path, params: dict[str, str], run_id: str, project: str) -> None:
        import wandb

        (folder / "wandb").mkdir(parents=True, exist_ok=True)
        id_file = folder / "wandb_run_id"
        wid = id_file.read_text().strip() if id_file.is_file() else None
        self.run = wandb.init(
            project=project, name=run_id, id=wid, resume="allow", mode="offline", dir=str(folder), config=params
        )
        id_file.write_text(self.run.id)
        self._defined: set[str] = set()

    def log(self, scalars: dict[str, float], step: int, histograms: dict[str, list[float]] | None = None) -> None:
        for key in scalars:
            if key.endswith("/generation/index"):
                prefix = key[: -len("index")]
                if prefix not in self._defined:
                    self.run.define_metric(f"{prefix}*", step_metric=key)
                    self._defined.add(prefix)
        self.run.log(scalars, step=step)

    def close(self, summary: dict[str, Any] | None) -> None:
        if summary and summary.get("stop_reason"):
            self.run.summary["stop_reason"] = str(summary["stop_reason"])
        self.run.finish()


# ----------------------------------------------------------------------------------------------- observer
class RunTracker:
    """The loop's observer that mirrors its metrics to the enabled trackers (see the module doc).

    Args:
        config: the ``tracking`` section (nothing is started when every tracker is off).
        run_dir: the run folder. run_id: the run's id (its folder name). run_name: ``run.name``.
        params: the run config as a mapping (logged as flattened parameters).
        store: the run's trajectory store (ES history rows are read from it); ``None`` skips them.

    Never raises after construction; a failing tracker is switched off with one warning.
    """

    def __init__(
        self,
        config: TrackingConfig | None,
        run_dir: Path,
        run_id: str,
        run_name: str,
        params: dict[str, Any] | None = None,
        store: Any = None,
    ) -> None:
        self.config = config or TrackingConfig()
        self.run_id = run_id
        self.store = store
        self.backends: list[Any] = []
        self.best: dict[str, float] = {}
        self.es_done: dict[str, int] = {}
        if not self.config.enabled:
            return
        folder = Path(self.config.dir) if self.config.dir else Path(run_dir) / "tracking"
        flat = flatten_params(params or {})
        experiment = self.config.experiment or run_name
        wanted = [
            ("tensorboard", self.config.tensorboard, lambda: _TensorBoard(folder, flat)),
            (
                "mlflow",
                self.config.mlflow,
                lambda: _MLflow(folder, flat, run_id, experiment, self.config.mlflow_tracking_uri),
            ),
            ("wandb", self.config.wandb, lambda: _WandB(folder, flat, run_id, experiment)),
        ]
        for name, on, make in wanted:
            if not on:
                continue
            try:
                folder.mkdir(parents=True, exist_ok=True)
                self.backends.append(make())
            except Exception as exc:  # noqa: BLE001 - any tracker failure must leave the run going
                hint = ""
                if isinstance(exc, ImportError):
                    hint = " (pip install wandb)" if name == "wandb" else " (pip install 'coevo[tracking]')"
                log.warning("tracking: %s is off for this run: %s: %s%s", name, type(exc).__name__, exc, hint)
        if store is not None:  # generations logged by an earlier process of this run (resume) are not repeated
            for name, last in self._stored_generations().items():
                self.es_done[name] = last

    @property
    def active(self) -> list[str]:
        """Names of the trackers still logging."""
        return [b.name for b in self.backends]

    def _call(self, method: str, *args: Any) -> None:
        for backend in list(self.backends):
            try:
                getattr(backend, method)(*args)
            except Exception as exc:  # noqa: BLE001
                log.warning(
                    "tracking: %s failed in %s and is off for the rest of the run: %s: %s",
                    backend.name,
                    method,
                    type(exc).__name__,
                    exc,
                )
                self.backends.remove(backend)

    def _stored_generations(self) -> dict[str, int]:
        rows = self.store.conn.execute(
            "SELECT evolver, MAX(generation) FROM es_history WHERE run_id = ? GROUP BY evolver", (self.run_id,)
        ).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def on_step(self, record: dict[str, Any], step: int) -> None:
        """Log one evolver step's record (and, after a parameter-space step, its new ES generations)."""
        if not self.backends:
            return
        name = str(record.get("evolver"))
        scalars = _scalars(
            {f"{name}/step/{k}": record.get(k) for k in ("samples", "trajectories", "best_reward", "wall_s")}
        )
        scalars.update(_scalars({f"{name}/step/{k}": v for k, v in (record.get("metrics") or {}).items()}))
        scalars.update(_scalars({"run/samples_total": record.get("samples_total"), "run/round": record.get("round")}))
        best = _finite(record.get("best_reward"))
        if best is not None:
            self.best[name] = max(self.best.get(name, -math.inf), best)
        scalars.update({f"run/best_reward/{k}": v for k, v in self.best.items()})
        self._call("log", scalars, int(step))
        if record.get("space") == "parameter" and self.store is not None:
            self._log_generations(name, int(step))

    def _log_generations(self, evolver: str, step: int) -> None:
        try:
            rows = self.store.es_history(self.run_id, evolver)
        except Exception as exc:  # noqa: BLE001
            log.warning("tracking: cannot read the ES history of %s: %s", evolver, exc)
            return
        for row in rows:
            g = int(row["generation"])
            if g <= self.es_done.get(evolver, -1):
                continue
            rewards = [float(r) for r in row.get("rewards") or []]
            finite = [r for r in rewards if math.isfinite(r)]
            update = row.get("update") or {}
            values = {f: row.get(k) for k, f in ES_FIELDS.items()}
            values.update({f: update.get(f) for f in UPDATE_FIELDS})
            if finite:
                values.update(reward_mean=sum(finite) / len(finite), reward_max=max(finite), reward_min=min(finite))
            prefix = f"{evolver}/generation/"
            scalars = _scalars({prefix + k: v for k, v in values.items()})
            hists = {prefix + "member_rewards": rewards, prefix + "coeffs": [float(c) for c in row.get("coeffs") or []]}
            for backend in list(self.backends):
                try:
                    if backend.name == "wandb":
                        backend.log({**scalars, prefix + "index": float(g)}, step)
                    else:
                        backend.log(scalars, g, hists)
                except Exception as exc:  # noqa: BLE001
                    log.warning(
                        "tracking: %s failed in log and is off for the rest of the run: %s: %s",
                        backend.name,
                        type(exc).__name__,
                        exc,
                    )
                    self.backends.remove(backend)
            self.es_done[evolver] = g

    def close(self, summary: dict[str, Any] | None = None) -> None:
        """Finish every tracker (``summary``: the run summary, its ``stop_reason`` is recorded)."""
        self._call("close", summary)
        self.backends = []
