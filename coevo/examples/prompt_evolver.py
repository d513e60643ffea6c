"""A context evolver that co-evolves the system prompt of an ES rollout (the README's second worked example).

Each step: read the last ES generation's worst member trajectories on train cases (``ctx.pool``), ask the
centre policy for ``candidates`` new system prompts, score the current prompt and each candidate under the
unperturbed centre on that generation's training cases (``ESEvolver.score_context``, cached by key), and publish
the best one if it beats the current prompt (``ctx.publish``); the next ES generation, in-process or on Ray
actors, runs under it. Every sample has a deterministic key, so a run killed at any moment resumes bit-identically.
Run it with ``coevo run configs/examples/prompt_es_tiny.yaml``.
"""

from __future__ import annotations

from coevo.errors import ConfigError
from coevo.evolvers import Evolver, EvolverConfig, StepReport, register_evolver
from coevo.types import Trajectory

META_PROMPT = (
    "You write the system prompt of an assistant. Current system prompt:\n{current}\n\n"
    "Answers it got wrong:\n{failures}\n\nWrite one better system prompt, and nothing else."
)


@register_evolver("prompt-evolver")
class PromptEvolver(Evolver):
    """Evolves context key ``key`` (default ``system_prompt``) read by the rollout of ES evolver ``evolver``."""

    space = "context"

    class Config(EvolverConfig):
        evolver: str = "es"  # the ES evolver whose rollout reads the prompt (checked by the config)
        key: str = "system_prompt"
        candidates: int = 2
        show: int = 3  # worst train trajectories shown to the proposer
        max_new_tokens: int = 48
        max_chars: int = 400

    def setup(self):
        self.es = self.ctx.evolvers[self.config.evolver]
        if self.config.key not in self.es.rollout.declared_context():
            raise ConfigError(f"evolvers.{self.name}.key: the rollout of {self.config.evolver!r} does not read it")

    def step(self, round_index):
        cfg, ctx, g = self.config, self.ctx, self.es.generation - 1
        report = StepReport(reward_unit="centre's mean train reward under the prompt")
        if g < 0:
            return report  # no ES generation yet: nothing to learn from
        current = ctx.context(cfg.key)  # version 0: the rollout's own default prompt
        worst = ctx.pool(evolver=self.es.name, members_only=True, generation=g, bottom_k=cfg.show, distinct_task=True)
        failures = "\n".join(f"- {t.steps[0].observation} -> {t.steps[0].model_output}" for t in worst if t.steps)
        text = current.value or self.es.rollout.current_context().values.get(cfg.key) or "(none)"
        conv = [{"role": "user", "content": META_PROMPT.format(current=text, failures=failures or "(none)")}]
        candidates = []
        for i in range(cfg.candidates):
            key = ctx.traj_key(self.name, round_index, "propose", i)
            traj = ctx.cached(key)
            if traj is None:
                if ctx.budget.allow(1) < 1:
                    break
                seed = ctx.rng(self.name, round_index, i).getrandbits(31)
                out = ctx.policy.generate([conv], ctx.sampling_params(max_new_tokens=cfg.max_new_tokens, seed=seed))[0]
                traj = ctx.record(
                    Trajectory.from_completion(  # one LLM call: llm_error when it failed, its tokens counted
                        out,
                        key=key,
                        run_id=ctx.run_id,
                        evolver=self.name,
                        space=self.space,
                        prompt=conv[0]["content"],
                        round=round_index,
                        generation=g,
                        meta={"seed": seed},
                    )
                )
            report.samples += traj.llm_calls
            report.trajectories += 1
            proposal = (traj.steps[0].model_output or "").strip()[: cfg.max_chars]
            if traj.valid and proposal:
                candidates.append(proposal)
        base = self.es.score_context({cfg.key: current}, evolver=self.name, label=f"r{round_index}-current")
        if base is None:
            return report  # the sample budget cannot pay for scoring
        report.samples += sum(t.llm_calls for t in base.trajectories)
        best, best_score = None, base.score
        for i, prompt in enumerate(candidates):
            scored = self.es.score_context({cfg.key: prompt}, evolver=self.name, label=f"r{round_index}-c{i}")
            if scored is None:
                break
            report.samples += sum(t.llm_calls for t in scored.trajectories)
            if scored.score > best_score:
                best, best_score = prompt, scored.score
        if best is not None:
            ctx.publish(cfg.key, best, evolver=self.name, meta={"score": best_score, "baseline": base.score})
        report.best_reward = best_score
        report.metrics = {"baseline": base.score, "published": float(best is not None)}
        report.metrics["version"] = float(ctx.context(cfg.key).version)
        return report
