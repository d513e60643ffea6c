"""Small model-free evolvers used by the loop tests (importable by dotted path from a subprocess)."""

from __future__ import annotations

import os
import time

from coevo.evolvers.base import Evolver, EvolverConfig, StepReport
from coevo.types import Trajectory


class CounterConfig(EvolverConfig):
    samples_per_step: int = 3
    sleep_s: float = 0.0
    invalid_every: int = 0  # every k-th sample is a failed sample (0 = never)
    stop_at_round: int = -1  # the step of this round asks the loop to stop (as ES does after its T generations)


class Counter(Evolver):
    """Writes ``samples_per_step`` deterministic trajectories per step; reward = a function of the position.

    Keeps a running sum of rewards in its state so that a resumed run can be compared with an uninterrupted
    one. Sleeps ``sleep_s`` per new sample so that a test can kill it mid-step. Each new sample is preceded by
    ``ctx.sample_boundary(1)``, as a real LLM call through ``ctx.policy`` is, so budgets and interrupts can end
    a step between two samples.
    """

    space = "context"
    Config = CounterConfig

    def __init__(self, name, config, ctx):
        super().__init__(name, config, ctx)
        self.total = 0.0
        self.seen_pool = 0

    def step(self, round_index: int) -> StepReport:
        cfg = self.config
        rng = self.ctx.rng(self.name, round_index)
        rep = StepReport()
        self.seen_pool = len(self.ctx.store.query(run_id=self.ctx.run_id))
        for i in range(self.ctx.budget.allow(cfg.samples_per_step)):
            value = rng.random()  # drawn before the cache lookup so resumed steps see the same stream
            key = self.ctx.traj_key(self.name, round_index, i)
            traj = self.ctx.cached(key)
            if traj is None:
                self.ctx.sample_boundary(1)
                if cfg.sleep_s:
                    time.sleep(cfg.sleep_s)
                invalid = cfg.invalid_every and (round_index * cfg.samples_per_step + i) % cfg.invalid_every == 0
                traj = self.ctx.record(
                    Trajectory(
                        key=key,
                        run_id=self.ctx.run_id,
                        evolver=self.name,
                        space=self.space,
                        round=round_index,
                        reward=None if invalid else value,
                        valid=not invalid,
                        failure="parse" if invalid else None,
                        llm_calls=1,
                        meta={"pid": os.getpid()},
                    )
                )
            rep.samples += traj.llm_calls
            rep.trajectories += 1
            if traj.valid:
                self.total += traj.reward
                rep.best_reward = traj.reward if rep.best_reward is None else max(rep.best_reward, traj.reward)
        rep.metrics = {"total": self.total, "pool": float(self.seen_pool)}
        if round_index == cfg.stop_at_round:
            rep.stop, rep.stop_reason = True, f"the counter reached round {round_index}"
        return rep

    def state_dict(self):
        return {"total": self.total}

    def load_state_dict(self, state):
        self.total = state.get("total", 0.0)


class ParamCounter(Counter):
    space = "parameter"


class BuggyConfig(EvolverConfig):
    fail_at_round: int = 1


class Buggy(Counter):
    """A Counter whose step raises a plain ValueError at ``fail_at_round``: a bug, not bad input."""

    Config = BuggyConfig

    def step(self, round_index: int) -> StepReport:
        if round_index >= self.config.fail_at_round:
            raise ValueError("internal inconsistency in Buggy.step")
        return StepReport()
