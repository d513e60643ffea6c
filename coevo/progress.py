"""Live progress of a run for the person watching it: a bar on a terminal, timestamped lines otherwise.

:class:`RunProgress` is fed by the loop (rounds, steps) and, through the run context's ``progress``
callback (:meth:`coevo.evolvers.base.RunContext.report_progress`), from inside a step: ``"sampling"`` before
a batch of LLM samples, ``"samples"`` when the batch is drawn, ``"trajectories"`` when a trajectory (an
evaluated candidate, a member's case) is recorded, ``"text"`` when free-text calls (reflections: they are LLM
samples that make no candidate) are recorded, so the line says how many of the samples were text. So the counters move per batch of samples and per
candidate, not once per evolver step.

Modes:

* ``bar``: rich progress bars (rounds, LLM samples, the current step) on the stream, for a terminal;
* ``lines``: plain lines ``YYYY-mm-dd HH:MM:SS round 2/11 es (parameter): ...`` at most one per
  ``interval_s`` seconds, plus a heartbeat line when nothing happened for ``interval_s`` (model loading, a
  long batch), for logs, CI and ``nohup``;
* ``off``: nothing on the stream.

``auto`` picks ``bar`` when the stream is a terminal, else ``lines``. In every mode the same bounded-rate
lines are also logged (logger ``coevo.progress``, INFO), which the loop writes to the run folder's
``run.log``.

Long phases show life: while the run's model is created (``"loading"`` ... ``"loaded"``, minutes for a first
build of the embedded model) the line says so, and the progress bars of libraries (transformers' GGUF
conversion, written with ``tqdm`` to stderr) are kept off the stream: their latest state is shown in the
line instead (:class:`_BarSink`). While a model batch decodes, the backend's counter
(:class:`coevo.backends.streaming.DecodeCounter`) reports the rows finished and tokens decoded, so the
line changes during a 15-minute batch. :meth:`RunProgress.acknowledge` prints a message at once from
another context (the loop's SIGINT handler: "stopping after the current batch"), through the heartbeat
thread, so a signal handler never writes to the stream itself.
"""

from __future__ import annotations

import io
import logging
import re
import sys
import threading
import time
from typing import TextIO

log = logging.getLogger("coevo.progress")


def _hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def loading_text(model: str | None) -> str:
    """What the line says while the run's model is created: ``loading model NAME``, or, for an embedded model
    not built yet, that it is being built first (about two minutes)."""
    if not model:
        return "loading the model"
    try:
        from coevo.backends.models import MODEL_REGISTRY, default_cache_dir, read_marker

        spec = MODEL_REGISTRY.get(model)
        if (
            spec is not None
            and (read_marker(default_cache_dir() / "models" / spec.name) or {}).get("sha256") != spec.sha256
        ):
            return (
                f"building model {model} from its installed GGUF packages (first use: about 2 min for the 0.5B, "
                "4+ for the 1.5B), then loading it"
            )
    except (ImportError, OSError, ValueError):
        pass
    return f"loading model {model}"


class _BarSink(io.TextIOBase):
    """Stands in for ``sys.stderr`` while the model is created: a progress bar's redraws (``tqdm`` writes
    ``"\r" + bar``, then a lone newline when it closes) are kept, the latest as :attr:`bar`; any other text
    (warnings) goes on to the real stream."""

    def __init__(self, real: TextIO) -> None:
        super().__init__()
        self.real = real
        self.bar: str | None = None
        self._open = False

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if "\r" in text:
            tail = text.rsplit("\r", 1)[-1].strip()
            if tail:  # "Converting ...: 31%|###   | 89/291 [00:12<00:05, 39.21it/s]" without the bar's drawing
                self.bar = re.sub(r"\s+", " ", re.sub(r"\|[^|]*\|", " ", tail)).strip()
            self._open = True
            return len(text)
        if self._open and text.strip() == "":
            self._open = False
            return len(text)
        self.real.write(text)
        return len(text)

    def flush(self) -> None:
        self.real.flush()


