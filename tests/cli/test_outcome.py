"""What a run amounts to (rllib_r3l.cli.outcome): a run in which not one iteration updated the policy is
not a success, whatever the cause (issue 37, 4): it is marked TRAINED ON NOTHING, with the reason, and
``rllib-r3l train`` exits non-zero."""

from __future__ import annotations

import os
import types

import pytest

from rllib_r3l.cli import commands as cli
from rllib_r3l.cli.outcome import INTERRUPTED, TRAINED_ON_NOTHING, TrainingTracker, trial_rows
from tests import REPO_ROOT

TOY = os.path.join(str(REPO_ROOT), "tuned_examples", "cpu", "toy_corridor_tiny.yaml")
EMPTY = {"r3l": {"batch": {"empty_batches": 1}}, "env_runners": {"num_episodes": 8}}
OVERFLOW = {
    "r3l": {"batch": {"empty_batches": 1}},
    "env_runners": {"num_episodes": 8, "r3l": {"faults": {"context_overflow": 8}}},
}
TRAINED = {"r3l": {"batch": {"items": 6}}, "env_runners": {"num_episodes": 8}}


class _Trial:
    def __init__(self, trial_id="t1", status="TERMINATED", done=True):
        self.trial_id, self.status, self.last_result = trial_id, status, {"done": done, "training_iteration": 2}
        self.experiment_dir_name, self.remote_experiment_path = "exp", "/storage/exp"
        self.path, self.checkpoint, self.error_file = "/storage/exp/t", None, None

    def __str__(self):
        return self.trial_id


def _row(*results, **trial):
    tracker, t = TrainingTracker(), _Trial(**trial)
    for r in results:
        tracker.on_trial_result(0, [], t, r)
    return trial_rows([t], tracker)[0]


def test_all_equal_rewards_every_iteration_is_trained_on_nothing():
    """temperature 0, a task too hard or too easy: every group scored alike, every batch empty."""
    row = _row(EMPTY, EMPTY)
    assert row["status"] == TRAINED_ON_NOTHING
    assert "trained on nothing: all 2 iteration(s) had an empty batch" in row["problem"]
    assert "scored alike" in row["problem"] and "advantage" in row["problem"]


def test_every_episode_overflowing_the_context_names_max_context_tokens():
    row = _row(OVERFLOW)
    assert row["status"] == TRAINED_ON_NOTHING
    assert "context_overflow 8" in row["problem"] and "max_context_tokens" in row["problem"]


def test_a_few_overflowing_episodes_are_not_taken_for_the_cause():
    few = {
        "r3l": {"batch": {"empty_batches": 1}},
        "env_runners": {"num_episodes": 8, "r3l": {"faults": {"context_overflow": 1}}},
    }
    row = _row(few)
    assert row["status"] == TRAINED_ON_NOTHING and "scored alike" in row["problem"]


def test_groups_lost_to_an_exploration_error_are_named_not_called_scored_alike():
    """Re-probe 11: a system_prompt placeholder the runner could not fill raised in every runner's exploration;
    every group was lost, and the summary said the episodes "scored alike"."""
    lost = {
        "r3l": {"batch": {"empty_batches": 1}},
        "env_runners": {
            "num_episodes": 0,
            "r3l": {"faults": {"exploration_errors": 1, "groups_lost_with_exploration_error": 2}},
        },
    }
    row = _row(lost, lost)
    assert row["status"] == TRAINED_ON_NOTHING
    assert "exploration_errors 2, groups_lost_with_exploration_error 4" in row["problem"]
    assert "scored alike" not in row["problem"]
    runner_lost = {"r3l": {"batch": {"empty_batches": 1}, "faults": {"groups_lost_with_runner": 2}}}
    assert "groups_lost_with_runner 2" in _row(runner_lost)["problem"]
    nothing = {"r3l": {"batch": {"empty_batches": 1}}, "env_runners": {"num_episodes": 0}}
    assert "no episode was sampled" in _row(nothing)["problem"]


def test_one_trained_iteration_is_a_success():
    row = _row(EMPTY, TRAINED)
    assert row["status"] == "TERMINATED" and row["problem"] is None


