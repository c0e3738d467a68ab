"""A retry's pivot turn: the one turn where the retry must leave the failed episode's path.

A small policy given guidance still tends to take the failed action again at the pivot (the retry
then replays the failure). Two options give its retry a reason to differ there, both only at the
pivot turn of a retry (``EpisodeSpec.kind == RETRY`` and ``turn == pivot``):

* ``pivot_action="exclude_failed"``: the failed episode's action at the pivot is not allowed. With
  choice decoding it is left out of the choices (unless it is the only one, counted as
  ``pivot_exclusion_impossible``); with free text the turn is sampled again, up to
  ``pivot_resamples`` times, while it repeats it (``pivot_resamples``; what still repeats is kept and
  counted as ``pivot_repeats_kept``). Actions compare as the environments compare them
  (``environments._common.normalize_action``).
* ``pivot_temperature``: the pivot turn samples at its own temperature.

The retry's tokens are trained as any retry's (off-policy, paper §4): their log-probs are the sampler's.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

from rllib_r3l.trajectory import Kind


def _normalize(action: str) -> str:
    from environments._common import normalize_action  # how the environments compare actions

    return normalize_action(action)


def failed_action(spec: Any, turn: int, pivot_action: str) -> Optional[str]:
    """The action a retry may not take at this turn (its base's action at the pivot), or None."""
    if pivot_action != "exclude_failed" or spec.kind != Kind.RETRY or turn != spec.pivot or spec.base is None:
        return None
    actions = spec.base.actions
    return actions[spec.pivot] if spec.pivot < len(actions) else None


def exclude(choices: Optional[List[str]], failed: Optional[str], counters: Dict[str, int]) -> Optional[List[str]]:
    """``choices`` without ``failed`` (all of them when nothing else would be left, counted)."""
    if not choices or failed is None:
        return choices
    kept = [c for c in choices if _normalize(c) != _normalize(failed)]
    if not kept:
        counters["pivot_exclusion_impossible"] += 1
        return choices
    if len(kept) < len(choices):
        counters["pivot_choices_excluded"] += 1
    return kept


def repeats(text: str, failed: Optional[str]) -> bool:
    return failed is not None and _normalize(text.strip()) == _normalize(failed)


def temperature(spec: Any, turn: int, default: float, pivot_temperature: Optional[float]) -> float:
    """The sampling temperature of this turn: ``pivot_temperature`` at a retry's pivot turn, else ``default``."""
    at_pivot = spec.kind == Kind.RETRY and turn == spec.pivot
    return float(pivot_temperature) if at_pivot and pivot_temperature is not None else float(default)


def generate(
    generate_fn: Callable[..., List[Any]],
    requests: Sequence[Any],
    temperatures: Sequence[float],
    failed: Sequence[Optional[str]],
    resamples: int,
    counters: Dict[str, int],
) -> List[Any]:
    """One result per request: ``generate_fn(requests, temperature=t)`` per distinct temperature, then the
    free-text pivot turns that repeat their ``failed`` action sampled again, up to ``resamples`` times."""
    results: List[Any] = [None] * len(requests)

    def run(indices: List[int]) -> None:
        by_temp: Dict[float, List[int]] = {}
        for i in indices:
            by_temp.setdefault(temperatures[i], []).append(i)
        for temp, idx in by_temp.items():
            for i, out in zip(idx, generate_fn([requests[i] for i in idx], temperature=temp)):
                results[i] = out

    run(list(range(len(requests))))
    redo: List[int] = [i for i, f in enumerate(failed) if f is not None and repeats(results[i].text, f)]
    for _ in range(resamples):
        if not redo:
            break
        counters["pivot_resamples"] += len(redo)
        run(redo)
        redo = [i for i in redo if repeats(results[i].text, failed[i])]
    counters["pivot_repeats_kept"] += len(redo)
    return results


__all__ = ["exclude", "failed_action", "generate", "repeats", "temperature"]
