"""Tune's experiment state, kept whole: a full disk can cut ``experiment_state-*.json`` mid-write.

Tune copies its experiment state into the storage folder now and then, not atomically; a disk that
fills up can leave the file cut short, and Tune then takes the experiment for one that never started
(``--resume`` began a new trial from iteration 1 with the file's own stop and settings, and the cut
trial's rows stayed in Ray's staging folder). :class:`StateBackup` keeps a copy of the last state that
parsed (written aside, renamed into place: a full disk keeps the previous copy); ``--resume`` puts it
back in place of a cut one (:func:`restore`), or refuses in one line where there is none.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
from typing import Optional

from ray.tune import Callback

from rllib_r3l.cli.resume_from import STATE_GLOB
from rllib_r3l.cli.storage import write_atomically
from rllib_r3l.errors import UsageError

PREFIX = ".r3l-backup-"  # not matched by Tune's experiment_state-*.json
DAMAGED = ".r3l-damaged"


def _newest_state(exp_dir: str) -> Optional[str]:
    files = sorted(glob.glob(os.path.join(exp_dir, STATE_GLOB)))  # Tune reads the newest: max(name)
    return files[-1] if files else None


def _parses(path: str) -> bool:
    try:
        with open(path) as f:
            json.load(f)
        return True
    except (OSError, ValueError):
        return False


def problem(exp_dir: str) -> Optional[str]:
    """Why Tune's newest saved state in ``exp_dir`` cannot be read, or None (also when there is none)."""
    state = _newest_state(exp_dir)
    if state is None or _parses(state):
        return None
    return f"{os.path.basename(state)} is cut short ({os.path.getsize(state)} bytes, not valid JSON: a full disk?)"


def save(exp_dir: str) -> None:
    """Copy Tune's newest state to ``PREFIX<name>`` when it parses (aside, then renamed)."""
    state = _newest_state(exp_dir)
    if state is None:
        return
    try:
        with open(state) as f:
            text = f.read()
        json.loads(text)
        dst = os.path.join(exp_dir, PREFIX + os.path.basename(state))
        write_atomically(dst, text)
        for old in glob.glob(os.path.join(exp_dir, PREFIX + "*.json")):  # one copy: the newest state's
            if old != dst:
                os.remove(old)
    except (OSError, ValueError):  # a full disk or a state being written: the previous copy stays
        pass


def restore(exp_dir: str) -> Optional[str]:
    """Put the kept copy in place of a cut newest state, or of one that is gone (set aside by an earlier
    resume that the full disk kept from putting the copy back); a note for the console, or None when there
    is nothing to restore (the state is whole, or no copy parses). :class:`UsageError` when the copy cannot
    be written (the disk still full): the files stay as they were."""
    state = _newest_state(exp_dir)
    if state is not None and _parses(state):
        return None
    name = _put_back(exp_dir, state, PREFIX, STATE_GLOB, _parses)
    if name is None:
        return None
    if state is None:
        return f"Tune's saved state was missing; resuming from R3L's copy of the last whole one ({name})"
    return (
        f"Tune's saved state {os.path.basename(state)} was cut short (set aside as "
        f"{os.path.basename(state)}{DAMAGED}); resuming from R3L's copy of the last whole one ({name})"
    )


# Tune's search-algorithm state beside it (a pickle despite the name), kept too: a cut one makes Tune print
# an UnpicklingError, "Restarting experiment", and run a NEW trial with the file's own stop and settings
# beside the old one, exit 0
SEARCH_GLOB = "basic-variant-state-*.json"
SEARCH_PREFIX = ".r3l-search-backup-"  # not matched by PREFIX's glob, nor by Tune's


def _newest_search(exp_dir: str) -> Optional[str]:
    files = sorted(glob.glob(os.path.join(exp_dir, SEARCH_GLOB)))
    return files[-1] if files else None