def test_a_resumed_trial_that_trained_before_the_resume_is_a_success():
    """After --resume only this run's iterations are reported; RLlib's lifetime counter (restored from the
    checkpoint) says the policy was updated before."""
    before = {**EMPTY, "learners": {"__all_modules__": {"num_env_steps_trained_lifetime": 8.0}}}
    row = _row(before, before)
    assert row["status"] == "TERMINATED" and row["problem"] is None


def test_an_interrupted_or_failed_trial_keeps_its_status():
    assert _row(EMPTY, done=False)["status"] == INTERRUPTED
    assert _row(EMPTY, status="ERROR", done=False)["status"] == "ERROR"


def _checkpoint_folder(path, complete=True):
    """A checkpoint folder in RLlib's layout (what checkpoint_integrity checks), with an empty state if not complete."""
    (path / "learner_group").mkdir(parents=True)
    (path / "rllib_checkpoint.json").write_text("{}")
    (path / "learner_group" / "metadata.json").write_text("{}" if complete else "")
    return str(path)


def test_an_interrupted_trial_names_the_complete_checkpoint_on_disk_that_tune_had_not_recorded(tmp_path):
    # re-probe 2 (M-1): SIGTERM after iteration 2 with --checkpoint-freq 2 printed "checkpoint: (none)" while
    # checkpoint_000000 was complete on disk, and the next line advised --resume (which used it)
    t = _Trial(status="TERMINATED", done=False)
    t.path = str(tmp_path)
    assert trial_rows([t])[0]["checkpoint"] is None  # nothing on disk: none
    first = _checkpoint_folder(tmp_path / "checkpoint_000000")
    _checkpoint_folder(tmp_path / "checkpoint_000001", complete=False)  # a copy cut short: not named
    row = trial_rows([t])[0]
    assert row["status"] == INTERRUPTED and row["checkpoint"] == first
    # re-probe 3 (M1): after a double Ctrl-C Tune's record lagged one behind the complete folder --resume uses
    second = _checkpoint_folder(tmp_path / "checkpoint_000002")
    t.checkpoint = types.SimpleNamespace(path=first)
    assert trial_rows([t])[0]["checkpoint"] == second


@pytest.fixture
def tune_trains_on_nothing(monkeypatch):
    """Tune without Ray: one trial whose two results had empty batches, reported to the callbacks."""
    import ray
    from ray import tune

    import rllib_r3l

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(rllib_r3l, "register", lambda: None)
    monkeypatch.setattr(tune, "Experiment", lambda name, run, **kw: types.SimpleNamespace(name=name))

    def run(exp, callbacks=(), **kw):
        trial = _Trial(f"{exp.name}_00000")
        for cb in callbacks:
            if isinstance(cb, TrainingTracker):
                for _ in range(2):
                    cb.on_trial_result(0, [trial], trial, EMPTY)
        return types.SimpleNamespace(trials=[trial], experiment_path=f"/tmp/{exp.name}")

    monkeypatch.setattr(tune, "run", run)


@pytest.mark.integration
def test_train_exits_nonzero_with_the_reason_when_nothing_was_trained(tune_trains_on_nothing, capsys, tmp_path):
    code = cli.main(
        [
            "train",
            TOY,
            "--experiment",
            "toy-corridor-tiny-r3l",
            "--set",
            "model=tiny",
            "--verbose",
            "0",
            "--storage-path",
            str(tmp_path),
        ]
    )
    out, err = capsys.readouterr()
    assert code == cli.EXIT_FAILED, out + err
    assert f": {TRAINED_ON_NOTHING}," in out and "trained on nothing" in err
    assert "rllib-r3l evaluate" not in out and "rllib-r3l export" not in out  # nothing worth evaluating


def test_a_trial_without_a_result_is_summarised_with_0_iterations(capsys):
    # re-probe 5 (M6): "None iteration(s)" for a trial that never reported
    from rllib_r3l.cli.outcome import print_train_summary

    trial = _Trial(status="PENDING", done=False)
    trial.last_result = {}
    print_train_summary(trial_rows([trial]))
    out = capsys.readouterr().out
    assert "t1: INTERRUPTED, 0 iteration(s)" in out and "None iteration" not in out, out
