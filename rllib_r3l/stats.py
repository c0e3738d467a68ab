"""Small exact statistics for paired comparisons (pure Python, no SciPy): Student t quantiles and a paired
mean-difference interval. Used by the retry ledger (retry vs a fresh sample of the same task) and the
benchmarks (seed-level paired intervals), where a normal 1.96 for t would be too narrow at small n.
"""

from __future__ import annotations

import math
from typing import Dict, Sequence


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on the exact CDF)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def paired_interval(differences: Sequence[float], level: float = 0.95) -> Dict[str, float]:
    """Mean of paired differences with its two-sided ``level`` t interval: ``{n, mean, low, high}``;
    ``low``/``high`` are NaN below two pairs (no spread to estimate)."""
    d = [float(x) for x in differences]
    n = len(d)
    if n == 0:
        return {"n": 0, "mean": math.nan, "low": math.nan, "high": math.nan}
    mean = sum(d) / n
    if n < 2:
        return {"n": n, "mean": mean, "low": math.nan, "high": math.nan}
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    half = t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "low": mean - half, "high": mean + half}


__all__ = ["betainc", "paired_interval", "t_cdf", "t_quantile"]
