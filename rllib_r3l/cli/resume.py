"""Starting, resuming and not silently forking an experiment of ``rllib-r3l train``.

Tune keeps an experiment in ``STORAGE/NAME`` (``experiment_state-*.json`` plus one directory per
trial). Running the same file again into a directory that already holds that state would start a
second trial from iteration 1 beside the first (after which ``evaluate EXPERIMENT_DIR`` cannot tell
which one is meant), so ``plan_runs`` refuses, and asks for one of:

* ``--resume``: ``tune.run(..., resume=...)`` continues every unfinished (or errored) trial from its
  last checkpoint; the iteration counter, weights, optimizer and sampling state continue. Tune
  keeps the saved configs and stop criteria of a resumed experiment.
* ``--new``: a fresh experiment beside the old one, named ``NAME_<date>-<time>``.

A run counts as interrupted when a trial ended without reaching its stop criterion (Ctrl-C, SIGTERM,
SIGUSR1): ``rllib-r3l train`` then exits non-zero and prints the command that resumes it, or, when
no checkpoint was saved yet, the one that starts it anew (``--resume`` then refuses: Tune would
restart at iteration 1 over the rows kept so far). ``--set``/``--stop`` are refused with
``--resume`` (Tune keeps the saved ones) and left out of the printed resume command.

Which checkpoint a resumed trial continues from is Tune's choice: the latest one its saved experiment
state records (Tune records a checkpoint only after copying it completely; the copy itself is not
atomic, so a crash mid-copy leaves an incomplete ``checkpoint_*`` folder that is not recorded).
``resume_choices`` reads that state with Ray's own decoders, checks the recorded checkpoint
(``checkpoint_integrity.problem``) and names it, and every incomplete folder it skips; where the
recorded one is itself incomplete (damaged after it was written), ``rewind`` points the trial's state
at the newest complete recorded one before Tune resumes (the original state file is kept beside it).
"""

from __future__ import annotations

import glob
import json
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


def _trials(exp_dir: str) -> List[str]:
    return [d for d in glob.glob(os.path.join(exp_dir, "*")) if os.path.isfile(os.path.join(d, "params.json"))]


def _checkpoint_dirs(trial_dir: str) -> List[str]:
    return sorted(c for c in glob.glob(os.path.join(trial_dir, "checkpoint_*")) if os.path.isdir(c))


def checkpoints(exp_dir: str) -> List[str]:
    """The complete ``checkpoint_*`` names of every trial of an experiment directory, sorted."""
    from rllib_r3l.cli.checkpoint_integrity import is_complete

    return sorted(os.path.basename(c) for t in _trials(exp_dir) for c in _checkpoint_dirs(t) if is_complete(c))


def _last_row_done(trial_dir: str) -> bool:
    """Whether the trial's last result row says it reached its stop criterion."""
    try:
        with open(os.path.join(trial_dir, "result.json")) as f:
            rows = [line for line in f if line.strip()]
        return bool(rows) and bool(json.loads(rows[-1]).get("done"))
    except (OSError, ValueError):
        return False


def restarts_from_scratch(exp_dir: str) -> List[str]:
    """Unfinished trials with result rows but no checkpoint: a resume would run them from iteration 1
    again and write over those rows."""
    def has_rows(t: str) -> bool:
        f = os.path.join(t, "result.json")
        return os.path.isfile(f) and os.path.getsize(f) > 0

    from rllib_r3l.cli.checkpoint_integrity import is_complete

    return [os.path.basename(t) for t in _trials(exp_dir)
            if not any(is_complete(c) for c in _checkpoint_dirs(t)) and has_rows(t) and not _last_row_done(t)]


# --------------------------------------------------------------------------------------------------
# Which checkpoint Tune resumes a trial from (its saved experiment state), complete or rewound
# --------------------------------------------------------------------------------------------------
def _state_file(exp_dir: str) -> Optional[str]:
    files = sorted(glob.glob(os.path.join(exp_dir, STATE_GLOB)))  # Tune reads the newest: max(name)
    return files[-1] if files else None