class RunProgress:
    """Progress display of one run session (module docstring).

    Args:
        mode: "auto", "bar", "lines" or "off".
        stream: where bars / lines go (default ``sys.stderr``).
        interval_s: minimum seconds between two progress lines (lines mode and the log), > 0.
        max_rounds, max_samples: budget totals shown beside the counters (None = unknown).
        quiet: :meth:`note` only logs (in every mode, including "off", notes are printed otherwise).
        model: the run's model name, for the line shown while it loads (None: "the model").
    """

    def __init__(
        self,
        mode: str = "auto",
        *,
        stream: TextIO | None = None,
        interval_s: float = 10.0,
        max_rounds: int | None = None,
        max_samples: int | None = None,
        quiet: bool = False,
        model: str | None = None,
    ) -> None:
        if mode not in ("auto", "bar", "lines", "off"):
            raise ValueError(f"progress mode must be auto, bar, lines or off, got {mode!r}")
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if getattr(self.stream, "isatty", lambda: False)() else "lines"
        self.mode = mode
        self.quiet = quiet
        self.interval_s = float(interval_s)
        self.max_rounds, self.max_samples = max_rounds, max_samples
        self.round = 0
        self.step: tuple[str, str] | None = None  # (evolver, space)
        self.samples_base = 0  # samples in the store when the step started
        self.step_samples = 0  # drawn in the current step (reported by the policy hook)
        self.step_trajectories = 0
        self.text_base = 0  # free-text calls in the store when the session started
        self.text_calls = 0  # free-text calls recorded in this session
        self.step_text = 0  # of them in the current step
        self.pending = 0  # samples being drawn right now
        self.model = model
        self.loading: str | None = None  # what is being loaded (the line says it), None when nothing is
        self.batch_rows = 0  # rows of the model batch decoding now (0: none), its rows finished, tokens decoded
        self.rows_done = 0
        self.tokens = 0
        self._sink: _BarSink | None = None
        self._acks: list[str] = []
        self._wake = threading.Event()
        self.best: dict[str, float] = {}
        self.started = time.monotonic()
        self._last_line = float("-inf")
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar = None
        self._tasks: dict[str, int] = {}

    # ------------------------------------------------------------------ lifecycle
    def start(self, round_index: int, samples_used: int, *, text_calls: int = 0, elapsed_s: float = 0.0) -> None:
        """Begin showing progress (a run at ``round_index`` with ``samples_used`` samples in the store, of them
        ``text_calls`` free-text calls; ``elapsed_s``: wall seconds of the run's earlier sessions, so ``elapsed``
        counts from the run's start on a resume, as the report's wall clock does)."""
        self.round, self.samples_base, self.text_base = round_index, samples_used, text_calls
        self.started = time.monotonic() - max(0.0, elapsed_s)
        if self.mode == "bar":
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._bar.start()
            self._tasks["rounds"] = self._bar.add_task("rounds", total=self.max_rounds, completed=round_index, info="")
            self._tasks["samples"] = self._bar.add_task(
                "LLM samples", total=self.max_samples, completed=samples_used, info=""
            )
        self._thread = threading.Thread(target=self._heartbeat, name="coevo-progress", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the bar and the heartbeat, print any acknowledgement not printed yet (idempotent)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with self._lock:
            self._release_stderr()
            self._print_acks()
            if self._bar is not None:
                self._bar.stop()
                self._bar = None

    def acknowledge(self, text: str) -> None:
        """Print ``text`` at once (within a fraction of a second, through the heartbeat thread; logged only when
        quiet); safe to call from a signal handler (it only queues the text)."""
        self._acks.append(text)
        self._wake.set()

    def _print_acks(self) -> None:
        while self._acks:
            text = self._acks.pop(0)
            log.info(text)
            if not self.quiet:
                self._print(text)

    def _print(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
        else:
            print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}", file=self.stream, flush=True)

    def _hold_stderr(self) -> None:
        """Route ``sys.stderr`` through a :class:`_BarSink` (while the model is created)."""
        if self._sink is None and self.mode != "off":
            self._sink = _BarSink(sys.stderr)
            sys.stderr = self._sink

    def _release_stderr(self) -> None:
        if self._sink is not None:
            if sys.stderr is self._sink:
                sys.stderr = self._sink.real
            self._sink = None

    # ------------------------------------------------------------------ feeding
    def step_started(self, round_index: int, evolver: str, space: str, samples_used: int) -> None:
        with self._lock:
            self.round, self.step, self.samples_base = round_index, (evolver, space), samples_used
            self.step_samples = self.step_trajectories = self.step_text = self.pending = 0
            self._refresh()
            self._line()

    def event(self, kind: str, n: int = 1) -> None:
        """The run context's ``progress`` callback: ``kind`` is "sampling", "samples", "trajectories",
        "loading" / "loaded" (the model), or a backend's "batch", "tokens", "rows" (see the module docstring)."""
        with self._lock:
            if kind == "sampling":
                self.pending = n
                self.batch_rows = 0
            elif kind == "samples":
                self.step_samples += n
                self.pending = self.batch_rows = 0
            elif kind == "trajectories":
                self.step_trajectories += n
            elif kind == "text":
                self.step_text += n
                self.text_calls += n
            elif kind == "loading":
                self.loading = loading_text(self.model)
                self._hold_stderr()
                self._line(force=True)
            elif kind == "loaded":
                self._release_stderr()
                self.loading = None
                self._line(force=True)
            elif kind == "batch":
                self.batch_rows, self.rows_done, self.tokens = n, 0, 0
            elif kind == "tokens":
                self.tokens += n
            elif kind == "rows":
                self.rows_done += n
            self._refresh()
            self._line()

    def step_finished(self, samples_used: int, best: dict[str, float | None]) -> None:
        with self._lock:
            self.best = {k: v for k, v in best.items() if v is not None}
            self.samples_base, self.step_samples, self.pending, self.batch_rows = samples_used, 0, 0, 0
            self._refresh()
            self._line()

    def round_changed(self, round_index: int) -> None:
        with self._lock:
            self.round = round_index
            self._refresh()

    def note(self, text: str) -> None:
        """A one-off message (resumed, stopped): logged, and printed at once unless ``quiet``."""
        log.info(text)
        if self.quiet:
            return
        with self._lock:
            self._print(text)

    # ------------------------------------------------------------------ output
    def status(self) -> str:
        """The current state in one line (no timestamp)."""
        rounds = f"{self.round}/{self.max_rounds}" if self.max_rounds else str(self.round)
        total = self.samples_base + self.step_samples
        samples = f"{total}/{self.max_samples}" if self.max_samples else str(total)
        parts = [f"round {rounds}"]
        if self.step is not None:
            parts.append(f"{self.step[0]} ({self.step[1]})")
        text = self.text_base + self.text_calls
        parts.append(f"LLM samples {samples}" + (f" ({text} text calls)" if text else ""))
        if self.loading:
            parts.append(self.loading + (f" ({self._sink.bar})" if self._sink is not None and self._sink.bar else ""))
        elif self.step is not None:
            text = f" ({self.step_text} text calls)" if self.step_text else ""
            parts.append(
                f"this step: {self.step_samples} samples{text}, {self.step_trajectories} trajectories" + self._drawing()
            )
        if self.best:
            parts.append("best " + " ".join(f"{k}={v:.4g}" for k, v in self.best.items()))
        parts.append(f"elapsed {_hms(time.monotonic() - self.started)}")
        return " · ".join(parts)

    def _drawing(self) -> str:
        """``, drawing 8 (batch of 8 rows: 3 finished, 412 tokens)``: what is being sampled now, or ""."""
        text = f", drawing {self.pending}" if self.pending else ""
        if self.batch_rows:
            text += f"{' (' if text else ', decoding ('}batch of {self.batch_rows} rows: {self.rows_done} finished, "
            text += f"{self.tokens} tokens)"
        return text

    def _refresh(self) -> None:
        if self._bar is None:
            return
        self._bar.update(
            self._tasks["rounds"],
            completed=self.round,
            info=f"round {self.round} · {self.step[0]} ({self.step[1]})" if self.step else "",
        )
        text = f" ({self.step_text} text)" if self.step_text else ""
        step = f"step: {self.step_samples} samples{text}, {self.step_trajectories} traj." if self.step else ""
        if self.batch_rows:  # short, for a terminal's width: the decoding counters first
            step = f"decoding {self.rows_done}/{self.batch_rows} rows, {self.tokens} tokens · {step}"
        elif self.pending:
            step += f", drawing {self.pending}"
        step = self.loading or step
        best = " ".join(f"{k}={v:.4g}" for k, v in self.best.items())
        self._bar.update(
            self._tasks["samples"],
            completed=self.samples_base + self.step_samples,
            info=" · ".join(p for p in (step, f"best {best}" if best else "") if p),
        )

    def _line(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_line < self.interval_s:
            return
        self._last_line = now
        text = self.status()
        log.info(text)
        if self.mode == "lines":
            print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}", file=self.stream, flush=True)

    def _heartbeat(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(min(1.0, self.interval_s / 2))
            self._wake.clear()
            if self._stop.is_set():
                return
            with self._lock:
                self._print_acks()
                if time.monotonic() - self._last_line >= self.interval_s:
                    self._line()
