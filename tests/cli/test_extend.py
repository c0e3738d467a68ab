"""Training a finished run further (issue 49, item 6): ``rllib-r3l train FILE --resume --stop
training_iteration=4`` of a run that finished at iteration 2 continues the same trial from its last
checkpoint: rows 3 and 4 follow 2 in result.json/progress.csv, the learner's lifetime counters go on,
Tune's saved state records the new stop (a later --resume and report read it). Before, --resume of a
finished run said there was nothing to continue and refused --stop, and the advised --new started
again from the base model without saying so. A new stop the run already reached is refused, naming
the value reached. Tiny model, toy corridor, CPU."""

from __future__ import annotations

import math
import os
import shlex

import pytest

from rllib_r3l.cli import commands as cli
from tests.cli.tiny_runs import (
    EXPERIMENT,
    SMALL,
    TOY,
    cli_process,
    finished,
    iterations,
    progress_iterations,
    rows,
    trial_dirs,
)

pytestmark = pytest.mark.integration

NEW_SAID = "--new (a fresh run of the file from its base model at iteration 1, as toy-corridor-tiny-no-reflect_"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A run of the toy file that reached its stop, training_iteration 2: ``(the command that started it
    without its --stop, the same without --set: a resume's, exp dir, trial dir)``."""
    storage = tmp_path_factory.mktemp("extend")
    argv = ["train", TOY, *SMALL, "--storage-path", str(storage)]
    proc = cli_process([*argv, "--stop", "training_iteration=2"])
    out, err = proc.communicate(timeout=900)
    assert finished(proc, err), out[-2000:] + err[-3000:]
    exp = storage / EXPERIMENT
    (trial,) = trial_dirs(exp)
    assert iterations(trial) == [1, 2]
    from rllib_r3l.cli.resume import resume_command

    return argv, shlex.split(resume_command(argv))[1:-1], exp, trial


def test_a_stop_the_finished_run_already_reached_is_refused_naming_the_value(finished_run, capsys):
    argv, resume, exp, trial = finished_run
    reached = iterations(trial)[-1]  # 2 (4 where the extension test ran first)
    before = iterations(trial)
    for stop in (reached, 1):
        code = cli.main([*resume, "--resume", "--stop", f"training_iteration={stop}", "--dry-run"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert (
            f"--stop training_iteration={stop}: trial {os.path.basename(trial)} of experiment {EXPERIMENT!r} "
            f"already reached training_iteration {reached} (its last result), so it would stop after one more "
            f"iteration; give a value above {reached}"
        ) in err, err
    # the advice without a stop names the way on, and what --new really does
    for again in (argv, [*resume, "--resume"]):
        code = cli.main([*again, "--dry-run"])
        err = capsys.readouterr().err
        assert code == 2 and "finished (reached its stop criterion)" in err, err
        assert (
            f"to train it further from its last checkpoint, give a higher stop: --resume --stop "
            f"training_iteration=N (N above {reached}, the iteration it reached)"
        ) in err, err
        assert NEW_SAID in err and "beside this one, which stays as it is)" in err, err
    assert iterations(trial) == before and len(trial_dirs(exp)) == 1  # nothing ran


def test_a_finished_run_trains_on_from_its_last_checkpoint_to_a_new_stop(finished_run, capsys):
    _argv, resume, exp, trial = finished_run
    if iterations(trial) != [1, 2]:
        pytest.skip("the finished run was extended already (this test ran before in this session)")
    extend = [*resume, "--resume", "--stop", "training_iteration=4"]
    assert cli.main([*extend, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"{os.path.basename(trial)}: resuming from {trial}/checkpoint_000000 (iteration 2)" in out, out
    assert "training on until its new stop {'training_iteration': 4}" in out, out
    proc = cli_process(extend)
    out, err = proc.communicate(timeout=900)
    assert finished(proc, err), out[-2000:] + err[-3000:]
    assert trial_dirs(exp) == [trial]  # the same trial went on: no second one beside it
    assert iterations(trial) == [1, 2, 3, 4] and progress_iterations(trial) == [1, 2, 3, 4]
    r = rows(trial)
    assert [x["done"] for x in r] == [False, True, False, True]
    assert r[2]["time_total_s"] > r[1]["time_total_s"]  # Tune restored the trainable, clock included
    # the learner state came from the checkpoint: iteration 3's lifetime count of trained steps adds to
    # iteration 2's (a run from the base model counts from 0 again)
    learner = [x.get("learners", {}).get("__all_modules__", {}) for x in r]
    life = [x.get("num_env_steps_trained_lifetime", 0) for x in learner]
    this = learner[2].get("num_env_steps_trained")
    assert life[2] == life[1] + (this if isinstance(this, (int, float)) and not math.isnan(this) else 0), life
    from rllib_r3l.cli.export import checkpoint_iteration, find_checkpoint

    assert checkpoint_iteration(find_checkpoint(str(exp))) == 4  # evaluate EXPERIMENT_DIR: the newest weights
    # Tune's saved state holds the new stop and the finished trial: a later --resume reads them
    from rllib_r3l.cli.resume_from import all_finished, saved_stops

    assert saved_stops(str(exp)) == {os.path.basename(trial): {"training_iteration": 4}}
    assert all_finished(str(exp))
    assert cli.main([*resume, "--resume", "--dry-run"]) == 2
    assert "(N above 4, the iteration it reached)" in capsys.readouterr().err
    # report: one trial, one curve of 4 iterations
    assert cli.main(["report", str(exp)]) == 0
    capsys.readouterr()
    import pandas as pd

    table = pd.read_csv(exp / "report" / "summary.csv")
    assert list(table["iterations"]) == [4] and list(table["status"]) == ["TERMINATED"]


def test_a_reflecting_run_s_retry_ledger_goes_on_across_resumes(tmp_path):
    """``retries.jsonl`` lives in the trial's folder and in each checkpoint: every extension used to replace it
    with the resumed run's rows only (the earlier iterations' reflections were lost)."""
    from rllib_r3l import retry_ledger
    from rllib_r3l.cli.resume import resume_command

    argv = [
        "train",
        TOY,
        *[a if a != EXPERIMENT else "toy-corridor-tiny-r3l" for a in SMALL],
        "--set",
        "sampling_seed=0",
        "--storage-path",
        str(tmp_path),
    ]
    resumed = shlex.split(resume_command(argv))[1:-1]  # a resume keeps the saved --set
    ledgers = []
    for n, again in ((1, argv), (2, [*resumed, "--resume"])):
        proc = cli_process([*again, "--stop", f"training_iteration={n}"])
        out, err = proc.communicate(timeout=900)
        assert finished(proc, err), out[-2000:] + err[-3000:]
        (trial,) = trial_dirs(tmp_path / "toy-corridor-tiny-r3l")
        assert iterations(trial) == list(range(1, n + 1)) and progress_iterations(trial) == list(range(1, n + 1))
        ledgers.append(retry_ledger.read(os.path.join(trial, retry_ledger.LEDGER_FILE)))
    assert ledgers[0], "the seeded first iteration reflects on a failure"
    for earlier, later in zip(ledgers, ledgers[1:]):
        assert later[: len(earlier)] == earlier  # every earlier row kept, in order
    assert {r["iteration"] for r in ledgers[-1]} <= {1, 2}
