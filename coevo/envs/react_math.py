"""ReAct tool use on verifiable math: the agent thinks, runs Python in coevo's sandbox, reads the output, answers.

The task family of the ReAct math experiment of Agentic ESOpt (arXiv 2608.17310), on a problem set that needs
no download: :func:`make_problem` generates problems from a seed in eight families whose answers Python
computes exactly (big-integer arithmetic, modular powers, prime sums and counts, gcd / lcm, fraction
arithmetic, digit sums of powers, binomial coefficients, and shopping word problems with decimal prices). The
generator and the templates are in this module; the answers are exact ``int`` / ``Fraction`` values stored as
canonical strings (``"123"``, ``"13/21"``, ``"44.75"``).

Protocol (one reply per turn, :class:`MathEpisode`):

* a reply with a fenced ```` ```python ```` block (or ``<python>...</python>``) is a tool call: the code runs in
  :class:`coevo.sandbox.Sandbox` (bubblewrap when usable, not the zygote that is the default for heuristics:
  tool code is general Python that may import anything installed or run the interpreter; no network,
  private PID namespace, read-only filesystem; always rlimits, a wall-clock timeout and a process-group kill), with the value of a final bare
  expression printed as in a REPL; the next observation is its stdout (capped) plus the error, if any;
* a reply with ``Answer: ...`` / ``<answer>...</answer>`` / ``\\boxed{...}`` ends the episode (whichever of tool
  call and answer comes first in the reply is taken);
* anything else is a counted turn with feedback. After ``max_turns`` turns the episode ends unanswered.

Reward: 1.0 when the answer equals the expected one exactly (:func:`answers_match`: numerically as exact
fractions after normalising ``1,234`` / ``$5`` / ``\\frac{a}{b}`` / ``12.50`` / trailing units, else as
normalised strings), else 0.0. Metrics over k samples per problem: Mean@k (mean success) and Pass@k (the
unbiased estimator of Chen et al. 2021, arXiv 2107.03374).

This module imports only the standard library at import time: the sandbox worker imports it to reach
:func:`tool_target`.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from coevo.envs.multiturn import TurnEpisode
from coevo.sandbox.extract import CandidateParseError, parse_bounded

FAMILIES = ("arith", "modpow", "primes", "gcdlcm", "fraction", "digitsum", "binomial", "shopping")
TOOL_TARGET = "coevo.envs.react_math:tool_target"

_CODE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```|<python>(.*?)</python>", re.DOTALL | re.IGNORECASE)
_ANSWER = re.compile(
    r"<answer>(.*?)</answer>|\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}|(?:final\s+)?answer\s*[:=]\s*(.+)", re.IGNORECASE
)
_NUM = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)(e[-+]?\d+)?$", re.IGNORECASE)


# ----------------------------------------------------------------------------------------------- problems
@dataclass(frozen=True)
class Problem:
    """A math problem with its exact answer (canonical string) and family."""

    problem_id: str
    question: str
    answer: str
    family: str


def _canon(value: int | Fraction) -> str:
    """``int`` -> ``"12"``; a Fraction with a terminating decimal (denominator 2^a 5^b) -> ``"44.75"``; else ``"a/b"``."""
    v = Fraction(value)
    if v.denominator == 1:
        return str(v.numerator)
    d = v.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    if d != 1:
        return f"{v.numerator}/{v.denominator}"
    digits = 0
    while (v * 10**digits).denominator != 1:
        digits += 1
    sign = "-" if v < 0 else ""
    scaled = abs(v.numerator) * 10**digits // v.denominator
    return f"{sign}{scaled // 10**digits}.{scaled % 10**digits:0{digits}d}"


def _primes_below(n: int) -> list[int]:
    sieve = bytearray([1]) * n
    sieve[:2] = b"\x00\x00"[:n]
    for p in range(2, math.isqrt(max(n - 1, 0)) + 1):
        if sieve[p]:
            sieve[p * p :: p] = bytearray(len(range(p * p, n, p)))
    return [i for i in range(n) if sieve[i]]


def make_problem(rng: random.Random, family: str | None = None, problem_id: str = "") -> Problem:
    """One generated problem (family drawn uniformly from :data:`FAMILIES` unless given).

    Raises:
        ValueError: unknown family.
    """
    fam = family or rng.choice(FAMILIES)
    if fam == "arith":
        a, b, c = rng.randint(1000, 99999), rng.randint(100, 9999), rng.randint(1000, 999999)
        q, ans = f"Compute {a} * {b} - {c}.", a * b - c
    elif fam == "modpow":
        a, e, m = rng.randint(2, 99), rng.randint(50, 500), rng.choice([97, 1000, 1009, 10007, 65537])
        q, ans = f"What is {a}^{e} mod {m}?", pow(a, e, m)
    elif fam == "primes":
        n = rng.randint(100, 3000)
        if rng.random() < 0.5:
            q, ans = f"What is the sum of all prime numbers below {n}?", sum(_primes_below(n))
        else:
            q, ans = f"How many prime numbers are there below {n}?", len(_primes_below(n))
    elif fam == "gcdlcm":
        g = rng.randint(2, 60)
        a, b = g * rng.randint(2, 400), g * rng.randint(2, 400)
        if rng.random() < 0.5:
            q, ans = f"What is the greatest common divisor of {a} and {b}?", math.gcd(a, b)
        else:
            q, ans = f"What is the least common multiple of {a} and {b}?", math.lcm(a, b)
    elif fam == "fraction":
        a, b, c, d = rng.randint(1, 30), rng.randint(2, 40), rng.randint(1, 30), rng.randint(2, 40)
        op = rng.choice("+-*")
        val = {
            "+": Fraction(a, b) + Fraction(c, d),
            "-": Fraction(a, b) - Fraction(c, d),
            "*": Fraction(a, b) * Fraction(c, d),
        }[op]
        q, ans = f"Compute {a}/{b} {op} {c}/{d}. Give the result as a fraction in lowest terms.", val
        return Problem(
            problem_id, q, f"{val.numerator}/{val.denominator}" if val.denominator != 1 else str(val.numerator), fam
        )
    elif fam == "digitsum":
        b, e = rng.randint(2, 9), rng.randint(40, 300)
        q, ans = f"What is the sum of the decimal digits of {b}^{e}?", sum(map(int, str(b**e)))
    elif fam == "binomial":
        n = rng.randint(20, 60)
        k = rng.randint(3, n // 2)
        q, ans = (
            f"In how many ways can {k} items be chosen from {n} distinct items (order does not matter)?",
            math.comb(n, k),
        )
    elif fam == "shopping":
        qty1, qty2 = rng.randint(2, 30), rng.randint(2, 30)
        p1, p2 = Fraction(rng.randint(50, 2000), 100), Fraction(rng.randint(50, 2000), 100)
        total = qty1 * p1 + qty2 * p2
        paid = (int(total) // 50 + 1) * 50
        q = (
            f"Sam buys {qty1} notebooks at ${_canon(p1)} each and {qty2} pens at ${_canon(p2)} each, and pays "
            f"with ${paid}. How many dollars of change does Sam get?"
        )
        ans = paid - total
    else:
        raise ValueError(f"unknown family {fam!r}; known: {FAMILIES}")
    return Problem(problem_id, q, _canon(ans), fam)


def problems(split: str, count: int, seed: int, families: tuple[str, ...] = FAMILIES) -> list[Problem]:
    """Problems ``0..count-1`` of a split; problem ``i`` depends only on (split, seed, families, i)."""
    out = []
    for i in range(count):
        rng = random.Random(f"react_math/{split}/{seed}/{i}")
        out.append(make_problem(rng, rng.choice(families), f"{split}/{i}"))
    return out


# ----------------------------------------------------------------------------------------------- answers
def extract_code(text: str) -> tuple[str | None, int]:
    """(code of the first tool call, its position) or (None, -1)."""
    m = _CODE.search(text or "")
    return (m.group(1) if m.group(1) is not None else m.group(2), m.start()) if m else (None, -1)


def extract_final(text: str) -> tuple[str | None, int]:
    """(the final answer's text, its position) or (None, -1): ``<answer>``, ``\\boxed{}`` or ``Answer: ...``."""
    m = _ANSWER.search(text or "")
    if not m:
        return None, -1
    value = next(g for g in m.groups() if g is not None)
    return value.strip().splitlines()[0].strip() if value.strip() else "", m.start()


def parse_number(text: str) -> Fraction | None:
    """The exact value of a numeric answer, or None: accepts ``-1,234``, ``12.50``, ``$5``, ``3/4``,
    ``\\frac{3}{4}``, ``1e3`` and a trailing unit word or period (``42 dollars.``)."""
    s = text.strip().strip("$").replace("\\$", "").replace("\\!", "").strip()
    s = re.sub(r"^\\boxed\{(.*)\}$", r"\1", s)
    s = re.sub(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}", r"\1/\2", s)
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s).replace(" ", "")
    s = re.sub(r"[a-zA-Z%]*\.?$", "", s) if not _NUM.match(s) else s
    s = s.rstrip(".").strip("$")
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            if not (_NUM.match(num) and _NUM.match(den)):
                return None
            return Fraction(num) / Fraction(den) if Fraction(den) != 0 else None
        return Fraction(s) if _NUM.match(s) else None
    except (ValueError, ZeroDivisionError):
        return None


