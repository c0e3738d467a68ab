"""Starting, resuming and not silently forking an experiment of ``rllib-r3l train``.

Tune keeps an experiment in ``STORAGE/NAME`` (``experiment_state-*.json`` plus one directory per
trial). Running the same file again into a directory that already holds that state would start a
second trial from iteration 1 beside the first (after which ``evaluate EXPERIMENT_DIR`` cannot tell
which one is meant), so ``plan_runs`` refuses, and asks for one of:

* ``--resume``: ``tune.run(..., resume=...)`` continues every unfinished (or errored) trial from its
  last checkpoint; the iteration counter, weights, optimizer and sampling state continue. Tune
  keeps the saved configs and stop criteria of a resumed experiment.
* ``--new``: a fresh experiment beside the old one, named ``NAME_<date>-<time>``, from the file's base
  model at iteration 1 (the old one is left as it is).
* ``--resume --stop KEY=VALUE``: as ``--resume``, and every trial, finished ones too, trains on until the
  new stop (:mod:`rllib_r3l.cli.extend`): a finished run extended from its last checkpoint.

A run counts as interrupted when a trial ended without reaching its stop criterion (Ctrl-C, SIGTERM,
SIGUSR1): ``rllib-r3l train`` then exits non-zero and prints the command that resumes it, or, when
no checkpoint was saved yet, the one that starts it anew (``--resume`` then refuses: Tune would
restart at iteration 1 over the rows kept so far). ``--set`` is refused with ``--resume`` (Tune keeps the
saved config) and, with ``--stop`` of a fresh run, left out of the printed resume command.

Which checkpoint a resumed trial continues from, and the rows of the iterations it runs again:
:mod:`rllib_r3l.cli.resume_from` (the newest complete checkpoint, whether or not Tune's saved state
records it).
"""

from __future__ import annotations

import glob
import os
import shlex
import time
from typing import Any, Dict, List, Optional, Sequence

from rllib_r3l.cli import driver_mark, state_backup
from rllib_r3l.cli.extend import check_new_stop, extend_hint, fresh_run
from rllib_r3l.cli.result_rows import parsed_rows
from rllib_r3l.cli.resume_from import STATE_GLOB, all_finished, checkpoint_dirs, resume_choices
from rllib_r3l.errors import UsageError

START, RESUME = "start", "resume"


def default_storage() -> str:
    from ray.train.constants import DEFAULT_STORAGE_PATH

    return DEFAULT_STORAGE_PATH


def experiment_dir(storage: Optional[str], name: str) -> str:
    return os.path.join(os.path.abspath(os.path.expanduser(storage or default_storage())), name)


def has_state(exp_dir: str) -> bool:
    """Whether Tune has saved an experiment's state in ``exp_dir``."""
    return bool(glob.glob(os.path.join(exp_dir, STATE_GLOB)))


def _trials(exp_dir: str) -> List[str]:
    """Trial folders: with Tune's ``params.json``, or with a checkpoint (a driver killed before Tune copied
    the rest of the folder to the storage)."""
    return [
        d
        for d in glob.glob(os.path.join(exp_dir, "*"))
        if os.path.isfile(os.path.join(d, "params.json")) or checkpoint_dirs(d)
    ]


def checkpoints(exp_dir: str) -> List[str]:
    """The complete ``checkpoint_*`` names of every trial of an experiment directory, sorted."""
    from rllib_r3l.checkpoint_integrity import is_complete

    return sorted(os.path.basename(c) for t in _trials(exp_dir) for c in checkpoint_dirs(t) if is_complete(c))


def _last_row_done(trial_dir: str) -> bool:
    """Whether the trial's last result row says it reached its stop criterion."""
    rows = parsed_rows(trial_dir)
    return bool(rows and rows[-1][1] and rows[-1][1].get("done"))


def _has_rows(trial_dir: str) -> bool:
    f = os.path.join(trial_dir, "result.json")
    return os.path.isfile(f) and os.path.getsize(f) > 0


def restarts_from_scratch(exp_dir: str) -> List[str]:
    """Unfinished trials with result rows but no checkpoint: a resume would run them from iteration 1
    again and write over those rows."""
    from rllib_r3l.checkpoint_integrity import is_complete

    return [
        os.path.basename(t)
        for t in _trials(exp_dir)
        if not any(is_complete(c) for c in checkpoint_dirs(t)) and _has_rows(t) and not _last_row_done(t)
    ]


