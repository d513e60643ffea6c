"""Write a sampler-test prompt set (``<version>.json`` beside this file); the committed set is its output.

    python -m coevo.sampler_test.build [--version sampler-test-v1] [--prompts 128] [--check]

Per problem of :data:`~coevo.sampler_test.promptset.PROBLEMS`:

* settings: ``configs/ahd/<problem>.yaml`` (the main job's config): the run's ``sampling`` section with the
  heuristic-design evolver's overrides (temperature, top-p, top-k, token cap), its answer format, training size
  and count, sandbox limits and ``parents_m``;
* parents: every ``parents/<problem>/*.py`` (textbook rules and variants, written for this test) and the
  problem's published heuristics named in :data:`PUBLISHED` (none that a shipped config starts from); each is
  checked to differ, as code (:func:`coevo.ahd.population.code_key`) and, with ``--check``, in behaviour on the
  test instances, from every heuristic a shipped config under ``configs/ahd/`` starts its population with (the
  seed heuristic and ``seed_heuristics``), and to be valid on those instances;
* prompts: ``--prompts`` of them, operator ``OPERATOR_CYCLE[i % 8]``, parents drawn uniformly (e1 / e2:
  ``parents_m`` distinct ones) and batch seeds from ``random.Random("<version>/<problem>")``.

The output is deterministic: the same sources and arguments write the same file.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from coevo.sampler_test.promptset import (
    BATCH_SIZE,
    HERE,
    OPERATOR_CYCLE,
    PROBLEMS,
    PROMPT_SET_VERSION,
    prompt_set_path,
)

#: problem -> published heuristics (``heuristics/<problem>/published/<name>.py``) that join its test parents
PUBLISHED = {"kp_construct": ("agentic_esopt",)}
#: seed of the evaluation instances (no shipped config uses it as train, test or validation seed)
INSTANCE_SEED = 5353
ROOT = HERE.parents[1]


def shipped_settings(problem: str, config_root: Path | None = None) -> dict[str, Any]:
    """The sampling and evaluation settings of ``configs/ahd/<problem>.yaml`` (module docstring).

    Raises:
        ConfigError: the config does not load. ValueError: it has no heuristic-design evolver.
    """
    from coevo.ahd.problem import load_problem
    from coevo.backends.base import SamplingParams
    from coevo.config import load_config

    cfg, _ = load_config((config_root or ROOT / "configs" / "ahd") / f"{problem}.yaml")
    ev = next((e.params for e in cfg.evolvers if e.type in ("eoh", "sample")), None)
    if ev is None:
        raise ValueError(f"configs/ahd/{problem}.yaml has no eoh or sample evolver")
    # the run's sampling section with the evolver's overrides, as RunContext.sampling_params makes them
    base = cfg.sampling.model_dump() if cfg.sampling is not None else {}
    own = {"temperature": ev.temperature, "top_p": ev.top_p, "top_k": ev.top_k, "max_new_tokens": ev.max_new_tokens}
    base.update({k: v for k, v in own.items() if v is not None})
    params = SamplingParams(**{**base, "stop": tuple(base.get("stop", ()))})

    return {
        "config": f"configs/ahd/{problem}.yaml",
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "max_new_tokens": params.max_new_tokens,
        "stop": list(params.stop),
        "answer_format": ev.answer_format,
        "answer_grammar": ev.answer_grammar,
        "change_marks": ev.change_marks,
        "train_size": ev.train_size or load_problem(problem).default_size,
        "train_count": ev.train_count,
        "eval_timeout_s": ev.eval_timeout_s,
        "eval_memory_mb": ev.eval_memory_mb,
        "eval_workers": ev.eval_workers,
        "parents_m": getattr(ev, "parents_m", 2),
    }


def training_starts(problem: str) -> dict[str, str]:
    """name -> code of every heuristic a shipped config (``configs/ahd/**/*.yaml``) starts ``problem``'s
    population with: its seed heuristic and each ``seed_heuristics`` entry."""
    import yaml

    from coevo.ahd.problem import load_problem

    prob = load_problem(problem)
    starts = {"seed": prob.seed_heuristic_code()}
    for path in sorted((ROOT / "configs" / "ahd").rglob("*.yaml")):
        raw = yaml.safe_load(path.read_text()) or {}
        for ev in raw.get("evolvers") or []:
            if isinstance(ev, dict) and ev.get("problem") == problem:
                for name in ev.get("seed_heuristics") or []:
                    starts[f"published:{name}"] = prob.published_heuristic_code(name)
    return starts


def test_parents(problem: str) -> list[dict[str, str]]:
    """The parents of ``problem``'s test: name, source, thought, code (sorted by name, published ones last).

    Raises:
        ValueError: a parent is a copy (as code) of a heuristic a shipped config starts from, or has no thought.
    """
    from coevo.ahd.population import code_key
    from coevo.ahd.problem import load_problem

    prob = load_problem(problem)
    found = [
        (f.stem, f"parents/{problem}/{f.name}", f.read_text())
        for f in sorted((HERE / "parents" / problem).glob("*.py"))
    ]
    found += [(n, f"published:{n}", prob.published_heuristic_code(n)) for n in PUBLISHED.get(problem, ())]
    starts = {code_key(code): name for name, code in training_starts(problem).items()}
    out = []
    for name, source, code in found:
        if code_key(code) in starts:
            raise ValueError(f"{problem}: test parent {name} is the training start {starts[code_key(code)]}")
        thought = prob.heuristic_idea(code)
        if not thought:
            raise ValueError(f"{problem}: test parent {source} has no idea (docstring) to show in a prompt")
        out.append({"name": name, "source": source, "thought": thought, "code": code})
    return out


def build_problem(problem: str, version: str, n_prompts: int) -> dict[str, Any]:
    """One problem's entry of the prompt set (module docstring)."""
    settings = shipped_settings(problem)
    parents = test_parents(problem)
    names = [p["name"] for p in parents]
    rng = random.Random(f"{version}/{problem}")
    prompts = []
    seed = 0
    for i in range(n_prompts):
        op = OPERATOR_CYCLE[i % len(OPERATOR_CYCLE)]
        if i % BATCH_SIZE == 0:
            seed = rng.getrandbits(63)
        if op == "i1":
            chosen = []
        elif op in ("e1", "e2"):
            chosen = rng.sample(names, min(settings["parents_m"], len(names)))
        else:
            chosen = [rng.choice(names)]
        prompts.append({"index": i, "operator": op, "parents": chosen, "seed": seed})
    return {"settings": settings, "parents": parents, "prompts": prompts}