def normalize_text(text: str) -> str:
    """Lower case, ``\\text{}``/``$``/surrounding punctuation removed, inner whitespace collapsed."""
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", text).replace("$", "").lower()
    return re.sub(r"\s+", " ", s).strip(" .,;:!\"'")


def answers_match(given: str | None, expected: str) -> bool:
    """Exact check: equal as exact numbers when both parse as numbers, else equal as normalised strings."""
    if given is None:
        return False
    a, b = parse_number(given), parse_number(expected)
    if a is not None and b is not None:
        return a == b
    return bool(normalize_text(given)) and normalize_text(given) == normalize_text(expected)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from n samples with c correct: ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021).

    Raises:
        ValueError: not ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_and_pass_at_k(successes: dict[str, list[bool]], k: int) -> dict[str, float]:
    """``{"mean@k", "pass@k"}`` averaged over problems, from each problem's n >= k sample outcomes."""
    if not successes:
        return {f"mean@{k}": 0.0, f"pass@{k}": 0.0}
    means = [sum(v) / len(v) for v in successes.values()]
    passes = [pass_at_k(len(v), sum(v), k) for v in successes.values()]
    return {f"mean@{k}": sum(means) / len(means), f"pass@{k}": sum(passes) / len(passes)}


# ----------------------------------------------------------------------------------------------- the tool
#: The candidate module the sandboxed process loads: ``coevo_tool(source)`` runs the agent's code there (never
#: in the caller's process), as ``__main__``, printing the value of a final bare expression unless it is None
#: (``repr``, as the REPL does). Output goes to the sandboxed process's stdout (line-buffered, so it survives a
#: kill), which the sandbox captures; exceptions propagate to the sandbox worker, which classifies them.
_TOOL_MODULE = """
import ast as _ast
import sys as _sys


def coevo_tool(source):
    _sys.stdout.reconfigure(line_buffering=True)
    tree = _ast.parse(source, "<candidate>")
    echo = bool(tree.body) and isinstance(tree.body[-1], _ast.Expr)
    if echo:
        last = tree.body[-1]
        tree.body[-1] = _ast.copy_location(_ast.Assign([_ast.Name("_coevo_last", _ast.Store())], last.value), last)
        _ast.fix_missing_locations(tree)
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(tree, "<candidate>", "exec"), namespace)
        if echo and namespace.get("_coevo_last") is not None:
            print(repr(namespace["_coevo_last"]))
    finally:
        _sys.stdout.flush()
    return None
"""


