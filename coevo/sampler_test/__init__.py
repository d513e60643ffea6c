"""The held-out sampler test: how well a model writes heuristics on prompts no training run sees.

``coevo heuristics sampler-test MODEL`` (:mod:`coevo.sampler_test.cli`) asks MODEL (a registered name, a
model folder, an ES run whose weights are rebuilt from its history, a PEFT adapter: :mod:`.model_ref`) a
fixed, versioned set of EoH prompts per problem (:mod:`.promptset`, written by :mod:`.build`), evaluates every
answer in the sandbox and reports valid, valid-and-new and better-than-its-best-parent rates and completion
tokens per valid-and-new answer, each with a 95 % interval (:mod:`.run`, :mod:`.stats`). This is how a trained
sampler is judged against the frozen one (docs/ahd.md, "Testing a sampler").
"""

from coevo.sampler_test.promptset import PROMPT_SET_VERSION, load_prompt_set
from coevo.sampler_test.run import make_test_sampler, sampler_test

__all__ = ["PROMPT_SET_VERSION", "load_prompt_set", "make_test_sampler", "sampler_test"]
