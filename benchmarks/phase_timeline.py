"""Where the overlap of exploring and learning goes (issue 47): an iteration's phases from ``r3l/timeline``
(rllib_r3l/timeline.py) as lanes of a text timeline, and the loss against the ideal period split into its parts.

Pure functions of the rows ``benchmarks/policy_lag.py`` writes (one per iteration, its ``timeline`` dict in
seconds since the run's first phase). The runner's lane is its request (``sample``) where there is one
(``max_policy_lag`` >= 1), else the driver's exploring phase (lag 0 samples inside it)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

Interval = Tuple[float, float]


def _span(t: dict, phase: str) -> Optional[Interval]:
    s, e = t.get(f"{phase}_start"), t.get(f"{phase}_end")
    return (float(s), float(e)) if isinstance(s, (int, float)) and isinstance(e, (int, float)) else None


def lanes(rows: Sequence[dict]) -> Dict[str, List[Interval]]:
    """Per lane the intervals of the rows' iterations: ``runner`` (its request, else exploring), ``update``,
    ``sync``. An iteration without a phase (no update: an empty batch) adds nothing to that lane."""
    out: Dict[str, List[Interval]] = {"runner": [], "update": [], "sync": []}
    for r in rows:
        t = r.get("timeline") or {}
        runner = _span(t, "sample") or _span(t, "explore")
        for lane, span in (("runner", runner), ("update", _span(t, "update")), ("sync", _span(t, "sync"))):
            if span is not None:
                out[lane].append(span)
    return out


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _gaps(spans: Sequence[Interval]) -> List[float]:
    """Idle seconds between consecutive intervals of one lane (in time order)."""
    s = sorted(spans)
    return [max(0.0, b[0] - a[1]) for a, b in zip(s, s[1:])]


def _period(spans: Sequence[Interval]) -> float:
    s = sorted(spans)
    return (s[-1][0] - s[0][0]) / (len(s) - 1) if len(s) > 1 else float("nan")


def split_loss(base: Sequence[dict], lagged: Sequence[dict]) -> Dict[str, float]:
    """The lagged run's period (update to update) against the ideal ``max(E0, L0)`` from the lag-0 rows
    (E0: exploring; L0: update + sync), split on the runner's side: ``period = E1 + runner_gap``, so
    ``period - ideal = (E1 - E0) + runner_gap - (ideal - E0)``: ``contention`` = E1 - E0 (the request's growth
    beside the learner: contention, and the lag's own work such as behaviour scoring, r3l/timers),
    ``runner_gap`` (the runner waiting between requests: the weight sync, the driver's work),
    ``runner_slack`` = ideal - E0 (the runner could not be the bottleneck: L0 > E0). The learner's side is
    given as L1, ``learner_contention`` (L1 against the lag-0 update alone) and ``learner_gap`` (its wait
    between updates)."""
    b, g = lanes(base), lanes(lagged)
    e0 = _mean([e - s for s, e in b["runner"]])
    update0 = _mean([e - s for s, e in b["update"]])
    l0 = update0 + _mean([e - s for s, e in b["sync"]])
    e1 = _mean([e - s for s, e in g["runner"]])
    l1 = _mean([e - s for s, e in g["update"]])
    ideal, period = max(e0, l0), _period(g["update"])
    runner_gap = _mean(_gaps(g["runner"]))
    return {
        "E0": e0,
        "L0": l0,
        "ideal": ideal,
        "period": period,
        "loss": period - ideal,
        "E1": e1,
        "contention": e1 - e0,
        "runner_gap": runner_gap,
        "runner_slack": ideal - e0,
        "L1": l1,
        "learner_contention": l1 - update0,
        "learner_gap": _mean(_gaps(g["update"])),
    }


MARKS = {"runner": "S", "update": "U", "sync": "w"}


def gantt(rows: Sequence[dict], width: int = 100) -> List[str]:
    """The rows' phases as text lanes, ``width`` characters from the first phase's start to the last one's end:
    ``runner`` (S: sampling), ``learner`` (U: update, w: weight sync); ``.`` idle. A character is painted when
    its phase covers its midpoint."""
    ls = lanes(rows)
    spans = [s for v in ls.values() for s in v]
    if not spans:
        return []
    t0, t1 = min(s for s, _ in spans), max(e for _, e in spans)
    step = (t1 - t0) / width if t1 > t0 else 1.0

    def paint(names: Sequence[str]) -> str:
        cells = []
        for i in range(width):
            mid = t0 + (i + 0.5) * step
            mark = next((MARKS[n] for n in names for s, e in ls[n] if s <= mid < e), ".")
            cells.append(mark)
        return "".join(cells)

    return [
        f"runner  |{paint(['runner'])}|",
        f"learner |{paint(['update', 'sync'])}|",
        f"         {t0:.1f} s{' ' * max(1, width - 14)}{t1:.1f} s (1 character = {step:.2f} s)",
    ]


def work_rates(rows: Sequence[dict]) -> Dict[str, float]:
    """Each side's rate of work over the rows (NaN without the fields): the learner's forward tokens per second
    of its updates (timeline), the runner engine's tokens (computed prompt + generated) per engine second.
    Two arms train different batches, so their phase seconds differ with the work; these rates do not."""
    upd = sum(e - s for s, e in lanes(rows)["update"])
    fwd = sum(float(r.get("learner_forward_tokens") or 0) for r in rows if (r.get("timeline") or {}).get("update_end"))
    eng_s = sum(float(r.get("runner_engine_s") or 0) for r in rows)
    eng_t = sum(float(r.get("runner_engine_tokens") or 0) for r in rows)
    has = all("learner_forward_tokens" in r for r in rows) and bool(rows)
    return {
        "learner_tokens_per_s": fwd / upd if has and upd > 0 else float("nan"),
        "engine_tokens_per_s": eng_t / eng_s if has and eng_s > 0 else float("nan"),
    }
