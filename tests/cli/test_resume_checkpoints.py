"""``--resume`` of a Tune experiment continues from the newest complete checkpoint (issue 37).

Tune records a checkpoint in its experiment state only after copying it completely, but the copy into
``checkpoint_*`` is not atomic (docs/reliability.md). A real trial (tiny model, toy corridor) dies in its
third iteration after two checkpoints; then the recorded latest checkpoint is damaged and a folder a crash
left half-copied is added. The resume plan names both, says it continues from the first checkpoint, and
Tune, resumed with R3L's rewound state, does exactly that and finishes.
"""

from __future__ import annotations

import glob
import json
import os
import shutil

import pytest

from rllib_r3l import R3L

pytestmark = pytest.mark.integration


class FlakyR3L(R3L):
    """R3L whose third iteration raises, unless it was restored from a checkpoint (a crash, once)."""

    def training_step(self):
        if self.iteration == 2 and not getattr(self, "_restored", False):
            raise RuntimeError("injected: the trial dies in its third iteration")
        return super().training_step()

    def restore_from_path(self, *args, **kwargs):
        self._restored = True
        return super().restore_from_path(*args, **kwargs)


def _iterations(trial_dir):
    with open(os.path.join(trial_dir, "result.json")) as f:
        return [json.loads(line)["training_iteration"] for line in f if line.strip()]


def test_resume_skips_incomplete_checkpoints_and_continues_from_the_newest_complete(ray_session, tmp_path):
    from ray import tune

    from rllib_r3l.cli import resume
    from rllib_r3l.cli.checkpoint_integrity import problem
    from tests.scripted_rllib import tiny_config

    cfg = tiny_config(sampling_seed=0, tasks_per_iteration=1)

    def experiment():
        return tune.Experiment("exp", FlakyR3L, config=cfg.to_dict(), stop={"training_iteration": 3},
                               storage_path=str(tmp_path), checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1))

    analysis = tune.run(experiment(), raise_on_failed_trial=False, verbose=0)
    (trial,) = analysis.trials
    assert trial.status == "ERROR"
    tdir = trial.path
    assert _iterations(tdir) == [1, 2]
    first, second = (os.path.join(tdir, f"checkpoint_00000{i}") for i in (0, 1))
    assert problem(first) is None and problem(second) is None  # Tune wrote both completely

    # damage: the recorded latest checkpoint loses half of its learner state; a later copy was cut short
    state = os.path.join(second, "learner_group", "learner", "state.pkl")
    with open(state, "r+b") as f:
        f.truncate(os.path.getsize(state) // 2)
    cut = os.path.join(tdir, "checkpoint_000002")
    shutil.copytree(first, cut)
    os.remove(os.path.join(cut, "algorithm_state.pkl"))

    exp_dir = str(tmp_path / "exp")
    plan = resume.plan_runs(["exp"], {"exp": str(tmp_path)}, resume=True, new=False)
    notes = resume.resume_notes(plan)
    name = os.path.basename(tdir)
    assert f"exp / {name}: skipping incomplete checkpoint_000001 (learner_group/learner/state.pkl: truncated " \
           "(no pickle end))" in notes, notes
    assert f"exp / {name}: skipping incomplete checkpoint_000002 (algorithm_state.pkl: missing)" in notes, notes
    assert notes[-1] == f"exp / {name}: resuming from {first} (iteration 1) (Tune's state pointed at an incomplete " \
                        "one: rewound)", notes
    assert resume.describe(exp_dir).endswith("last checkpoint checkpoint_000000")

    resume.rewind(exp_dir, plan["exp"]["choices"])
    assert glob.glob(os.path.join(exp_dir, ".r3l-before-rewind-experiment_state-*.json"))
    analysis = tune.run(experiment(), resume_config=resume.tune_resume_config(), raise_on_failed_trial=False,
                        verbose=0)
    (trial,) = analysis.trials
    assert trial.status == "TERMINATED", trial.error_file
    assert _iterations(tdir) == [1, 2, 2, 3]  # restored at iteration 1: iteration 2 ran again, then 3
    assert trial.checkpoint.path.endswith("checkpoint_000003") and problem(trial.checkpoint.path) is None
    assert problem(cut) is None  # Tune wrote its next checkpoint over the cut copy, completely


def test_an_experiment_whose_only_checkpoint_is_incomplete_cannot_be_resumed(tmp_path):
    """A hand-made experiment (no Ray): an incomplete folder is no checkpoint to resume from."""
    from rllib_r3l.cli import resume
    from rllib_r3l.errors import UsageError
    from tests.cli.test_resume import _saved_experiment

    exp = _saved_experiment(tmp_path, "exp", checkpoint=True)
    (exp / "R3L_x_00000" / "checkpoint_000000" / "algorithm_state.pkl").write_bytes(b"")
    with pytest.raises(UsageError, match=r"no checkpoint yet .*--new"):
        resume.plan_runs(["exp"], {"exp": str(tmp_path)}, resume=True, new=False)
    assert resume.describe(str(exp)) == "1 trial(s), last checkpoint (none)"
