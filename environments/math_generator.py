"""Offline math problems for ``r3l/Math`` without a data set: bare arithmetic and templated word
problems generated from a seed, each hashed into the train/dev/test fold its text belongs to (so the
folds are disjoint, as for the problems read from files: ``fold_of``)."""

from __future__ import annotations

import hashlib
import random
from typing import Tuple


def fold_of(question: str) -> str:
    """The fold (train 80 %, dev 10 %, test 10 %) a question's text hashes into."""
    h = int(hashlib.sha1(question.encode("utf-8")).hexdigest(), 16) % 10
    return "train" if h < 8 else ("dev" if h == 8 else "test")


_NAMES = [
    "Ava",
    "Ben",
    "Chloe",
    "Diego",
    "Emma",
    "Farid",
    "Grace",
    "Hiro",
    "Isla",
    "Jonas",
    "Kemi",
    "Liam",
    "Maya",
    "Noah",
    "Olga",
    "Priya",
    "Quinn",
    "Rosa",
    "Sam",
    "Tara",
]
_ITEMS = ["apples", "marbles", "stickers", "pencils", "cookies", "stamps", "books", "shells", "cards", "beads"]
_PRON = {
    "Ava": "she",
    "Ben": "he",
    "Chloe": "she",
    "Diego": "he",
    "Emma": "she",
    "Farid": "he",
    "Grace": "she",
    "Hiro": "he",
    "Isla": "she",
    "Jonas": "he",
    "Kemi": "she",
    "Liam": "he",
    "Maya": "she",
    "Noah": "he",
    "Olga": "she",
    "Priya": "she",
    "Quinn": "she",
    "Rosa": "she",
    "Sam": "he",
    "Tara": "she",
}


def _word_problem(rng: random.Random, difficulty: int) -> Tuple[str, int]:
    s = 10**difficulty  # number scale
    name = rng.choice(_NAMES)
    pron = _PRON[name]
    item = rng.choice(_ITEMS)
    kind = rng.randrange(6)
    if kind == 0:
        a, b, c = rng.randint(2, 2 * s), rng.randint(2, 9), rng.randint(2, max(3, s // 2))
        d = rng.randint(1, a + b * c - 1)
        q = (
            f"{name} has {a} {item}. Then {pron} buys {b} packs with {c} {item} in each pack and gives "
            f"{d} {item} to a friend. How many {item} does {name} have now?"
        )
        return q, a + b * c - d
    if kind == 1:
        price, n = rng.randint(2, max(3, s)), rng.randint(2, 9)
        bill = (price * n // 10 + 1 + rng.randint(0, 3)) * 10
        q = (
            f"A shop sells {item} for ${price} each. {name} buys {n} of them and pays with ${bill}. "
            f"How many dollars of change does {name} get?"
        )
        return q, bill - price * n
    if kind == 2:
        a, d, b, e = rng.randint(5, 3 * s), rng.randint(2, 9), rng.randint(5, 3 * s), rng.randint(2, 9)
        q = (
            f"{name} reads {a} pages a day for {d} days and then {b} pages a day for {e} days. "
            f"How many pages does {name} read in total?"
        )
        return q, a * d + b * e
    if kind == 3:
        g, share = rng.randint(2, 9), rng.randint(2, max(3, s))
        broken = rng.randint(2, max(3, s // 2))
        total = g * share + broken
        q = (
            f"There are {total} {item} in a box. {broken} of them are damaged and thrown away. The rest are "
            f"shared equally among {g} children. How many {item} does each child get?"
        )
        return q, share
    if kind == 4:
        v, h, w, i = rng.randint(20, 12 * s), rng.randint(2, 6), rng.randint(20, 12 * s), rng.randint(2, 6)
        q = (
            f"A train travels at {v} km per hour for {h} hours and then at {w} km per hour for {i} hours. "
            f"How many km does it travel in total?"
        )
        return q, v * h + w * i
    pct = rng.choice([5, 10, 20, 25, 50])
    salary = 20 * rng.randint(5, 10 * s)
    spend = rng.randint(1, max(2, salary * (100 - pct) // 100 - 1))
    q = (
        f"{name} earns ${salary} and saves {pct}% of it. From the rest, {pron} spends ${spend} on {item}. "
        f"How many dollars are left after saving and spending?"
    )
    return q, salary - salary * pct // 100 - spend


def _bare_arithmetic(rng: random.Random) -> Tuple[str, int]:
    """One operation: a sum or difference of two-digit numbers, or a product of a two-digit and a
    one-digit number (the answer is never negative)."""
    kind = rng.randrange(3)
    if kind == 0:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return f"What is {a} + {b}?", a + b
    if kind == 1:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        a, b = max(a, b), min(a, b)
        return f"What is {a} - {b}?", a - b
    a, b = rng.randint(10, 99), rng.randint(2, 9)
    return f"What is {a} * {b}?", a * b


def generate_problem(seed: int, split: str, difficulty: int = 1) -> Tuple[str, str]:
    """A problem for ``seed`` whose text hashes into ``split``'s fold (so folds are disjoint):
    bare arithmetic at ``difficulty`` 0, a word problem at 1-3."""
    for k in range(10_000):
        rng = random.Random(f"r3l-math/{difficulty}/{split}/{seed}/{k}")
        q, ans = _bare_arithmetic(rng) if difficulty == 0 else _word_problem(rng, difficulty)
        if fold_of(q) == split:
            return q, str(ans)
    raise RuntimeError("generator failed to find a problem in the split")  # pragma: no cover
