"""Each environment's options, checked by declaration before anything is built.

An environment declares its options once, as its constructor's keywords: the type annotation is the
option's type, and the class attribute ``option_bounds`` (``{name: (low, high)}``, inclusive, None =
open; merged over the class's bases) its numeric range. :func:`bad_option` checks an ``env_config``
against both and names the first key that does not fit, so a value of the wrong type ("three" for an
integer, 2.5 for a count) is an error about that key before Ray starts, not a ``TypeError`` from deep
inside the first ``reset``. Annotations it cannot read (a custom class) are not checked.
"""

from __future__ import annotations

import collections.abc
import inspect
import typing
from typing import Any, Callable, Dict, Optional, Tuple

# Bounds every environment shares for these names: a count of turns, attempts or listed actions below 1
# ends every episode before its first action.
COMMON_BOUNDS: Dict[str, Tuple[Optional[float], Optional[float]]] = {
    "max_turns": (1, None),
    "max_attempts": (1, None),
    "max_listed_actions": (1, None),
    "max_repeats": (1, None),
}

# Keys an env runner takes out of ``env_config`` for every environment (rllib_r3l.preflight.RUNNER_ENV_KEYS),
# checked here by the same rules as an environment's own options.
RUNNER_HINTS: Dict[str, Any] = {"eval_split": str, "step_delay_s": float}
RUNNER_BOUNDS: Dict[str, Tuple[Optional[float], Optional[float]]] = {"step_delay_s": (0, None)}


def bounds_of(factory: Callable[..., Any]) -> Dict[str, Tuple[Optional[float], Optional[float]]]:
    """``option_bounds`` of ``factory`` and its bases (a subclass's entry wins), over :data:`COMMON_BOUNDS`."""
    merged = dict(COMMON_BOUNDS)
    for klass in reversed(getattr(factory, "__mro__", (factory,))):
        merged.update(getattr(klass, "__dict__", {}).get("option_bounds", {}) or {})
    return merged


def _hints(factory: Callable[..., Any]) -> Dict[str, Any]:
    target = factory.__init__ if inspect.isclass(factory) else factory
    try:
        return typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - annotations that do not resolve here: nothing to check by type
        return {}


def _fits(value: Any, hint: Any) -> Optional[bool]:
    """Whether ``value`` fits the annotation ``hint``; None where the annotation is not one this reads."""
    if hint is Any or hint is inspect.Parameter.empty:
        return True
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        fits = [_fits(value, a) for a in args]
        return True if any(fits) else (None if None in fits else False)
    if origin in (list, tuple, collections.abc.Sequence):
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            return False
        inner = [_fits(v, args[0]) for v in value] if args and args[0] is not Ellipsis else []
        return None if None in inner else all(inner)
    if origin in (dict, collections.abc.Mapping):
        return isinstance(value, dict)
    if origin is collections.abc.Callable or hint is collections.abc.Callable:
        return callable(value)
    return None


def describe(hint: Any) -> str:
    """``"an integer"``, ``"None or a list of strings"``, ... for a message."""
    names = {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a string",
        type(None): "None",
        Any: "any value",
    }
    if hint in names:
        return names[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        parts = [describe(a) for a in args]
        return ", ".join(parts[:-1]) + " or " + parts[-1] if len(parts) > 1 else parts[0]
    if origin in (list, tuple, collections.abc.Sequence):
        inner = describe(args[0]) if args and args[0] is not Ellipsis else "values"
        return f"a list of {inner.replace('an integer', 'integers').replace('a string', 'strings')}"
    if origin in (dict, collections.abc.Mapping):
        return "a mapping"
    return getattr(hint, "__name__", str(hint))


def _range_text(low: Optional[float], high: Optional[float]) -> str:
    if low is not None and high is not None:
        return f" in [{low}, {high}]"
    return f" >= {low}" if low is not None else f" <= {high}" if high is not None else ""


def bad_option(env_id: str, factory: Callable[..., Any], env_config: Dict[str, Any]) -> Optional[Tuple[str, str]]:
    """``(key, message)`` for the first ``env_config`` value that does not fit its declared type or range."""
    hints, bounds = _hints(factory), bounds_of(factory)
    for key, value in env_config.items():
        hint = hints.get(key, RUNNER_HINTS.get(key, Any))
        low, high = bounds.get(key, RUNNER_BOUNDS.get(key, (None, None)))
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        out_of_range = numeric and ((low is not None and value < low) or (high is not None and value > high))
        if _fits(value, hint) is False or out_of_range:
            return key, f"{env_id} option {key!r} must be {describe(hint)}{_range_text(low, high)}, got {value!r}"
    return None


__all__ = ["COMMON_BOUNDS", "RUNNER_BOUNDS", "RUNNER_HINTS", "bad_option", "bounds_of", "describe"]
