"""Parsing a reflection into a report (paper §4, "Reflect-then-retry"): lenient, never raises.

Every text gets a :class:`~rllib_r3l.runner.reflection.report.ParseResult` whose status says how far it
got. Validity rules (as in the authors' implementation): the summary, root cause and outcome must be
present; outcome ``success`` means a *perfect* episode (no retry); the other two outcomes need a
non-null suggestion and a pivot ``0 <= pivot < num_turns``. Finding and leniently loading the object
in free text is :mod:`rllib_r3l.runner.reflection.lenient_json`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, Mapping, Optional, Tuple

from rllib_r3l.runner.reflection.lenient_json import NotAnObject, load_lenient
from rllib_r3l.runner.reflection.lenient_json import candidates as find_candidates
from rllib_r3l.runner.reflection.report import _RANK, Outcome, ParseResult, ParseStatus, ReflectionReport

__all__ = ["parse_report"]


# Canonical field -> accepted names (after lower-casing and mapping spaces/hyphens to "_").
# The first present, non-null alias wins.
_ALIASES: Dict[str, Tuple[str, ...]] = {
    "summary": ("summary", "trajectory_summary"),
    "root_cause": ("root_cause", "root_cause_analysis"),
    "outcome": ("outcome", "trajectory_outcome"),
    "suggestion": ("suggestion", "improvement_suggestion"),
    "pivot": ("retry_from_step", "pivot", "pivot_turn"),
}
_NULL_WORDS = frozenset({"null", "none", "n/a", "na", "nil"})

_THINK_END = "</think>"


def _norm_key(key: Any) -> Optional[str]:
    if not isinstance(key, str):
        return None
    return re.sub(r"[\s\-]+", "_", key.strip().lower())


def _text_field(value: Any) -> Optional[str]:
    """A report text field as a stripped string; lists (e.g. why/because chains) are joined by
    lines, objects dumped as JSON; ``None``, empty strings and null-words count as absent."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        s = value.strip()
    elif isinstance(value, (int, float)):
        s = str(value)
    elif isinstance(value, list):
        parts = [_text_field(v) for v in value]
        s = "\n".join(p for p in parts if p)
    elif isinstance(value, dict):
        try:
            s = json.dumps(value, ensure_ascii=False)
        except Exception:  # noqa: BLE001
            s = str(value)
    else:
        s = str(value).strip()
    if not s or s.lower() in _NULL_WORDS:
        return None
    return s


