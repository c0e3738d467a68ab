"""Starting, resuming and not silently forking an experiment of ``rllib-r3l train``.

Tune keeps an experiment in ``STORAGE/NAME`` (``experiment_state-*.json`` plus one directory per
trial). Running the same file again into a directory that already holds that state would start a
second trial from iteration 1 beside the first (after which ``evaluate EXPERIMENT_DIR`` cannot tell
which one is meant), so ``plan_runs`` refuses, and asks for one of:

* ``--resume``: ``tune.run(..., resume=...)`` continues every unfinished (or errored) trial from its
  last checkpoint; the iteration counter, weights, optimizer and sampling state continue. Tune
  keeps the saved configs and stop criteria of a resumed experiment.
* ``--new``: a fresh experiment beside the old one, named ``NAME_<date>-<time>``.

A run counts as interrupted when a trial ended without reaching its stop criterion (Ctrl-C,
SIGUSR1): ``rllib-r3l train`` then exits non-zero and prints the command that resumes it.
"""

from __future__ import annotations

import glob
import os
import shlex
import time
from typing import Any, Dict, List, Optional, Sequence

from rllib_r3l.errors import UsageError

STATE_GLOB = "experiment_state-*.json"
START, RESUME = "start", "resume"


def default_storage() -> str:
    from ray.train.constants import DEFAULT_STORAGE_PATH

    return DEFAULT_STORAGE_PATH


def experiment_dir(storage: Optional[str], name: str) -> str:
    return os.path.join(os.path.abspath(os.path.expanduser(storage or default_storage())), name)


def has_state(exp_dir: str) -> bool:
    """Whether Tune has saved an experiment's state in ``exp_dir``."""
    return bool(glob.glob(os.path.join(exp_dir, STATE_GLOB)))


def describe(exp_dir: str) -> str:
    """``N trial(s), last checkpoint checkpoint_00000k`` for an existing experiment directory."""
    trials = [d for d in glob.glob(os.path.join(exp_dir, "*")) if os.path.isfile(os.path.join(d, "params.json"))]
    ckpts = sorted(os.path.basename(c) for t in trials for c in glob.glob(os.path.join(t, "checkpoint_*")))
    return f"{len(trials)} trial(s), last checkpoint {ckpts[-1] if ckpts else '(none)'}"


def plan_runs(names: Sequence[str], storages: Dict[str, Optional[str]], resume: bool, new: bool) -> Dict[str, Dict[str, Any]]:
    """Per experiment ``{"mode": "start"|"resume", "name": run name, "dir": experiment directory}``.

    Raises :class:`UsageError` when an experiment already has state and neither ``--resume`` nor
    ``--new`` says what to do, or when ``--resume`` finds nothing to resume.
    """
    if resume and new:
        raise UsageError("--resume and --new exclude each other: --resume continues the saved experiment, "
                         "--new starts a fresh one beside it")
    plan: Dict[str, Dict[str, Any]] = {}
    for name in names:
        d = experiment_dir(storages.get(name), name)
        if not has_state(d):
            plan[name] = {"mode": START, "name": name, "dir": d}
        elif resume:
            plan[name] = {"mode": RESUME, "name": name, "dir": d}
        elif new:
            fresh = f"{name}_{time.strftime('%Y%m%d-%H%M%S')}"
            plan[name] = {"mode": START, "name": fresh, "dir": experiment_dir(storages.get(name), fresh)}
        else:
            raise UsageError(f"experiment {name!r} already exists in {d} ({describe(d)}); pass --resume to continue "
                             "it from its last checkpoint, or --new to start a fresh run beside it")
    if resume and not any(p["mode"] == RESUME for p in plan.values()):
        where = ", ".join(p["dir"] for p in plan.values())
        raise UsageError(f"--resume: nothing to resume, no saved experiment state in {where}; run without --resume "
                         "(or give the --storage-path of the earlier run)")
    return plan


def tune_resume_config():
    """Resume unfinished trials, and errored ones, from their last checkpoints; finished ones stay."""
    from ray.tune import ResumeConfig

    return ResumeConfig(unfinished=ResumeConfig.ResumeType.RESUME, errored=ResumeConfig.ResumeType.RESUME,
                        finished=ResumeConfig.ResumeType.SKIP)


def resume_command(argv: Sequence[str]) -> str:
    """The command line that resumes the run ``argv`` started (``--new`` dropped, ``--resume`` added)."""
    args: List[str] = [a for a in argv if a != "--new"]
    if "--resume" not in args:
        args.append("--resume")
    return "rllib-r3l " + " ".join(shlex.quote(str(a)) for a in args)
