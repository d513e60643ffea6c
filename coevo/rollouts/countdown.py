"""Verifiable reasoning tasks with exact checkers: integer arithmetic and Countdown.

* ``arithmetic``: "What is 37 * 4 + 12?"; reward 1.0 when the first integer of the answer is exact.
* ``countdown`` (as in Qiu et al., "Evolution Strategies at Scale", arXiv 2509.24372 §4): given numbers and a
  target, write an arithmetic expression using each number at most once that equals the target; reward 1.0
  for a correct expression, 0.1 for a well-formed but wrong one (format reward), 0.0 otherwise.

Cases are generated from a seed: train cases change per ES generation (seed = (split seed, generation)),
held-out test cases are fixed, and so is their sampling seed (with ``temperature > 0``): every held-out
evaluation (the base model's, after each update, the last one) samples with the same random numbers, so two
evaluations differ by the weights and the context only. The answer is parsed from ``<answer>...</answer>``
when present, else from the last line. Expressions are checked with :mod:`ast` (only + - * / and parentheses on integers): the model
output is never ``eval``-ed.
"""

from __future__ import annotations

import ast
import random
import re
from fractions import Fraction
from typing import Any, Literal

from pydantic import Field, model_validator

from coevo.backends.base import Completion, SamplingParams
from coevo.rollouts.base import Split, register_rollout
from coevo.rollouts.batched import SingleTurnConfig, SingleTurnRollout
from coevo.rollouts.logprob import target_logprobs
from coevo.sandbox.extract import CandidateParseError, parse_bounded
from coevo.types import Step

_INT = re.compile(r"-?\d+")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class CountdownConfig(SingleTurnConfig):
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
        tree = parse_bounded(expr.strip().replace("×", "*").replace("÷", "/"), mode="eval")
        value, used = _eval_expr(tree)
    except (CandidateParseError, ValueError, ZeroDivisionError, RecursionError):
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
class CountdownRollout(SingleTurnRollout):
    """Arithmetic / Countdown cases with exact checkers (see module docstring). Context slots
    ``system_prompt`` and ``instruction`` (:class:`~coevo.rollouts.batched.SingleTurnRollout`)."""

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

    def _sampling(self, generation: int, split: Split = "train") -> SamplingParams:
        """Decoding of one call: seed ``seed + generation`` on the train split (every member of a generation
        draws the same random numbers), ``seed + 7919`` on the held-out split whatever the generation."""
        cfg = self.config
        seed = cfg.seed + (generation if split == "train" else 7_919)
        return SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=1.0, seed=seed)

    def answer(self, policy, rows, cases, split: Split, generation: int) -> list[tuple[Completion | None, Any]]:
        """``(completion or None, (log p(answer), tokens) or None)`` per row: completions unless the reward is
        dense and the split is train; the answer's log-probability with ``reward: answer_logprob``."""
        dense = self.config.reward == "answer_logprob"
        sampling = self._sampling(generation, split)
        outs = policy.generate(rows, sampling) if split == "test" or not dense else [None] * len(rows)
        scored = target_logprobs(policy, rows, [str(c["answer"]) for c in cases]) if dense else [None] * len(rows)
        return list(zip(outs, scored, strict=True))

    def case_fields(self, case: dict, output, call, index: int) -> dict:
        cfg = self.config
        out, dense_score = output
        exact, feedback = score_case(cfg.task, case, out.text) if out is not None else (None, "")
        reward = dense_score[0] / dense_score[1] if dense_score is not None else exact
        if dense_score is not None:
            feedback = f"log p(answer) per token = {reward:.4f}" + (f"; greedy answer: {feedback}" if out else "")
        if out is None:
            out = Completion(text="", prompt_tokens=0, completion_tokens=0)
        return {
            "task_id": f"{cfg.task}:{call.split}:{call.generation if call.split == 'train' else 0}:{index}",
            "steps": [
                Step(
                    observation=case["prompt"],
                    model_output=out.text,
                    action=extract_answer(out.text),
                    tool_result=feedback,
                    reward=reward,
                )
            ],
            "reward": reward,
            "valid": out.error is None,
            "failure": "llm_error" if out.error else None,
            "failure_detail": out.error,
            "llm_calls": 1,
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": out.completion_tokens,
            "meta": {"case": case, "exact": exact},
        }

    def n_cases(self, split: Split = "train") -> int:
        return self.config.cases_per_member if split == "train" else self.config.test_cases
