"""Running the held-out sampler test: prompts -> answers -> sandbox -> rates with 95 % intervals.

For each problem of the prompt set (:mod:`coevo.sampler_test.promptset`) the first ``prompts`` prompts go
through :class:`coevo.ahd.sampler.HeuristicSampler` as in a run (one batched ``generate`` per batch of 8, the
answer read back, the code evaluated in the sandbox on ``train_count`` instances of the training size drawn
from the set's ``instance_seed``), with the set's sampling settings and seeds. Every answer that defines the
function is evaluated (no duplicate is rejected before evaluation).

Per answer (JSON lines, ``answers.jsonl``): valid or not (failure kind), objective, behaviour key
(:func:`coevo.ahd.sampler.behaviour_key`: the exact per-instance objectives), the best parent's objective
(for i1, which has no parent: the problem's seed heuristic, the textbook rule), tokens and the text.

Per problem and over all problems (``summary.jsonl`` and a table):

* ``valid``: the answer defines the function, runs and is feasible on every instance;
* ``valid_new``: valid, and its per-instance objectives equal neither a known heuristic's (every parent of the
  problem's set and its seed heuristic) nor an earlier (lower index) valid answer's of the same problem: what the
  sampler's ``reject_same_behaviour`` would keep;
* ``better``: valid with an objective strictly better than its best parent's (relative tolerance 1e-9);
* ``tokens_per_valid_new``: completion tokens of all answers / valid-and-new answers.

Rates carry a Wilson 95 % interval; the token ratio a percentile bootstrap over prompts (2,000 resamples, seed 0;
it treats the prompts as independent, which the "earlier answer" rule of ``valid_new`` is not quite).

Resume: ``answers.jsonl`` is appended one whole batch at a time; a rerun with the same ``--out`` skips the
batches it holds (a batch cut by a kill is redone: its seeds do not depend on what was done before). The
header line names the model, the prompt set and its settings; an ``--out`` holding another model's or
version's test is refused.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coevo.errors import InputFileError, UsageError
from coevo.sampler_test.promptset import PROBLEMS, ProblemSet, PromptSet, load_prompt_set
from coevo.sampler_test.stats import bootstrap_ratio_interval, wilson_interval

if TYPE_CHECKING:
    from coevo.ahd.population import Individual
    from coevo.ahd.problem import HeuristicProblem
    from coevo.ahd.sampler import HeuristicSampler
    from coevo.backends.base import Policy
    from coevo.store import TrajectoryStore

#: relative tolerance of "better than its best parent"
BETTER_RTOL = 1e-9
#: characters of an answer's text kept in answers.jsonl
TEXT_LIMIT = 4000
#: evaluations more of a test parent that ran out of time (a busy machine; the set's builder found it valid)
PARENT_TIMEOUT_RETRIES = 2


def make_test_sampler(
    problem: HeuristicProblem, settings: dict[str, Any], *, store: TrajectoryStore, run_id: str, instance_seed: int
) -> HeuristicSampler:
    """The :class:`~coevo.ahd.sampler.HeuristicSampler` of one problem of the test, built from the prompt set's
    ``settings`` as a run's heuristic-design evolver builds its own (:mod:`coevo.evolvers.ahd_common`), with
    the duplicate and same-behaviour checks off (every answer is evaluated; "new" is counted afterwards).

    This is the one place the test builds a sampler.
    """
    from coevo.ahd.sampler import HeuristicSampler, SamplerSettings
    from coevo.backends.base import SamplingParams
    from coevo.budget import Budget

    s = settings
    return HeuristicSampler(
        problem,
        SamplerSettings(
            train_size=int(s["train_size"]),
            train_count=int(s["train_count"]),
            train_seed=int(instance_seed),
            eval_timeout_s=float(s["eval_timeout_s"]),
            eval_memory_mb=int(s["eval_memory_mb"]),
            eval_workers=int(s["eval_workers"]),
            reject_duplicates=False,
            reject_same_behaviour=False,
            answer_format=s["answer_format"],
            answer_grammar=bool(s["answer_grammar"]),
            change_marks=bool(s["change_marks"]),
        ),
        owner="sampler-test",
        run_id=run_id,
        store=store,
        budget=Budget(store, run_id, None),
        sampling=SamplingParams(
            max_new_tokens=int(s["max_new_tokens"]),
            temperature=float(s["temperature"]),
            top_p=float(s["top_p"]),
            top_k=int(s["top_k"]),
            stop=tuple(s["stop"]),
        ),
    )


def evaluated_parents(
    sampler: HeuristicSampler, pset: ProblemSet
) -> tuple[dict[str, Individual], Individual, dict[str, Any]]:
    """The set's parents as evaluated individuals (id ``parent:<name>``, operator ``seed``), the problem's seed
    heuristic (id ``seed``: the baseline of i1 answers, which have no parent) and the ``known`` line: every
    parent's and the seed heuristic's objective and behaviour key.

    Raises:
        RuntimeError: a parent or the seed heuristic is invalid on the test instances (a broken prompt set, or
            one out of time :data:`PARENT_TIMEOUT_RETRIES` + 1 times on an overloaded machine).
    """
    from coevo.ahd.population import Individual
    from coevo.ahd.sampler import behaviour_key

    named = [(p.name, p.thought, p.code) for p in pset.parents.values()]
    seed_code = sampler.problem.seed_heuristic_code()
    named.append(("seed", sampler.problem.heuristic_idea(seed_code) or "the problem's seed heuristic", seed_code))
    results = sampler.evaluate([code for _, _, code in named])
    for _ in range(PARENT_TIMEOUT_RETRIES):  # valid when the set was built, out of time on a busy machine
        again = [i for i, r in enumerate(results) if not r.valid and r.error_kind == "timeout"]
        for i, r in zip(again, sampler.evaluate([named[i][2] for i in again])):
            results[i] = r
    individuals: dict[str, Individual] = {}
    known: dict[str, Any] = {}
    for (name, thought, code), res in zip(named, results):
        if not res.valid:
            raise RuntimeError(f"{pset.problem}: test parent {name} is invalid ({res.error_kind}: {res.error})")
        individuals[name] = Individual(
            id="seed" if name == "seed" else f"parent:{name}", thought=thought, code=code, objective=res.objective,
            reward=res.score, operator="seed", source="sampler-test",
        )  # fmt: skip
        known[name] = {"objective": res.objective, "behaviour": behaviour_key(res.metrics.get("objectives"))}
    seed = individuals.pop("seed")
    return individuals, seed, known


def _answer_row(problem, prompt, row, batch_seed, t, baseline, wall) -> dict[str, Any]:
    from coevo.ahd.sampler import behaviour_key
    from coevo.backends.base import request_seed

    metrics = t.meta.get("metrics") or {}
    return {
        "kind": "answer",
        "problem": problem,
        "index": prompt.index,
        "operator": prompt.operator,
        "parents": list(prompt.parents),
        "batch_seed": batch_seed,
        "row": row,
        "request_seed": request_seed(batch_seed, row),
        "valid": bool(t.valid),
        "failure": t.failure,
        "detail": (t.failure_detail or "")[:300] or None,
        "objective": t.meta.get("objective"),
        "behaviour": behaviour_key(metrics.get("objectives")) if t.valid else None,
        "baseline": baseline,
        "baseline_objective": None,
        "finish_reason": t.meta.get("finish_reason"),
        "prompt_tokens": t.prompt_tokens,
        "completion_tokens": t.completion_tokens,
        "batch_wall_s": round(wall, 2),
        "text": (t.steps[0].model_output or "")[:TEXT_LIMIT] if t.steps else "",
    }


class AnswerLog:
    """``answers.jsonl`` of one test: a header line, per problem a ``known`` line, the answer lines; appended a
    batch at a time (one ``write`` + ``fsync``) so a kill leaves whole batches and at most one torn last line.

    Raises (constructor):
        InputFileError: the file holds another model's or prompt set's test, or is not a test's answers.
    """

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self.rows: list[dict[str, Any]] = []
        self.known: dict[str, dict[str, Any]] = {}
        if path.exists():
            lines = path.read_text().splitlines()
            parsed = []
            for line in lines:
                try:
                    parsed.append(json.loads(line))
                except ValueError:
                    continue  # a line torn by a kill: its batch is incomplete and is redone
            if not parsed or parsed[0].get("kind") != "header":
                raise InputFileError(f"{path} is not a sampler-test answers file; give another --out")
            old = parsed[0]
            for key in ("model", "version", "settings"):
                if old.get(key) != header.get(key):
                    raise InputFileError(
                        f"{path} holds a test of {key} {old.get(key)!r}, not {header.get(key)!r}; give another --out"
                    )
            answers: dict[tuple[str, int], dict[str, Any]] = {}
            for rec in parsed[1:]:
                if rec.get("kind") == "known":
                    self.known[rec["problem"]] = rec["known"]
                elif rec.get("kind") == "answer":
                    answers[(rec["problem"], rec["index"])] = rec  # a redone batch's answer replaces the torn one
            self.rows = list(answers.values())
            if lines and not path.read_text().endswith("\n"):
                self._write("\n")  # the next batch starts on a line of its own
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._write(json.dumps(header) + "\n")

    def _write(self, text: str) -> None:
        with self.path.open("a") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    def done(self, problem: str, indices: Sequence[int]) -> bool:
        """Whether every answer of ``indices`` of ``problem`` is recorded."""
        have = {r["index"] for r in self.rows if r["problem"] == problem}
        return set(indices) <= have

    def add_known(self, problem: str, known: dict[str, Any]) -> None:
        if problem not in self.known:
            self.known[problem] = known
            self._write(json.dumps({"kind": "known", "problem": problem, "known": known}) + "\n")

    def add(self, rows: list[dict[str, Any]]) -> None:
        redone = {(r["problem"], r["index"]) for r in rows}
        self.rows = [r for r in self.rows if (r["problem"], r["index"]) not in redone] + rows
        self._write("".join(json.dumps(r) + "\n" for r in rows))


def run_problem(
    pset: ProblemSet,
    prompt_set: PromptSet,
    n_prompts: int,
    log: AnswerLog,
    policy: Callable[[], Policy],
    progress: Callable[[str], None] = lambda _line: None,
) -> None:
    """Answer the first ``n_prompts`` prompts of one problem (batches already in ``log`` skipped) and append
    them to ``log``. ``policy`` is called only when a batch is due (a finished test loads no model)."""
    from coevo.ahd.problem import load_problem
    from coevo.store import TrajectoryStore

    prompts = pset.prompts[:n_prompts]
    batches = [prompts[i : i + prompt_set.batch_size] for i in range(0, len(prompts), prompt_set.batch_size)]
    todo = [b for b in batches if not log.done(pset.problem, [p.index for p in b])]
    if not todo and pset.problem in log.known:
        return
    problem = load_problem(pset.problem)
    with tempfile.TemporaryDirectory(prefix="coevo-sampler-test-") as tmp:
        store = TrajectoryStore(Path(tmp) / "store.sqlite")
        try:
            sampler = make_test_sampler(
                problem, pset.settings, store=store, run_id="sampler-test", instance_seed=prompt_set.instance_seed
            )
            parents, seed_ind, known = evaluated_parents(sampler, pset)
            log.add_known(pset.problem, known)
            for batch in todo:
                batch_seed = batch[0].seed
                jobs = [
                    sampler.job(
                        p.operator,
                        key=sampler.key(pset.problem, p.index),
                        seed=batch_seed,
                        parents=[parents[name] for name in p.parents],
                    )
                    for p in batch
                ]
                t0 = time.perf_counter()
                trajs = sampler.sample(jobs, round_index=0, generation=0, policy=policy())
                wall = time.perf_counter() - t0
                rows = []
                for r, (p, t) in enumerate(zip(batch, trajs, strict=True)):
                    best = max((parents[name] for name in p.parents), key=lambda q: q.reward, default=seed_ind)
                    row = _answer_row(pset.problem, p, r, batch_seed, t, best.id, wall)
                    row["baseline_objective"] = best.objective
                    rows.append(row)
                log.add(rows)
                ok = sum(r["valid"] for r in rows)
                progress(f"{pset.problem}: prompts {batch[0].index}..{batch[-1].index}: {ok} valid, {wall:.0f} s")
        finally:
            store.close()


def _better(objective: float | None, baseline: float, direction: str) -> bool:
    if objective is None:
        return False
    tol = BETTER_RTOL * max(1.0, abs(baseline))
    return objective < baseline - tol if direction == "minimize" else objective > baseline + tol


def score_rows(rows: list[dict[str, Any]], known: dict[str, Any], direction: str) -> list[dict[str, Any]]:
    """``rows`` of one problem in index order, each with ``new`` (valid and a behaviour no known heuristic and no
    earlier valid answer has) and ``better`` set (module docstring)."""
    seen = {k["behaviour"] for k in known.values() if k.get("behaviour")}
    out = []
    for r in sorted(rows, key=lambda r: r["index"]):
        new = bool(r["valid"]) and r["behaviour"] is not None and r["behaviour"] not in seen
        if r["valid"] and r["behaviour"] is not None:
            seen.add(r["behaviour"])
        better = bool(r["valid"]) and _better(r["objective"], r["baseline_objective"], direction)
        out.append({**r, "new": new, "better": better})
    return out


def _rate(hits: int, n: int) -> dict[str, Any]:
    lo, hi = wilson_interval(hits, n)
    return {"n": hits, "pct": round(100 * hits / n, 1), "ci95": [round(100 * lo, 1), round(100 * hi, 1)]}


def summarise(scored: list[dict[str, Any]], label: str) -> dict[str, Any]:
    """The summary line of ``scored`` answers (:func:`score_rows`): counts, rates with Wilson 95 % intervals,
    tokens per valid-and-new answer with its bootstrap interval, failure kinds, answers cut at the token cap and
    ``wall_s`` (generating and evaluating the batches, summed)."""
    n = len(scored)
    tokens = [r["completion_tokens"] for r in scored]
    hits = [int(r["new"]) for r in scored]
    total_new = sum(hits)
    lo, hi = bootstrap_ratio_interval(tokens, hits)
    walls = {(r["problem"], r["batch_seed"]): r["batch_wall_s"] for r in scored}
    return {
        "kind": "summary",
        "problem": label,
        "prompts": n,
        "valid": _rate(sum(r["valid"] for r in scored), n),
        "valid_new": _rate(total_new, n),
        "better": _rate(sum(r["better"] for r in scored), n),
        "completion_tokens": sum(tokens),
        "tokens_per_valid_new": round(sum(tokens) / total_new, 1) if total_new else None,
        "tokens_per_valid_new_ci95": [None if lo is None else round(lo, 1), None if hi is None else round(hi, 1)],
        "cut_at_cap": sum(r["finish_reason"] == "length" for r in scored),
        "failures": dict(Counter(r["failure"] for r in scored if not r["valid"])),
        "wall_s": round(sum(walls.values()), 1),  # generate + evaluate, summed over the batches
    }


def table(summaries: list[dict[str, Any]]) -> str:
    """The summaries as a fixed-width text table (rates in %, 95 % intervals in brackets)."""

    def rate(x):
        return f"{x['pct']:5.1f} [{x['ci95'][0]:4.1f}, {x['ci95'][1]:5.1f}]"

    def ratio(s):
        if s["tokens_per_valid_new"] is None:
            return "n/a"
        lo, hi = s["tokens_per_valid_new_ci95"]
        return f"{s['tokens_per_valid_new']:.0f} [{lo:.0f}, {'inf' if hi is None else f'{hi:.0f}'}]"

    head = f"{'problem':16} {'prompts':>7}  {'valid %':20} {'valid & new %':20} {'better than parent %':20} tokens/valid&new"
    lines = [head]
    for s in summaries:
        lines.append(
            f"{s['problem']:16} {s['prompts']:7d}  {rate(s['valid']):20} {rate(s['valid_new']):20} "
            f"{rate(s['better']):20} {ratio(s)}"
        )
    return "\n".join(lines)


def model_slug(ref: str) -> str:
    """A folder name for MODEL ``ref`` (its last path part, unsafe characters as ``_``)."""
    name = Path(ref.rstrip("/")).name or ref
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"


def sampler_test(
    model: str,
    *,
    out: str | Path | None = None,
    prompts: int | None = None,
    problems: Sequence[str] = PROBLEMS,
    version: str | None = None,
    backend: str = "auto",
    progress: Callable[[str], None] = lambda _line: None,
) -> tuple[list[dict[str, Any]], Path]:
    """Run (or resume) the held-out sampler test of MODEL (module docstring; MODEL: :mod:`model_ref`).

    Args:
        model: the MODEL reference. out: output folder (default ``sampler-test/<model>-<version>``).
        prompts: prompts per problem (default: all of the set's, 128). problems: which problems.
        version: prompt set version (default :data:`~coevo.sampler_test.promptset.PROMPT_SET_VERSION`).
        backend: engine of a registered name or model folder ("auto", "hf", "vllm").

    Returns:
        ``(summary lines, out folder)``: one summary per problem, then ``overall``; also written to
        ``summary.jsonl`` in the folder.

    Raises:
        UsageError: ``prompts`` < 1 or more than the set holds, an unknown problem.
        InputFileError: an unknown version; an ``out`` holding another test.
        SamplerTestModelError / ModelPrepareError: MODEL cannot be loaded (:func:`model_ref.load_model`).
    """
    from coevo.ahd.problem import load_problem
    from coevo.sampler_test.model_ref import check_model, load_model

    prompt_set = load_prompt_set(version) if version else load_prompt_set()
    unknown = [p for p in problems if p not in prompt_set.problems]
    if unknown:
        raise UsageError(f"--problems: {', '.join(unknown)} not in the prompt set; known: {', '.join(PROBLEMS)}")
    most = min(len(prompt_set.problems[p].prompts) for p in problems)
    n = most if prompts is None else prompts
    if not 1 <= n <= most:
        raise UsageError(f"--prompts must be between 1 and {most} (the prompt set's prompts per problem), got {n}")
    kind = check_model(model)  # a bad MODEL fails here, before anything is written or loaded
    out_dir = Path(out) if out is not None else Path("sampler-test") / f"{model_slug(model)}-{prompt_set.version}"
    header = {
        "kind": "header",
        "model": model,
        "model_kind": kind,
        "version": prompt_set.version,
        "settings": {p: s.settings for p, s in sorted(prompt_set.problems.items())},  # any --problems may resume
        "instance_seed": prompt_set.instance_seed,
        "batch_size": prompt_set.batch_size,
    }
    log = AnswerLog(out_dir / "answers.jsonl", header)
    loaded = None

    def policy() -> Policy:
        nonlocal loaded
        if loaded is None:
            t0 = time.perf_counter()
            loaded = load_model(model, backend=backend, batch_size=prompt_set.batch_size)
            progress(
                f"model {model} ({loaded.kind}, {loaded.info.get('engine')}) loaded in {time.perf_counter() - t0:.0f} s"
            )
            (out_dir / "model.json").write_text(
                json.dumps({"model": model, "kind": loaded.kind, **loaded.info}, indent=2)
            )
        return loaded.policy

    try:
        for name in problems:
            run_problem(prompt_set.problems[name], prompt_set, n, log, policy, progress)
    finally:
        if loaded is not None:
            loaded.policy.close()
    summaries, everything = [], []
    for name in problems:
        rows = [r for r in log.rows if r["problem"] == name and r["index"] < n]
        scored = score_rows(rows, log.known[name], load_problem(name).direction)
        summaries.append(summarise(scored, name))
        everything.extend(scored)
    summaries.append(summarise(everything, "overall"))
    for s in summaries:
        s.update(model=model, model_kind=kind, version=prompt_set.version, prompts_per_problem=n)
    (out_dir / "summary.jsonl").write_text("".join(json.dumps(s) + "\n" for s in summaries))
    return summaries, out_dir
