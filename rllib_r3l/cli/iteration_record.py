"""One training iteration's numbers as the main job's ``summary.json`` keeps them (and benchmarks read them)."""

from __future__ import annotations

import math
from typing import Any, Dict

from rllib_r3l.cli.result_rows import get_metric


def find_r3l_metrics(d: Any, key: str):
    """The dict under ``.../r3l/<key>`` anywhere in a nested result (learner metrics sit under
    ``learners/<module>/r3l/learner``)."""
    if not isinstance(d, dict):
        return None
    if isinstance(d.get("r3l"), dict) and key in d["r3l"]:
        return d["r3l"][key]
    for v in d.values():
        found = find_r3l_metrics(v, key)
        if found is not None:
            return found
    return None


def _flat(d: Any) -> Dict[str, Any]:
    return {k: v for k, v in (d or {}).items() if not isinstance(v, dict)}


def _overlap(r: Dict[str, Any]) -> Dict[str, Any]:
    """``r3l/async`` with the idle fractions of the iteration: the learner's (its wait for samples) and the
    runners' (1 - their sampling time), both of the iteration's wall time."""
    out = _flat(get_metric(r, "r3l/async", {}))
    wall = float(r.get("time_this_iter_s") or 0.0)
    sampled = get_metric(r, "env_runners/r3l/rollout_seconds")
    if wall > 0:
        out["learner_idle_fraction"] = min(1.0, float(out.get("wait_for_samples_s", 0.0)) / wall)
        if isinstance(sampled, (int, float)):
            out["runner_idle_fraction"] = max(0.0, 1.0 - float(sampled) / wall)
    return out


def iteration_record(it: int, r: Dict[str, Any]) -> Dict[str, Any]:
    """One iteration's numbers for summary.json: success, every env-runner ``r3l/`` metric, the
    credit/batch metrics and the learner's throughput (NaN where the iteration had no update)."""
    er = r.get("env_runners", {})
    return {
        "iteration": it,
        "seconds": float(r.get("time_this_iter_s", float("nan"))),
        "success_rate": get_metric(er, "success_rate", math.nan),
        "episodes": get_metric(er, "num_episodes", math.nan),  # base episodes (more than planned with dynamic sampling)
        "episode_return_mean": get_metric(er, "episode_return_mean", math.nan),
        "r3l": _flat(get_metric(er, "r3l", {})),
        # where the runner's time went: engine per phase, environment steps/resets, replay, reflection
        "timers": _flat(get_metric(er, "r3l/timers", {})),
        # dynamic sampling: extra rounds of new tasks, groups without a learning signal
        "dynamic_sampling": _flat(get_metric(er, "r3l/dynamic_sampling", {})),
        "credit": _flat(get_metric(r, "r3l", {})),
        "batch": _flat(get_metric(r, "r3l/batch", {})),
        "learner": _flat(find_r3l_metrics(r.get("learners", {}), "learner")),
        # max_policy_lag: requests in flight, the driver's wait for samples; the lag itself is under "credit"
        **({"async": _overlap(r)} if get_metric(r, "r3l/async") else {}),
        # when each phase ran, in seconds since the run's first phase (rllib_r3l/timeline.py)
        **({"timeline": _flat(get_metric(r, "r3l/timeline"))} if get_metric(r, "r3l/timeline") else {}),
        # evaluation_interval: R3L.evaluate()'s held-out episodes after this iteration (not only on the console)
        **(
            {"held_out": _flat(r["evaluation"].get("env_runners", {}))} if isinstance(r.get("evaluation"), dict) else {}
        ),
    }
