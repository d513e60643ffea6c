"""Skills on MiniWoB++: does the agent load them, and do they change held-out success? (issue 14, "measure")

One process, one model, the same held-out episodes and the same seeded decoding under three conditions of the
``web`` rollout (:class:`coevo.rollouts.web.WebRollout`, real MiniWoB++ pages in real headless Chromium):

* ``none``: ``use_skills: false`` (no skill in the prompt, no skill actions);
* ``catalog``: ``use_skills: true, skill_mode: catalog`` with the shipped skills (``--skill-dirs``, default
  ``skills/web-navigation`` and ``skills/miniwob-forms``): the system prompt lists their names and
  descriptions and the agent may call ``load_skill`` / ``read_skill_file`` (progressive disclosure);
* ``preload``: ``use_skills: true, skill_mode: preload, skill_name: miniwob-forms``: the same catalog plus the
  body of ``miniwob-forms`` in the system prompt;
* one more catalog condition per ``--libraries NAME=DIR[+DIR...]`` (issue 48): the agent sees that library
  instead of the shipped one, e.g. ``user=benchmarks/web_user_skills`` (a user's own two skills) or a library
  Trace2Skill distilled (``coevo skills export``-ed folders).

The rollout settings (task set, tasks, ``max_obs_chars``, ``history_len``, ``actions``, ``seed``) come from the
web rollout of ``--config`` (default ``configs/web/miniwob_skills_only.yaml``); ``--tasks``, ``--max-steps``,
``--n-envs`` and the decoding options override them. Episodes: the rollout's held-out list
(:meth:`WebRollout.episodes` on split ``"test"`` with ``test_episodes = tasks x --seeds``: each task with the
first ``--seeds`` held-out seeds of the task set, e.g. 10000-10003 of ``miniwob10``), run in waves of
``--n-envs`` episodes through :meth:`WebRollout.run` (``split="test"``, ``episodes=`` the wave), conditions
interleaved wave by wave so that a stopped measurement has the same episodes in every condition. Sampling is
the rollout's held-out sampling (seeded from the rollout ``seed``; turn t of a wave uses seed + t, row i its own
generator), so a rerun repeats the completions and the conditions share the sampler's random numbers.

Per condition (and per condition and task): episodes, successes (reward 1.0) and success rate over all
episodes, success rate over the episodes the rollout scores (browser and evaluator failures left out, as
:meth:`WebRollout.member_reward`), agent steps, steps whose recorded action is ``load_skill`` /
``read_skill_file`` (name of ``Step.action``, the parsed call) and their fraction of all steps, episodes with at
least one ``load_skill``, malformed outputs (steps without an action), mean steps per episode, failures by kind
(``runtime`` = browser, ``evaluation`` = task evaluator, ``model`` = backend error), wall seconds (each episode
carries its share of its wave's wall time; a condition's first wave in a process also starts its browsers) and
prompt / completion tokens; per-seed success rate mean +- std over seeds; and paired against ``none`` (same
episode, same sampling seed): episodes solved only with skills and only without.

Output: a Markdown table (also ``OUT/table.md``), a plot ``OUT/web_skills.png`` (success per condition, split
by episodes with / without a loaded skill), then one JSON line per metric
``{"metric", "value", "goal", "met"}``. ``OUT/results.jsonl`` gets one line per finished episode (condition,
task, seed, success, failure, steps, action names, model outputs, tokens, wall share) as each wave ends;
``OUT/settings.json`` the settings. Resuming: the same command with the same ``--out`` runs only the episodes
missing from ``results.jsonl`` (more ``--seeds`` or other ``--conditions`` add episodes; other settings are an
error: use a new ``--out``; a recorded failed episode counts as run). Without a missing episode no model is
loaded and no browser started; ``--report-only`` reports the episodes recorded so far and runs none.

Usage (the 0.5B model on CPU; smoke run on a tiny random model)::

    .venv/bin/python benchmarks/web_skills.py --seeds 4 --out runs/web_skills
    .venv/bin/python benchmarks/web_skills.py --model 'tiny:{"tokenizer_from": null}' --tasks click-button \\
        --seeds 1 --max-steps 1 --n-envs 1 --out /tmp/web_skills_smoke

Needs headless Chromium and the web extra (``scripts/setup_browser.sh``;
:func:`coevo.envs.browser.ensure_browser_env`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coevo.tables import md_table

CONDITIONS = ("none", "catalog", "preload")
DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"
DEFAULT_CONFIG = ROOT / "configs" / "web" / "miniwob_skills_only.yaml"
DEFAULT_SKILL_DIRS = ("skills/web-navigation", "skills/miniwob-forms")
PRELOAD_SKILL = "miniwob-forms"
SKILL_ACTIONS = ("load_skill", "read_skill_file")
#: settings that change an episode's outcome: a resumed --out must have been written with the same values
RESUME_KEYS = (
    "model",
    "dtype",
    "config",
    "taskset",
    "tasks",
    "max_steps",
    "n_envs",
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "skill_dirs",
    "libraries",
)
FAILURE_KINDS = {"runtime": "runtime", "evaluation": "evaluation", "llm_error": "model"}
#: rollout fields that only apply with use_skills: true (dropped for the ``none`` condition)
SKILL_FIELDS = ("use_skills", "skill_mode", "skill_dirs", "skill_name", "max_skill_chars")


def web_rollout_section(config: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(rollout section, run sampling section)`` of the first evolver whose rollout is ``type: web``.

    Raises:
        SystemExit: no such evolver in ``config``.
    """
    data = yaml.safe_load(config.read_text()) or {}
    for ev in data.get("evolvers", []):
        rollout = ev.get("rollout") or {}
        if rollout.get("type") == "web":
            return dict(rollout), dict(data.get("sampling") or {})
    raise SystemExit(f"{config}: no evolver with a `rollout: {{type: web}}` section")


