"""(1+1)-EPS: LLM hill climbing over heuristics (type ``hillclimb``).

Zhang et al., "Understanding the importance of evolutionary search in automated heuristic design with large
language models", PPSN 2024 (LLM4AD's ``HillClimb``): one incumbent, first the problem's seed heuristic; each
step asks for ``batch`` improved variants of it (EoH's m1 prompt, one parent) and a variant replaces it only if
strictly better. ES members (rollout ``eoh_children``) write the same m1 variants of the incumbent under
perturbed weights; the next step weighs them like its own. docs/extending.md shows this file as the example.
"""

from __future__ import annotations

from pydantic import Field

from coevo.ahd.population import Individual
from coevo.evolvers import AHDConfig, AHDEvolver, StepReport, register_evolver


class HillClimbConfig(AHDConfig):
    batch: int = Field(1, ge=1, description="improved variants asked per step ((1+1)-EPS: 1)")


@register_evolver("hillclimb")
class HillClimbEvolver(AHDEvolver):
    """One incumbent, replaced only by a strictly better variant (module docstring)."""

    Config = HillClimbConfig
    member_operators = ("m1",)  # what ES members write: improved variants of the incumbent

    def __init__(self, name, config, ctx):
        super().__init__(name, config, ctx)
        self.incumbent: Individual | None = None
        self.steps = 0

    @property
    def population(self):  # parents of m1, here and in ES members' children
        return [self.incumbent] if self.incumbent else []

    def step(self, round_index):
        """Ask for ``batch`` improved variants of the incumbent; keep a strictly better one (ES members' too)."""
        if self.incumbent is None:
            self.incumbent = self.sampler.seed_individual()  # evaluated on the training instances
        rng = self.ctx.rng(self.name, "step", self.steps)  # the same stream when a step re-runs
        jobs = [
            self.sampler.job(
                "m1",
                key=self.sampler.key(self.name, round_index, "m1", i),
                seed=rng.getrandbits(63),
                parents=[self.incumbent],
            )
            for i in range(self.config.batch)
        ]
        trajs = self.sampler.sample(jobs, round_index=round_index, generation=self.steps, existing=self.population)
        # ES members' variants were written before this step's: earliest first, so equals keep the earliest
        variants = self.collect_pooled() + [Individual.from_trajectory(t) for t in trajs if t.valid]
        for v in variants:
            if v.reward > self.incumbent.reward:  # strictly better only
                self.incumbent = v
        self.steps += 1
        self.publish_best()
        return StepReport(
            samples=sum(t.llm_calls for t in trajs),
            trajectories=len(trajs),
            best_reward=self.incumbent.reward,
            reward_unit=f"incumbent's {self.sampler.reward_unit}",
            metrics={"incumbent_objective": self.incumbent.objective, "variants": float(len(variants))},
        )

    def state_dict(self):
        incumbent = self.incumbent.to_dict() if self.incumbent else None
        return {**super().state_dict(), "incumbent": incumbent, "steps": self.steps}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.incumbent = Individual.from_dict(state["incumbent"]) if state.get("incumbent") else None
        self.steps = state.get("steps", 0)