def _recorded_trials(exp_dir: str) -> List[tuple]:
    """``(index, trial dir, status, run metadata)`` per trial of Tune's newest state; [] when unreadable."""
    try:
        from ray.tune.trainable.metadata import _TrainingRunMetadata
        from ray.tune.utils.serialization import _loads_with_cloudpickle

        with open(_state_file(exp_dir) or "") as f:
            raw = json.load(f)
        out = []
        for i, (trial_json, meta_json) in enumerate(raw.get("trial_data", [])):
            trial = _loads_with_cloudpickle(trial_json)
            tdir = os.path.join(exp_dir, trial["storage"].trial_dir_name)
            out.append((i, tdir, trial.get("status"), _TrainingRunMetadata.from_json_state(meta_json)))
        return out
    except Exception:  # noqa: BLE001 - no or another state format: Tune resumes as it sees fit, unnamed
        return []


def _recorded(tdir: str, md) -> List[tuple]:
    """``(local path, result)`` of the checkpoints Tune recorded for a trial, oldest first."""
    cm = md.checkpoint_manager
    results = list(getattr(cm, "_checkpoint_results", None) or []) if cm else []
    results.sort(key=lambda r: (r.metrics or {}).get("training_iteration", 0))
    return [(os.path.join(tdir, os.path.basename(r.checkpoint.path.rstrip("/"))), r) for r in results]


def resume_choices(exp_dir: str) -> List[Dict[str, Any]]:
    """Per trial a resume continues (not finished): ``trial``, ``from`` (the checkpoint, None: none
    recorded), ``iteration``, ``skipped`` ([(path, why)] of its incomplete folders), ``rewind`` (the
    recorded latest is incomplete: ``from`` is an older complete one), ``unrecorded`` (complete folders
    newer than ``from`` that Tune's state does not know), ``index`` (in the state's trial_data).
    :class:`UsageError` when a trial has recorded checkpoints and none of them is complete."""
    from rllib_r3l.cli.checkpoint_integrity import problem

    choices = []
    for index, tdir, status, md in _recorded_trials(exp_dir):
        if status == "TERMINATED":  # finished trials are left as they are
            continue
        recorded = _recorded(tdir, md)
        complete = [(p, r) for p, r in recorded if problem(p) is None]
        skipped = [(c, problem(c)) for c in _checkpoint_dirs(tdir) if problem(c)]
        name = os.path.basename(tdir)
        if recorded and not complete:
            raise UsageError(f"--resume: trial {name}: every checkpoint Tune recorded is incomplete ("
                             + "; ".join(f"{os.path.basename(p)}: {why}" for p, why in skipped)
                             + f"); start anew beside it with --new (the rows stay in {tdir})")
        path, result = complete[-1] if complete else (None, None)
        newer = [c for c in _checkpoint_dirs(tdir) if path and c > path and problem(c) is None
                 and c not in [p for p, _ in recorded]]
        choices.append({"trial": name, "index": index, "from": path, "skipped": skipped, "unrecorded": newer,
                        "iteration": (result.metrics or {}).get("training_iteration") if result else None,
                        "rewind": bool(recorded) and recorded[-1][0] != path})
    return choices


def resume_notes(plan: Dict[str, Dict[str, Any]]) -> List[str]:
    """One line per skipped incomplete checkpoint and per resumed trial: the checkpoint it continues from."""
    lines = []
    for name, p in plan.items():
        for c in p.get("choices", []):
            at = f"{name} / {c['trial']}"
            lines += [f"{at}: skipping incomplete {os.path.basename(q)} ({why})" for q, why in c["skipped"]]
            lines += [f"{at}: {os.path.basename(q)} is complete but Tune's saved state does not list it (the run "
                      "ended before Tune saved its state); Tune cannot resume from it" for q in c["unrecorded"]]
            if c["from"]:
                rewound = " (Tune's state pointed at an incomplete one: rewound)" if c["rewind"] else ""
                lines.append(f"{at}: resuming from {c['from']} (iteration {c['iteration']}){rewound}")
    return lines


