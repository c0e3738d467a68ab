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
from tests.cli.tiny_runs import progress_iterations

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


def _new_ray_session():
    import ray

    from tests.conftest import RAY_SESSION_KWARGS

    ray.shutdown()
    ray.init(**RAY_SESSION_KWARGS)


def test_resume_skips_incomplete_checkpoints_and_continues_from_the_newest_complete(ray_session, tmp_path):
    from ray import tune

    from rllib_r3l.checkpoint_integrity import problem
    from rllib_r3l.cli import resume, resume_from
    from tests.scripted_rllib import tiny_config

    cfg = tiny_config(sampling_seed=0, tasks_per_iteration=1)

    def experiment():
        return tune.Experiment(
            "exp",
            FlakyR3L,
            config=cfg.to_dict(),
            stop={"training_iteration": 3},
            storage_path=str(tmp_path),
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1),
        )

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
    notes = resume_from.resume_notes(plan)
    name = os.path.basename(tdir)
    assert (
        f"exp / {name}: skipping incomplete checkpoint_000001 (learner_group/learner/state.pkl: truncated "
        "(no pickle end))" in notes
    ), notes
    assert f"exp / {name}: skipping incomplete checkpoint_000002 (algorithm_state.pkl: missing)" in notes, notes
    assert (
        notes[-2] == f"exp / {name}: resuming from {first} (iteration 1) (Tune's state pointed at an incomplete "
        "one: rewound)"
    ), notes
    assert (
        notes[-1] == f"exp / {name}: iteration(s) 2 ran after that checkpoint and run again; their first rows "
        "are set aside in result.json.r3l-redone and progress.csv.r3l-redone"
    ), notes
    assert resume.describe(exp_dir).endswith("last checkpoint checkpoint_000000")

    resume_from.point_tune_at(exp_dir, plan["exp"]["choices"])
    assert glob.glob(os.path.join(exp_dir, ".r3l-before-resume-experiment_state-*.json"))
    assert _iterations(tdir) == [1]  # iteration 2's row set aside: it runs again
    _new_ray_session()  # as `rllib-r3l train --resume` runs: a new driver (Tune would re-upload this one's staging)
    analysis = tune.run(experiment(), resume_config=resume.tune_resume_config(), raise_on_failed_trial=False, verbose=0)
    (trial,) = analysis.trials
    assert trial.status == "TERMINATED", trial.error_file
    assert _iterations(tdir) == [1, 2, 3]  # restored at iteration 1: iteration 2 ran again (once in the file), then 3
    assert progress_iterations(tdir) == [1, 2, 3]
    with open(os.path.join(tdir, "result.json.r3l-redone")) as f:
        assert [json.loads(line)["training_iteration"] for line in f] == [2]  # the first run of it, kept
    assert trial.checkpoint.path.endswith("checkpoint_000003") and problem(trial.checkpoint.path) is None
    assert problem(cut) is None  # Tune wrote its next checkpoint over the cut copy, completely


def test_an_experiment_whose_only_checkpoint_is_incomplete_cannot_be_resumed(tmp_path):
    """A hand-made experiment (no Ray): an incomplete folder is no checkpoint to resume from."""
    from rllib_r3l.cli import resume
    from rllib_r3l.errors import UsageError
    from tests.cli.fake_checkpoints import saved_experiment

    exp = saved_experiment(tmp_path, "exp", checkpoint=True)
    (exp / "R3L_x_00000" / "checkpoint_000000" / "algorithm_state.pkl").write_bytes(b"")
    with pytest.raises(UsageError, match=r"only incomplete checkpoint folders \(checkpoint_000000\).*--new"):
        resume.plan_runs(["exp"], {"exp": str(tmp_path)}, resume=True, new=False)
    assert resume.describe(str(exp)) == "1 trial(s), last checkpoint (none)"


def _drop_latest_record(exp_dir):
    """Tune's saved state as a driver killed right after writing its latest checkpoint folder leaves it:
    the folder is on disk, the state (saved before) does not list it. Edited with Ray's own decoders."""
    from ray.tune.trainable.metadata import _TrainingRunMetadata
    from ray.tune.utils.serialization import TuneFunctionEncoder, _loads_with_cloudpickle

    (state,) = glob.glob(os.path.join(exp_dir, "experiment_state-*.json"))
    with open(state) as f:
        raw = json.load(f)
    trial = _loads_with_cloudpickle(raw["trial_data"][0][0])
    trial["storage"].current_checkpoint_index = 0  # as saved before checkpoint_000001: the next save goes there
    raw["trial_data"][0][0] = json.dumps(trial, indent=2, cls=TuneFunctionEncoder)
    md = _TrainingRunMetadata.from_json_state(raw["trial_data"][0][1])
    cm = md.checkpoint_manager
    cm._checkpoint_results = cm._checkpoint_results[:-1]
    cm._latest_checkpoint_result = cm._checkpoint_results[-1]
    md.invalidate_cache()
    raw["trial_data"][0][1] = md.get_json_state()
    with open(state, "w") as f:
        json.dump(raw, f)