def condition_spec(base: dict[str, Any], condition: str, args: argparse.Namespace) -> dict[str, Any]:
    """The web rollout config of one condition: ``base`` with the shared overrides and the skill settings.

    Returns a dict for :func:`coevo.rollouts.base.build_rollout`: ``test_episodes`` = tasks x seeds, the
    decoding in ``sampling``, and ``use_skills`` / ``skill_mode`` / ``skill_dirs`` / ``skill_name`` per
    condition (``none``: no skill field at all).
    """
    spec = {k: v for k, v in base.items() if k not in SKILL_FIELDS}
    spec.update(
        type="web",
        benchmark="miniwob",
        tasks=list(args.tasks),
        test_episodes=len(args.tasks) * args.seeds,
        max_steps=args.max_steps,
        n_envs=args.n_envs,
        seed=args.seed,
        sampling={
            "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "top_k": args.top_k,
        },
    )
    if condition == "catalog":
        spec.update(use_skills=True, skill_mode="catalog", skill_dirs=list(args.skill_dirs))
    elif condition in args.libraries:
        spec.update(use_skills=True, skill_mode="catalog", skill_dirs=list(args.libraries[condition]))
    elif condition == "preload":
        spec.update(use_skills=True, skill_mode="preload", skill_dirs=list(args.skill_dirs), skill_name=PRELOAD_SKILL)
    elif condition != "none":
        raise ValueError(f"unknown condition {condition!r}; choose from {CONDITIONS} or --libraries names")
    return spec


def action_name(action: str | None) -> str | None:
    """The function name of a recorded step action (``"load_skill('x')"`` -> ``"load_skill"``; None stays)."""
    return None if action is None else action.split("(", 1)[0].strip()


