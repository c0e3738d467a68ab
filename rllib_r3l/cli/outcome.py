"""What a Tune run of R3L amounts to, per trial: finished, failed, interrupted, or trained on nothing.

Tune calls a trial TERMINATED both when it reached its stop criterion and when the run was
interrupted (Ctrl-C): only the first has ``done`` in its last result. A trial whose every iteration
had an empty batch because episodes were lost (every episode lost, every group partial) "succeeds"
in Tune's eyes although no update happened; :class:`TrainingTracker` (a Tune callback) counts trained iterations and losses so
that the command line can end non-zero with the reason.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, List, Optional

from ray.tune import Callback

INTERRUPTED = "INTERRUPTED"
# counted per trial over the iterations of this run: name -> flattened result key
LOSS_KEYS = {
    "episodes_lost": "env_runners/r3l/faults/episodes_lost",
    "env_errors": "env_runners/r3l/faults/env_errors",
    "env_create_errors": "env_runners/r3l/faults/env_create_errors",
    "generation_errors": "env_runners/r3l/faults/generation_errors",
    "partial_groups": "r3l/faults/partial_groups",
}


def get_metric(result: Dict[str, Any], path: str) -> Any:
    """``result["a"]["b"]`` for ``path = "a/b"`` (or a flattened key)."""
    node: Any = result
    for p in path.split("/"):
        if not isinstance(node, dict) or p not in node:
            return result.get(path)
        node = node[p]
    return node


def _count(v: Any) -> int:
    """A counter from a result: absent, NaN (not logged this iteration) and non-numbers count 0."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        return 0
    return int(v)


class TrainingTracker(Callback):
    """Counts, per trial, the iterations, those with a learner update, and the episodes lost."""

    def __init__(self) -> None:
        self.stats: Dict[str, Counter] = {}

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        s = self.stats.setdefault(trial.trial_id, Counter())
        s["iterations"] += 1
        if _count(get_metric(result, "r3l/batch/empty_batches")) == 0:
            s["trained"] += 1
        for name, key in LOSS_KEYS.items():
            s[name] += _count(get_metric(result, key))

    def problem(self, trial_id: str) -> Optional[str]:
        """Why a trial that ran did not train, or None."""
        s = self.stats.get(trial_id)
        if not s or s["iterations"] == 0 or s["trained"] > 0:
            return None
        losses = ", ".join(f"{k} {s[k]}" for k in LOSS_KEYS if s[k])
        if not losses:
            # every batch empty because every advantage was 0 (all episodes of each group scored
            # alike: nothing to learn from) is a legitimate outcome, not a fault
            return None
        return (f"trained on nothing: all {s['iterations']} iteration(s) had an empty batch ({losses}); "
                "see its error/log output and docs/reliability.md")


def trial_rows(trials, tracker: Optional[TrainingTracker] = None) -> List[Dict[str, Any]]:
    rows = []
    for trial in trials:
        res = trial.last_result or {}
        status = trial.status
        if status != "ERROR" and not res.get("done"):
            status = INTERRUPTED  # ended (or never started) before its stop criterion
        rows.append({
            "experiment": trial.experiment_dir_name,
            "experiment_path": trial.remote_experiment_path,
            "trial": str(trial),
            "status": status,
            "iterations": res.get("training_iteration"),
            "reward": get_metric(res, "env_runners/episode_return_mean"),
            "success_rate": get_metric(res, "env_runners/success_rate"),
            "dir": trial.path,
            "checkpoint": trial.checkpoint.path if trial.checkpoint is not None else None,
            "error": trial.error_file if trial.status == "ERROR" else None,
            "problem": tracker.problem(trial.trial_id) if tracker is not None else None,
        })
    return rows
