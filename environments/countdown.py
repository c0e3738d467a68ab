"""Countdown number puzzles (``r3l/Countdown``), generated offline from the seed.

Given numbers and a target, answer with an arithmetic expression (+, -, *, /, parentheses) that
uses each given number at most once and equals the target. Expressions are evaluated exactly
(fractions) by walking the ``ast`` — no ``eval``. Targets are built from a random expression over
the numbers, so every puzzle is solvable. Multi-attempt like ``r3l/Math``; reward 1.0 on success.
Problems hash into train/dev/test folds, so the splits are disjoint.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
from collections import Counter
from fractions import Fraction
from typing import Any, List, Optional, Sequence, Tuple

from environments._attempts import MultiAttemptEnv
from environments._common import check_positive_int

_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}
_MAX_ABS = 10**12


class ExpressionError(ValueError):
    """The text is not an allowed arithmetic expression."""


def evaluate(expr: str) -> Tuple[Fraction, List[int]]:
    """Exact value of ``expr`` and the integer literals it uses. Raises ``ExpressionError``."""
    expr = expr.replace("×", "*").replace("÷", "/").replace("−", "-").replace("x", "*").replace("X", "*")
    if len(expr) > 300:
        raise ExpressionError("the expression is too long")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as e:
        raise ExpressionError(f"not an arithmetic expression ({e.msg})") from None
    used: List[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ExpressionError("division by zero")
            value = _OPS[type(node.op)](left, right)
            if abs(value) > _MAX_ABS:
                raise ExpressionError("a value is too large")
            return value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            raise ExpressionError("unary minus is not allowed; use the given numbers only")
        raise ExpressionError(
            f"'{ast.unparse(node) if hasattr(ast, 'unparse') else node}' is not allowed "
            "(only integers, + - * / and parentheses)"
        )

    return walk(tree), used


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_EXPR_CHARS = re.compile(r"^[\d\s+\-*/()×÷−xX.]+$")


def extract_expression(response: str) -> Optional[str]:
    """The expression of a response: ``<answer>..</answer>``, else ``\\boxed{..}``, else the last line
    that looks like an expression (``... = target`` keeps the left side)."""
    from environments.math_env import last_boxed

    tags = _ANSWER_TAG.findall(response)
    cands: List[str] = []
    if tags:
        cands.append(tags[-1])
    else:
        boxed = last_boxed(response)
        if boxed is not None:
            cands.append(
                boxed.replace("\\times", "*")
                .replace("\\div", "/")
                .replace("\\cdot", "*")
                .replace("\\left", "")
                .replace("\\right", "")
                .replace("{", "(")
                .replace("}", ")")
            )
        cands += [ln for ln in reversed(response.strip().splitlines()) if ln.strip()]
    for c in cands:
        c = c.strip().strip("$`").strip()
        if "=" in c:
            c = c.split("=")[0].strip()
        c = c.rstrip(".").strip()
        if c and _EXPR_CHARS.match(c) and re.search(r"\d", c):
            return c
    return None


def check_countdown(response: str, numbers: Sequence[int], target: int) -> Tuple[bool, Optional[str], str]:
    expr = extract_expression(response)
    if expr is None:
        return False, None, ("answer with an arithmetic expression, e.g. <answer>(1 + 2) * 3</answer>.")
    try:
        value, used = evaluate(expr)
    except ExpressionError as e:
        return False, None, f"'{expr}': {e}."
    avail, need = Counter(numbers), Counter(used)
    extra = [n for n in need if need[n] > avail.get(n, 0)]
    if extra:
        return (
            False,
            expr,
            (
                f"it uses {', '.join(map(str, sorted(extra)))} more often than given; use each of "
                f"{', '.join(map(str, numbers))} at most once"
            ),
        )
    if value != target:
        shown = str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
        return False, expr, f"it equals {shown}, not {target}"
    return True, expr, ""


def _fold_of(numbers: Sequence[int], target: int) -> str:
    key = ",".join(map(str, sorted(numbers))) + f"->{target}"
    h = int(hashlib.sha1(key.encode()).hexdigest(), 16) % 10
    return "train" if h < 8 else ("dev" if h == 8 else "test")


def generate_puzzle(
    seed: int, split: str, num_numbers: int = 4, max_number: int = 100, max_target: int = 1000
) -> Tuple[List[int], int, str]:
    """(numbers, target, one solution) for ``seed``, hashing into ``split``'s fold."""
    for k in range(100_000):
        rng = random.Random(f"r3l-countdown/{num_numbers}/{max_number}/{split}/{seed}/{k}")
        numbers = [rng.randint(1, max_number) for _ in range(num_numbers)]
        order = numbers[:]
        rng.shuffle(order)
        used = rng.randint(max(2, num_numbers - 1), num_numbers) if num_numbers > 1 else 1
        value, expr = Fraction(order[0]), str(order[0])
        for n in order[1:used]:
            op = rng.choice("+-*/")
            if op == "/" and (n == 0 or (value / n).denominator != 1):
                op = "+"
            if op == "-" and value - n <= 0:
                op = "+"
            value = {"+": value + n, "-": value - n, "*": value * n, "/": value / n}[op]
            expr = f"({expr} {op} {n})"
        if value.denominator != 1 or not 1 <= value <= max_target:
            continue
        target = int(value)
        if target in numbers:
            continue
        if _fold_of(numbers, target) == split:
            return numbers, target, expr[1:-1] if expr.startswith("(") else expr
    raise RuntimeError("could not generate a countdown puzzle")  # pragma: no cover