def episode_row(condition: str, index: int, traj: Any, wall_share: float) -> dict[str, Any]:
    """One ``results.jsonl`` line from a web trajectory (:class:`coevo.types.Trajectory`)."""
    names = [action_name(s.action) for s in traj.steps]
    return {
        "condition": condition,
        "episode": index,
        "task": traj.meta["task"],
        "seed": int(traj.meta["seed"]),
        "success": bool(traj.valid and traj.reward == 1.0),
        "reward": traj.reward,
        "raw_reward": traj.meta.get("raw_reward"),
        "valid": traj.valid,
        "failure": FAILURE_KINDS.get(traj.failure, traj.failure),
        "failure_detail": traj.failure_detail,
        "end": traj.meta.get("end"),
        "steps": len(traj.steps),
        "actions": names,
        "action_texts": [s.action for s in traj.steps],
        "step_kinds": [s.meta.get("kind") for s in traj.steps],
        "outputs": [s.model_output for s in traj.steps],
        "load_skill_steps": names.count("load_skill"),
        "read_skill_file_steps": names.count("read_skill_file"),
        "skills_loaded": traj.meta.get("skills_loaded", 0),
        "skills_loaded_names": traj.meta.get("skills_loaded_names", []),
        "skill_load_calls": traj.meta.get("skill_load_calls", names.count("load_skill")),
        "skills_listed": traj.meta.get("skills_listed", []),
        "ignored_action_steps": sum(bool(s.meta.get("ignored_actions")) for s in traj.steps),
        "malformed_steps": sum(s.action is None and s.meta.get("kind") == "parse_error" for s in traj.steps),
        "llm_calls": traj.llm_calls,
        "prompt_tokens": traj.prompt_tokens,
        "completion_tokens": traj.completion_tokens,
        "system_prompt_chars": len(traj.steps[0].meta.get("system_prompt", "")) if traj.steps else 0,
        "duration_s": round(traj.duration_s or 0.0, 3),
        "wall_s": round(wall_share, 3),
        "skill_mode": traj.meta.get("skill_mode"),
        "skill_name": traj.context.skill_name,
        "skill_version": traj.context.skill_version,
    }


def read_results(path: Path) -> list[dict[str, Any]]:
    """The episode rows of ``results.jsonl`` (a last line cut by a kill is ignored)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts over episode rows (see the module docstring); rates are ``None`` without episodes / steps."""
    n = len(rows)
    steps = sum(r["steps"] for r in rows)
    succ = sum(r["success"] for r in rows)
    fails = {k: sum(r["failure"] == k for r in rows) for k in ("runtime", "evaluation", "model")}
    scored = n - fails["runtime"] - fails["evaluation"]
    load = sum(r["load_skill_steps"] for r in rows)
    read = sum(r["read_skill_file_steps"] for r in rows)
    prompt = sum(r["prompt_tokens"] for r in rows)
    calls = sum(r["llm_calls"] for r in rows)
    loaded = [r for r in rows if r.get("skills_loaded", 0) > 0]
    unloaded = [r for r in rows if r.get("skills_loaded", 0) == 0]
    by_seed: dict[int, list[bool]] = {}
    for r in rows:
        by_seed.setdefault(r["seed"], []).append(r["success"])
    seed_rates = [sum(v) / len(v) for _, v in sorted(by_seed.items())]
    return {
        "episodes": n,
        "successes": succ,
        "success_rate": succ / n if n else None,
        "scored_success_rate": succ / scored if scored else None,
        "steps": steps,
        "mean_steps": steps / n if n else None,
        "load_skill_steps": load,
        "load_skill_step_fraction": load / steps if steps else None,
        "read_skill_file_steps": read,
        "read_skill_file_step_fraction": read / steps if steps else None,
        "episodes_with_load_skill": sum(r["load_skill_steps"] > 0 for r in rows),
        "successful_loads": sum(r.get("skills_loaded", 0) for r in rows),
        "episodes_with_loaded_skill": len(loaded),
        "solved_with_loaded_skill": sum(r["success"] for r in loaded),
        "episodes_without_loaded_skill": len(unloaded),
        "solved_without_loaded_skill": sum(r["success"] for r in unloaded),
        "tokens_per_episode": (prompt + sum(r["completion_tokens"] for r in rows)) / n if n else None,
        "malformed_steps": sum(r["malformed_steps"] for r in rows),
        "failures": fails,
        "seeds": len(seed_rates),
        "seed_success_mean": statistics.fmean(seed_rates) if seed_rates else None,
        "seed_success_std": statistics.stdev(seed_rates) if len(seed_rates) > 1 else None,
        "wall_s": sum(r["wall_s"] for r in rows),
        "prompt_tokens": prompt,
        "completion_tokens": sum(r["completion_tokens"] for r in rows),
        "prompt_tokens_per_step": prompt / calls if calls else None,
    }


