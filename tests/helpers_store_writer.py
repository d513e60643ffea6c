"""Child-process writer for the store's crash and concurrency tests (run with ``sys.executable``).

Usage::

    python helpers_store_writer.py DB MODE N_STEPS COUNT [MARKER]

MODE ``free``: insert ``COUNT`` trajectories (0 = forever), each with ``N_STEPS`` steps, printing
``begin i`` before and ``done i`` after each ``add_trajectory`` (flushed), so that the parent can kill it
at a known point. MODE ``pause``: insert ``COUNT`` complete trajectories, then start one more whose step
list, half-way through being written inside the store's transaction, creates the file ``MARKER`` and
sleeps, so that the parent can SIGKILL the writer while it holds an open write transaction.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

from coevo.store import TrajectoryStore
from coevo.types import ContextRef, ESMember, Step, Trajectory

LLM_CALLS_PER_TRAJECTORY = 3


class PausingSteps(list):
    """A step list that, once half of it has been iterated (i.e. written), touches ``marker`` and sleeps."""

    def __init__(self, steps: list[Step], marker: Path) -> None:
        super().__init__(steps)
        self.marker = marker

    def __iter__(self) -> Iterator[Step]:
        for i, step in enumerate(super().__iter__()):
            if i == len(self) // 2:
                self.marker.touch()
                time.sleep(600)
            yield step


def make_trajectory(i: int, n_steps: int) -> Trajectory:
    """Trajectory number ``i`` of run ``crash`` with ``n_steps`` steps of ~300 characters each."""
    steps = [
        Step(
            observation=f"obs {i}/{j} " + "x" * 200,
            model_output=f"out {i}/{j}",
            action=f"click({j})",
            tool_result="ok",
            reward=float(j % 3),
            meta={"j": j},
        )
        for j in range(n_steps)
    ]
    return Trajectory(
        key=f"crash/es/{i}",
        run_id="crash",
        evolver="es",
        space="parameter",
        generation=i,
        task_id=f"task-{i % 4}",
        steps=steps,
        reward=float(i),
        member=ESMember(seed=1000 + i, sigma=1e-3, sign=1 if i % 2 == 0 else -1, index=i),
        context=ContextRef(skill_name="web", skill_version=1),
        llm_calls=LLM_CALLS_PER_TRAJECTORY,
        meta={"i": i},
    )


def main(argv: list[str]) -> None:
    db, mode, n_steps, count = argv[0], argv[1], int(argv[2]), int(argv[3])
    with TrajectoryStore(db) as store:
        if mode == "free":
            i = 0
            while count == 0 or i < count:
                print(f"begin {i}", flush=True)
                store.add_trajectory(make_trajectory(i, n_steps))
                print(f"done {i}", flush=True)
                i += 1
        elif mode == "pause":
            for i in range(count):
                store.add_trajectory(make_trajectory(i, n_steps))
            t = make_trajectory(count, n_steps)
            t.steps = PausingSteps(t.steps, Path(argv[4]))
            store.add_trajectory(t)
        else:
            raise SystemExit(f"unknown MODE {mode!r} (expected 'free' or 'pause')")


if __name__ == "__main__":
    main(sys.argv[1:])
