"""Ray-level checks of issue 15: an interrupted ``rllib-r3l train`` exits non-zero and resumes from the
command line with the iteration counter continuing; an iteration that loses every episode to
environment creation raises with the environment's message. Tiny model, toy corridor, CPU.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import signal
import subprocess
import time

import pytest

from rllib_r3l.cli import commands as cli
from tests import REPO_ROOT
from tests.cli.fake_checkpoints import saved_experiment
from tests.cli.tiny_runs import cli_process, progress_iterations

ROOT = str(REPO_ROOT)
TOY = os.path.join(ROOT, "tuned_examples", "cpu", "toy_corridor_tiny.yaml")
SMALL = [
    "--experiment",
    "toy-corridor-tiny-no-reflect",
    "--set",
    "tasks_per_iteration=1",
    "--set",
    "env_config={num_rooms: 3, max_turns: 3}",
    "--num-cpus",
    "4",
    "--quiet-workers",
    "--verbose",
    "0",
]


class BrokenEnv:
    """An environment whose constructor always fails (a JVM that does not start)."""

    def __init__(self, split: str = "train") -> None:
        raise OSError("JVM did not start")


@pytest.mark.integration
@pytest.mark.subprocess
def test_iteration_losing_every_episode_to_env_creation_raises_with_the_env_message(monkeypatch):
    import ray

    from rllib_r3l import R3LConfig, preflight

    monkeypatch.setattr(preflight, "check_env", lambda *a, **k: None)  # the build-time check would catch it first
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        algo = (
            R3LConfig()
            .environment("tests.cli.test_resume:BrokenEnv")
            .training(
                model="tiny",
                backend="transformers",
                group_size=4,
                tasks_per_iteration=1,
                max_response_tokens=8,
                max_context_tokens=2048,
                reflect=False,
            )
        ).build_algo()
        try:
            with pytest.raises(Exception, match="environment could not be created: OSError: JVM did not start"):
                algo.train()
        finally:
            algo.stop()
    finally:
        ray.shutdown()


def finished(proc, err: str) -> bool:
    """The run ended at its stop criterion: exit 0, or 1 for a trial that never updated the policy (the
    tiny random policy on one task group of 4 can score alike for a few iterations: a matter of learning,
    not of the resume these tests check)."""
    return proc.returncode == 0 or (proc.returncode == 1 and "trained on nothing" in err)


def _iterations(trial_dir):
    with open(os.path.join(trial_dir, "result.json")) as f:
        return [json.loads(line)["training_iteration"] for line in f if line.strip()]


def _interrupted_after(tmp_path, checkpoint):
    """A 4-iteration run of the toy file stopped by Ctrl-C once ``checkpoint`` is written: exit 130."""
    argv = [
        "train",
        TOY,
        *SMALL,
        "--stop",
        "training_iteration=4",
        "--checkpoint-freq",
        "1",
        "--storage-path",
        str(tmp_path),
    ]
    exp = tmp_path / "toy-corridor-tiny-no-reflect"
    proc = cli_process(argv)
    # poll often: on a fast CPU the tiny run's remaining iterations take about a second
    while proc.poll() is None and not glob.glob(str(exp / "*" / checkpoint / "rllib_checkpoint.json")):
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted:\n" + proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    out, err = proc.communicate()
    assert proc.returncode == 130, out[-2000:] + err[-3000:]
    return argv, exp, out, err


@pytest.mark.subprocess
def test_interrupted_run_exits_nonzero_and_resumes_from_the_command_line(tmp_path, capsys):
    argv, exp, out, err = _interrupted_after(tmp_path, "checkpoint_000000")
    assert "INTERRUPTED" in out and "--resume" in err
    (trial,) = [d for d in glob.glob(str(exp / "*")) if os.path.isdir(d)]
    assert max(_iterations(trial)) < 4

    # the same command again: no silent second trial
    code = cli.main(argv + ["--dry-run"])
    assert code == 2 and "--resume" in capsys.readouterr().err

    from rllib_r3l.cli.resume import resume_command

    resume_argv = shlex.split(resume_command(argv))[1:]  # the printed command: --set/--stop left out
    assert "--resume" in resume_argv and "--set" not in resume_argv
    # re-probe 9: another --checkpoint-freq than the saved one was dropped without a word; the same passes
    assert cli.main(resume_argv + ["--checkpoint-freq", "3", "--dry-run"]) == 2
    assert "keeps the checkpoint frequency it started with (1)" in capsys.readouterr().err
    assert cli.main(resume_argv + ["--checkpoint-freq", "1", "--dry-run"]) == 0
    proc = cli_process(resume_argv)
    out, err = proc.communicate()
    assert finished(proc, err), out[-2000:] + err[-3000:]
    assert [d for d in glob.glob(str(exp / "*")) if os.path.isdir(d)] == [trial]  # the same trial continued
    its = _iterations(trial)
    assert its[-1] == 4 and its.count(1) == 1, its  # the counter continued from the checkpoint
    assert f"tensorboard --logdir {exp}" in out
    from rllib_r3l.cli.export import find_checkpoint

    assert find_checkpoint(str(exp)).endswith("checkpoint_000003")  # evaluate EXPERIMENT_DIR: one trial


@pytest.mark.subprocess
def test_a_driver_killed_after_its_first_checkpoint_resumes_with_every_row_once(tmp_path, capsys):
    """Re-probe (issue 37): ``kill -9`` of ``rllib-r3l train`` right after its first checkpoint folder was
    written left the storage folder with that checkpoint and nothing else (Tune copies params and rows
    there now and then), ``report`` called its trial RUNNING, and ``--resume`` said "no checkpoint yet".
    Now ``report`` says INTERRUPTED, and the resume continues from that checkpoint,
    the killed driver's rows come back from its staging folder, and every iteration has one row. The
    moment of the kill varies with the machine; the outcome asserted holds at every moment."""
    argv = [
        "train",
        TOY,
        *[a for a in SMALL if not a.startswith(("--set", "tasks_", "env_config"))],
        "--checkpoint-freq",
        "1",
        "--storage-path",
        str(tmp_path),
    ]
    exp = tmp_path / "toy-corridor-tiny-no-reflect"
    from rllib_r3l.checkpoint_integrity import is_complete

    proc = cli_process([*argv, *SMALL[2:6], "--stop", "training_iteration=5"])
    while proc.poll() is None and not any(is_complete(c) for c in glob.glob(str(exp / "*" / "checkpoint_000000"))):
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed:\n" + proc.communicate()[1][-3000:]
    proc.kill()  # SIGKILL: no handler, no state saved, no rows copied
    proc.communicate()
    assert cli.main(["report", str(exp)]) == 0  # Tune's state says RUNNING; its driver is gone
    assert "INTERRUPTED" in capsys.readouterr().out
    proc = cli_process([*argv, "--resume"])
    out, err = proc.communicate()
    assert finished(proc, err), out[-2000:] + err[-3000:]
    assert "resuming from" in out + err, out[-2000:] + err[-3000:]
    (trial,) = [d for d in glob.glob(str(exp / "R3L_*")) if os.path.isdir(d)]  # (report/ is the report's)
    assert _iterations(trial) == [1, 2, 3, 4, 5] and progress_iterations(trial) == [1, 2, 3, 4, 5]
    # the file keeps 2 checkpoints: the last two iterations', each in its own folder (the re-probe saw the
    # resumed trial write over existing folders, then delete them, and finish with none)
    from rllib_r3l.checkpoint_integrity import newest_complete
    from rllib_r3l.cli.export import checkpoint_iteration

    kept = sorted(glob.glob(os.path.join(trial, "checkpoint_*")))
    assert [checkpoint_iteration(c) for c in kept] == [4, 5], kept
    assert newest_complete(kept)[0] == kept[-1] and kept[-1] in out


@pytest.mark.subprocess
def test_a_driver_killed_before_its_first_checkpoint_keeps_its_rows_and_advises_only_new(tmp_path, capsys):
    """Re-probe 2 (M-2, M-3): ``kill -9`` after iteration 1, before any checkpoint: the only row was in Ray's
    staging folder (/tmp/ray/session_*/...), yet ``--resume`` said "the rows so far stay in <experiment>"
    (an empty trial folder there), and the same command without flags advised ``--resume``, which is refused.
    Now both refusals first copy the staged rows into the experiment, and the plain one advises only --new."""
    import ray._common.utils as ray_utils

    argv = [
        "train",
        TOY,
        *SMALL,
        "--checkpoint-freq",
        "100000",
        "--stop",
        "training_iteration=500",
        "--storage-path",
        str(tmp_path),
    ]
    exp = tmp_path / "toy-corridor-tiny-no-reflect"
    proc = cli_process(argv)
    staged = os.path.join(
        ray_utils.get_default_ray_temp_dir(),
        "session_*",
        "artifacts",
        "*",
        exp.name,
        "driver_artifacts",
        "*",
        "result.json",
    )
    before = set(glob.glob(staged))
    deadline = time.time() + 300
    while (
        proc.poll() is None
        and time.time() < deadline
        and not (
            any(os.path.getsize(f) > 0 for f in set(glob.glob(staged)) - before)
            and (glob.glob(str(exp / "R3L_*" / "params.json")) or glob.glob(str(exp / "experiment_state-*.json")))
        )
    ):
        time.sleep(0.05)  # a row staged, and the experiment in the storage (a loaded machine copies it later)
    assert proc.poll() is None, "the run ended before it could be killed:\n" + proc.communicate()[1][-3000:]
    proc.kill()
    proc.communicate()
    assert not glob.glob(str(exp / "*" / "checkpoint_*"))
    code = cli.main(["train", TOY, *SMALL[:2], "--storage-path", str(tmp_path), "--resume", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "nothing to continue" in err and f"the rows so far stay in {exp}" in err, err
    (trial,) = [d for d in glob.glob(str(exp / "R3L_*")) if os.path.isdir(d)]
    # the row is in the experiment now, as the message says: copied from the staging folder (the message
    # then says so) unless Tune had copied it there before the kill
    assert _iterations(trial)[0] == 1, err
    code = cli.main([*argv, "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "has no checkpoint to continue from; pass --new" in err and "--resume" not in err, err


@pytest.mark.subprocess
def test_a_cut_tune_state_is_resumed_from_r3ls_copy_with_every_row(tmp_path, capsys):
    """Re-probe 3 (S1, D1): a full disk cut Tune's experiment_state-*.json (8192 bytes) and the trial's
    result.json; the advised --resume then started a NEW trial from iteration 1 with the file's own stop
    and settings, exit 0, and the cut trial's rows stayed in Ray's staging folder. Now R3L keeps a copy
    of the last whole state; --resume puts it back and the trial continues with every row once. Without
    a copy, --resume refuses in one line."""
    _argv, exp, _out, _err = _interrupted_after(tmp_path, "checkpoint_000001")
    (trial,) = [d for d in glob.glob(str(exp / "R3L_*")) if os.path.isdir(d)]
    (state,) = glob.glob(str(exp / "experiment_state-*.json"))
    assert glob.glob(str(exp / ".r3l-backup-experiment_state-*.json"))
    # what the full disk left: the state cut mid-file, the trial's rows gone from the storage folder
    with open(state, "r+b") as f:
        f.truncate(os.path.getsize(state) // 2)
    for name in ("result.json", "progress.csv"):
        open(os.path.join(trial, name), "w").close()
    resume_argv = [
        "train",
        TOY,
        *SMALL[:2],
        "--num-cpus",
        "4",
        "--quiet-workers",
        "--verbose",
        "0",
        "--storage-path",
        str(tmp_path),
        "--resume",
    ]
    proc = cli_process(resume_argv)
    out, err = proc.communicate()
    assert finished(proc, err), out[-2000:] + err[-3000:]
    assert "resuming from R3L's copy of the last whole one" in out + err, out[-3000:]
    assert [d for d in glob.glob(str(exp / "R3L_*")) if os.path.isdir(d)] == [trial]  # no new trial
    assert _iterations(trial) == [1, 2, 3, 4], _iterations(trial)
    # re-probe 4 (SW-1): the resumed rows carried more keys than progress.csv's header and every value
    # after the first new key sat under the wrong name; the file is rebuilt from result.json
    import csv

    with open(os.path.join(trial, "progress.csv"), newline="") as f:
        table = list(csv.reader(f))
    assert all(len(r) == len(table[0]) for r in table[1:]), [len(r) for r in table]
    with open(os.path.join(trial, "result.json")) as f:
        want = [str(json.loads(line)["env_runners"]["success_rate"]) for line in f if line.strip()]
    col = table[0].index("env_runners/success_rate")
    assert [r[col] for r in table[1:]] == want
    # no copy left: a cut state is refused, naming the checkpoint to use
    state = max(glob.glob(str(exp / "experiment_state-*.json")))  # Tune reads the newest name
    with open(state, "r+b") as f:
        f.truncate(10)
    for copy in glob.glob(str(exp / ".r3l-backup-*")):
        os.remove(copy)
    code = cli.main([*resume_argv, "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "is cut short" in err and "no whole copy" in err and "checkpoint_00000" in err, err


# ==================================================================================================
# Resume traps (issue 37, item 5): no resume without a checkpoint, no flags that resume would ignore
# ==================================================================================================
def test_resume_without_a_checkpoint_is_refused_and_points_to_new(tmp_path):
    from rllib_r3l.cli import resume
    from rllib_r3l.errors import UsageError

    exp = saved_experiment(tmp_path, "exp", checkpoint=False)
    # before: planned as a resume, which restarted at iteration 1 over result.json/progress.csv
    with pytest.raises(UsageError, match=r"--resume: experiment 'exp' .* has no checkpoint.*--new"):
        resume.plan_runs(["exp"], {"exp": str(tmp_path)}, resume=True, new=False)
    assert resume.plan_runs(["exp"], {"exp": str(tmp_path)}, resume=False, new=True)["exp"]["mode"] == "start"
    saved_experiment(tmp_path, "done", checkpoint=True)
    assert resume.plan_runs(["done"], {"done": str(tmp_path)}, resume=True, new=False)["done"]["mode"] == "resume"
    assert (exp / "R3L_x_00000" / "result.json").read_text() == '{"training_iteration": 1}\n'


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_driver_killed_before_tune_saved_its_state_is_not_taken_for_a_new_experiment(tmp_path, checkpoint):
    """The suite under load (session 27): ``kill -9`` after iteration 1 but before Tune's first state save
    left trial folders without experiment_state; --resume said "nothing to resume ... run without --resume",
    and the plain rerun started over in the same folder. Both now treat it as the experiment it is."""
    from rllib_r3l.cli import resume
    from rllib_r3l.errors import UsageError

    exp = saved_experiment(tmp_path, "exp", checkpoint=checkpoint)
    (exp / "experiment_state-2026.json").unlink()
    why = "Tune saved no state of it" if checkpoint else "no checkpoint yet"
    with pytest.raises(UsageError, match=rf"--resume: experiment 'exp' in {exp}.*{why}.*--new"):
        resume.plan_runs(["exp"], {"exp": str(tmp_path)}, resume=True, new=False)
    why = "Tune saved no state of it to resume" if checkpoint else "has no checkpoint to continue from"
    with pytest.raises(UsageError, match=rf"experiment 'exp' already exists in {exp} .*{why}; pass --new"):
        resume.plan_runs(["exp"], {"exp": str(tmp_path)}, resume=False, new=False)
    assert resume.plan_runs(["exp"], {"exp": str(tmp_path)}, resume=False, new=True)["exp"]["mode"] == "start"
    assert (exp / "R3L_x_00000" / "result.json").read_text() == '{"training_iteration": 1}\n'


@pytest.mark.parametrize("flags", [["--set", "lr=0.5"], ["--set=lr=0.5"]])
def test_resume_refuses_set_it_would_ignore(tmp_path, capsys, flags):  # --stop is a new stop: tests/cli/test_extend.py
    saved_experiment(tmp_path, "toy-corridor-tiny-r3l", checkpoint=True)
    code = cli.main(
        [
            "train",
            TOY,
            "--experiment",
            "toy-corridor-tiny-r3l",
            "--storage-path",
            str(tmp_path),
            "--resume",
            "--dry-run",
            *flags,
        ]
    )
    err = capsys.readouterr().err
    flag = flags[0].split("=")[0]
    assert code == 2 and f"--resume with {flag}" in err and "--new" in err, err


def test_resume_command_drops_set_and_stop():
    from rllib_r3l.cli import resume

    argv = [
        "train",
        "f.yaml",
        "--set",
        "lr=0.5",
        "--stop=training_iteration=9",
        "--new",
        "--storage-path",
        "s",
        "--stop",
        "time_total_s=5",
        "--set=model=tiny",
        "--checkpoint-freq",
        "2",
    ]
    assert resume.resume_command(argv) == "rllib-r3l train f.yaml --storage-path s --resume"
    assert (
        resume.new_command(["train", "f.yaml", "--resume", "--set", "lr=1"])
        == "rllib-r3l train f.yaml --set lr=1 --new"
    )
    # the --stop of a resume is its new stop (issue 49): a run cut short before Tune saved it needs it again
    assert (
        resume.resume_command(["train", "f.yaml", "--resume", "--stop", "training_iteration=20"])
        == "rllib-r3l train f.yaml --resume --stop training_iteration=20"
    )


def test_resume_refuses_when_one_trial_of_several_would_restart_over_its_rows(tmp_path):
    from rllib_r3l.cli import resume
    from rllib_r3l.errors import UsageError

    exp = saved_experiment(tmp_path, "grid", checkpoint=True)
    other = exp / "R3L_x_00001"  # a second grid-search trial, stopped before its first checkpoint
    other.mkdir()
    (other / "params.json").write_text("{}")
    (other / "result.json").write_text('{"training_iteration": 1, "done": false}\n')
    with pytest.raises(UsageError, match=r"trial R3L_x_00001 .* no checkpoint.*--new"):
        resume.plan_runs(["grid"], {"grid": str(tmp_path)}, resume=True, new=False)
    (other / "result.json").write_text('{"training_iteration": 1, "done": true}\n')  # finished: Tune skips it
    assert resume.plan_runs(["grid"], {"grid": str(tmp_path)}, resume=True, new=False)["grid"]["mode"] == "resume"


def test_interrupted_advice_gives_each_experiment_of_a_file_its_own_command(tmp_path):
    """Re-probe 5 (P112): Ctrl-C in a file's second experiment before its first checkpoint advised
    --resume, which was then refused for it, and --new would have run the finished first one again."""
    from rllib_r3l.cli import resume

    done = saved_experiment(tmp_path, "a", checkpoint=True)
    (done / "R3L_x_00000" / "result.json").write_text('{"training_iteration": 1, "done": true}\n')
    cut = saved_experiment(tmp_path, "b", checkpoint=False)
    plan = {n: {"mode": "start", "name": n, "dir": str(tmp_path / n)} for n in ("a", "b", "c")}
    argv = ["train", "f.yaml", "--storage-path", str(tmp_path), "--set", "lr=0.1"]
    advice = resume.interrupted_advice(argv, plan)
    assert advice == (
        "to go on, one command per experiment: "
        f"b (new: from the base model at iteration 1, beside the old run): rllib-r3l train f.yaml --storage-path "
        f"{tmp_path} --set lr=0.1 --experiment b --new; "
        f"c (start): rllib-r3l train f.yaml --storage-path {tmp_path} --set lr=0.1 --experiment c"
    ), advice
    assert cut.is_dir()
    # one experiment, or every unfinished one needing the same: the one command, as before
    one = resume.interrupted_advice(argv, {"b": plan["b"]})
    assert one.startswith("no checkpoint was saved yet") and one.endswith("--set lr=0.1 --new"), one


def test_a_signal_that_stopped_ray_promises_rows_back_only_where_a_resume_can_run(tmp_path):
    """Re-probe 11: SIGTERM to the process group before the first checkpoint printed "rows ... come back with
    --resume", then "no checkpoint was saved yet, so it cannot be resumed"."""
    from rllib_r3l.cli import resume

    argv = ["train", "f.yaml", "--storage-path", str(tmp_path)]
    saved_experiment(tmp_path, "b", checkpoint=False)
    plan = {"b": {"mode": "start", "name": "b", "dir": str(tmp_path / "b")}}
    line = resume.runtime_lost_line(resume.interrupted_advice(argv, plan))
    assert "come back with --resume" not in line and "cannot be resumed" in line, line
    saved_experiment(tmp_path, "a", checkpoint=True)
    plan = {"a": {"mode": "start", "name": "a", "dir": str(tmp_path / "a")}}
    line = resume.runtime_lost_line(resume.interrupted_advice(argv, plan))
    assert "(rows not yet copied to the experiment come back with --resume); to continue from the last" in line, line