def describe(exp_dir: str) -> str:
    """``N trial(s), last checkpoint checkpoint_00000k`` for an existing experiment directory."""
    ckpts = checkpoints(exp_dir)
    return f"{len(_trials(exp_dir))} trial(s), last checkpoint {ckpts[-1] if ckpts else '(none)'}"


def _recovered_note(exp_dir: str) -> str:
    """Rows a killed driver left only in Ray's staging folder are copied into ``exp_dir`` first (they would
    be lost with /tmp); ``"; rows of <trial> recovered there from Ray's staging folder"`` or ``""``."""
    from rllib_r3l.cli.resume_from import recover_staged_rows

    found = recover_staged_rows(exp_dir)
    return f"; rows of {', '.join(found)} recovered there from Ray's staging folder" if found else ""


def plan_runs(
    names: Sequence[str],
    storages: Dict[str, Optional[str]],
    resume: bool,
    new: bool,
    stop: Optional[Dict[str, Any]] = None,
) -> Dict[str, Dict[str, Any]]:
    """Per experiment ``{"mode": "start"|"resume", "name": run name, "dir": experiment directory}``; with
    ``resume`` and ``stop`` (the ``--stop`` keys) also ``"stop"`` and ``"stops"`` (per trial the criteria
    it trains on to): every trial, finished ones too, continues.

    Raises :class:`UsageError` when an experiment already has state and neither ``--resume`` nor
    ``--new`` says what to do, or when ``--resume`` finds nothing to resume.
    """
    if resume and new:
        raise UsageError(
            "--resume and --new exclude each other; pass one of them: --resume (continues the saved "
            f"experiment from its last checkpoint) or {fresh_run()}"
        )
    plan: Dict[str, Dict[str, Any]] = {}
    for name in names:
        d = experiment_dir(storages.get(name), name)
        pid = driver_mark.running_pid(d) if not new else None
        if pid is not None:  # a second driver would rewrite the live run's state, rows and checkpoints
            raise UsageError(
                f"experiment {name!r} in {d} is running now (process {pid} on this host); wait for it "
                f"to end, or stop it first (Ctrl-C in its terminal, or kill -TERM {pid}), then --resume; "
                f"or pass {fresh_run(name)}"
            )
        if not has_state(d) and not _trials(d):
            plan[name] = {"mode": START, "name": name, "dir": d}
        elif resume:
            # a cut experiment_state or search state (full disk): the last whole one back
            restored = state_backup.restore(d)
            damaged = state_backup.problem(d)
            if damaged:  # Tune would take it for a new experiment: a new trial from iteration 1
                ckpts = checkpoints(d)
                raise UsageError(
                    f"--resume: experiment {name!r} in {d}: Tune's saved state {damaged} and there is "
                    "no whole copy of it, so Tune cannot continue its trials"
                    f"{_recovered_note(d)}; "
                    + (f"its newest complete checkpoint is {ckpts[-1]}: evaluate or export it, or " if ckpts else "")
                    + f"start anew with {fresh_run(name)}"
                )
            if not checkpoints(d):  # Tune would restart at iteration 1 and write over the rows kept so far
                folders = sorted(os.path.basename(c) for t in _trials(d) for c in checkpoint_dirs(t))
                why = (
                    f"only incomplete checkpoint folders ({', '.join(folders)})"
                    if folders
                    else "no checkpoint yet (it stopped before the first one)"
                )
                raise UsageError(
                    f"--resume: experiment {name!r} in {d} has {why}, so there is nothing to continue; "
                    f"start it anew with {fresh_run(name)} instead of --resume (the rows so far "
                    f"stay in {d}{_recovered_note(d)})"
                )
            if not has_state(d):  # killed before Tune first saved its state: its trials exist, Tune cannot resume them
                raise UsageError(
                    f"--resume: experiment {name!r} in {d}: Tune saved no state of it before its driver "
                    f"ended, so Tune cannot continue its trials{_recovered_note(d)}; its newest complete "
                    f"checkpoint is {checkpoints(d)[-1]}: evaluate or export it, or start anew with "
                    f"{fresh_run(name)}"
                )
            lost = restarts_from_scratch(d)
            if lost:
                raise UsageError(
                    f"--resume: trial {lost[0]} of experiment {name!r} has results but no checkpoint; "
                    "resuming would run it from iteration 1 over its result.json/progress.csv; start "
                    f"anew with {fresh_run(name)} (the rows stay in {d})"
                )
            plan[name] = {
                "mode": RESUME,
                "name": name,
                "dir": d,
                "choices": resume_choices(d, finished=bool(stop)),
                "restored": restored,
            }
            if stop:  # every trial trains on to the new stop, finished ones from their last checkpoint
                plan[name].update(stop=dict(stop), stops=check_new_stop(name, d, stop))
                bare = [
                    c["trial"]
                    for c in plan[name]["choices"]
                    if not c["from"] and _has_rows(os.path.join(d, c["trial"]))
                ]
                if bare:  # a finished trial without a checkpoint: Tune would train it from iteration 1 over its rows
                    raise UsageError(
                        f"--resume --stop: trial {bare[0]} of experiment {name!r} finished without a "
                        "complete checkpoint (checkpoint_config.checkpoint_at_end was off, or its "
                        "checkpoints were deleted), so it cannot be trained further; start again with "
                        f"{fresh_run(name)}"
                    )
        elif new:
            fresh = f"{name}_{time.strftime('%Y%m%d-%H%M%S')}"
            plan[name] = {"mode": START, "name": fresh, "dir": experiment_dir(storages.get(name), fresh)}
        elif not checkpoints(d) or not has_state(d):  # --resume would be refused: only --new is advice
            note = _recovered_note(d)
            why = "has no checkpoint to continue from" if not checkpoints(d) else "Tune saved no state of it to resume"
            raise UsageError(
                f"experiment {name!r} already exists in {d} ({describe(d)}{note}) and {why}; pass {fresh_run(name)}"
            )
        elif all_finished(d):  # a plain --resume would do nothing: only one with a higher stop trains on
            raise UsageError(
                f"experiment {name!r} already exists in {d} ({describe(d)}) and every trial of it "
                f"finished (reached its stop criterion); {extend_hint(d)}; or evaluate or export its "
                f"checkpoint; or pass {fresh_run(name)}"
            )
        else:
            raise UsageError(
                f"experiment {name!r} already exists in {d} ({describe(d)}); pass --resume to continue "
                f"it from its last checkpoint, or {fresh_run(name)}"
            )
    if resume and not stop and plan and all(p["mode"] == RESUME and all_finished(p["dir"]) for p in plan.values()):
        first = next(iter(plan.values()))
        raise UsageError(
            "--resume: nothing to continue, every trial of "
            + ", ".join(repr(n) for n in plan)
            + f" finished (reached its stop criterion); "
            f"{extend_hint(first['dir'])}; or evaluate or export its checkpoint; or start again with "
            f"{fresh_run(first['name'])}"
        )
    if resume and not any(p["mode"] == RESUME for p in plan.values()):
        where = ", ".join(p["dir"] for p in plan.values())
        raise UsageError(
            f"--resume: nothing to resume, no saved experiment state in {where}; run without --resume "
            "(or give the --storage-path of the earlier run)"
        )
    return plan


