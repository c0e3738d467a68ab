"""Preemption (issue 37, item 5 and "What to build" 2): SIGTERM, what Slurm and Kubernetes send,
behaves like Ctrl-C: the run stops at a safe point, keeps the last checkpoint, exits 130 with the
summary and the command to run next; a second signal ends it at once. Before the first checkpoint
the advice is to start anew (--new), not a --resume that would restart at iteration 1 over the rows.
Real runs of the tiny model on the toy corridor, in a subprocess each."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from rllib_r3l.cli import commands as cli
from tests import REPO_ROOT

pytestmark = pytest.mark.integration

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
    "training_iteration=500",
]
WAIT_S = 300


def _start(tmp_path, *extra, own_group=False):
    argv = ["train", TOY, *SMALL, "--storage-path", str(tmp_path), *extra]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_CHDIR_TO_TRIAL_DIR="0")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rllib_r3l.cli.commands", *argv],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=own_group,
    )
    return proc, argv


def _wait_for(proc, pattern):
    deadline = time.time() + WAIT_S
    while proc.poll() is None and not glob.glob(pattern) and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before the signal:\n" + proc.communicate()[1][-3000:]
    assert glob.glob(pattern), f"nothing matched {pattern} within {WAIT_S} s"


def _finish(proc, timeout=WAIT_S):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def test_sigterm_after_a_checkpoint_stops_like_ctrl_c(tmp_path):
    proc, argv = _start(tmp_path, "--checkpoint-freq", "1")
    _wait_for(proc, str(tmp_path / EXP / "*" / "checkpoint_000000" / "rllib_checkpoint.json"))
    proc.send_signal(signal.SIGTERM)
    code, out, err = _finish(proc)
    # before: exit 1 like a failed trial, no summary, no resume command
    assert code == 130, out[-2000:] + err[-3000:]
    assert "=== rllib-r3l train: summary ===" in out and "INTERRUPTED" in out
    assert "to continue from the last checkpoint: rllib-r3l train" in err and "--resume" in err
    assert "--set" not in err.split("to continue from the last checkpoint:")[1]  # resume refuses --set
    # re-probe 2: a signal right after the copy, before Tune recorded it, printed "checkpoint: (none)"
    from rllib_r3l.checkpoint_integrity import problem

    complete = sorted(c for c in glob.glob(str(tmp_path / EXP / "*" / "checkpoint_*")) if problem(c) is None)
    assert complete, "no complete checkpoint on disk"
    assert "checkpoint: (none)" not in out and f"checkpoint: {complete[-1]}" in out, out[-2000:]


# SIGTERM only: the driver turns it into Ctrl-C's KeyboardInterrupt (signals.sigterm_as_sigint), so it takes
# Ctrl-C's path and the conversion too (Ctrl-C itself: tests/cli/test_resume.py); each case is a 20-s run
@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_signal_before_the_first_checkpoint_advises_new_not_resume(tmp_path, capsys, sig):
    # no periodic checkpoint (the file's is every 10 iterations, a second on this tiny run): none before
    # the signal, and an interrupted trial is not checkpointed at its end
    proc, argv = _start(tmp_path, "--checkpoint-freq", "100000")
    _wait_for(proc, str(tmp_path / EXP / "*" / "params.json"))
    proc.send_signal(sig)
    code, out, err = _finish(proc)
    assert code == 130, out[-2000:] + err[-3000:]
    assert not glob.glob(str(tmp_path / EXP / "*" / "checkpoint_*"))
    # before: "to continue from the last checkpoint: ... --resume", and that resume wrote over result.json
    assert "no checkpoint was saved yet" in err and "--new" in err and "--resume" not in err, err[-2000:]
    code = cli.main(["train", TOY, "--experiment", EXP, "--storage-path", str(tmp_path), "--resume", "--dry-run"])
    assert code == 2 and "has no checkpoint yet" in capsys.readouterr().err


def test_a_second_sigterm_ends_the_run_at_once(tmp_path):
    proc, argv = _start(tmp_path, "--checkpoint-freq", "1")
    _wait_for(proc, str(tmp_path / EXP / "*" / "checkpoint_000000" / "rllib_checkpoint.json"))
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    code, out, err = _finish(proc, timeout=120)
    assert code == 130, out[-2000:] + err[-3000:]
    assert "--resume" in err and "Traceback" not in err[-3000:], err[-3000:]


def test_sigterm_to_the_whole_process_group_ends_at_once_with_the_resume_command(tmp_path):
    """Re-probe 3 (S5): `timeout` and Slurm's scancel signal the whole process group, so Ray's GCS and
    raylet (started by the driver, in its group) die too; the driver then showed the live line for ~60 s
    and Ray's core worker ended it with exit 1: no INTERRUPTED, no resume command."""
    proc, argv = _start(tmp_path, "--checkpoint-freq", "1", own_group=True)
    _wait_for(proc, str(tmp_path / EXP / "*" / "checkpoint_000000" / "rllib_checkpoint.json"))
    t0 = time.time()
    os.killpg(proc.pid, signal.SIGTERM)
    code, out, err = _finish(proc, timeout=120)
    took = time.time() - t0
    assert code == 130, out[-2000:] + err[-3000:]
    # on the console (re-probe 4, M-1: the line went into the log file the run's output is routed to)
    assert "interrupted" in out + err and "--resume" in out + err, out[-2000:] + err[-3000:]
    assert took < 45, f"{took:.0f} s after the signal"  # before: about 60 s, then exit 1
    from rllib_r3l.cli import commands as cli_commands

    resume_argv = ["train", TOY, "--experiment", EXP, "--storage-path", str(tmp_path), "--resume", "--dry-run"]
    assert cli_commands.main(resume_argv) == 0  # the advice works: the experiment resumes


def test_sigterm_while_train_starts_exits_130_with_a_line(tmp_path):
    """Re-probe 7 (M5, issue 37): SIGTERM 5-8 s after `train` started (Ray starting) ended it with exit 15
    (Ray's own handler: sys.exit(signum)) and printed nothing. Now: exit 130 and a line."""
    proc, _argv = _start(tmp_path, "--checkpoint-freq", "100000")
    _wait_for(proc, str(tmp_path / EXP / "r3l-experiment.json"))  # the checks passed: Ray starts next
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    code, out, err = _finish(proc, timeout=120)
    assert code == 130, (code, out[-2000:] + err[-3000:])
    assert "interrupted" in err and "Traceback" not in err, err[-3000:]
