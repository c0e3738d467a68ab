"""Per-phase timeline of an iteration (issue 47: where the overlap of exploring and learning goes).

Each phase of ``R3L.training_step`` logs when it started and ended, in seconds since the algorithm's first
phase (``r3l/timeline/<phase>_start`` / ``_end``, window 1: this iteration's):

- ``explore``: the driver's exploring phase (at ``max_policy_lag`` 0 the sampling itself; above, its wait for
  the oldest queued request);
- ``sample``: with ``max_policy_lag`` >= 1, the runners' request whose groups this iteration trains (the
  earliest start and latest end over the runners, their own clocks: on one host the same clock, across hosts
  as far apart as the hosts' clocks are);
- ``update``: the learner update; ``sync``: the weights into the engines.

``benchmarks/policy_lag.py`` draws these as a timeline and splits the loss against the ideal overlap into its
parts (docs/scaling.md, "Where the overlap goes").
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

KEY = ("r3l", "timeline")
_now = time.time  # the clock (a test sets its own)


def _origin(algo: Any) -> float:
    origin = getattr(algo, "_r3l_timeline_origin", None)
    if origin is None:
        origin = algo._r3l_timeline_origin = _now()
    return origin


def log(algo: Any, phase: str, start: float, end: float) -> None:
    """Log ``phase`` as running from ``start`` to ``end`` (``time.time()`` values) in this iteration."""
    origin = _origin(algo)
    for edge, t in (("start", start), ("end", end)):
        algo.metrics.log_value((*KEY, f"{phase}_{edge}"), float(t) - origin, reduce="mean", window=1)


@contextlib.contextmanager
def phase(algo: Any, name: str) -> Iterator[None]:
    """Time the block as phase ``name`` (logged when it ends, also when it raises)."""
    _origin(algo)
    start = _now()
    try:
        yield
    finally:
        log(algo, name, start, _now())