def test_a_cut_search_state_is_restored_from_r3ls_copy_or_refused(tmp_path):
    """Re-probe 6 soak (anomaly C): a full disk cut Tune's basic-variant-state-*.json (a pickle); --resume
    printed Tune's UnpicklingError, "Restarting experiment", and ran a NEW trial with the file's own stop
    and settings beside the old one, exit 0. R3L keeps a copy of the last whole one; without a copy the
    resume is refused."""
    import pickle

    from rllib_r3l.cli import resume, state_backup
    from rllib_r3l.errors import UsageError

    exp = saved_experiment(tmp_path, "exp", checkpoint=True)
    search = exp / "basic-variant-state-2026-12-05_19-18-11.json"
    whole = pickle.dumps({"_total_samples": 1, "_finished": True})
    search.write_bytes(whole)
    state_backup.save(str(exp))  # the search state's copy too
    assert (exp / (state_backup.SEARCH_PREFIX + search.name)).read_bytes() == whole
    search.write_bytes(whole[: len(whole) // 2])  # the full disk's cut
    plan = resume.plan_runs(["exp"], {"exp": str(tmp_path)}, resume=True, new=False)
    assert plan["exp"]["mode"] == "resume" and "search state" in plan["exp"]["restored"]
    assert search.read_bytes() == whole
    (exp / (state_backup.SEARCH_PREFIX + search.name)).unlink()
    search.write_bytes(whole[:5])
    with pytest.raises(UsageError, match=rf"Tune's saved state {search.name} is cut short .* no whole copy"):
        resume.plan_runs(["exp"], {"exp": str(tmp_path)}, resume=True, new=False)


@pytest.mark.subprocess
def test_putting_the_state_back_on_a_full_disk_changes_nothing_and_a_later_resume_still_can(tmpfs):
    """Re-probe 7 (D1, issue 37): --resume while the disk was still full set Tune's cut state aside, then
    failed to write R3L's copy in its place (an empty .r3l-tmp); the next --resume, with room again, found
    no state and called the experiment one Tune never saved: not resumable. Now the copy is written
    first: on a full disk the resume is refused in one line and nothing changes; a state that is gone
    while R3L's copy is there is put back."""
    from rllib_r3l.cli import state_backup
    from rllib_r3l.errors import UsageError

    disk = tmpfs("small", "size=256k")
    exp = disk / "exp"
    exp.mkdir()
    state = exp / "experiment_state-2026-12-05_21-00-00.json"
    whole = json.dumps({"trial_data": [["x" * 2000, "y"]], "runner_data": {}})
    state.write_text(whole)
    state_backup.save(str(exp))
    state.write_text(whole[:1000])  # cut by the full disk
    filler = disk / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=4k"], capture_output=True)  # until ENOSPC
    before = sorted(os.listdir(exp))
    with pytest.raises(
        UsageError,
        match=r"--resume: experiment_state-2026-12-05_21-00-00.json in .* must be put back "
        r"from R3L's copy .*cannot be written \(No space left on device\); free "
        r"space there and run the same --resume again \(nothing was changed\)",
    ):
        state_backup.restore(str(exp))
    assert sorted(os.listdir(exp)) == before and state.read_text() == whole[:1000]
    os.remove(filler)
    assert "resuming from R3L's copy of the last whole one" in state_backup.restore(str(exp))
    assert state.read_text() == whole and (exp / (state.name + state_backup.DAMAGED)).read_text() == whole[:1000]
    # what the earlier code left: the state set aside, nothing in its place: R3L's copy goes back
    os.remove(state)
    assert state_backup.restore(str(exp)) == (
        f"Tune's saved state was missing; resuming from R3L's copy of the last whole one ({state.name})"
    )
    assert state.read_text() == whole