def paired(rows: list[dict[str, Any]], condition: str, baseline: str = "none") -> dict[str, int] | None:
    """Over the episodes both conditions ran: solved only under ``condition`` (wins), only under ``baseline``
    (losses), by both, by neither. None when they share no episode."""
    a = {(r["task"], r["seed"]): r["success"] for r in rows if r["condition"] == condition}
    b = {(r["task"], r["seed"]): r["success"] for r in rows if r["condition"] == baseline}
    both = sorted(set(a) & set(b))
    if not both:
        return None
    return {
        "episodes": len(both),
        "wins": sum(a[k] and not b[k] for k in both),
        "losses": sum(b[k] and not a[k] for k in both),
        "both": sum(a[k] and b[k] for k in both),
        "neither": sum(not a[k] and not b[k] for k in both),
    }


HEADER = [
    "condition",
    "task",
    "episodes",
    "success",
    "rate",
    "scored rate",
    "steps",
    "mean steps",
    "load_skill steps",
    "read_skill_file steps",
    "eps with load_skill",
    "successful loads",
    "solved with loaded skill",
    "solved without",
    "malformed",
    "fail runtime/eval/model",
    "wall s",
    "prompt tok",
    "compl tok",
    "prompt tok/step",
]


def _row(condition: str, task: str, s: dict[str, Any]) -> list[Any]:
    def frac(k: int, f: float | None) -> str:
        return f"{k} ({f:.0%})" if f is not None else str(k)

    f = s["failures"]
    return [
        condition,
        task,
        s["episodes"],
        s["successes"],
        s["success_rate"],
        s["scored_success_rate"],
        s["steps"],
        s["mean_steps"],
        frac(s["load_skill_steps"], s["load_skill_step_fraction"]),
        frac(s["read_skill_file_steps"], s["read_skill_file_step_fraction"]),
        s["episodes_with_load_skill"],
        s["successful_loads"],
        f"{s['solved_with_loaded_skill']}/{s['episodes_with_loaded_skill']}",
        f"{s['solved_without_loaded_skill']}/{s['episodes_without_loaded_skill']}",
        s["malformed_steps"],
        f"{f['runtime']}/{f['evaluation']}/{f['model']}",
        round(s["wall_s"], 1),
        s["prompt_tokens"],
        s["completion_tokens"],
        None if s["prompt_tokens_per_step"] is None else round(s["prompt_tokens_per_step"], 1),
    ]


