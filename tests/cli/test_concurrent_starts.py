"""Two ``rllib-r3l train`` started together into one storage path: the second is refused before Ray starts
(exit 2, naming the first one's process), never merged into the first's experiment. The claim is an
``flock`` beside the experiment folder (``driver_mark.claims``), taken before the run is planned and
released when the driver ends, however it ends."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from rllib_r3l.cli import commands as cli
from rllib_r3l.cli import driver_mark
from tests import REPO_ROOT

ROOT = str(REPO_ROOT)
TOY = os.path.join(ROOT, "tuned_examples", "cpu", "toy_corridor_tiny.yaml")
EXP = "toy-corridor-tiny-no-reflect"
SMALL = [
    "--experiment",
    EXP,
    "--set",
    "tasks_per_iteration=1",
    "--set",
    "env_config={num_rooms: 3, max_turns: 3}",
    "--num-cpus",
    "4",
    "--quiet-workers",
    "--verbose",
    "0",
    "--stop",
    "training_iteration=1",
]
ENV = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_CHDIR_TO_TRIAL_DIR="0", VLLM_ENABLE_V1_MULTIPROCESSING="0")
HOLD = (
    "import sys, time\nfrom rllib_r3l.cli import driver_mark\nwith driver_mark.claims() as claim:\n"
    "    claim(sys.argv[1], 'x')\n    print('held', flush=True)\n    time.sleep(600)\n"
)


def _holder(exp_dir):
    """A process of its own that holds the claim on ``exp_dir`` (as a running driver does)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, exp_dir],
        cwd=ROOT,
        env=ENV,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout.readline().strip() == "held", proc.stderr.read()
    return proc


@pytest.mark.subprocess
def test_a_claimed_folder_refuses_a_second_driver_before_anything_is_written(tmp_path, capsys):
    exp_dir = str(tmp_path / EXP)
    holder = _holder(exp_dir)
    try:
        code = cli.main(["train", TOY, *SMALL, "--storage-path", str(tmp_path)])
        err = capsys.readouterr().err
        assert code == 2, err
        assert (
            f"experiment {EXP!r} in {exp_dir} is being run by another `rllib-r3l train` now (process {holder.pid} "
            "on this host)"
            in err
            and "--new" in err
            and "Traceback" not in err
        )
        assert not os.path.exists(exp_dir)  # nothing planned, saved or started
        with pytest.raises(Exception, match="is being run by another"), driver_mark.claims() as claim:
            claim(exp_dir, EXP)
    finally:
        holder.kill()
        holder.wait()
    with driver_mark.claims() as claim:  # a dead holder's lock is gone with it: no stale lock to clear
        claim(exp_dir, EXP)


LATE = (  # a holder that locks, then writes its pid a moment later (as a driver under load does)
    "import fcntl, os, sys, time\nfrom rllib_r3l.cli import driver_mark\n"
    "path = driver_mark.lock_path(sys.argv[1]); os.makedirs(os.path.dirname(path), exist_ok=True)\n"
    "fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644); fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('locked', flush=True); time.sleep(float(sys.argv[2])); os.write(fd, str(os.getpid()).encode())\n"
    "time.sleep(600)\n"
)


@pytest.mark.subprocess
@pytest.mark.parametrize("late_s, named", [(0.5, True), (3.0, False)])
def test_a_holder_that_writes_its_pid_late_is_still_named(tmp_path, late_s, named):
    """CI (session 36): two drivers started together; the loser read the lock file before the winner wrote
    its pid and said "another process on this host". The loser now waits up to PID_WAIT_S for the pid."""
    exp_dir = str(tmp_path / EXP)
    holder = subprocess.Popen(
        [sys.executable, "-c", LATE, exp_dir, str(late_s)],
        cwd=ROOT,
        env=ENV,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline().strip() == "locked", holder.stderr.read()
        with pytest.raises(Exception, match="is being run by another") as refused, driver_mark.claims() as claim:
            claim(exp_dir, EXP)
        assert (late_s < driver_mark.PID_WAIT_S) == named  # the two cases sit either side of the wait
        if named:
            assert f"(process {holder.pid} on this host)" in str(refused.value) and f"kill -TERM {holder.pid}" in str(
                refused.value
            )
        else:  # no pid within the wait: still refused, with the generic advice
            assert "(another process on this host)" in str(refused.value), refused.value
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.subprocess
def test_a_claim_ends_with_its_block_and_new_is_not_held_back(tmp_path, capsys):
    exp_dir = str(tmp_path / EXP)
    for _ in range(2):  # the same process, one block after the other (tests call cli.main many times)
        with driver_mark.claims() as claim:
            claim(exp_dir, EXP)
            claim(exp_dir, EXP)  # taking one's own claim again is no conflict
            assert os.path.exists(driver_mark.lock_path(exp_dir))
        assert not os.path.exists(driver_mark.lock_path(exp_dir))  # nothing left beside the experiments
    holder = _holder(exp_dir)
    try:  # --new starts beside the held folder: only the new folder is claimed
        code = cli.main(["train", TOY, *SMALL, "--storage-path", str(tmp_path), "--new", "--dry-run"])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert "valid; not started (--dry-run)" in out
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.integration
def test_two_drivers_started_together_make_one_experiment(tmp_path):
    """Both used to exit 0 with one trial in Tune's state, interleaved logs and one driver mark."""
    argv = [sys.executable, "-m", "rllib_r3l.cli.commands", "train", TOY, *SMALL, "--storage-path", str(tmp_path)]
    procs = [
        subprocess.Popen(argv, cwd=ROOT, env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    results = [(p.pid, *p.communicate(timeout=900), p.returncode) for p in procs]
    refused = [r for r in results if r[3] == 2]
    assert len(refused) == 1, [(r[3], r[2][-2000:]) for r in results]
    loser, winner = refused[0], next(r for r in results if r[3] != 2)
    # the winner ran its iteration to the end (1 = that iteration trained on nothing, said in its summary)
    assert winner[3] in (0, 1) and "=== rllib-r3l train: summary ===" in winner[1], winner[2][-3000:]
    assert "is being run by another `rllib-r3l train` now" in loser[2] and str(winner[0]) in loser[2], loser[2]
    trials = glob.glob(str(tmp_path / EXP / "*" / "params.json"))
    assert len(trials) == 1, trials
    with open(os.path.join(os.path.dirname(trials[0]), "result.json")) as f:
        assert [json.loads(line)["training_iteration"] for line in f if line.strip()] == [1]
    with open(tmp_path / EXP / driver_mark.MARK) as f:
        assert json.load(f)["pid"] == winner[0]
    state = sorted(glob.glob(str(tmp_path / EXP / "experiment_state-*.json")))[-1]
    with open(state) as f:
        assert len(json.load(f)["trial_data"]) == 1
