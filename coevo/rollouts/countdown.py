"""Verifiable reasoning tasks with exact checkers: integer arithmetic and Countdown.

* ``arithmetic``: "What is 37 * 4 + 12?"; reward 1.0 when the first integer of the answer is exact.
* ``countdown`` (as in Qiu et al., "Evolution Strategies at Scale", arXiv 2509.24372 §4): given numbers and a
  target, write an arithmetic expression using each number at most once that equals the target; reward 1.0
  for a correct expression, 0.1 for a well-formed but wrong one (format reward), 0.0 otherwise.

Cases are generated from a seed: train cases change per ES generation (seed = (split seed, generation)),
held-out test cases are fixed. The answer is parsed from ``<answer>...</answer>`` when present, else from
the last line. Expressions are checked with :mod:`ast` (only + - * / and parentheses on integers): the model
output is never ``eval``-ed.
"""

from __future__ import annotations

import ast
import random
import re
import time
from fractions import Fraction
from typing import Literal

from pydantic import Field, model_validator

from coevo.backends.base import Completion, SamplingParams
from coevo.rollouts.base import Rollout, RolloutConfig, Split, register_rollout
from coevo.rollouts.logprob import target_logprobs
from coevo.types import Step

_INT = re.compile(r"-?\d+")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class CountdownConfig(RolloutConfig):
    type: str = "countdown"
    task: Literal["arithmetic", "countdown"] = Field("arithmetic", description="which task family")
    cases_per_member: int = Field(8, ge=1, description="train cases per population member (and generation)")
    test_cases: int = Field(32, ge=1, description="held-out cases")
    seed: int = Field(1234, description="seed of the case generator")
    max_operand: int = Field(20, ge=2, description="largest operand / number")
    n_numbers: int = Field(3, ge=2, le=6, description="countdown: numbers per case")
    max_new_tokens: int = Field(24, ge=1, description="answer length limit in tokens")
    temperature: float = Field(0.0, ge=0, description="0 = greedy decoding (as Qiu et al.)")
    same_cases_for_all_members: bool = Field(True, description="every member of a generation sees the same cases")
    reward: Literal["exact", "answer_logprob"] = Field(
        "exact",
        description="exact: 1 for a correct answer (sampled/greedy); answer_logprob: per-token log-probability of "
        "the checker's correct answer (dense, no sampling; arithmetic only); held-out cases also record exact-match",
    )

    @model_validator(mode="after")
    def _check_reward(self) -> CountdownConfig:
        if self.reward == "answer_logprob" and self.task != "arithmetic":
            raise ValueError("reward 'answer_logprob' needs task 'arithmetic' (countdown has many correct answers)")
        return self