def test_resume_adopts_a_complete_checkpoint_tunes_state_missed(ray_session, tmp_path):
    """Re-probe (issue 37): after a double Ctrl-C or kill -9, Tune's state lagged its newest checkpoint,
    so ``--resume`` continued from an older one and the iterations after it appeared twice in
    result.json/progress.csv. Now the newest complete checkpoint is added to the state and used."""
    from ray import tune

    from rllib_r3l.cli import resume, resume_from
    from tests.scripted_rllib import tiny_config

    cfg = tiny_config(sampling_seed=0, tasks_per_iteration=1)

    def experiment():
        return tune.Experiment(
            "exp",
            FlakyR3L,
            config=cfg.to_dict(),
            stop={"training_iteration": 3},
            storage_path=str(tmp_path),
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1),
        )

    (trial,) = tune.run(experiment(), raise_on_failed_trial=False, verbose=0).trials
    tdir, exp_dir = trial.path, str(tmp_path / "exp")
    assert _iterations(tdir) == [1, 2]
    _drop_latest_record(exp_dir)
    second = os.path.join(tdir, "checkpoint_000001")

    plan = resume.plan_runs(["exp"], {"exp": str(tmp_path)}, resume=True, new=False)
    (choice,) = plan["exp"]["choices"]
    assert choice["from"] == second and choice["iteration"] == 2 and choice["adopt"] and not choice["redone"]
    assert resume_from.resume_notes(plan)[-1].endswith(
        f"resuming from {second} (iteration 2) (complete, but Tune's saved state does not list it: the run ended "
        "before Tune saved its state; added to it)"
    )
    resume_from.point_tune_at(exp_dir, plan["exp"]["choices"])
    (trial,) = tune.run(
        experiment(), resume_config=resume.tune_resume_config(), raise_on_failed_trial=False, verbose=0
    ).trials
    assert trial.status == "TERMINATED", trial.error_file
    assert _iterations(tdir) == [1, 2, 3] and progress_iterations(tdir) == [1, 2, 3]  # was [1, 2, 2, 3]
    # re-probe: Tune numbered the next checkpoint from its lagging state, wrote iteration 3 over the
    # adopted checkpoint_000001, and num_to_keep then deleted it as an old one
    from rllib_r3l.cli.export import checkpoint_iteration

    assert checkpoint_iteration(second) == 2
    assert trial.checkpoint.path.endswith("checkpoint_000002") and checkpoint_iteration(trial.checkpoint.path) == 3


def test_rows_after_the_checkpoint_are_set_aside_not_deleted(tmp_path):
    """Hand-made trial folder: rows of iterations 1-5, resumed at 3; a second resume at 2 adds to the
    set-aside files (one header), and the kept files stay readable by Tune's loggers (csv header kept)."""
    import csv

    from rllib_r3l.cli import result_rows

    rows = [{"training_iteration": i, "reward": i / 10} for i in range(1, 6)]
    (tmp_path / "result.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with open(tmp_path / "progress.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["reward", "training_iteration"])
        w.writeheader()
        w.writerows(rows)
    assert result_rows.set_aside_rows(str(tmp_path), 3) == {"result.json": 2, "progress.csv": 2}
    assert _iterations(tmp_path) == [1, 2, 3] and progress_iterations(tmp_path) == [1, 2, 3]
    assert result_rows.set_aside_rows(str(tmp_path), 2) == {"result.json": 1, "progress.csv": 1}
    assert _iterations(tmp_path) == [1, 2]
    with open(tmp_path / "result.json.r3l-redone") as f:
        assert [json.loads(line)["training_iteration"] for line in f] == [4, 5, 3]
    with open(tmp_path / "progress.csv.r3l-redone", newline="") as f:
        assert [(r["training_iteration"], r["reward"]) for r in csv.DictReader(f)] == [
            ("4", "0.4"),
            ("5", "0.5"),
            ("3", "0.3"),
        ]
    assert result_rows.set_aside_rows(str(tmp_path), 2) == {}  # nothing after 2 any more


def test_a_checkpoint_whose_row_the_disk_never_wrote_is_named_on_resume(ray_session, tmp_path):
    """Re-probe 4 leftover (issue 37): a full disk kept Tune from writing iteration 2's row, Ray's staging
    folder was gone, and no checkpoint reached back to the rows (a checkpoint every 2 iterations): the
    resume continued from iteration 2's checkpoint and the row was lost without a word. Now the resume
    says which iterations have no row and that their training is in the checkpoint."""
    from ray import tune

    from rllib_r3l.cli import resume, resume_from
    from tests.scripted_rllib import tiny_config

    cfg = tiny_config(sampling_seed=0, tasks_per_iteration=1)
    experiment = tune.Experiment(
        "exp",
        FlakyR3L,
        config=cfg.to_dict(),
        stop={"training_iteration": 3},
        storage_path=str(tmp_path),
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1),
    )
    (trial,) = tune.run(experiment, raise_on_failed_trial=False, verbose=0).trials
    tdir, exp_dir = trial.path, str(tmp_path / "exp")
    assert _iterations(tdir) == [1, 2]
    shutil.rmtree(os.path.join(tdir, "checkpoint_000000"))  # as with checkpoint_frequency 2: none at iteration 1
    with open(os.path.join(tdir, "result.json")) as f:
        first = f.readline()
    with open(os.path.join(tdir, "result.json"), "w") as f:  # the row of iteration 2 was never written
        f.write(first)
    staged = resume_from.staged_trial_dir(exp_dir, os.path.basename(tdir))
    if staged:  # Ray's staging folder gone (a cleaned /tmp, another node)
        os.remove(os.path.join(staged, "result.json"))
    plan = resume.plan_runs(["exp"], {"exp": str(tmp_path)}, resume=True, new=False)
    (choice,) = plan["exp"]["choices"]
    assert choice["iteration"] == 2 and choice["rowless"] == [2] and not choice["redone"]
    assert (
        f"exp / {os.path.basename(tdir)}: iteration(s) 2 have no row in result.json or progress.csv (the disk "
        "filled before they were written): their training is in the checkpoint, their metrics are lost"
        in resume_from.resume_notes(plan)
    )
    assert resume_from._span([1, 2, 3, 5, 7, 8]) == "1-3, 5, 7-8"
