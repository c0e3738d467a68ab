"""The reflection report: its model and per-status counts (paper §4, "Reflect-then-retry").

The reflector answers with a structured report (summary, root cause, outcome, suggestion, pivot
turn). The parser (:mod:`rllib_r3l.runner.reflection.parse`) never raises: every text gets a
:class:`ParseResult` whose :class:`ParseStatus` says how far it got, so malformed reflections are
counted (:class:`ReflectionStats`, logged as metrics) rather than silently dropped.

Validity rules (as in the authors' implementation): the summary, root cause and outcome must be
present; outcome ``success`` means a *perfect* episode (no retry); the other two outcomes need a
non-null suggestion and a pivot ``0 <= pivot < num_turns``. Prompting the reflector and the retry's
guidance live in :mod:`rllib_r3l.runner.reflection.reflect`; finding and leniently loading the object in free text,
in :mod:`rllib_r3l.runner.reflection.lenient_json`.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Union

__all__ = ["Outcome", "ReflectionReport", "ParseStatus", "ParseResult", "ReflectionStats"]


# ==================================================================================================
# Report model
# ==================================================================================================
class Outcome(str, enum.Enum):
    """The reflector's judgement of an episode (paper §4: outcome of the diagnosis)."""

    SUCCESS = "success"
    SUCCESS_BUT_INEFFICIENT = "success_but_inefficient"
    FAILURE = "failure"

    @classmethod
    def parse(cls, value: Any) -> Optional["Outcome"]:
        """Normalise a reported outcome; ``None`` when it is not one of the three.

        Case is ignored and any run of spaces, hyphens or other punctuation counts as one ``_``,
        so ``"Success but inefficient"``, ``"success-but-inefficient"`` and ``"FAILURE."`` parse.
        """
        if isinstance(value, Outcome):
            return value
        if not isinstance(value, str):
            return None
        key = re.sub(r"[^0-9a-z]+", "_", value.strip().lower()).strip("_")
        try:
            return cls(key)
        except ValueError:
            return None


@dataclass(frozen=True)
class ReflectionReport:
    """A parsed, valid reflection report (paper §4 "Reflect-then-retry").

    ``suggestion`` and ``pivot`` are ``None`` exactly when ``outcome`` is ``success``; otherwise
    ``0 <= pivot < num_turns`` of the reflected episode. ``raw`` is the JSON text it came from.
    """

    summary: str
    root_cause: str
    outcome: Outcome
    suggestion: Optional[str]
    pivot: Optional[int]
    raw: str

    def to_dict(self) -> Dict[str, Any]:
        """The report in the canonical field names the reflector is asked for."""
        return {
            "summary": self.summary,
            "root_cause": self.root_cause,
            "outcome": self.outcome.value,
            "suggestion": self.suggestion,
            "retry_from_step": self.pivot,
        }

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)


class ParseStatus(str, enum.Enum):
    """The classification of every :func:`parse_report` result."""

    VALID = "valid"  # a usable report with outcome failure / success_but_inefficient
    PERFECT = "perfect"  # a valid report with outcome success: no retry
    NO_JSON = "no_json"  # no {...} span in the text (or the input is not a str)
    BAD_JSON = "bad_json"  # {...} spans exist but none parses
    NOT_AN_OBJECT = "not_an_object"  # something parsed, but not to a JSON object
    MISSING_FIELDS = "missing_fields"  # summary, root cause or outcome absent / empty
    BAD_OUTCOME = "bad_outcome"  # outcome is not one of the three
    MISSING_SUGGESTION = "missing_suggestion"  # non-success outcome without a suggestion
    BAD_PIVOT = "bad_pivot"  # non-success outcome without an integer pivot in [0, num_turns)
    EMPTY = "empty"  # empty / whitespace-only text (or None)

    @property
    def ok(self) -> bool:
        return self in (ParseStatus.VALID, ParseStatus.PERFECT)


# How far a candidate got; the best-ranked candidate decides the result.
_RANK = {
    ParseStatus.EMPTY: 0,
    ParseStatus.NO_JSON: 0,
    ParseStatus.BAD_JSON: 1,
    ParseStatus.NOT_AN_OBJECT: 2,
    ParseStatus.MISSING_FIELDS: 3,
    ParseStatus.BAD_OUTCOME: 4,
    ParseStatus.MISSING_SUGGESTION: 5,
    ParseStatus.BAD_PIVOT: 5,
    ParseStatus.VALID: 9,
    ParseStatus.PERFECT: 9,
}


@dataclass(frozen=True)
class ParseResult:
    """What :func:`parse_report` returns: a status, the report when ok, and an error when not."""

    status: ParseStatus
    report: Optional[ReflectionReport] = None
    error: str = ""

    @property
    def ok(self) -> bool:
        """A usable report (``VALID`` or ``PERFECT``)."""
        return self.status.ok

    @property
    def triggers_retry(self) -> bool:
        """A valid report whose outcome is not ``success``: retry from ``report.pivot``."""
        return (
            self.status is ParseStatus.VALID and self.report is not None and self.report.outcome is not Outcome.SUCCESS
        )


# ==================================================================================================
# Statistics
# ==================================================================================================
@dataclass
class ReflectionStats:
    """Counts of parse results per status, so no malformed reflection goes unnoticed."""

    counts: Dict[ParseStatus, int] = field(default_factory=lambda: {s: 0 for s in ParseStatus})
    retries: int = 0

    def add(self, result: Union[ParseResult, ParseStatus]) -> None:
        if isinstance(result, ParseResult):
            status = result.status
            self.retries += int(result.triggers_retry)
        else:
            status = ParseStatus(result)
            self.retries += int(status is ParseStatus.VALID)
        self.counts[status] = self.counts.get(status, 0) + 1

    def merge(self, other: "ReflectionStats") -> "ReflectionStats":
        for s, n in other.counts.items():
            self.counts[s] = self.counts.get(s, 0) + n
        self.retries += other.retries
        return self

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_metrics(self, prefix: str = "reflection_") -> Dict[str, float]:
        """``{prefix}{status}`` counts for every status, ``{prefix}total``, ``{prefix}retries``
        and ``{prefix}valid_rate`` (VALID + PERFECT over total; 0.0 when nothing was added)."""
        total = self.total
        out: Dict[str, float] = {f"{prefix}{s.value}": self.counts.get(s, 0) for s in ParseStatus}
        ok = self.counts.get(ParseStatus.VALID, 0) + self.counts.get(ParseStatus.PERFECT, 0)
        out[f"{prefix}total"] = total
        out[f"{prefix}retries"] = self.retries
        out[f"{prefix}valid_rate"] = ok / total if total else 0.0
        return out
