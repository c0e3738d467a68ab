"""The retry ledger: one row per reflected episode and retry, so that every link of reflect-then-retry
(paper §4) can be seen and split: was the report valid, did its pivot come at or before the first
mistake, did the retry act differently there, did it succeed, and did it beat a fresh sample of the
same task (``retry_control``)?

Rows are written by the driver as JSON lines, ``retries.jsonl`` in the trial's folder under Tune (beside
``result.json``; with remote storage, in ``R3L.logdir``, which ``SyncConfig(sync_artifacts=True)`` copies
there), the main job's ``--out``, or ``R3L.logdir`` outside Tune. A checkpoint holds the rows up to it, and
restoring it puts them back (a resume, a PBT exploit), so the ledger goes on like ``result.json``. One row per
reflection on a base episode, and per retry of it
(``retries_per_failure`` > 1: one row each, the reflection's fields repeated; ``attempt`` counts them):

=====================  ==========================================================================
iteration              the training iteration (the driver stamps it)
group_id, task_seed    the task group and the environment seed of its task
reflection             the reflection's id within the iteration (rows of one reflection share it)
attempt                0, 1, ... the retry of that reflection; 0 also for a reflection without retry
style, status, valid   reflection_style; the report's parse status; whether it is a valid report
reported_pivot, pivot  the report's pivot; the turn the retry started from (after ``pivot_backoff``)
hindsight_pivot        ``pivot_selector="hindsight"``: the turn the policy's own odds blame (None: not used)
oracle_pivot           the first mistake by the environment's oracle (None: no oracle, or none)
base_action            the failed episode's action at ``pivot`` (None: it had ended)
retry_action           the retry's action at ``pivot`` (None: no retry or nothing generated there)
action_changed         retry_action differs from base_action (normalised as the environments compare)
retry_status           none | ok | lost | empty | skipped (replay mismatch) | cut (past the trajectory budget)
retry_success          the retry succeeded (None: no retry)
control_success        a fresh unguided episode of the same task succeeded (None: no control)
base_reward, retry_reward, base_turns, retry_turns   the episodes' returns and turns (turns: in all)
group_base_success     success rate of the group's base episodes
reflection_tokens, retry_tokens   tokens generated for the report; by the retry from its pivot on
=====================  ==========================================================================
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, Iterable, List, Optional

from rllib_r3l.stats import paired_interval

LEDGER_FILE = "retries.jsonl"
RETRIED = ("ok", "empty", "lost")  # retry statuses of a retry that started (skipped: its replay mismatched)


def reflection_row(
    base: Any, parsed: Any, out: Any, *, style: str, group_base_success: float, reflection: int
) -> Dict[str, Any]:
    """The reflection's part of a row (the retry fields empty): ``base`` the reflected trajectory,
    ``parsed`` its ParseResult (None: generation failed), ``out`` the GenerationResult (None: oracle)."""
    report = getattr(parsed, "report", None) if parsed is not None else None
    reported = getattr(report, "pivot", None) if report is not None else None
    return {
        "group_id": base.group_id,
        "task_seed": base.seed,
        "reflection": reflection,
        "attempt": 0,
        "style": style,
        "status": getattr(getattr(parsed, "status", None), "value", None) if parsed else "no_output",
        "valid": bool(parsed is not None and parsed.ok),
        "reported_pivot": reported if isinstance(reported, int) and not isinstance(reported, bool) else None,
        "hindsight_pivot": None,
        "pivot": None,
        "oracle_pivot": base.info.get("oracle_pivot"),
        "base_action": None,
        "retry_action": None,
        "action_changed": None,
        "retry_status": "none",
        "retry_success": None,
        "control_success": None,
        "base_reward": float(base.reward),
        "retry_reward": None,
        "base_turns": int(base.num_turns),
        "retry_turns": None,
        "group_base_success": float(group_base_success),
        "reflection_tokens": len(out.token_ids) if out is not None else 0,
        "retry_tokens": None,
    }


def with_retry(
    row: Dict[str, Any],
    base: Any,
    pivot: int,
    retry: Optional[Any],
    status: str,
    attempt: int,
    control: Optional[Any] = None,
) -> Dict[str, Any]:
    """``row`` completed with one retry from ``pivot`` (``retry`` None: skipped) and its control episode."""
    from environments._common import normalize_action  # how the environments compare actions

    out = dict(row, attempt=attempt, pivot=int(pivot), retry_status=status)
    out["base_action"] = base.actions[pivot] if pivot < len(base.actions) else None
    if retry is not None:
        out["retry_action"] = retry.actions[pivot] if pivot < len(retry.actions) else None
        if out["retry_action"] is not None and out["base_action"] is not None:
            out["action_changed"] = normalize_action(out["retry_action"]) != normalize_action(out["base_action"])
        out.update(
            retry_success=bool(retry.success),
            retry_reward=float(retry.reward),
            retry_turns=int(retry.num_turns),
            retry_tokens=sum(len(s.token_ids) for s in retry.segments if s.role == "response" and s.turn >= pivot),
        )
    if control is not None and control.status.value not in ("env_error", "generation_error"):
        out["control_success"] = bool(control.success)
    return out


# ------------------------------------------------------------------------------------------ files
def append(path: str, iteration: int, rows: Iterable[Dict[str, Any]]) -> int:
    """Append ``rows`` (stamped with ``iteration``) to the ledger at ``path``; how many were written."""
    rows = list(rows)
    if not rows:
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        for r in rows:
            f.write(json.dumps({"iteration": int(iteration), **r}) + "\n")
    return len(rows)


def read(path: str) -> List[Dict[str, Any]]:
    """Every row of a ledger; a cut last line (a crash mid-write) is left out, nothing else is."""
    rows: List[Dict[str, Any]] = []
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return rows
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            if i != len(lines) - 1:
                raise ValueError(f"{path}: line {i + 1} is not JSON (only a cut last line is expected)") from None
    return rows


def replace(path: str, rows: Iterable[Dict[str, Any]]) -> None:
    """The ledger at ``path`` holds exactly ``rows`` (a restored checkpoint's), written aside and renamed."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


def adopt(algo: Any, path: str, restored: bool) -> None:
    """Point ``algo``'s ledger at ``path`` (a run folder of its own): a restored algorithm's rows there are its
    checkpoint's (what ran after the checkpoint runs again), a fresh one's none."""
    replace(path, read(algo.retry_ledger_path) if restored else [])
    algo.retry_ledger_path = path


# ------------------------------------------------------------------------------------------ the chain
def funnel(rows: Iterable[Dict[str, Any]]) -> Dict[str, Any]:
    """The chain as counts: reflections -> valid -> pivot in time (of those the oracle could score) ->
    retried -> action changed (of retries whose both actions exist) -> success."""
    rows = list(rows)
    reflections: Dict[tuple, Dict[str, Any]] = {}
    for r in rows:
        reflections.setdefault((r.get("iteration"), r.get("group_id"), r.get("reflection")), r)
    refl = list(reflections.values())
    start = {id(r): r["pivot"] if r.get("pivot") is not None else r.get("reported_pivot") for r in refl}
    scored = [r for r in refl if r.get("valid") and start[id(r)] is not None and r.get("oracle_pivot") is not None]
    retries = [r for r in rows if r.get("retry_status") in RETRIED]
    compared = [r for r in retries if r.get("action_changed") is not None]
    return {
        "reflections": len(refl),
        "valid": sum(1 for r in refl if r.get("valid")),
        "pivot_scored": len(scored),
        "pivot_in_time": sum(1 for r in scored if start[id(r)] <= r["oracle_pivot"]),
        "pivot_exact": sum(1 for r in scored if start[id(r)] == r["oracle_pivot"]),
        "retried": len(retries),
        "action_compared": len(compared),
        "action_changed": sum(1 for r in compared if r["action_changed"]),
        "retry_success": sum(1 for r in retries if r.get("retry_success")),
    }


def control_comparison(rows: Iterable[Dict[str, Any]]) -> Dict[str, Any]:
    """Retry success against the fresh control on the same tasks: paired over the retries that have a
    control (``retry_success - control_success`` per task, a t interval), and the ratio of the rates.
    What cannot be computed (no pair; no control success for the ratio; one pair for the interval) is None."""
    rows = list(rows)
    pairs = [
        (bool(r["retry_success"]), bool(r["control_success"]))
        for r in rows
        if r.get("retry_status") in RETRIED
        and r.get("retry_success") is not None
        and r.get("control_success") is not None
    ]
    n = len(pairs)
    tasks = len(
        {
            (r.get("iteration"), r.get("group_id"))
            for r in rows
            if r.get("retry_status") in RETRIED
            and r.get("retry_success") is not None
            and r.get("control_success") is not None
        }
    )
    retry, control = sum(a for a, _ in pairs), sum(b for _, b in pairs)
    diff = {
        k: (None if isinstance(v, float) and math.isnan(v) else v)
        for k, v in paired_interval([float(a) - float(b) for a, b in pairs]).items()
    }
    return {
        "pairs": n,
        "tasks": tasks,
        "retry_successes": retry,
        "control_successes": control,
        "retry_rate": retry / n if n else None,
        "control_rate": control / n if n else None,
        "ratio": retry / control if control else None,
        "difference": diff["mean"],
        "difference_low": diff["low"],
        "difference_high": diff["high"],
    }


def funnel_lines(rows: List[Dict[str, Any]]) -> List[str]:
    """The funnel and the control comparison as console lines (empty: no row)."""
    if not rows:
        return []
    f = funnel(rows)
    pivots = (
        f"{f['pivot_in_time']}/{f['pivot_scored']} pivots at or before the first mistake ({f['pivot_exact']} exact)"
        if f["pivot_scored"]
        else "pivots not scored (no oracle)"
    )
    lines = [
        f"retry chain: {f['reflections']} reflections -> {f['valid']} valid -> {pivots} -> "
        f"{f['retried']} retries -> {f['action_changed']}/{f['action_compared']} changed the action at the "
        f"pivot -> {f['retry_success']} succeeded"
    ]
    c = control_comparison(rows)
    if c["pairs"]:
        interval = (
            ""
            if c["difference_low"] is None
            else f" [{c['difference_low']:+.2f}, {c['difference_high']:+.2f}] 95% paired t"
        )
        lines.append(
            f"retry vs a fresh sample of the same task: {c['retry_successes']}/{c['pairs']} vs "
            f"{c['control_successes']}/{c['pairs']}, difference {c['difference']:+.2f}{interval} over "
            f"{c['pairs']} retry/control pairs ({c['tasks']} task{'s' if c['tasks'] != 1 else ''})"
        )
    return lines


__all__ = [
    "LEDGER_FILE",
    "append",
    "control_comparison",
    "funnel",
    "funnel_lines",
    "read",
    "reflection_row",
    "adopt",
    "replace",
    "with_retry",
]
