"""Population-based training through Tune for real (issue 49): two tiny trials, an exploit after every
iteration. The trial that clones another's checkpoint trains at its OWN (perturbed) lr from its first
update on, and ``rllib-r3l report`` says which curve is spliced from a clone.

One experiment for the module (``pbt_experiment``): scripted episodes (``tests/scripted_rllib``) so
every iteration has a batch to train on; ``synch=True`` so both trials reach each perturbation
together and the lower one always exploits the upper one's checkpoint.
"""

from __future__ import annotations

import json
import math
import os

import pytest

pytestmark = pytest.mark.integration

ITERATIONS = 2  # an exploit after iteration 1, and one update after it (the stop criterion ends the trials at 2)
LRS = [1e-4, 3e-4]


@pytest.fixture(scope="module")
def pbt_experiment(ray_session, tmp_path_factory):
    """``(experiment folder, trials)`` of a finished 2-trial PBT run on the tiny model."""
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    from rllib_r3l import R3LConfig
    from tests.scripted_rllib import ScriptedEnvRunner

    cfg = (
        R3LConfig()
        .environment("r3l/ToyCorridor", env_config={"num_rooms": 3, "max_turns": 4})
        .training(
            model="tiny",
            backend="transformers",
            group_size=2,
            tasks_per_iteration=1,
            max_response_tokens=8,
            micro_batch_size=8,
            weight_decay=0.0,
            sampling_seed=0,
            num_threads=1,
        )
        .env_runners(env_runner_cls=ScriptedEnvRunner)
        .debugging(seed=0)
    ).to_dict()
    cfg["lr"] = tune.grid_search(LRS)
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=1,
        synch=True,
        hyperparam_mutations={"lr": tune.loguniform(1e-5, 1e-2)},
        resample_probability=0.0,
    )  # always x0.8 or x1.2: never the donor's own lr
    storage = tmp_path_factory.mktemp("pbt")
    analysis = tune.run(
        "R3L",
        name="pbt",
        config=cfg,
        scheduler=pbt,
        metric="env_runners/episode_return_mean",
        mode="max",
        stop={"training_iteration": ITERATIONS},
        storage_path=str(storage),
        verbose=0,
    )
    for trial in analysis.trials:
        assert trial.status == "TERMINATED", trial.error_file
    return os.path.join(str(storage), "pbt"), analysis.trials


def _rows(trial_dir: str):
    with open(os.path.join(trial_dir, "result.json")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _exploits(exp_dir: str):
    """Tune's record of every exploit: [target tag, clone tag, target iteration, clone iteration, ...]."""
    with open(os.path.join(exp_dir, "pbt_global.txt")) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_the_first_update_after_an_exploit_runs_at_the_trials_own_lr(pbt_experiment):
    from rllib_r3l.cli.console import learner_metric

    exp_dir, trials = pbt_experiment
    exploits = _exploits(exp_dir)
    assert exploits, "no exploit happened: the test checks nothing"
    checked = 0
    for target_tag, _clone_tag, _target_iter, _clone_iter, clone_config, new_config in exploits:
        # Tune tags a perturbed trial "<its first tag>@perturbed[...]"
        (trial,) = [t for t in trials if t.experiment_tag.split("@")[0] == target_tag]
        rows = _rows(trial.local_path)
        # the first row at the new config (the file's iterations are the trials' last results when
        # Tune wrote it, one of them stale under synch=True: the rows say where the clone continued)
        i = next(i for i, r in enumerate(rows) if r["config"]["lr"] == new_config["lr"])
        assert i > 0 and new_config["lr"] != clone_config["lr"]
        # the lr the optimizer step of the first iteration after the exploit ran at: the trial's own
        # (perturbed) one, the row's config; before the fix the donor's (clone_config's)
        assert learner_metric(rows[i], "step_lr") == pytest.approx(new_config["lr"], rel=1e-9), (
            new_config["lr"],
            clone_config["lr"],
        )
        checked += 1
    assert checked >= 1
    for trial in trials:  # and every other update at its row's own lr too
        for row in _rows(trial.local_path):
            step_lr = learner_metric(row, "step_lr")
            assert math.isnan(step_lr) or step_lr == pytest.approx(row["config"]["lr"], rel=1e-9)


def test_report_says_which_curve_is_spliced_from_a_clone(pbt_experiment, tmp_path, capsys):
    import pandas as pd

    from rllib_r3l.cli import commands as cli

    exp_dir, trials = pbt_experiment
    (target_tag, clone_tag, *_rest), *_more = _exploits(exp_dir)
    (target,) = [t for t in trials if t.experiment_tag.split("@")[0] == target_tag]
    (source,) = [t for t in trials if t.experiment_tag.split("@")[0] == clone_tag]
    assert cli.main(["report", exp_dir, "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "spliced from a PBT clone" in line]
    # the exploit came after iteration 1 (synch=True: both trials there); the table's trial names end in the id
    assert len(notes) == 1 and f"{target.trial_id}'s curve is spliced" in notes[0], out
    assert f"from iteration 2 on it continues R3L_r3l_ToyCorridor_{source.trial_id}'s run" in notes[0], notes
    assert "checkpoint of iteration 1" in notes[0] and "perturbed lr" in notes[0], notes
    table = pd.read_csv(tmp_path / "report" / "summary.csv")
    spliced = dict(zip(table["trial"], table["spliced_from"]))
    assert spliced[f"R3L_r3l_ToyCorridor_{target.trial_id}"] == f"R3L_r3l_ToyCorridor_{source.trial_id}@2"
    assert pd.isna(spliced[f"R3L_r3l_ToyCorridor_{source.trial_id}"])  # never exploited: its own run throughout
