"""Reflection quality against an oracle: how close is a reported pivot to the true one? (pure Python)

An environment with an oracle (``env.has_oracle``) knows, for a finished episode, the *oracle pivot*:
the first turn from which the episode could no longer be finished optimally (each environment's
docstring defines it exactly): the first mistake. A reflection reports its own pivot
(``retry_from_step``). Per reflection with both an integer reported pivot ``p`` and an integer oracle
pivot ``o``:

- ``pivot_exact``: 1.0 when ``p == o``;
- ``pivot_in_time``: 1.0 when ``p <= o``: the retry starts at or before the first mistake, so it can
  still avoid it. A later pivot replays the mistake in the prefix and the retry cannot undo it, which
  is why this, not the distance, says whether a pivot is usable;
- ``pivot_error``: the signed error ``p - o`` (negative: the reflector restarts early);
- ``pivot_early``: 1.0 when ``p < o`` (usable, but replays less of the good prefix and masks less credit);
- ``pivot_accuracy``: 1.0 when ``|p - o| <= 1``. Secondary only: it scores a pivot one turn *after* the
  mistake as accurate (a constant pivot of 1 scores every episode whose mistake is at turn 0).

Over many reflections the runner logs their means as ``r3l/pivot_exact_rate``, ``r3l/pivot_in_time_rate``,
``r3l/pivot_error_mean``, ``r3l/pivot_early_rate`` and ``r3l/pivot_accuracy``. A reflection without a pivot (invalid, or
``success``) or an episode without an oracle pivot (it was finished optimally, or no optimal finish
existed from the start) is not scored: :func:`pivot_quality` returns None for it.
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

__all__ = ["PIVOT_METRICS", "pivot_quality", "summarize_pivot_quality"]

#: per-reflection key -> the name of its mean in the runner's metrics (under ``r3l/``)
PIVOT_METRICS: Dict[str, str] = {
    "pivot_exact": "pivot_exact_rate",
    "pivot_in_time": "pivot_in_time_rate",
    "pivot_error": "pivot_error_mean",
    "pivot_early": "pivot_early_rate",
    "pivot_accuracy": "pivot_accuracy",
}


def _as_int(value: object) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return int(value)


def pivot_quality(pivot: Optional[int], oracle: Optional[int], tolerance: int = 1) -> Optional[Dict[str, float]]:
    """The scores of one reflection (see the module docstring), or None when it cannot be scored."""
    p, o = _as_int(pivot), _as_int(oracle)
    if p is None or o is None:
        return None
    err = p - o
    return {
        "pivot_exact": float(err == 0),
        "pivot_in_time": float(err <= 0),
        "pivot_error": float(err),
        "pivot_early": float(err < 0),
        "pivot_accuracy": float(abs(err) <= tolerance),
    }


def summarize_pivot_quality(
    pairs: Iterable[Tuple[Optional[int], Optional[int]]], tolerance: int = 1
) -> Dict[str, float]:
    """Means over ``(reported pivot, oracle pivot)`` pairs, under the logged metric names, plus
    ``pivot_scored`` (how many pairs could be scored). Empty dict when none could."""
    sums: Dict[str, float] = {}
    n = 0
    for p, o in pairs:
        q = pivot_quality(p, o, tolerance)
        if q is None:
            continue
        n += 1
        for k, v in q.items():
            sums[k] = sums.get(k, 0.0) + v
    if not n:
        return {}
    out = {PIVOT_METRICS[k]: v / n for k, v in sums.items()}
    out["pivot_scored"] = float(n)
    return out