def tune_resume_config(finished: bool = False):
    """Resume unfinished trials, and errored ones, from their last checkpoints; finished ones stay, or, with
    ``finished`` (a new stop), resume too."""
    from ray.tune import ResumeConfig

    return ResumeConfig(
        unfinished=ResumeConfig.ResumeType.RESUME,
        errored=ResumeConfig.ResumeType.RESUME,
        finished=ResumeConfig.ResumeType.RESUME if finished else ResumeConfig.ResumeType.SKIP,
    )


# Flags of a fresh run that the resume command printed after an interruption leaves out: Tune keeps the
# saved config, stop criteria and checkpoint frequency (a --stop given with --resume is a new stop: kept).
FIXED_ON_RESUME = ("--set", "--stop", "--checkpoint-freq")


def check_resume_flags(resume: bool, sets: Sequence[str]) -> None:
    """Refuse --set with --resume instead of ignoring it without a word."""
    if resume and sets:
        raise UsageError(
            f"--resume with --set {sets[0]}: a resumed experiment keeps its saved config, --set cannot "
            f"change it; drop --set to continue it as it was, or start again with {fresh_run()}"
        )


def check_checkpoint_freq(plan: Dict[str, Dict[str, Any]], freq: Optional[int]) -> None:
    """Refuse a --checkpoint-freq that differs from what a resumed experiment saved: Tune keeps the saved one
    and drops the new one without a word. The same value, as in the first command, passes."""
    from rllib_r3l.cli.resume_from import saved_checkpoint_frequencies

    if freq is None:
        return
    for name, p in plan.items():
        saved = saved_checkpoint_frequencies(p["dir"]) if p["mode"] == RESUME else set()
        if saved and saved != {freq}:
            raise UsageError(
                f"--resume with --checkpoint-freq {freq}: experiment {name!r} keeps the checkpoint "
                f"frequency it started with ({', '.join(map(str, sorted(saved)))}); drop --checkpoint-freq "
                f"to continue it so, or start again with {fresh_run(name)}"
            )


