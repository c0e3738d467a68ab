"""Hindsight pivots (``pivot_selector="hindsight"``): where did the episode go wrong, by the policy's own odds?

A reflection names its pivot in words, and small reflectors name it late (after the first mistake, so the
retry replays it). Hindsight localisation asks the policy instead: with the report put before the episode,
the turn whose action loses the most log-probability is the one the report speaks against. Per failed base
episode with a valid report, one scoring pass of the engine over the episode as it was and one with the
report inserted as a system message after the system prompt; the per-turn change is

    delta_t = log pi(a_t | report, history_t) - log pi(a_t | history_t)    (summed over a_t's tokens)

and the hindsight pivot is ``argmin_t delta_t`` over the turns ``0 .. reported pivot`` (bounded by the report:
a retry from a later turn would replay the turn the report blames). Ties go to the earliest turn.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, List, Optional, Sequence

from rllib_r3l.trajectory import Trajectory

logger = logging.getLogger(__name__)


def guidance_segment(chat, system_text: str, text: str) -> List[int]:
    """Tokens of an extra system message right after the conversation's system message."""
    sys_msg = {"role": "system", "content": system_text}
    before = chat._render([sys_msg], False)
    return chat.encode(chat._diff(before, chat._render([sys_msg, {"role": "system", "content": text}], False)))


def turn_logprobs(trajectory_ids: Sequence[int], scores: Sequence[float], spans: Sequence[tuple]) -> Dict[int, float]:
    """Per turn, the sum of the log-probs of its response tokens; ``scores[j]`` is token ``j + 1``'s log-prob,
    ``spans`` the ``(turn, start, end)`` token ranges of the responses in ``trajectory_ids``."""
    out: Dict[int, float] = {}
    for turn, start, end in spans:
        out[turn] = out.get(turn, 0.0) + float(sum(scores[start - 1 : end - 1]))
    return out


def response_spans(t: Trajectory, offset_after_first: int = 0) -> List[tuple]:
    """``(turn, start, end)`` of each response segment; positions after the first segment shift by
    ``offset_after_first`` (the inserted report)."""
    spans, pos = [], 0
    for i, s in enumerate(t.segments):
        n = len(s.token_ids)
        if s.role == "response":
            shift = offset_after_first if i > 0 else 0
            spans.append((s.turn, pos + shift, pos + shift + n))
        pos += n
    return spans


def choose(deltas: Dict[int, float], bound: int) -> Optional[int]:
    """The turn at or before ``bound`` whose action lost the most log-probability (earliest on a tie).
    A turn whose score is not finite (a NaN log-prob) is no evidence: it is never chosen."""
    turns = sorted(t for t in deltas if 0 <= t <= bound and math.isfinite(deltas[t]))
    return min(turns, key=lambda t: (deltas[t], t)) if turns else None


def hindsight_pivots(
    backend, chat, bases: Sequence[Trajectory], reports: Sequence[str], bounds: Sequence[int]
) -> List[Optional[int]]:
    """The hindsight pivot of each base episode (None where it has no scorable turn at or before its bound).

    ``reports``: the text put before the episode (the retry's guidance); ``bounds``: each report's pivot."""
    pairs, layout = [], []
    for t, report in zip(bases, reports):
        ids = t.token_ids
        first = len(t.segments[0].token_ids)
        insert = guidance_segment(chat, t.info.get("system_text", ""), report)
        guided = ids[:first] + insert + ids[first:]
        pairs += [(ids[:1], ids[1:]), (guided[:1], guided[1:])]
        layout.append((response_spans(t), response_spans(t, len(insert))))
    scores = backend.score_batch(pairs) if pairs else []
    out: List[Optional[int]] = []
    for i, (t, bound) in enumerate(zip(bases, bounds)):
        plain, guided_spans = layout[i]
        before = turn_logprobs(t.token_ids, scores[2 * i], plain)
        after = turn_logprobs(None, scores[2 * i + 1], guided_spans)
        out.append(choose({k: after[k] - before[k] for k in before if k in after}, int(bound)))
    return out


def explorer_pivots(
    explorer: Any, bases: Sequence[Trajectory], reflections: Sequence[tuple]
) -> Dict[int, Optional[int]]:
    """``pivot_selector="hindsight"`` in an ``Explorer``: per base episode (by ``id``) whose report starts a retry,
    its hindsight pivot (None where no turn could be scored); ``{}`` with another selector. A scoring failure
    is counted (``hindsight_errors``) and the reports' own pivots stand."""
    if explorer.opts.pivot_selector != "hindsight":
        return {}
    todo = [(b, p) for b, (p, _ids, _o) in zip(bases, reflections) if p is not None and p.triggers_retry and b.actions]
    if not todo:
        return {}
    from rllib_r3l.runner.reflection import reflect as reflect_lib

    texts = [reflect_lib.format_guidance(p.report, explorer.opts.guidance_template) for _b, p in todo]
    try:
        found = hindsight_pivots(
            explorer.episodes.backend,
            explorer.chat,
            [b for b, _p in todo],
            texts,
            [int(p.report.pivot) for _b, p in todo],
        )
    except Exception:  # the report's own pivot is still a pivot: counted, logged, not lost
        explorer.counters["hindsight_errors"] += len(todo)
        logger.exception("hindsight scoring failed; the reports' pivots are used")
        return {}
    for (_b, p), h in zip(todo, found):
        if h is not None:
            explorer._log("hindsight_pivot_shift", h - int(p.report.pivot))
    return {id(b): h for (b, _p), h in zip(todo, found)}


__all__ = ["choose", "explorer_pivots", "guidance_segment", "hindsight_pivots", "response_spans", "turn_logprobs"]