class CountdownEnv(MultiAttemptEnv):
    """Reach the target from the given numbers; answer ``<answer>expression</answer>``."""

    rules = (
        "Countdown: combine the given numbers with +, -, *, / and parentheses to reach the target. "
        "Use each number at most once. Give your final expression as <answer>expression</answer>."
    )

    option_bounds = {"num_numbers": (2, 8), "max_number": (1, None), "max_target": (1, None)}

    def __init__(
        self,
        num_numbers: int = 4,
        max_number: int = 100,
        max_target: int = 1000,
        split: str = "train",
        max_attempts: int = 3,
        reveal_answer: bool = False,
    ) -> None:
        super().__init__(split=split, max_attempts=max_attempts, reveal_answer=reveal_answer)
        self.num_numbers = check_positive_int("num_numbers", num_numbers)
        if self.num_numbers < 2 or self.num_numbers > 8:
            raise ValueError(f"num_numbers must be between 2 and 8; got {num_numbers!r}")
        self.max_number = check_positive_int("max_number", max_number)
        self.max_target = check_positive_int("max_target", max_target)
        self._solution = ""

    def _problem(self, seed: int):
        numbers, target, solution = generate_puzzle(
            seed, self.split, self.num_numbers, self.max_number, self.max_target
        )
        self._solution = solution
        prompt = (
            f"Using the numbers {numbers}, write an arithmetic expression that equals {target}. You may use "
            "+, -, *, / and parentheses, and each number at most once. Show your work, then give the "
            "expression as <answer>expression</answer>."
        )
        return prompt, (numbers, target), {"numbers": list(numbers), "target": target}

    def _check(self, response: str, gold: Any):
        numbers, target = gold
        return check_countdown(response, numbers, target)

    def _gold_text(self, gold: Any) -> str:
        return f"{self._solution} = {gold[1]}"

    def _oracle_answer(self, seed: int):
        numbers, target, solution = generate_puzzle(
            seed, self.split, self.num_numbers, self.max_number, self.max_target
        )
        return (numbers, target), f"<answer>{solution}</answer>"

    def solution(self) -> str:
        """One expression that solves the current puzzle (for tests)."""
        return self._solution


__all__ = ["CountdownEnv", "evaluate", "extract_expression", "check_countdown", "generate_puzzle", "ExpressionError"]