def _without(argv: Sequence[str], flags: Sequence[str]) -> List[str]:
    """``argv`` without ``flags`` and their values (both ``--set X`` and ``--set=X``): the flags a resume
    fixes (--set/--stop/--checkpoint-freq) or ``--experiment`` (one command per experiment)."""
    flags = tuple(flags)
    out: List[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        elif not a.startswith(tuple(f + "=" for f in flags)):
            out.append(a)
    return out


def _command(args: Sequence[str]) -> str:
    return "rllib-r3l " + " ".join(shlex.quote(str(a)) for a in args)


def resume_command(argv: Sequence[str]) -> str:
    """The command line that resumes the run ``argv`` started (``--new``, ``--set``, ``--stop`` dropped:
    the saved experiment keeps its own; ``--resume`` added). The ``--stop`` of a resume is its new stop,
    which a run cut short before saving it needs again: kept."""
    keep = ("--stop",) if "--resume" in argv else ()
    args = [a for a in _without(argv, [f for f in FIXED_ON_RESUME if f not in keep]) if a != "--new"]
    if "--resume" not in args:
        args.append("--resume")
    return _command(args)


def new_command(argv: Sequence[str]) -> str:
    """The command line that starts the run ``argv`` started again, beside the old one (``--new``)."""
    args = [a for a in argv if a != "--resume"]
    if "--new" not in args:
        args.append("--new")
    return _command(args)


def _only(argv: Sequence[str], name: str) -> List[str]:
    """``argv`` for the one experiment ``name`` (any ``--experiment`` flags replaced)."""
    return _without(argv, ["--experiment"]) + ["--experiment", name]


def _finished(exp_dir: str) -> bool:
    trials = _trials(exp_dir)
    return has_state(exp_dir) and bool(trials) and all(_last_row_done(t) for t in trials)


def runtime_lost_line(advice: str) -> str:
    """What the console says when a signal to the whole process group stopped Ray's own processes too;
    the rows Tune had not copied come back only with a --resume (promised only
    where a checkpoint was saved: without one the run "cannot be resumed")."""
    rows = (
        " (rows not yet copied to the experiment come back with --resume)"
        if advice.startswith("to continue from the last checkpoint")
        else ""
    )
    return (
        f"interrupted: the signal reached Ray's own processes too, so the trials stopped where they were{rows}; "
        f"{advice}"
    )


def interrupted_advice(argv: Sequence[str], plan: Dict[str, Dict[str, Any]]) -> str:
    """What to run after an interruption: resume from the last checkpoint, or, with none yet, start anew.
    A file's experiments that need different commands (one finished, one cut before its first checkpoint,
    one not started) get one command each (a single --resume is refused for
    the one without a checkpoint, a single --new runs the finished one again)."""
    steps = []
    for name, p in plan.items():
        d = p["dir"]
        if _finished(d):
            continue
        kind = "resume" if checkpoints(d) else "new" if has_state(d) or _trials(d) else "start"
        steps.append((kind, name))
    if len(plan) > 1 and len({k for k, _ in steps}) > 1:
        commands = {"resume": resume_command, "new": new_command, "start": lambda a: _command(list(a))}
        said = {"new": "new: from the base model at iteration 1, beside the old run"}
        return "to go on, one command per experiment: " + "; ".join(
            f"{name} ({said.get(kind, kind)}): {commands[kind](_only(argv, name))}" for kind, name in steps
        )
    dirs = [p["dir"] for p in plan.values()]
    if any(checkpoints(d) for d in dirs):
        return f"to continue from the last checkpoint: {resume_command(argv)}"
    if any(has_state(d) for d in dirs):
        return (
            f"no checkpoint was saved yet, so it cannot be resumed; to start it anew from the base model at "
            f"iteration 1, beside the old run (whose rows stay in {', '.join(dirs)}): {new_command(argv)}"
        )
    return f"nothing was saved yet; to start again: {_command(list(argv))}"
