"""Running prepared experiments with Ray Tune (what ``rllib-r3l train`` does after validation).

Experiments run one after another (with several in one Tune run, Ray 2.60 syncs only the first
one's results to its storage path). Each is started or resumed as ``rllib_r3l.resume.plan_runs``
decided; an interrupted experiment ends the sequence. The progress table is Tune's CLIReporter
with R3L's columns (iteration, time, reward, success rate, episodes lost) instead of the first
four keys Tune's default output happens to find.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from rllib_r3l import outcome
from rllib_r3l.errors import UsageError
from rllib_r3l.resume import RESUME, tune_resume_config

PROGRESS_COLUMNS = {
    "training_iteration": "iter",
    "time_total_s": "total time (s)",
    "env_runners/episode_return_mean": "reward",
    "env_runners/success_rate": "success",
    "r3l/trained_tokens": "trained tokens",
    "env_runners/r3l/faults/episodes_lost": "episodes lost",
}


def checkpoint_config(spec: Dict[str, Any], freq: Optional[int]):
    from ray.tune import CheckpointConfig

    raw = dict(spec.get("checkpoint_config") or {})
    raw.setdefault("checkpoint_at_end", True)
    if freq is not None:
        raw["checkpoint_frequency"] = freq
    try:
        return CheckpointConfig(**raw)
    except (TypeError, ValueError) as e:
        raise UsageError(f"checkpoint_config / --checkpoint-freq: {e}; keys: checkpoint_frequency (>= 0), "
                         "checkpoint_at_end, num_to_keep") from None


def _varied_params(config: Dict[str, Any], prefix: str = "") -> List[str]:
    out = []
    for k, v in config.items():
        if isinstance(v, dict):
            out += [f"{prefix}{k}"] if set(v) == {"grid_search"} else _varied_params(v, f"{prefix}{k}/")
    return out


def progress_reporter(spec: Dict[str, Any]):
    from ray.tune import CLIReporter

    return CLIReporter(metric_columns=dict(PROGRESS_COLUMNS), parameter_columns=_varied_params(spec["config"]),
                       max_report_frequency=30)


def run(experiments: Dict[str, Dict[str, Any]], plan: Dict[str, Dict[str, Any]], *,
        storage: Optional[str], checkpoint_freq: Optional[int], callbacks: Sequence[Any], verbose: int,
        max_concurrent: Optional[int]) -> Tuple[List[Dict[str, Any]], bool]:
    """Run (or resume) each experiment with Tune; returns the per-trial rows and whether it was interrupted."""
    from ray import tune

    # the legacy output engine: it takes a progress reporter with chosen columns (the default engine
    # shows num_env_steps_sampled_lifetime & co, prints 1e-6 as "0." and points TensorBoard at Ray's
    # staging directory)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    rows: List[Dict[str, Any]] = []
    for name, spec in experiments.items():
        p = plan[name]
        kwargs = {k: v for k, v in spec.items() if k not in ("run", "config", "stop", "checkpoint_config",
                                                               "storage_path", "sync_config")}
        if spec.get("sync_config"):
            from ray.tune import SyncConfig

            kwargs["sync_config"] = SyncConfig(**spec["sync_config"])
        exp_storage = storage or (os.path.abspath(os.path.expanduser(spec["storage_path"]))
                                  if spec.get("storage_path") else None)
        exp = tune.Experiment(p["name"], spec["run"], config=spec["config"], stop=spec.get("stop"),
                              storage_path=exp_storage, checkpoint_config=checkpoint_config(spec, checkpoint_freq),
                              **kwargs)
        tracker = outcome.TrainingTracker()
        resume = {"resume_config": tune_resume_config()} if p["mode"] == RESUME else {}
        analysis = tune.run(exp, callbacks=[*callbacks, tracker], raise_on_failed_trial=False, verbose=verbose,
                            max_concurrent_trials=max_concurrent, progress_reporter=progress_reporter(spec), **resume)
        new_rows = outcome.trial_rows(analysis.trials, tracker)
        rows += new_rows
        print(f"\nexperiment {name!r}: results in {analysis.experiment_path}")
        if any(r["status"] == outcome.INTERRUPTED for r in new_rows):
            return rows, True
    return rows, False