def _eval_expr(node: ast.AST) -> tuple[Fraction, list[int]]:
    if isinstance(node, ast.Expression):
        return _eval_expr(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return Fraction(node.value), [node.value]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        a, na = _eval_expr(node.left)
        b, nb = _eval_expr(node.right)
        if isinstance(node.op, ast.Add):
            v = a + b
        elif isinstance(node.op, ast.Sub):
            v = a - b
        elif isinstance(node.op, ast.Mult):
            v = a * b
        else:
            if b == 0:
                raise ZeroDivisionError
            v = a / b
        return v, na + nb
    raise ValueError("only integers, + - * / and parentheses are allowed")


def check_countdown(expr: str, numbers: list[int], target: int) -> tuple[bool, bool]:
    """(well_formed, correct) for a Countdown answer: each given number used at most once, value == target."""
    try:
        tree = ast.parse(expr.strip().replace("×", "*").replace("÷", "/"), mode="eval")
        value, used = _eval_expr(tree)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return False, False
    pool = list(numbers)
    for n in used:
        if n not in pool:
            return True, False
        pool.remove(n)
    return True, value == target


def extract_answer(text: str) -> str:
    """The answer span: inside ``<answer>`` tags if present, else the last non-empty line."""
    m = _ANSWER.search(text)
    if m:
        return m.group(1).strip()
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def make_case(task: str, rng: random.Random, max_operand: int, n_numbers: int) -> dict:
    """One task case: {"prompt", "answer"} (arithmetic) or {"prompt", "numbers", "target"} (countdown)."""
    if task == "arithmetic":
        a, b, c = (rng.randint(2, max_operand) for _ in range(3))
        op1, op2 = rng.choice("+-*"), rng.choice("+-")
        expr = f"{a} {op1} {b} {op2} {c}"
        value = int(_eval_expr(ast.parse(expr, mode="eval"))[0])
        return {"prompt": f"What is {expr}? Answer with the number only.", "answer": value, "expr": expr}
    while True:
        nums = [rng.randint(1, max_operand) for _ in range(n_numbers)]
        ops = [rng.choice("+-*") for _ in range(n_numbers - 1)]
        expr = str(nums[0])
        for op, n in zip(ops, nums[1:]):
            expr = f"({expr} {op} {n})"
        target = int(_eval_expr(ast.parse(expr, mode="eval"))[0])
        if target > 0:
            break
    prompt = (
        f"Using the numbers {nums}, each at most once, and the operations + - * /, write an expression that "
        f"equals {target}. Give only the expression inside <answer></answer>."
    )
    return {"prompt": prompt, "numbers": nums, "target": target}


def score_case(task: str, case: dict, text: str) -> tuple[float, str]:
    """Reward and feedback for one answer."""
    ans = extract_answer(text)
    if task == "arithmetic":
        m = _INT.search(ans) or _INT.search(text)
        if not m:
            return 0.0, "no integer in the answer"
        ok = int(m.group()) == case["answer"]
        return (1.0, "correct") if ok else (0.0, f"wrong: {m.group()} != {case['answer']}")
    well_formed, correct = check_countdown(ans, case["numbers"], case["target"])
    if correct:
        return 1.0, "correct"
    return (0.1, "well-formed but wrong") if well_formed else (0.0, "malformed expression")


@register_rollout("countdown")
class CountdownRollout(Rollout):
    """Arithmetic / Countdown cases with exact checkers (see module docstring)."""

    Config = CountdownConfig

    def cases(self, split: Split, generation: int, member_index: int = 0) -> list[dict]:
        cfg = self.config
        if split == "test":
            rng = random.Random(f"{cfg.seed}/test")
            n = cfg.test_cases
        else:
            salt = "" if cfg.same_cases_for_all_members else f"/{member_index}"
            rng = random.Random(f"{cfg.seed}/train/{generation}{salt}")
            n = cfg.cases_per_member
        return [make_case(cfg.task, rng, cfg.max_operand, cfg.n_numbers) for _ in range(n)]

    def _request(self, split: Split, generation: int, member) -> tuple[list[dict], list[list[dict]]]:
        cases = self.cases(split, generation, member.index if member else 0)
        return cases, [[{"role": "user", "content": c["prompt"]}] for c in cases]

    def _sampling(self, generation: int) -> SamplingParams:
        cfg = self.config
        return SamplingParams(
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=1.0, seed=cfg.seed + generation
        )

    def _needs(self, split: Split) -> tuple[bool, bool]:
        """(generate completions, score the answer's log-probability) for a call on ``split``."""
        dense = self.config.reward == "answer_logprob"
        return split == "test" or not dense, dense

    def run(self, policy, *, generation, member, key_prefix, split: Split = "train", evolver="es", round_index=0):
        cases, convs = self._request(split, generation, member)
        gen, dense = self._needs(split)
        t0 = time.time()
        outs = policy.generate(convs, self._sampling(generation)) if gen else [None] * len(cases)
        scored = target_logprobs(policy, convs, [str(c["answer"]) for c in cases]) if dense else []
        return self._trajectories(
            cases,
            outs,
            scored,
            time.time() - t0,
            generation=generation,
            member=member,
            key_prefix=key_prefix,
            split=split,
            evolver=evolver,
            round_index=round_index,
        )

    def run_population(
        self, population, members, *, generation, key_prefixes, split: Split = "train", evolver="es", round_index=0
    ):
        """Every member's cases as rows of one batched generation (and one batched scoring pass)."""
        requests = [self._request(split, generation, m) for m in members]
        rows = [(m, conv) for m, (_, convs) in zip(members, requests, strict=True) for conv in convs]
        answers = (
            [str(c["answer"]) for cases, _ in requests for c in cases] if self.config.reward == "answer_logprob" else []
        )
        gen, dense = self._needs(split)
        t0 = time.time()
        outs = population.generate(rows, self._sampling(generation)) if gen else [None] * len(rows)
        scored = target_logprobs(population, rows, answers) if dense else []
        dt = (time.time() - t0) / len(members)
        result, start = [], 0
        for m, kp, (cases, _) in zip(members, key_prefixes, requests, strict=True):
            stop = start + len(cases)
            result.append(
                self._trajectories(
                    cases,
                    outs[start:stop],
                    scored[start:stop] if dense else [],
                    dt,
                    generation=generation,
                    member=m,
                    key_prefix=kp,
                    split=split,
                    evolver=evolver,
                    round_index=round_index,
                )
            )
            start = stop
        return result

    def _trajectories(self, cases, outs, scored, dt, *, generation, member, key_prefix, split, evolver, round_index):
        cfg = self.config
        dense = cfg.reward == "answer_logprob"
        trajs = []
        for i, (case, out) in enumerate(zip(cases, outs, strict=True)):
            exact, feedback = score_case(cfg.task, case, out.text) if out is not None else (None, "")
            reward = scored[i][0] / scored[i][1] if dense else exact
            if dense:
                feedback = f"log p(answer) per token = {reward:.4f}" + (f"; greedy answer: {feedback}" if out else "")
            if out is None:
                out = Completion(text="", prompt_tokens=0, completion_tokens=0)
            trajs.append(
                self.case_trajectory(
                    key_prefix=key_prefix,
                    split=split,
                    index=i,
                    generation=generation,
                    member=member,
                    evolver=evolver,
                    round_index=round_index,
                    task_id=f"{cfg.task}:{split}:{generation if split == 'train' else 0}:{i}",
                    steps=[
                        Step(
                            observation=case["prompt"],
                            model_output=out.text,
                            action=extract_answer(out.text),
                            tool_result=feedback,
                            reward=reward,
                        )
                    ],
                    reward=reward,
                    valid=out.error is None,
                    failure="llm_error" if out.error else None,
                    failure_detail=out.error,
                    llm_calls=1,
                    prompt_tokens=out.prompt_tokens,
                    completion_tokens=out.completion_tokens,
                    duration_s=dt / max(1, len(cases)),
                    meta={"split": split, "case": case, "exact": exact},
                )
            )
        return trajs

    def n_cases(self, split: Split = "train") -> int:
        return self.config.cases_per_member if split == "train" else self.config.test_cases
