"""What a Tune run of R3L amounts to, per trial: finished, failed, interrupted, or trained on nothing.

Tune calls a trial TERMINATED both when it reached its stop criterion and when the run was
interrupted (Ctrl-C): only the first has ``done`` in its last result. A trial in which not one
iteration updated the policy "succeeds" in Tune's eyes: every episode lost, every episode over
max_context_tokens, or every task group scored alike (temperature 0, a task too hard or too easy: all
advantages 0). :class:`TrainingTracker` (a Tune callback) counts trained iterations and why the
others had an empty batch, so that the command line marks such a trial TRAINED ON NOTHING and
ends non-zero with the reason.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Dict, List, Optional

from ray.tune import Callback

from rllib_r3l.cli import retry_chain
from rllib_r3l.cli.result_rows import get_metric, number

INTERRUPTED = "INTERRUPTED"
TRAINED_ON_NOTHING = "TRAINED ON NOTHING"
# counted per trial over the iterations of this run: name -> flattened result key
LOSS_KEYS = {
    "episodes_lost": "env_runners/r3l/faults/episodes_lost",
    "env_errors": "env_runners/r3l/faults/env_errors",
    "env_create_errors": "env_runners/r3l/faults/env_create_errors",
    "generation_errors": "env_runners/r3l/faults/generation_errors",
    "partial_groups": "r3l/faults/partial_groups",
    # a runner whose exploration raised (every group lost) has not "scored alike"
    "exploration_errors": "env_runners/r3l/faults/exploration_errors",
    "groups_lost_with_exploration_error": "env_runners/r3l/faults/groups_lost_with_exploration_error",
    "groups_lost_with_runner": "r3l/faults/groups_lost_with_runner",
}
# why an episode ended without a learning signal, though nothing was lost
OVERFLOW_KEY = "env_runners/r3l/faults/context_overflow"
EPISODES_KEY = "env_runners/num_episodes"
# RLlib's lifetime count of trained steps: restored with a checkpoint, so a resumed trial that was
# updated before the resume is not taken for one that never was
TRAINED_LIFETIME_KEY = "learners/__all_modules__/num_env_steps_trained_lifetime"


def _count(v: Any) -> int:
    """A counter from a result: absent, NaN (not logged this iteration) and non-numbers count 0."""
    return int(number(v))


class TrainingTracker(Callback):
    """Counts, per trial, the iterations, those with a learner update, and the episodes lost."""

    def __init__(self) -> None:
        self.stats: Dict[str, Counter] = {}
        self.chains: Dict[str, Dict[str, Any]] = {}  # the reflect-then-retry chain's counts per trial

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        s = self.stats.setdefault(trial.trial_id, Counter())
        s["iterations"] += 1
        if _count(get_metric(result, "r3l/batch/empty_batches")) == 0:
            s["trained"] += 1
        s["trained_lifetime"] = max(s["trained_lifetime"], _count(get_metric(result, TRAINED_LIFETIME_KEY)))
        for name, key in LOSS_KEYS.items():
            s[name] += _count(get_metric(result, key))
        s["context_overflow"] += _count(get_metric(result, OVERFLOW_KEY))
        episodes = get_metric(result, EPISODES_KEY)
        s["episodes"] += _count(episodes)
        s["episodes_reported"] += episodes is not None
        retry_chain.add_counts(self.chains.setdefault(trial.trial_id, {}), retry_chain.reflection_counts(result))

    def retry_note(self, trial_id: str) -> Optional[str]:
        """Reflection was on and no retry ever ran in this trial: that it trained as GRPO, and why."""
        s = self.stats.get(trial_id)
        return retry_chain.verdict(self.chains.get(trial_id) or {}, s["iterations"]) if s else None

    def problem(self, trial_id: str) -> Optional[str]:
        """Why a trial that ran never updated the policy, or None (it did, or it never reported)."""
        s = self.stats.get(trial_id)
        if not s or s["iterations"] == 0 or s["trained"] > 0 or s["trained_lifetime"] > 0:
            return None
        head = f"trained on nothing: all {s['iterations']} iteration(s) had an empty batch"
        losses = ", ".join(f"{k} {s[k]}" for k in LOSS_KEYS if s[k])
        if losses:
            return f"{head} ({losses}); see its error/log output and docs/reliability.md"
        if s["context_overflow"] and 2 * s["context_overflow"] >= s["episodes"]:  # most episodes: the cause
            return (
                f"{head} (context_overflow {s['context_overflow']} of {s['episodes']} episode(s)): episodes "
                "ran out of max_context_tokens; raise max_context_tokens above the prompt's length "
                "(or shorten max_response_tokens / the environment's max_turns)"
            )
        if (
            s["episodes"] == 0 and s["episodes_reported"]
        ):  # nothing sampled and nothing counted as lost: never call it "scored alike"
            return f"{head}: no episode was sampled; see its error/log output and docs/reliability.md"
        return (
            f"{head}: every task group's episodes scored alike, so every group-relative advantage was 0 "
            "and no update was made; check temperature (> 0), the environment (max_turns, a task no episode "
            "solves; without positive_amplification also one every episode solves) and success_reward, or run "
            "more iterations"
        )


def _complete_on_disk(trial_dir: Optional[str]) -> Optional[str]:
    """The newest complete checkpoint folder of a trial, for a trial whose checkpoint Tune had not yet recorded
    when it stopped (a signal right after the copy): the one ``--resume`` continues from."""
    from rllib_r3l.checkpoint_integrity import problem
    from rllib_r3l.cli.resume_from import checkpoint_dirs

    if not trial_dir:
        return None
    return next((c for c in reversed(checkpoint_dirs(trial_dir)) if problem(c) is None), None)


def _newest_checkpoint(trial) -> Optional[str]:
    """Tune's recorded checkpoint, or a newer complete one on disk that Tune had not recorded when it stopped
    (a second Ctrl-C skips its last state save): the one ``--resume`` continues from."""
    recorded = trial.checkpoint.path if trial.checkpoint is not None else None
    on_disk = _complete_on_disk(trial.path)
    if on_disk and (recorded is None or os.path.basename(on_disk.rstrip("/")) > os.path.basename(recorded.rstrip("/"))):
        return on_disk
    return recorded


def trial_rows(trials, tracker: Optional[TrainingTracker] = None) -> List[Dict[str, Any]]:
    rows = []
    for trial in trials:
        res = trial.last_result or {}
        status = trial.status
        problem = tracker.problem(trial.trial_id) if tracker is not None else None
        if status != "ERROR" and not res.get("done"):
            status = INTERRUPTED  # ended (or never started) before its stop criterion
        elif status == "TERMINATED" and problem:
            status = TRAINED_ON_NOTHING  # reached its stop criterion without one update: not a success
        rows.append(
            {
                "experiment": trial.experiment_dir_name,
                "experiment_path": trial.remote_experiment_path,
                "trial": str(trial),
                "status": status,
                "iterations": res.get("training_iteration"),
                "reward": get_metric(res, "env_runners/episode_return_mean"),
                "success_rate": get_metric(res, "env_runners/success_rate"),
                "dir": trial.path,
                "checkpoint": _newest_checkpoint(trial),
                "error": trial.error_file if trial.status == "ERROR" else None,
                "problem": problem,
                "retry_note": tracker.retry_note(trial.trial_id) if tracker is not None else None,
            }
        )
    return rows


def print_train_summary(rows: List[Dict[str, Any]]) -> None:
    from rllib_r3l.cli.trial_errors import disk_full_advice, trial_reason

    print("\n=== rllib-r3l train: summary ===")
    for r in rows:
        if r["error"]:  # the project's own one-line message, read from Ray's error.txt
            r["reason"] = trial_reason(r["error"], r["dir"])
            advice = disk_full_advice(r["reason"], r["dir"])
            r["reason"] = f"{r['reason']}; {advice}" if advice else r["reason"]
        print(
            f"{r['experiment']} / {r['trial']}: {r['status']}, {r['iterations'] or 0} iteration(s), "
            f"reward {_fmt(r['reward'])}, success rate {_fmt(r['success_rate'])}"
        )
        print(f"  results:    {r['dir']}")
        print(f"  checkpoint: {r['checkpoint'] or '(none)'}")
        if r.get("reason"):
            print(f"  reason:     {r['reason']}")
        if r["error"]:
            print(f"  error:      {r['error']}")
        if r["problem"]:
            print(f"  problem:    {r['problem']}")
        if r.get("retry_note"):
            print(f"  note:       {r['retry_note']}")
    for e in sorted({r["experiment_path"] for r in rows if r["experiment_path"]}):
        print(f"next: rllib-r3l report {e}    |    tensorboard --logdir {e}")
    ckpts = [r["checkpoint"] for r in rows if r["checkpoint"] and r["status"] == "TERMINATED" and not r["problem"]]
    if ckpts:
        print(f"      rllib-r3l evaluate {ckpts[0]} --episodes 20")
        print(f"      rllib-r3l export {ckpts[0]} --out exported_model")


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) else "n/a"
