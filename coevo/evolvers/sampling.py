"""Random sampling: the baseline of automatic heuristic design (type ``sample``).

Each step draws ``batch`` independent ``i1`` samples (a new heuristic from scratch, the EoH initialisation
prompt of :mod:`coevo.ahd.prompts`) and keeps the best heuristic seen so far. This is the "Sample" baseline
the Agentic ESOpt AHD experiments compare against (batch 20 there; docs/references.md §2). Sampling, evaluation and
recording are the sampler service's (:class:`coevo.ahd.sampler.HeuristicSampler`); the best-heuristic
artifact and the report are shared with EoH (:mod:`coevo.evolvers.ahd_common`). With
``include_seed_heuristic`` / ``seed_heuristics`` the first step first puts the seed heuristics into the
population (the candidates the best is taken from, and ``tune``'s elites), so the best is never worse than them
on the training instances.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from coevo.ahd.population import Individual
from coevo.evolvers.ahd_common import AHDConfig, AHDEvolver
from coevo.evolvers.base import StepReport, register_evolver


class RandomSamplingConfig(AHDConfig):
    """Settings of the random-sampling evolver."""

    batch: int = Field(4, ge=1, description="i1 samples per step")


@register_evolver("sample")
class RandomSamplingEvolver(AHDEvolver):
    """Independent i1 samples, keeping the best (see the module docstring)."""

    Config = RandomSamplingConfig
    keeps_population = False  # ES members (rollout eoh_children) write i1 samples only

    def __init__(self, name: str, config: RandomSamplingConfig, ctx):
        super().__init__(name, config, ctx)
        self.steps_done = 0

    def step(self, round_index: int) -> StepReport:
        """Draw ``batch`` i1 samples (cut to the sample budget), record them, update the best."""
        if self.steps_done == 0 and not self.population:
            self.add_seed_heuristics()
        rng = self.ctx.rng(self.name, "step", self.steps_done)
        jobs = [
            self.sampler.job("i1", key=self.sampler.key(self.name, round_index, "i1", i), seed=rng.getrandbits(63))
            for i in range(self.config.batch)
        ]
        trajs = self.sampler.sample(jobs, round_index=round_index, generation=self.steps_done)
        self.steps_done += 1
        valid = [Individual.from_trajectory(t) for t in trajs if t.valid and t.reward is not None]
        self.publish_best()
        report = StepReport(
            samples=sum(t.llm_calls for t in trajs),
            trajectories=len(trajs),
            reward_unit=f"best sample's {self.sampler.reward_unit}",
            best_reward=max((i.reward for i in valid), default=None),
            metrics={"valid_samples": float(len(valid))},
        )
        if self.best is not None:
            report.metrics["best_objective"] = self.best.objective
        return report

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "steps_done": self.steps_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.steps_done = state.get("steps_done", 0)