def check_behaviour(problem: str, entry: dict[str, Any]) -> list[str]:
    """Evaluate ``problem``'s parents and training starts on the test instances: problems found (an invalid
    parent, a parent that behaves exactly as a training start or as another parent)."""
    from coevo.ahd.problem import load_problem
    from coevo.ahd.sampler import behaviour_key
    from coevo.sampler_test.run import make_test_sampler
    from coevo.store import TrajectoryStore

    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        store = TrajectoryStore(Path(tmp) / "s.sqlite")
        sampler = make_test_sampler(
            load_problem(problem), entry["settings"], store=store, run_id="build", instance_seed=INSTANCE_SEED
        )
        starts = training_starts(problem)
        keys: dict[str, str] = {}
        for name, res in zip(starts, sampler.evaluate(list(starts.values()))):
            keys.setdefault(behaviour_key(res.metrics.get("objectives")) or f"invalid:{name}", name)
        for p, res in zip(entry["parents"], sampler.evaluate([p["code"] for p in entry["parents"]])):
            if not res.valid:
                errors.append(f"{problem}: parent {p['name']} invalid ({res.error_kind}: {res.error})")
                continue
            k = behaviour_key(res.metrics.get("objectives"))
            if k in keys:
                errors.append(f"{problem}: parent {p['name']} behaves exactly as {keys[k]}")
            keys.setdefault(k, p["name"])
            print(f"{problem:15} {p['name']:22} objective {res.objective:.6g}", file=sys.stderr)
        store.close()
    return errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", default=PROMPT_SET_VERSION)
    ap.add_argument("--prompts", type=int, default=128, help="prompts per problem (default 128)")
    ap.add_argument("--check", action="store_true", help="also evaluate the parents (validity, distinct behaviour)")
    args = ap.parse_args(argv)
    out = {"version": args.version, "instance_seed": INSTANCE_SEED, "batch_size": BATCH_SIZE, "problems": {}}
    errors = []
    for problem in PROBLEMS:
        entry = build_problem(problem, args.version, args.prompts)
        out["problems"][problem] = entry
        if args.check:
            errors += check_behaviour(problem, entry)
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    path = prompt_set_path(args.version)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path} ({args.prompts} prompts per problem)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
