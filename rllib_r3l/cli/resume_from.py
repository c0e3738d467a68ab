"""Which checkpoint a resumed Tune trial continues from, and the rows it will run again.

Tune resumes a trial from the latest checkpoint its saved experiment state records. That state lags
the disk in two ways, and either way Tune's own choice loses work or repeats it:

* **recorded but incomplete**: Tune records a checkpoint after copying it, but the copy is not atomic;
  damaged later, the recorded latest cannot be restored. We *rewind* the state to the newest complete
  recorded one.
* **complete but unrecorded**: a second Ctrl-C or a ``kill -9`` ends the driver after the checkpoint
  folder is written but before Tune saves its state again, so Tune resumes from an older checkpoint
  (or from iteration 1). We *adopt* the newest complete folder into the state, but only up to the
  last iteration whose row reached the storage folder: Tune copies the rows there from a staging
  folder now and then, so a killed driver can leave the newest checkpoint ahead of the rows, and
  resuming from it would leave a gap; the iterations after the chosen checkpoint run again. Where the
  killed driver's staging folder is still on this machine (``<ray temp>/session_*/artifacts/...``),
  its rows are *recovered* first (copied into the storage folder, the storage's own files kept as
  ``<file>.r3l-before-recovery``), and the gap does not arise.

Either way the trial's ``result.json``/``progress.csv`` already hold rows of iterations after the
checkpoint; Tune appends the re-run iterations after them, so an iteration appears twice.
:func:`set_aside_rows` moves those rows into ``<file>.r3l-redone`` beside the file before Tune resumes:
the files read in order again, and nothing is deleted. (TensorBoard's event files keep both runs of
an iteration: TensorBoard shows the later one.)

``resume_choices`` reads the state with Ray's own decoders (Ray 2.60's ``_TrainingRunMetadata``);
where it cannot, Tune resumes as it sees fit and nothing is changed.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from typing import Any, Dict, List, Optional, Sequence

from rllib_r3l import ray_internals
from rllib_r3l.cli.result_rows import (
    REDONE,
    _iterations_after,
    _json_rows,
    _row,
    recover_rows,
    set_aside_rows,
    staged_trial_dir,
)
from rllib_r3l.cli.storage import write_atomically
from rllib_r3l.errors import UsageError

STATE_GLOB = "experiment_state-*.json"


def fresh_run(name: Optional[str] = None) -> str:
    """What ``--new`` does, for the advice that names it (it trains nothing of the old run further)."""
    return (
        f"--new (a fresh run of the file from its base model at iteration 1, as {name or 'NAME'}_<date>-<time> "
        "beside this one, which stays as it is)"
    )


def checkpoint_dirs(trial_dir: str) -> List[str]:
    return sorted(c for c in glob.glob(os.path.join(trial_dir, "checkpoint_*")) if os.path.isdir(c))


def _state_file(exp_dir: str) -> Optional[str]:
    files = sorted(glob.glob(os.path.join(exp_dir, STATE_GLOB)))  # Tune reads the newest: max(name)
    return files[-1] if files else None


def _state_trials(exp_dir: str) -> List[tuple]:
    """``(index, trial dir, trial state, run metadata)`` per trial of Tune's newest state; [] when unreadable."""
    ray_internals.check_version()  # another Ray: a named error, not a resume that silently chooses nothing
    try:
        with open(_state_file(exp_dir) or "") as f:
            raw = json.load(f)
        out = []
        for i, (trial_json, meta_json) in enumerate(raw.get("trial_data", [])):
            trial = ray_internals.load_trial_state(trial_json)
            tdir = os.path.join(exp_dir, trial["storage"].trial_dir_name)
            out.append((i, tdir, trial, ray_internals.load_run_metadata(meta_json)))
        return out
    except Exception:  # noqa: BLE001 - no state yet, or a cut or damaged one (the Ray version is checked above)
        return []


def _recorded_trials(exp_dir: str) -> List[tuple]:
    """``(index, trial dir, status, run metadata)`` per trial of Tune's newest state; [] when unreadable."""
    return [(i, tdir, trial.get("status"), md) for i, tdir, trial, md in _state_trials(exp_dir)]


