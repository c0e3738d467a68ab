"""Helpers for the tests that run the tiny toy-corridor experiment through ``rllib-r3l train`` in a
subprocess (a real Tune run of a few seconds an iteration on CPU)."""

from __future__ import annotations

import csv
import glob
import json
import os
import subprocess
import sys
from typing import Any, Dict, List

from tests import REPO_ROOT

ROOT = str(REPO_ROOT)
TOY = os.path.join(ROOT, "tuned_examples", "cpu", "toy_corridor_tiny.yaml")
EXPERIMENT = "toy-corridor-tiny-no-reflect"
# two task groups an iteration: an iteration without any update (every group scoring alike) is rare
SMALL = [
    "--experiment",
    EXPERIMENT,
    "--set",
    "tasks_per_iteration=2",
    "--set",
    "env_config={num_rooms: 3, max_turns: 3}",
    "--num-cpus",
    "4",
    "--quiet-workers",
    "--verbose",
    "0",
]


def cli_process(argv: List[str]) -> subprocess.Popen:
    """``python -m rllib_r3l.cli.commands ARGV`` from the repository root, output captured."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_CHDIR_TO_TRIAL_DIR="0")
    return subprocess.Popen(
        [sys.executable, "-m", "rllib_r3l.cli.commands", *argv],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finished(proc: subprocess.Popen, err: str) -> bool:
    """The run ended at its stop criterion: exit 0, or 1 for a trial that never updated the policy (the tiny
    random policy can score alike in every group: a matter of learning, not of what these tests check)."""
    return proc.returncode == 0 or (proc.returncode == 1 and "trained on nothing" in err)


def trial_dirs(exp_dir) -> List[str]:
    return sorted(d for d in glob.glob(os.path.join(str(exp_dir), "R3L_*")) if os.path.isdir(d))


def rows(trial_dir: str) -> List[Dict[str, Any]]:
    with open(os.path.join(trial_dir, "result.json")) as f:
        return [json.loads(line) for line in f if line.strip()]


def iterations(trial_dir: str) -> List[int]:
    return [r["training_iteration"] for r in rows(trial_dir)]


def progress_iterations(trial_dir: str) -> List[int]:
    with open(os.path.join(trial_dir, "progress.csv"), newline="") as f:
        return [int(r["training_iteration"]) for r in csv.DictReader(f)]