def _coerce_pivot(value: Any) -> Optional[int]:
    """Lenient integer: ``3``, ``3.0``, ``"3"``, ``" 3 "`` and ``"3.0"`` all give 3; booleans,
    fractions, NaN/inf, ``None`` and other text give ``None``."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, str):
        s = value.strip()
        if re.fullmatch(r"[+-]?\d+", s):
            try:
                return int(s)
            except ValueError:  # more digits than int() accepts
                return None
        try:
            f = float(s)
        except ValueError:
            return None
        return int(f) if math.isfinite(f) and f.is_integer() else None
    return None


def _pick(d: Mapping[str, Any], canonical: str) -> Tuple[bool, Any]:
    """(present, value) of a canonical field, trying its aliases in order."""
    present = False
    for alias in _ALIASES[canonical]:
        if alias in d:
            present = True
            if d[alias] is not None:
                return True, d[alias]
    return present, None


def _validate(obj: Any, raw: str, num_turns: int, depth: int = 0) -> ParseResult:
    if isinstance(obj, NotAnObject) or not isinstance(obj, dict):
        kind = "a set" if isinstance(obj, NotAnObject) else type(obj).__name__
        return ParseResult(ParseStatus.NOT_AN_OBJECT, None, f"expected a JSON object, got {kind}")
    d: Dict[str, Any] = {}
    for k, v in obj.items():
        nk = _norm_key(k)
        if nk is not None and nk not in d:
            d[nk] = v
    known = {a for aliases in _ALIASES.values() for a in aliases}
    if depth == 0 and not (known & d.keys()):
        # A wrapper such as {"reflection": {...}}: look one level down.
        inner = [v for v in d.values() if isinstance(v, dict)]
        if len(inner) == 1:
            return _validate(inner[0], raw, num_turns, depth + 1)

    summary = _text_field(_pick(d, "summary")[1])
    root_cause = _text_field(_pick(d, "root_cause")[1])
    _, outcome_value = _pick(d, "outcome")
    missing = [
        name
        for name, ok in (
            ("summary", summary is not None),
            ("root_cause", root_cause is not None),
            ("outcome", outcome_value is not None and _text_field(outcome_value) is not None),
        )
        if not ok
    ]
    if missing:
        return ParseResult(ParseStatus.MISSING_FIELDS, None, f"missing or empty field(s): {', '.join(missing)}")
    outcome = Outcome.parse(outcome_value)
    if outcome is None:
        return ParseResult(
            ParseStatus.BAD_OUTCOME,
            None,
            f"outcome {str(outcome_value)[:80]!r} is not one of " + ", ".join(o.value for o in Outcome),
        )
    assert summary is not None and root_cause is not None
    if outcome is Outcome.SUCCESS:
        report = ReflectionReport(summary, root_cause, outcome, None, None, raw)
        return ParseResult(ParseStatus.PERFECT, report, "")
    suggestion = _text_field(_pick(d, "suggestion")[1])
    if suggestion is None:
        return ParseResult(ParseStatus.MISSING_SUGGESTION, None, f"outcome {outcome.value} needs a suggestion")
    _, pivot_value = _pick(d, "pivot")
    pivot = _coerce_pivot(pivot_value)
    if pivot is None:
        what = "missing" if pivot_value is None else f"not an integer: {str(pivot_value)[:40]!r}"
        return ParseResult(ParseStatus.BAD_PIVOT, None, f"retry_from_step is {what} (outcome {outcome.value})")
    if not 0 <= pivot < num_turns:
        return ParseResult(ParseStatus.BAD_PIVOT, None, f"retry_from_step {pivot} is out of range [0, {num_turns})")
    report = ReflectionReport(summary, root_cause, outcome, suggestion, pivot, raw)
    return ParseResult(ParseStatus.VALID, report, "")


def _as_num_turns(num_turns: Any) -> int:
    if isinstance(num_turns, bool):
        return int(num_turns)
    try:
        return max(0, int(num_turns.__index__()))
    except Exception:  # noqa: BLE001
        return 0


def parse_report(text: str, num_turns: int) -> ParseResult:
    """Parse a reflection report from model output; never raises (paper §4 "Reflect-then-retry").

    Robustness, beyond the authors' first-``{``-to-last-``}`` rule:

    * if the text contains ``</think>``, only what follows the last one is searched (when it
      holds a ``{``), so drafts inside a reasoning block are ignored;
    * candidates are the first-``{``-to-last-``}`` span and every top-level balanced ``{...}``;
      each is parsed as JSON, then without trailing commas, then as a Python-style literal
      (single quotes, ``None``/``True``/``False``); raw newlines inside strings are accepted;
    * field names are matched case-insensitively with spaces/hyphens as ``_`` and aliases
      (``retry_from_step``/``pivot``/``pivot_turn``, ``root_cause_analysis``,
      ``improvement_suggestion``, ``trajectory_summary``); a single wrapping object
      (``{"reflection": {...}}``) is looked through;
    * the pivot may be written ``3``, ``3.0`` or ``"3"`` (integer-valued only; ``"step 3"`` or
      ``2.5`` is ``BAD_PIVOT``); list-valued text fields (a why/because chain) are joined by lines;
      suggestions ``""``/``"null"``/``"none"``/``"n/a"`` count as missing.

    The best candidate wins (an ok one over any failure; among failures, the one that got
    furthest); among equals, the later one (a final answer usually comes last). A report with
    outcome ``success`` is ``PERFECT`` and its suggestion/pivot are dropped. ``num_turns`` below 1
    (or not an integer) makes every non-success report ``BAD_PIVOT``. Non-``str`` input is
    classified (``None`` as ``EMPTY``, anything else as ``NO_JSON``).
    """
    if text is None:
        return ParseResult(ParseStatus.EMPTY, None, "no text (None)")
    if not isinstance(text, str):
        return ParseResult(ParseStatus.NO_JSON, None, f"expected str, got {type(text).__name__}")
    try:
        return _parse(text, _as_num_turns(num_turns))
    except Exception as e:  # noqa: BLE001 - last line of defence; should be unreachable
        return ParseResult(ParseStatus.BAD_JSON, None, f"parser error {type(e).__name__}: {e}")


def _parse(text: str, num_turns: int) -> ParseResult:
    if not text.strip():
        return ParseResult(ParseStatus.EMPTY, None, "empty reflection text")
    search = text
    cut = text.rfind(_THINK_END)
    if cut >= 0 and "{" in text[cut + len(_THINK_END) :]:
        search = text[cut + len(_THINK_END) :]
    candidates = find_candidates(search)
    # A JSON string that itself encodes the report (double-encoded output).
    stripped = search.strip()
    if stripped.startswith('"') and stripped.endswith('"') and len(stripped) >= 2:
        try:
            inner = json.loads(stripped)
        except Exception:  # noqa: BLE001
            inner = None
        if isinstance(inner, str):
            candidates.extend(c for c in find_candidates(inner) if c not in candidates)
    if not candidates:
        return ParseResult(ParseStatus.NO_JSON, None, "no {...} object found in the text")

    best: Optional[ParseResult] = None
    for cand in candidates:
        value, err = load_lenient(cand)
        if err:
            result = ParseResult(ParseStatus.BAD_JSON, None, f"invalid JSON ({err[:200]})")
        else:
            result = _validate(value, cand, num_turns)
        if best is None or _RANK[result.status] >= _RANK[best.status]:
            best = result
    assert best is not None
    if not best.ok and len(candidates) > 1:
        best = ParseResult(best.status, None, f"{best.error} [best of {len(candidates)} candidate objects]")
    return best