def saved_stops(exp_dir: str) -> Dict[str, Dict[str, Any]]:
    """Per trial folder name, the stop criteria Tune saved for it (what a resume keeps unless --stop changes
    them); {} when the state cannot be read."""
    return {
        os.path.basename(tdir): dict(trial.get("stopping_criterion") or {})
        for _i, tdir, trial, _md in _state_trials(exp_dir)
    }


def all_finished(exp_dir: str) -> bool:
    """Every trial Tune's saved state lists reached its stop criterion (TERMINATED; at least one)."""
    statuses = [status for _i, _t, status, _md in _recorded_trials(exp_dir)]
    return bool(statuses) and all(s == "TERMINATED" for s in statuses)


def saved_checkpoint_frequencies(exp_dir: str) -> set:
    """The checkpoint frequencies Tune saved for the experiment's trials (what a resume keeps)."""
    out = set()
    for _i, _t, _status, md in _recorded_trials(exp_dir):
        freq = getattr(
            getattr(getattr(md, "checkpoint_manager", None), "checkpoint_config", None), "checkpoint_frequency", None
        )
        if isinstance(freq, int):
            out.add(freq)
    return out


def _recorded(tdir: str, md) -> List[tuple]:
    """``(local path, result)`` of the checkpoints Tune recorded for a trial, oldest first."""
    results = ray_internals.checkpoint_results(md)
    results.sort(key=lambda r: (r.metrics or {}).get("training_iteration", 0))
    return [(os.path.join(tdir, os.path.basename(r.checkpoint.path.rstrip("/"))), r) for r in results]


def _iteration_of(path: str, recorded: Sequence[tuple]) -> Optional[int]:
    """The training iteration a checkpoint folder holds: Tune's record of it, else its own state file."""
    for p, r in recorded:
        if p == path:
            return (r.metrics or {}).get("training_iteration")
    from rllib_r3l.cli.export import checkpoint_iteration

    return checkpoint_iteration(path)


def resume_choices(exp_dir: str, finished: bool = False) -> List[Dict[str, Any]]:
    """Per trial a resume continues (not finished; with ``finished``, those too: a run extended to a new
    stop): ``trial``, ``from`` (the newest complete checkpoint,
    recorded or not; None: none), ``iteration``, ``skipped`` ([(path, why)] of its incomplete folders),
    ``rewind`` (Tune's recorded latest is incomplete), ``adopt`` (``from`` is complete but not in Tune's
    state), ``recover`` (a killed driver's staging folder with more rows than the storage's; None),
    ``last_index`` (the highest complete ``checkpoint_<index>``: Tune counts the index up *before* each
    save, Ray 2.60 ``Trainable.save``, so a saved index this high puts the next one past every complete
    checkpoint; an incomplete folder may be written over, as Tune does),
    ``redone`` (iterations after ``from`` that have rows), ``index`` (in the state's trial_data).
    :class:`UsageError` when a trial has checkpoint folders and none of them is complete."""
    from rllib_r3l.checkpoint_integrity import problem

    choices = []
    for index, tdir, status, md in _recorded_trials(exp_dir):
        if status == "TERMINATED" and not finished:  # finished trials are left as they are
            continue
        recorded, name = _recorded(tdir, md), os.path.basename(tdir)
        on_disk = checkpoint_dirs(tdir)
        why = {c: problem(c) for c in on_disk}  # one walk per folder (every file is read for its size/end)
        skipped = [(c, w) for c, w in why.items() if w]
        complete = [c for c, w in why.items() if w is None]
        with_it = [(it, c) for c in complete if (it := _iteration_of(c, recorded)) is not None]
        if (recorded or on_disk) and not with_it:
            raise UsageError(
                f"--resume: trial {name}: no checkpoint of it is complete ("
                + "; ".join(f"{os.path.basename(p)}: {why}" for p, why in skipped)
                + f"); start anew with {fresh_run()} (the rows stay in {tdir})"
            )
        staged = staged_trial_dir(exp_dir, name)
        rows = [it for _, it in _json_rows(staged or tdir) if it is not None]
        # a checkpoint past the last row the storage holds (its rows were still in the dead driver's staging
        # folder) would leave a gap in the rows: take the newest one the rows reach, and run the rest again
        in_rows = [(it, c) for it, c in with_it if rows and it <= max(rows)]
        iteration, path = max(in_rows or with_it) if with_it else (None, None)
        recorded_paths = [p for p, _ in recorded]
        choices.append(
            {
                "trial": name,
                "index": index,
                "from": path,
                "iteration": iteration,
                "skipped": skipped,
                "rewind": bool(recorded) and path in recorded_paths and recorded_paths[-1] != path,
                "adopt": path is not None and path not in recorded_paths,
                "recover": staged,
                "last_index": max((_folder_index(c) for c in complete), default=-1),
                "redone": _iterations_after(staged or tdir, iteration) if iteration is not None else [],
                # no row anywhere (a full disk before Tune wrote it, the staging folder gone)
                "rowless": sorted(set(range(1, (iteration or 0) + 1)) - set(rows)),
            }
        )
    return choices


