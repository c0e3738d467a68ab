"""Whether the reflect-then-retry chain closed: a run with reflection on that never retried trained
as plain GRPO, and the console says so with the likely cause (pure: result dicts in, text out).

The chain is: a failed base episode -> a reflection -> a valid report that asks for a retry -> a
retry from the pivot. Where it breaks, the runners' metrics say why: ``reflections_skipped_successes``
(nothing failed, so nothing to reflect on), ``faults/reflection_generation_errors``, the report
statuses (``reflection_<status>``, :class:`~rllib_r3l.runner.reflection.report.ParseStatus`),
``reflections_truncated`` (reports cut at ``max_reflection_tokens``), ``reflection_retries`` (valid
reports that asked for a retry) and ``num_retries`` (retries that ran).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

from rllib_r3l.cli.result_rows import get_metric, number
from rllib_r3l.runner.reflection.report import ParseStatus

_R3L = "env_runners/r3l/"
INVALID = tuple(s.value for s in ParseStatus if not s.ok)
_JSON_STATUSES = ("no_json", "bad_json", "not_an_object", "empty")
COUNT_KEYS = ("reflections", "valid", "asked", "retries", "truncated", "skipped_successes", "generation_errors")


def _get(result: Mapping[str, Any], path: str) -> float:
    return number(get_metric(result, path))


def reflection_counts(result: Mapping[str, Any]) -> Dict[str, Any]:
    """One iteration's chain from an RLlib/Tune result (nested or flattened): reflections, valid reports
    (``valid`` and ``perfect``), ``asked`` (valid reports asking for a retry), ``retries`` that ran,
    ``truncated`` reports, ``skipped_successes``, ``generation_errors`` and ``invalid`` per status."""
    out: Dict[str, Any] = {
        "reflections": round(_get(result, _R3L + "reflection_total")),
        "valid": round(_get(result, _R3L + "reflection_valid") + _get(result, _R3L + "reflection_perfect")),
        "asked": round(_get(result, _R3L + "reflection_retries")),
        "retries": round(_get(result, _R3L + "num_retries")),
        "truncated": round(_get(result, _R3L + "reflections_truncated")),
        "skipped_successes": round(_get(result, _R3L + "reflections_skipped_successes")),
        "generation_errors": round(_get(result, _R3L + "faults/reflection_generation_errors")),
    }
    out["invalid"] = {s: n for s in INVALID if (n := round(_get(result, _R3L + f"reflection_{s}")))}
    return out


def add_counts(total: Dict[str, Any], counts: Mapping[str, Any]) -> Dict[str, Any]:
    """``total`` plus one iteration's :func:`reflection_counts` (in place; returned)."""
    for k in COUNT_KEYS:
        total[k] = total.get(k, 0) + int(counts.get(k, 0) or 0)
    inv = total.setdefault("invalid", {})
    for s, n in (counts.get("invalid") or {}).items():
        inv[s] = inv.get(s, 0) + int(n)
    return total


def _reflection_on(c: Mapping[str, Any]) -> bool:
    """Something shows the runners reflect (reflection off logs none of these)."""
    return bool(c.get("reflections") or c.get("skipped_successes") or c.get("generation_errors") or c.get("retries"))


def broken_link(c: Mapping[str, Any]) -> Optional[str]:
    """Where the chain broke, in a few words with the likely cause; None when a retry ran or reflection
    is off. ``c`` is :func:`reflection_counts` of one iteration or their :func:`add_counts` sum."""
    if not _reflection_on(c) or c.get("retries"):
        return None
    n, valid = int(c.get("reflections", 0)), int(c.get("valid", 0))
    errors = int(c.get("generation_errors", 0))
    if n == 0:
        if errors:
            return f"the reflector's generation failed {errors} time(s); see the log"
        return f"no failure to reflect on ({int(c.get('skipped_successes', 0))} successful episode(s) passed over)"
    if valid == 0:
        truncated = int(c.get("truncated", 0))
        invalid = dict(c.get("invalid") or {})
        if truncated * 2 >= n:
            return (
                f"0/{n} reports valid: {truncated} cut at max_reflection_tokens; raise max_reflection_tokens "
                "(or lower reflection_max_chars)"
            )
        top = ", ".join(f"{s} {k}" for s, k in sorted(invalid.items(), key=lambda kv: -kv[1])[:3])
        if sum(invalid.get(s, 0) for s in _JSON_STATUSES) * 2 >= n:
            return (
                f"0/{n} reports valid: invalid JSON ({top}); reflection_structured=True holds the report to its schema"
            )
        return f"0/{n} reports valid ({top})"
    if not c.get("asked"):
        return f"{valid}/{n} reports valid, none asked for a retry (every one judged the episode a success)"
    return (
        f"{int(c['asked'])} report(s) asked for a retry, none ran (a retry whose replay did not match, or "
        "with nothing left to generate after the pivot: see faults/retries_skipped and retries_empty)"
    )


def iteration_note(c: Optional[Mapping[str, Any]]) -> str:
    """`` (0/8 reports valid: ...)`` after ``retries 0`` on an iteration line; ``""`` when nothing broke."""
    why = broken_link(c) if c else None
    return f" ({why})" if why else ""


def verdict(total: Mapping[str, Any], iterations: int) -> Optional[str]:
    """A run's verdict from its summed counts: None when a retry ran (or reflection is off), else that
    R3L never retried, so it trained as GRPO, and why."""
    why = broken_link(total)
    return None if why is None else f"no retry in {iterations} iteration(s), so R3L trained as GRPO: {why}"


def run_note(rows: Sequence[Mapping[str, Any]]) -> Optional[str]:
    """:func:`verdict` over the console's iteration rows (each with ``row["reflection"]``)."""
    total: Dict[str, Any] = {}
    for r in rows:
        add_counts(total, r.get("reflection") or {})
    return verdict(total, len(rows))


__all__ = ["reflection_counts", "add_counts", "broken_link", "iteration_note", "verdict", "run_note"]
