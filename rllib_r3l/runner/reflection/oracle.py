"""Oracle reflection (a DIAGNOSTIC) and pivot-quality metrics for environments with an oracle.

``reflector="oracle"`` replaces the policy's reflection by a report computed from the environment's
own truth (``env.oracle(seed, actions)``, see ``environments.base``): its pivot is the oracle pivot
and its suggestion names, in words, the gold action at that pivot. It is the upper bound of what a
reflection can hand to the rest of R3L (retry from the pivot, pivotal credit, amplification). It is
not a method to train with: the policy did not write these reports, so they are never trained on
(no reflection auxiliary item is made from them).

With the policy's own reflector, :func:`log_pivot_quality` scores every reported pivot against the
oracle pivot (``rllib_r3l.runner.reflection.pivot_metrics``) when the environment has an oracle.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from rllib_r3l.runner.reflection import reflect as reflect_lib
from rllib_r3l.runner.reflection.pivot_metrics import PIVOT_METRICS, pivot_quality

logger = logging.getLogger(__name__)

__all__ = ["env_has_oracle", "oracle_report", "oracle_reflections", "log_pivot_quality"]


def env_has_oracle(env_or_class: Any) -> bool:
    """Whether an environment (or its class / registered id) has an oracle."""
    if isinstance(env_or_class, str):
        import environments

        env_or_class = environments.registry.resolve(env_or_class)
    return bool(getattr(env_or_class, "has_oracle", False))


@contextlib.contextmanager
def borrowed_env(episodes: Any) -> Iterator[Any]:
    """An environment of the episode runner's pool (finished episodes only; reset before reuse)."""
    env = episodes.envs.acquire()
    healthy = True
    try:
        yield env
    except Exception:
        healthy = False
        raise
    finally:
        episodes.envs.release(env, healthy)


def oracle_report(
    actions: Sequence[str], success: bool, pivot: Optional[int], gold: Optional[str]
) -> Optional[reflect_lib.ParseResult]:
    """The oracle's report for an episode with ``actions``; None when there is nothing to retry
    (a failed episode without an oracle pivot: its every action was optimal, yet it did not finish)."""
    n = len(actions)
    if pivot is None:
        if not success:
            return None
        report = {
            "summary": f"The agent finished the task in {n} steps, with no step to spare.",
            "root_cause": "Every action was on a shortest way to the goal.",
            "outcome": reflect_lib.Outcome.SUCCESS.value,
            "suggestion": None,
            "retry_from_step": None,
        }
    else:
        taken = str(actions[pivot]).strip() if pivot < n else "(nothing)"
        want = gold if gold else "a different action"
        report = {
            "summary": (
                f"The agent took {n} steps and {'finished' if success else 'did not finish'} the task; "
                f"its steps 0 to {pivot - 1} were on a shortest way to the goal."
                if pivot > 0
                else f"The agent took {n} steps and {'finished' if success else 'did not finish'} the task."
            ),
            "root_cause": (
                f"Why did the attempt go wrong? Because at step {pivot} the agent chose '{taken}', "
                f"after which the task could no longer be finished in the fewest steps."
            ),
            "outcome": (reflect_lib.Outcome.SUCCESS_BUT_INEFFICIENT if success else reflect_lib.Outcome.FAILURE).value,
            "suggestion": f"At step {pivot}, instead of '{taken}', do '{want}'.",
            "retry_from_step": int(pivot),
        }
    import json

    return reflect_lib.parse_report(json.dumps(report), max(n, 1))


def _oracles(explorer: Any, trajectories: Sequence[Any]) -> List[Optional[Tuple[Optional[int], Optional[str]]]]:
    """``env.oracle(seed, actions)`` per trajectory (None where it failed: counted as oracle_errors)."""
    out: List[Optional[Tuple[Optional[int], Optional[str]]]] = []
    with borrowed_env(explorer.episodes) as env:
        for t in trajectories:
            try:
                out.append(env.oracle(t.seed, list(t.actions)))
            except Exception:  # an oracle that cannot decide (e.g. a search budget): counted, skipped
                explorer.counters["oracle_errors"] += 1
                logger.warning("oracle failed for seed %s", t.seed, exc_info=True)
                out.append(None)
    return out


def oracle_reflections(explorer: Any, trajectories: Sequence[Any]) -> List[tuple]:
    """``Explorer.reflect`` for ``reflector="oracle"``: ``(ParseResult or None, [], None)`` per
    trajectory. No prompt and no generation: nothing of it can become a training item."""
    results = []
    for t, verdict in zip(trajectories, _oracles(explorer, trajectories)):
        t.info["oracle_pivot"] = verdict[0] if verdict else None  # the retry ledger's row: its own pivot
        parsed = None
        if verdict is not None:
            parsed = oracle_report(t.actions, bool(t.success), *verdict)
        if parsed is None:
            explorer.counters["oracle_no_pivot"] += 1
        else:
            explorer.reflection_stats.add(parsed)
            if parsed.triggers_retry and verdict[1]:
                t.info["oracle_action"] = verdict[1]  # what the report names (retry_took_oracle_action)
        results.append((parsed, [], None))
    return results


def log_pivot_quality(explorer: Any, trajectories: Sequence[Any], results: Sequence[tuple]) -> None:
    """Score each reported pivot against the oracle pivot (when the environment has an oracle)."""
    todo = [
        (t, r[0].report.pivot)
        for t, r in zip(trajectories, results)
        if r[0] is not None and r[0].ok and r[0].report is not None and r[0].report.pivot is not None
    ]
    if not todo:
        return
    with borrowed_env(explorer.episodes) as env:
        if not env_has_oracle(env):
            return
    verdicts = _oracles(explorer, [t for t, _p in todo])
    for (t, p), verdict in zip(todo, verdicts):
        t.info["oracle_pivot"] = verdict[0] if verdict else None  # the retry ledger's row (explore.py)
        q = pivot_quality(p, verdict[0] if verdict else None)
        if q is not None:
            for key, name in PIVOT_METRICS.items():
                explorer._log(name, q[key])