def resume_notes(plan: Dict[str, Dict[str, Any]]) -> List[str]:
    """Per resumed trial: each incomplete checkpoint skipped, the checkpoint it continues from and why
    (where Tune's state did not point at it), and the iterations that run again."""
    lines = []
    for name, p in plan.items():
        if p.get("restored"):
            lines.append(f"{name}: {p['restored']}")
        for c in p.get("choices", []):
            at = f"{name} / {c['trial']}"
            lines += [f"{at}: skipping incomplete {os.path.basename(q)} ({why})" for q, why in c["skipped"]]
            if c.get("recover"):
                lines.append(
                    f"{at}: rows the driver had not copied to the storage folder (it was killed, or the disk "
                    f"filled) are recovered from its staging folder {c['recover']}"
                )
            if not c["from"]:
                continue
            why = (
                " (Tune's state pointed at an incomplete one: rewound)"
                if c["rewind"]
                else " (complete, but Tune's saved state does not list it: the run ended before Tune saved its "
                "state; added to it)"
                if c["adopt"]
                else ""
            )
            lines.append(f"{at}: resuming from {c['from']} (iteration {c['iteration']}){why}")
            if p.get("stops"):
                lines.append(f"{at}: training on until its new stop {p['stops'].get(c['trial'], p.get('stop'))}")
            if c.get("rowless"):
                lines.append(
                    f"{at}: iteration(s) {_span(c['rowless'])} have no row in result.json or progress.csv "
                    "(the disk filled before they were written): their training is in the checkpoint, "
                    "their metrics are lost"
                )
            if c["redone"]:
                lines.append(
                    f"{at}: iteration(s) {_span(c['redone'])} ran after that checkpoint and run again; "
                    f"their first rows are set aside in result.json{REDONE} and progress.csv{REDONE}"
                )
    return lines