def tool_target(fn: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Sandbox target (trusted side): one call of the sandboxed ``coevo_tool(source)`` with the agent's code
    ``payload["source"]``; the code runs in the sandboxed process, its output is the captured stdout."""
    fn(payload["source"])
    return {}


@dataclass
class ToolResult:
    """What one sandboxed tool call produced: stdout text, error text ("" if none), error kind, seconds."""

    stdout: str
    error: str
    error_kind: str | None
    duration_s: float
    isolation: str


class PythonTool:
    """The agent's Python tool: each call is one fresh sandboxed process (:class:`coevo.sandbox.Sandbox`).

    Args:
        timeout_s: wall-clock limit per call (s). memory_mb: address-space limit (MiB). max_output_chars: the
        observation keeps the last this many characters of stdout. use_bwrap: as ``Sandbox`` (None = when usable).
        isolation: ``SandboxLimits.isolation``; None = ``$COEVO_SANDBOX_ISOLATION``, else ``"bwrap"`` (not the
        sandbox's default, the zygote, whose workers import only a preloaded set and execute nothing).
    """

    def __init__(
        self,
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
        max_output_chars: int = 2000,
        use_bwrap: bool | None = None,
        isolation: str | None = None,
    ) -> None:
        import os

        from coevo.sandbox import Sandbox, SandboxLimits

        mode = isolation or os.environ.get("COEVO_SANDBOX_ISOLATION", "").strip() or "bwrap"
        limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, max_procs=32, isolation=mode)
        self.sandbox = Sandbox(limits, use_bwrap=use_bwrap)
        self.max_output_chars = max_output_chars

    def __call__(self, source: str) -> ToolResult:
        if not isinstance(source, str):
            raise TypeError(f"source must be a str, got {type(source).__name__}")
        try:
            parse_bounded(source)
        except CandidateParseError as exc:  # syntax error, NUL bytes, too large or too deeply nested
            return ToolResult("", str(exc), "syntax", 0.0, self.sandbox.isolation)
        run = self.sandbox.execute(_TOOL_MODULE, "coevo_tool", TOOL_TARGET, {"source": source})
        res = run.result
        out = run.stdout[-self.max_output_chars :]
        err = "" if res.valid else (res.error or res.error_kind or "error")
        return ToolResult(out, err, res.error_kind, res.duration_s, run.isolation)


# ----------------------------------------------------------------------------------------------- episode
SYSTEM = (
    "You solve math problems exactly, using a Python tool when it helps. To run code, reply with a fenced block\n"
    "```python\n<code>\n```\nand stop; the next message shows its output (print what you need; the value of a "
    "last bare expression is printed). When you know the result, reply 'Answer: <value>' (an integer, a "
    "decimal, or a fraction a/b in lowest terms)."
)


@dataclass(eq=False)
class MathEpisode(TurnEpisode):
    """One ReAct episode on one problem (see the module docstring).

    Args:
        problem: the problem. tool: the sandboxed Python tool. max_turns: turn limit (>= 1).

    Attributes:
        answer: the final answer text (None until given). turns, tool_calls, tool_errors: counts.
    """

    problem: Problem
    tool: PythonTool
    max_turns: int = 4
    answer: str | None = field(init=False, default=None)
    turns: int = field(init=False, default=0)
    tool_calls: int = field(init=False, default=0)
    tool_errors: int = field(init=False, default=0)
    _last: str = field(init=False, default="")

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        self.system = SYSTEM

    @property
    def done(self) -> bool:
        return self.answer is not None or self.turns >= self.max_turns

    def observation(self) -> str:
        if self.turns == 0:
            return f"Problem: {self.problem.question}"
        return f"{self._last}\n(turns left: {self.max_turns - self.turns})"

    def step(self, text: str) -> tuple[str | None, str]:
        """Run the reply's tool call or take its answer; returns (action, feedback). Never raises on bad text."""
        if self.done:
            raise RuntimeError("episode is done")
        self.turns += 1
        code, at_code = extract_code(text)
        final, at_final = extract_final(text)
        if final is not None and (code is None or at_final < at_code):
            self.answer = final
            ok = answers_match(final, self.problem.answer)
            self._last = f"Answer recorded: {final} ({'correct' if ok else 'incorrect'})."
            return f"answer {final}", self._last
        if code is not None:
            self.tool_calls += 1
            res = self.tool(code)
            self.tool_errors += bool(res.error)
            self._last = (
                "Observation:\n"
                + (res.stdout.rstrip() or "(no output)")
                + (f"\nError: {res.error}" if res.error else "")
            )
            return f"python:\n{code}", self._last
        self._last = "No tool call or answer found. Reply with a ```python``` block or 'Answer: <value>'."
        return None, self._last

    def reward(self) -> float:
        return 1.0 if answers_match(self.answer, self.problem.answer) else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "problem_id": self.problem.problem_id,
            "family": self.problem.family,
            "expected": self.problem.answer,
            "answer": self.answer,
            "correct": self.reward() == 1.0,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
        }