def rewind(exp_dir: str, choices: Sequence[Dict[str, Any]]) -> None:
    """Point Tune's saved state of every trial whose recorded latest checkpoint is incomplete at the
    newest complete recorded one (``choices`` from :func:`resume_choices`); the state file before the
    change is kept as ``.r3l-before-rewind-<name>`` (a name Tune does not read)."""
    todo = [c for c in choices if c["rewind"]]
    if not todo:
        return
    from ray.tune.trainable.metadata import _TrainingRunMetadata

    from rllib_r3l.cli.checkpoint_integrity import problem

    state = _state_file(exp_dir)
    with open(state) as f:
        raw = json.load(f)
    for c in todo:
        tdir = os.path.join(exp_dir, c["trial"])
        md = _TrainingRunMetadata.from_json_state(raw["trial_data"][c["index"]][1])
        keep = [(p, r) for p, r in _recorded(tdir, md) if problem(p) is None]
        cm = md.checkpoint_manager
        cm._checkpoint_results = [r for _, r in keep]
        cm._latest_checkpoint_result = next(r for p, r in keep if p == c["from"])
        md.invalidate_cache()
        raw["trial_data"][c["index"]][1] = md.get_json_state()
    import shutil

    shutil.copy2(state, os.path.join(exp_dir, ".r3l-before-rewind-" + os.path.basename(state)))
    tmp = state + ".r3l-tmp"
    with open(tmp, "w") as f:
        json.dump(raw, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, state)


def describe(exp_dir: str) -> str:
    """``N trial(s), last checkpoint checkpoint_00000k`` for an existing experiment directory."""
    ckpts = checkpoints(exp_dir)
    return f"{len(_trials(exp_dir))} trial(s), last checkpoint {ckpts[-1] if ckpts else '(none)'}"


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
            if not checkpoints(d):  # Tune would restart at iteration 1 and write over the rows kept so far
                raise UsageError(f"--resume: experiment {name!r} in {d} has no checkpoint yet (it stopped before the "
                                 "first one), so there is nothing to continue; start it anew beside the old one "
                                 f"with --new instead of --resume (the rows so far stay in {d})")
            lost = restarts_from_scratch(d)
            if lost:
                raise UsageError(f"--resume: trial {lost[0]} of experiment {name!r} has results but no checkpoint; "
                                 "resuming would run it from iteration 1 over its result.json/progress.csv; start "
                                 f"anew beside it with --new (the rows stay in {d})")
            plan[name] = {"mode": RESUME, "name": name, "dir": d, "choices": resume_choices(d)}
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


# Flags a resumed experiment cannot honour: Tune keeps the saved configs and stop criteria.
FIXED_ON_RESUME = ("--set", "--stop")


def check_resume_flags(resume: bool, sets: Sequence[str], stops: Sequence[str]) -> None:
    """Refuse --set/--stop with --resume instead of ignoring them without a word."""
    for flag, given in zip(FIXED_ON_RESUME, (sets, stops)):
        if resume and given:
            raise UsageError(f"--resume with {flag} {given[0]}: a resumed experiment keeps its saved config and stop "
                             f"criteria, {flag} cannot change them; drop {flag} to continue it as it was, or start a "
                             "fresh run with --new")


def _without_fixed_flags(argv: Sequence[str]) -> List[str]:
    """``argv`` without --set/--stop and their values (both ``--set X`` and ``--set=X``)."""
    out: List[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in FIXED_ON_RESUME:
            skip = True
        elif not a.startswith(tuple(f + "=" for f in FIXED_ON_RESUME)):
            out.append(a)
    return out


def _command(args: Sequence[str]) -> str:
    return "rllib-r3l " + " ".join(shlex.quote(str(a)) for a in args)


def resume_command(argv: Sequence[str]) -> str:
    """The command line that resumes the run ``argv`` started (``--new``, ``--set``, ``--stop`` dropped:
    the saved experiment keeps its own; ``--resume`` added)."""
    args = [a for a in _without_fixed_flags(argv) if a != "--new"]
    if "--resume" not in args:
        args.append("--resume")
    return _command(args)


def new_command(argv: Sequence[str]) -> str:
    """The command line that starts the run ``argv`` started again, beside the old one (``--new``)."""
    args = [a for a in argv if a != "--resume"]
    if "--new" not in args:
        args.append("--new")
    return _command(args)


def interrupted_advice(argv: Sequence[str], plan: Dict[str, Dict[str, Any]]) -> str:
    """What to run after an interruption: resume from the last checkpoint, or, with none yet, start anew."""
    dirs = [p["dir"] for p in plan.values()]
    if any(checkpoints(d) for d in dirs):
        return f"to continue from the last checkpoint: {resume_command(argv)}"
    if any(has_state(d) for d in dirs):
        return (f"no checkpoint was saved yet, so it cannot be resumed; to start it anew beside the old run "
                f"(whose rows stay in {', '.join(dirs)}): {new_command(argv)}")
    return f"nothing was saved yet; to start again: {_command(list(argv))}"