def metric(name: str, value: Any, goal: str, met: bool) -> dict[str, Any]:
    """Print one metric JSON line and return it."""
    row = {"metric": name, "value": value, "goal": goal, "met": bool(met)}
    print(json.dumps(row))
    return row


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="run config whose web rollout gives the defaults")
    p.add_argument("--model", default=DEFAULT_MODEL, help="model name, local folder, or tiny:<preset|JSON> (smoke)")
    p.add_argument("--dtype", default="float32", help="weight dtype of the HF policy")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--tasks", default=None, help="comma-separated MiniWoB++ tasks (default: the config's)")
    p.add_argument("--seeds", type=int, default=4, help="held-out seeds per task: the task set's first N")
    p.add_argument("--max-steps", type=int, default=2, help="model calls per episode")
    p.add_argument("--n-envs", type=int, default=None, help="browsers side by side = episodes per wave (config's)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens per agent step")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy (default: the config's)")
    p.add_argument("--top-p", type=float, default=None, help="default: the config's")
    p.add_argument("--top-k", type=int, default=None, help="default: the config's")
    p.add_argument("--seed", type=int, default=None, help="rollout seed: the sampling seed (default: the config's)")
    p.add_argument(
        "--conditions",
        default=None,
        help=f"comma-separated subset of {CONDITIONS} and the --libraries names (default: all of them)",
    )
    p.add_argument(
        "--libraries",
        default="",
        help="more catalog conditions: NAME=DIR[+DIR...] items, comma-separated (e.g. user=benchmarks/web_user_skills)",
    )
    p.add_argument(
        "--skill-dirs", default=",".join(DEFAULT_SKILL_DIRS), help="skill folders of catalog and preload (comma-sep.)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument(
        "--report-only", action="store_true", help="run nothing: the table and metrics of the episodes in --out"
    )
    p.add_argument("--out", default="runs/web_skills", help="folder of results.jsonl, settings.json, table.md")
    args = p.parse_args(argv)
    raw_libraries, args.libraries = args.libraries, {}
    for item in (i for i in raw_libraries.split(",") if i):
        name, _, dirs = item.partition("=")
        if not name or not dirs or name in CONDITIONS:
            p.error(f"--libraries: {item!r} is not NAME=DIR[+DIR...] with a NAME other than {CONDITIONS}")
        args.libraries[name] = [d for d in dirs.split("+") if d]
    known = [*CONDITIONS, *args.libraries]
    args.conditions = [c for c in (args.conditions or ",".join(known)).split(",") if c]
    unknown = sorted(set(args.conditions) - set(known))
    if unknown or not args.conditions:
        p.error(f"--conditions: unknown {unknown or 'empty list'}; choose from {known}")
    args.skill_dirs = [d for d in args.skill_dirs.split(",") if d]
    if args.seeds < 1 or args.max_steps < 1 or (args.n_envs is not None and args.n_envs < 1):
        p.error("--seeds, --max-steps and --n-envs must be >= 1")
    config = Path(args.config)
    if not config.is_file():
        p.error(f"--config: no such file {config}")
    base, run_sampling = web_rollout_section(config)
    args.base = base
    args.taskset = base.get("taskset", "miniwob_smoke")
    args.tasks = [t for t in args.tasks.split(",") if t] if args.tasks else list(base.get("tasks") or [])
    if not args.tasks:
        p.error("--tasks: none given and the config's web rollout names none")
    sampling = {**run_sampling, **(base.get("sampling") or {})}
    for name, key, default in (("temperature", "temperature", 0.0), ("top_p", "top_p", 1.0), ("top_k", "top_k", 0)):
        if getattr(args, name) is None:
            setattr(args, name, sampling.get(key, default))
    args.n_envs = args.n_envs or base.get("n_envs", 2)
    args.seed = base.get("seed", 0) if args.seed is None else args.seed
    args.config = str(config.resolve())
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from coevo.rollouts.base import build_rollout

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: getattr(args, k) for k in RESUME_KEYS}
    settings_path = out / "settings.json"
    if settings_path.exists():
        before = json.loads(settings_path.read_text())
        diff = sorted(k for k in RESUME_KEYS if before.get(k) != settings[k])
        if diff:
            print(
                f"web_skills: {out} holds results of other settings ({', '.join(diff)}: "
                f"{[before.get(k) for k in diff]} there, {[settings[k] for k in diff]} now); use a new --out",
                file=sys.stderr,
            )
            return 2
    else:
        settings_path.write_text(json.dumps(settings, indent=1) + "\n")

    try:
        rollouts = {c: build_rollout(condition_spec(args.base, c, args), None) for c in args.conditions}
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        print(f"web_skills: invalid rollout settings: {exc}", file=sys.stderr)
        return 2
    plan = next(iter(rollouts.values())).episodes("test")
    waves = [plan[i : i + args.n_envs] for i in range(0, len(plan), args.n_envs)]
    results_path = out / "results.jsonl"
    done = {(r["condition"], r["task"], r["seed"]) for r in read_results(results_path)}
    todo = [(w, c) for w in waves for c in args.conditions if any((c, t, s) not in done for t, s in w)]
    if args.report_only:
        todo = []  # the table of what results.jsonl holds (e.g. of a measurement stopped before its end)
    new_episodes, started = 0, time.time()
    policy = None
    try:
        for wave, condition in todo:
            pending = [(t, s) for t, s in wave if (condition, t, s) not in done]
            if policy is None:
                policy = load_policy(args)
            t0 = time.perf_counter()
            trajs = rollouts[condition].run(
                policy,
                generation=0,
                member=None,
                key_prefix=f"web_skills/{condition}",
                split="test",
                evolver="web_skills",
                episodes=pending,
            )
            share = (time.perf_counter() - t0) / len(trajs)
            with results_path.open("a") as fh:
                for (task, seed), traj in zip(pending, trajs):
                    row = episode_row(condition, plan.index((task, seed)), traj, share)
                    fh.write(json.dumps(row) + "\n")
                    done.add((condition, task, seed))
                fh.flush()
            new_episodes += len(trajs)
            print(
                f"# {condition}: {', '.join(f'{t}:{s}' for t, s in pending)} -> "
                f"{sum(t.valid and t.reward == 1.0 for t in trajs)}/{len(trajs)} solved, {share * len(trajs):.1f} s",
                file=sys.stderr,
            )
    except KeyboardInterrupt:
        print("# interrupted; run the same command again to continue", file=sys.stderr)
        return 130
    finally:
        for ro in rollouts.values():
            ro.close()

    wanted = set(plan)
    rows = [
        r for r in read_results(results_path) if r["condition"] in args.conditions and (r["task"], r["seed"]) in wanted
    ]
    report(rows, args, plan, new_episodes, time.time() - started, out)
    return 0


def load_policy(args: argparse.Namespace):
    """The HF policy of ``--model`` (``--dtype``, ``--device``; one batch = one wave)."""
    from coevo.backends.hf import HFPolicy

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    return HFPolicy(args.model, dtype=args.dtype, device=args.device, batch_size=max(8, args.n_envs))


def report(
    rows: list[dict[str, Any]],
    args: argparse.Namespace,
    plan: list[tuple[str, int]],
    new_episodes: int,
    call_wall_s: float,
    out: Path,
) -> list[dict[str, Any]]:
    """Print and write the table (``OUT/table.md``) and print the metric lines; returns the metrics."""
    per_cond = {c: summarise([r for r in rows if r["condition"] == c]) for c in args.conditions}
    table = []
    for c in args.conditions:
        table.append(_row(c, "all", per_cond[c]))
        for task in args.tasks:
            table.append(_row(c, task, summarise([r for r in rows if r["condition"] == c and r["task"] == task])))
    seeds = sorted({s for _, s in plan})
    title = (
        f"Skills on MiniWoB++ held-out episodes: model {args.model} ({args.dtype}), {len(args.tasks)} tasks x "
        f"{args.seeds} held-out seeds ({seeds[0]}-{seeds[-1]}), max_steps {args.max_steps}, "
        f"max_new_tokens {args.max_new_tokens}, temperature {args.temperature} top_p {args.top_p} top_k "
        f"{args.top_k}, sampling seed from rollout seed {args.seed}, {args.n_envs} browsers"
    )
    lines = [
        title,
        "",
        md_table(HEADER, table),
        "",
    ]
    for c in args.conditions:
        s = per_cond[c]
        if s["seed_success_mean"] is not None:
            std = "" if s["seed_success_std"] is None else f" +- {s['seed_success_std']:.3f}"
            lines.append(f"- {c}: success per seed {s['seed_success_mean']:.3f}{std} over {s['seeds']} seeds")
    for c in args.conditions:
        s = per_cond[c]
        listed = sorted({n for r in rows if r["condition"] == c for n in r.get("skills_listed") or ()})
        lines.append(
            f"- {c}: skills listed {len(listed)} ({', '.join(listed) or 'none'}); load_skill calls "
            f"{s['load_skill_steps']}, successful loads {s['successful_loads']}; solved with a loaded skill "
            f"{s['solved_with_loaded_skill']}/{s['episodes_with_loaded_skill']}, without "
            f"{s['solved_without_loaded_skill']}/{s['episodes_without_loaded_skill']}; "
            f"tokens per episode {_r(s['tokens_per_episode'], 1)}"
        )
    pairs = {c: paired(rows, c) for c in args.conditions if c != "none"}
    for c, pr in pairs.items():
        if pr is not None:
            lines.append(
                f"- {c} vs none, paired over {pr['episodes']} episodes: solved only with {c} {pr['wins']}, "
                f"only without {pr['losses']}, both {pr['both']}, neither {pr['neither']}"
            )
    text = "\n".join(lines)
    print(text)
    (out / "table.md").write_text(text + "\n")
    plot(per_cond, out / "web_skills.png", title)

    metrics = []
    for c in args.conditions:
        s = per_cond[c]
        metrics += [
            metric(f"web_skills_episodes/{c}", s["episodes"], f"= {len(plan)} planned", s["episodes"] == len(plan)),
            metric(
                f"web_skills_success_rate/{c}",
                _r(s["success_rate"]),
                f"informational: {s['successes']} of {s['episodes']} held-out episodes solved",
                s["episodes"] > 0,
            ),
            metric(
                f"web_skills_load_skill_step_fraction/{c}",
                _r(s["load_skill_step_fraction"]),
                f"informational: {s['load_skill_steps']} of {s['steps']} steps call load_skill "
                "(issue 14 saw 0 of 24 with the 0.5B model)",
                s["steps"] > 0,
            ),
            metric(
                f"web_skills_read_skill_file_steps/{c}",
                s["read_skill_file_steps"],
                f"informational: of {s['steps']} steps",
                True,
            ),
            metric(
                f"web_skills_episodes_with_load_skill/{c}",
                s["episodes_with_load_skill"],
                f"informational: of {s['episodes']} episodes",
                True,
            ),
            metric(
                f"web_skills_successful_loads/{c}",
                s["successful_loads"],
                "> 0 in a catalog condition (issue 48: the 0.5B model loaded no skill in 16 episodes)"
                if c not in ("none", "preload")
                else "informational (no catalog condition)",
                s["successful_loads"] > 0 or c in ("none", "preload"),
            ),
            metric(
                f"web_skills_solved_with_loaded_skill/{c}",
                f"{s['solved_with_loaded_skill']}/{s['episodes_with_loaded_skill']}",
                f"informational: without a loaded skill {s['solved_without_loaded_skill']}/"
                f"{s['episodes_without_loaded_skill']}",
                True,
            ),
            metric(
                f"web_skills_tokens_per_episode/{c}", _r(s["tokens_per_episode"], 1), "informational", s["episodes"] > 0
            ),
            metric(f"web_skills_mean_steps/{c}", _r(s["mean_steps"]), f"<= max_steps {args.max_steps}", True),
            metric(
                f"web_skills_failures/{c}",
                s["failures"],
                "0 runtime (browser) and 0 evaluation failures",
                s["failures"]["runtime"] + s["failures"]["evaluation"] == 0,
            ),
            metric(
                f"web_skills_prompt_tokens_per_step/{c}",
                _r(s["prompt_tokens_per_step"], 1),
                f"informational: {s['prompt_tokens']} prompt, {s['completion_tokens']} completion tokens",
                True,
            ),
            metric(f"web_skills_wall_s/{c}", round(s["wall_s"], 1), "informational: summed wave shares", True),
        ]
    for c, pr in pairs.items():
        if pr is None or "none" not in per_cond:
            continue
        delta = (pr["wins"] - pr["losses"]) / pr["episodes"]
        metrics.append(
            metric(
                f"web_skills_success_delta/{c}_vs_none",
                round(delta, 4),
                f"> 0: {c} raises held-out success (paired over {pr['episodes']} episodes: {pr['wins']} wins, "
                f"{pr['losses']} losses)",
                delta > 0,
            )
        )
    sets = {c: sorted((r["task"], r["seed"]) for r in rows if r["condition"] == c) for c in args.conditions}
    same = len({tuple(v) for v in sets.values()}) == 1
    metrics.append(metric("web_skills_same_episodes", same, "every condition ran the same (task, seed) set", same))
    metrics.append(metric("web_skills_new_episodes", new_episodes, "informational: episodes run by this call", True))
    metrics.append(metric("web_skills_call_wall_s", round(call_wall_s, 1), "informational: this call", True))
    return metrics


def plot(per_cond: dict[str, dict[str, Any]], path: Path, title: str) -> Path:
    """Grouped bars per condition: success over all episodes, over those with a loaded skill and over those
    without (count on each bar), saved to ``path`` (PNG, matplotlib Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [
        ("all episodes", "successes", "episodes"),
        ("with a loaded skill", "solved_with_loaded_skill", "episodes_with_loaded_skill"),
        ("without a loaded skill", "solved_without_loaded_skill", "episodes_without_loaded_skill"),
    ]
    names = list(per_cond)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(names)), 3.8))
    width = 0.8 / len(groups)
    for j, (label, k, n) in enumerate(groups):
        xs = [i + width * (j - 1) for i in range(len(names))]
        vals = [100 * per_cond[c][k] / per_cond[c][n] if per_cond[c][n] else 0 for c in names]
        bars = ax.bar(xs, vals, width=width, label=label)
        for bar, c in zip(bars, names):
            ax.annotate(
                f"{per_cond[c][k]}/{per_cond[c][n]}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center"
            )
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("episodes solved (%)")
    ax.set_ylim(0, 110)
    ax.set_title("\n".join(textwrap.wrap(title, 100)[:3]), fontsize=7)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


if __name__ == "__main__":
    sys.exit(main())