def _span(its: Sequence[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3, 5"``."""
    runs: List[List[int]] = []
    for it in sorted(its):
        if runs and it == runs[-1][-1] + 1:
            runs[-1].append(it)
        else:
            runs.append([it])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


# --------------------------------------------------------------------------------------------------
# Pointing Tune's state at the chosen checkpoint; setting aside the rows that will be redone
# --------------------------------------------------------------------------------------------------
def point_tune_at(exp_dir: str, choices: Sequence[Dict[str, Any]]) -> None:
    """Make Tune's saved state of every trial that is ``rewind`` or ``adopt`` record ``from`` as its
    latest checkpoint (the complete recorded ones up to it stay recorded), and number each trial's next
    checkpoint past the folders on disk (:func:`_stale_index`); the state file before the
    change is kept as ``.r3l-before-resume-<name>`` (a name Tune does not read). Rows a killed driver
    left in its staging folder are recovered first; then the rows of the iterations each trial runs
    again are set aside."""
    from rllib_r3l.cli.result_rows import drop_cut_rows

    for c in choices:
        if c.get("recover"):
            recover_rows(c["recover"], os.path.join(exp_dir, c["trial"]))
        drop_cut_rows(os.path.join(exp_dir, c["trial"]))  # a full disk's cut row: the next one would join it
    todo = [c for c in choices if c["rewind"] or c["adopt"] or _stale_index(exp_dir, c)]
    if todo:
        _rewrite_state(exp_dir, todo)
    drop_pending_decisions(exp_dir)
    for c in choices:
        if c["from"] and c["redone"]:
            set_aside_rows(os.path.join(exp_dir, c["trial"]), c["iteration"])


def drop_pending_decisions(exp_dir: str) -> bool:
    """Clear the trial decisions Tune saved but had not carried out (a trial that failed while saving
    leaves ``{trial: STOP}`` in ``runner_data``): a resume applied that STOP after its first checkpoint,
    ending the trial TERMINATED short of its stop criterion, and every later ``--resume`` trained nothing
    True when the state was changed."""
    state = _state_file(exp_dir)
    if state is None:
        return False
    try:
        with open(state) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return False
    runner = raw.get("runner_data") if isinstance(raw, dict) else None
    keys = [
        k for k in ("_cached_trial_decisions", "_queued_trial_decisions") if isinstance(runner, dict) and runner.get(k)
    ]
    if not keys:
        return False
    for k in keys:
        runner[k] = {}
    write_atomically(state, json.dumps(raw))
    return True


def _rewrite_state(exp_dir: str, todo: Sequence[Dict[str, Any]]) -> None:
    from rllib_r3l.checkpoint_integrity import problem

    state = _state_file(exp_dir)
    with open(state) as f:
        raw = json.load(f)
    for c in todo:
        tdir = os.path.join(exp_dir, c["trial"])
        raw["trial_data"][c["index"]][0] = _with_next_index(raw["trial_data"][c["index"]][0], c["last_index"])
        if not (c["rewind"] or c["adopt"]):
            continue
        md = ray_internals.load_run_metadata(raw["trial_data"][c["index"]][1])
        keep = [
            (p, r)
            for p, r in _recorded(tdir, md)
            if problem(p) is None and (r.metrics or {}).get("training_iteration", 0) <= c["iteration"]
        ]
        chosen = next((r for p, r in keep if p == c["from"]), None)
        if chosen is None:  # adopt: a result Tune would have recorded, with the row of that iteration
            chosen = ray_internals.training_result(
                c["from"], _row(tdir, c["iteration"]) or {"training_iteration": c["iteration"]}
            )
            keep.append((c["from"], chosen))
        ray_internals.set_checkpoint_results(md, [r for _, r in keep], chosen)
        raw["trial_data"][c["index"]][1] = md.get_json_state()
    shutil.copy2(state, os.path.join(exp_dir, ".r3l-before-resume-" + os.path.basename(state)))
    write_atomically(state, json.dumps(raw))


def _folder_index(path: str) -> int:
    try:
        return int(os.path.basename(path).split("_")[-1])
    except ValueError:
        return -1


def _stale_index(exp_dir: str, c: Dict[str, Any]) -> bool:
    """Whether Tune's saved state would number the trial's next checkpoint as a folder that exists.
    Tune saves into ``checkpoint_<index>`` and counts the index in the trial's saved state; a state that
    lags the disk (a killed driver) makes the resumed trial write over a newer checkpoint, which
    ``num_to_keep`` then deletes as if it were old: a finished run could end with none."""
    ray_internals.check_version()
    try:
        with open(_state_file(exp_dir) or "") as f:
            trial = ray_internals.load_trial_state(json.load(f)["trial_data"][c["index"]][0])
        return trial["storage"].current_checkpoint_index < c["last_index"]
    except Exception:  # noqa: BLE001 - a cut or damaged state: left as Tune wrote it (the version is checked above)
        return False


def _with_next_index(trial_json: str, last_index: int) -> str:
    trial = ray_internals.load_trial_state(trial_json)
    storage = trial["storage"]
    storage.current_checkpoint_index = max(storage.current_checkpoint_index, last_index)
    return ray_internals.dump_trial_state(trial)


# --------------------------------------------------------------------------------------------------
# Rows a killed driver left in its staging folder (the row files themselves: ``result_rows``)
# --------------------------------------------------------------------------------------------------
def recover_staged_rows(exp_dir: str) -> List[str]:
    """Rows a killed driver left only in Ray's staging folder, copied into the storage's trial folders (before
    a refusal that says "the rows stay in <exp_dir>", so that they do); the trials they were found for."""
    found = []
    recorded = [tdir for _i, tdir, _status, _md in _recorded_trials(exp_dir)] or [  # no readable state: every folder
        d for d in sorted(glob.glob(os.path.join(exp_dir, "*"))) if os.path.isdir(d)
    ]
    for tdir in recorded:
        staged = staged_trial_dir(exp_dir, os.path.basename(tdir))
        if staged:
            recover_rows(staged, tdir)
            found.append(os.path.basename(tdir))
    return found