def _put_back(exp_dir: str, cut: Optional[str], prefix: str, pattern: str, whole) -> Optional[str]:
    """Put the newest whole copy (``prefix + pattern``) in place under its name without ``prefix``, then set
    the cut file (None: there is none) aside as ``DAMAGED`` (kept for inspection, no longer read by Tune);
    that name, or None when there is no whole copy. The copy is written first: a disk still full
    (were the state set aside first and the copy then failed, the next resume would find no state at all)
    raises :class:`UsageError` and changes nothing."""
    copies = [c for c in sorted(glob.glob(os.path.join(exp_dir, prefix + pattern))) if whole(c)]
    if not copies:
        return None
    name = os.path.basename(copies[-1])[len(prefix) :]
    dst = os.path.join(exp_dir, name)
    linked = False
    if cut is not None and os.path.abspath(cut) == os.path.abspath(dst):  # written over: keep the cut one by a link
        with contextlib.suppress(OSError):
            if os.path.lexists(cut + DAMAGED):
                os.remove(cut + DAMAGED)
            os.link(cut, cut + DAMAGED)
            linked = True
    try:
        write_atomically(dst, lambda tmp: shutil.copyfile(copies[-1], tmp))
    except OSError as e:
        if linked:
            with contextlib.suppress(OSError):
                os.remove(cut + DAMAGED)
        raise UsageError(
            f"--resume: {os.path.basename(cut or dst)} in {exp_dir} must be put back from R3L's copy "
            f"{os.path.basename(copies[-1])}, but it cannot be written ({e.strerror or e}); free "
            "space there and run the same --resume again (nothing was changed)"
        ) from None
    if cut is not None and os.path.abspath(cut) != os.path.abspath(dst):
        os.replace(cut, cut + DAMAGED)
    return name


def _whole_pickle(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"."  # pickle's STOP opcode: a file cut short almost never ends on it
    except OSError:
        return False


def save_search(exp_dir: str) -> None:
    """Copy Tune's newest search-algorithm state aside when it is whole (one copy, the newest)."""
    src = _newest_search(exp_dir)
    if src is None or not _whole_pickle(src):
        return
    dst = os.path.join(exp_dir, SEARCH_PREFIX + os.path.basename(src))
    try:
        write_atomically(dst, lambda tmp: shutil.copyfile(src, tmp))
        for old in glob.glob(os.path.join(exp_dir, SEARCH_PREFIX + "*")):
            if old != dst:
                os.remove(old)
    except OSError:  # a full disk: the previous copy stays
        pass


def restore_search(exp_dir: str) -> Optional[str]:
    """Put the kept copy in place of a cut search-algorithm state; a note for the console, or None."""
    cut = _newest_search(exp_dir)
    if cut is None or _whole_pickle(cut):
        return None
    name = _put_back(exp_dir, cut, SEARCH_PREFIX, SEARCH_GLOB, _whole_pickle)
    if name is None:
        return None
    return f"Tune's search state {os.path.basename(cut)} was cut short; resuming from R3L's copy ({name})"


def search_problem(exp_dir: str) -> Optional[str]:
    """Why Tune's newest search-algorithm state cannot be read (cut, no copy to restore), or None."""
    cut = _newest_search(exp_dir)
    if cut is None or _whole_pickle(cut):
        return None
    return f"{os.path.basename(cut)} is cut short ({os.path.getsize(cut)} bytes: a full disk?)"


class StateBackup(Callback):
    """After every result: keep a copy of the experiment's last whole Tune state."""

    def __init__(self, exp_dir: str) -> None:
        self.exp_dir = exp_dir
        self._seen = None  # (name, mtime, size) of the state last copied: a grid's results do not copy it again

    def _save(self) -> None:
        state = _newest_state(self.exp_dir)
        try:
            key = (state, os.path.getmtime(state), os.path.getsize(state)) if state else None
        except OSError:
            return
        if key is not None and key != self._seen:
            save(self.exp_dir)
            save_search(self.exp_dir)
            self._seen = key

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self._save()

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info) -> None:
        self._save()
