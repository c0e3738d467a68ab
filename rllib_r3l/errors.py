"""User-facing errors: one line that names the field, flag or file and the fix.

:class:`UsageError` is a mistake in what the user gave (a config file, a flag, a path, a
checkpoint); the command line prints it without a traceback and exits with code 2. Every layer may
raise it (it lives here, below the CLI, so that lower layers never import the CLI).
"""

from __future__ import annotations

import difflib
from typing import Iterable


class UsageError(Exception):
    """A mistake in the command line, a config file or a path: printed without a traceback, exit code 2."""


class LearnerLost(RuntimeError):
    """A remote learner died (its node went away, or its process was killed). RLlib cannot restart a
    learner mid-run with its optimizer state, so the run ends; it resumes from its last checkpoint."""


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or ``""`` when none is close."""
    close = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def one_line(e: BaseException) -> str:
    """``Type: message`` on one line (a message over several lines joined)."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def template_problem(template: object, allowed: Iterable[str], required: Iterable[str]) -> str:
    """What is wrong with a ``str.format`` template a user wrote (``""``: nothing): not a string, a
    placeholder not in ``allowed`` (``{bogus}``, ``{0}``, ``{task.x}``), a stray brace, or none of
    ``required``. Such a template passed validation and failed in every episode (KeyError in the log)."""
    import string

    allowed, required = tuple(allowed), tuple(required)
    names = ", ".join("{" + n + "}" for n in allowed)
    if not isinstance(template, str):
        return f"must be a string with the placeholders {names}, got {type(template).__name__}"
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as e:  # "Single '}' encountered", "unmatched '{'"
        return f"is not a valid format string ({e}); write a literal brace as {{{{ or }}}}"
    unknown = sorted(f for f in fields if f not in allowed)
    if unknown:
        return f"has unknown placeholder(s) {unknown}; allowed: {names} (a literal brace is {{{{ or }}}})"
    if required and not fields & set(required):
        return f"must contain the placeholder {' or '.join('{' + n + '}' for n in required)}"
    try:
        template.format(**{n: "" for n in allowed})
    except (ValueError, KeyError, IndexError, AttributeError) as e:  # a format spec such as {task:d}
        return f"cannot be filled in ({type(e).__name__}: {e})"
    return ""
