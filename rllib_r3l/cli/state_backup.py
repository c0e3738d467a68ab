"""Tune's experiment state, kept whole: a full disk can cut ``experiment_state-*.json`` mid-write.

Tune copies its experiment state into the storage folder now and then, not atomically; a disk that
fills up can leave the file cut short, and Tune then takes the experiment for one that never started
(``--resume`` began a new trial from iteration 1 with the file's own stop and settings, and the cut
trial's rows stayed in Ray's staging folder). :class:`StateBackup` keeps a copy of the last state that
parsed (written aside, renamed into place: a full disk keeps the previous copy); ``--resume`` puts it
back in place of a cut one (:func:`restore`), or refuses in one line where there is none.

Tune's search-algorithm state (``basic-variant-state-*.json``) is kept the same way: :data:`KINDS` holds
the two kinds of file (Tune's glob, the copy's prefix, how a whole file is told from a cut one, the notes),
and every function here goes over both.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
from typing import Callable, NamedTuple, Optional

from ray.tune import Callback

from rllib_r3l.cli.resume_from import STATE_GLOB
from rllib_r3l.cli.storage import write_atomically
from rllib_r3l.errors import UsageError

PREFIX = ".r3l-backup-"  # not matched by Tune's experiment_state-*.json
DAMAGED = ".r3l-damaged"
# Tune's search-algorithm state beside it (a pickle despite the name), kept too: a cut one makes Tune print
# an UnpicklingError, "Restarting experiment", and run a NEW trial with the file's own stop and settings
# beside the old one, exit 0
SEARCH_GLOB = "basic-variant-state-*.json"
SEARCH_PREFIX = ".r3l-search-backup-"  # not matched by PREFIX's glob, nor by Tune's


def _json_whole(data: bytes) -> bool:
    try:
        json.loads(data)
        return True
    except ValueError:
        return False


class _Kind(NamedTuple):
    """One of Tune's saved files that R3L keeps a copy of: the two differ only in these."""

    pattern: str  # Tune's files (it reads the newest: max(name))
    prefix: str  # R3L's copy: PREFIX + the file's name
    whole: Callable[[bytes], bool]  # whether the bytes are a whole file, not one a full disk cut
    detail: str  # what :func:`problem` says after the size
    cut_note: str  # :func:`restore`'s note for a cut file put back
    missing_note: Optional[str]  # its note for a missing file put back; None: a missing one is left missing


KINDS = (
    _Kind(
        STATE_GLOB,
        PREFIX,
        _json_whole,
        ", not valid JSON",
        "Tune's saved state {cut} was cut short (set aside as {cut}" + DAMAGED + "); resuming from R3L's copy "
        "of the last whole one ({name})",
        "Tune's saved state was missing; resuming from R3L's copy of the last whole one ({name})",
    ),
    # pickle's STOP opcode ends every pickle: a file cut short almost never ends on it
    _Kind(
        SEARCH_GLOB,
        SEARCH_PREFIX,
        lambda data: data.endswith(b"."),
        "",
        "Tune's search state {cut} was cut short; resuming from R3L's copy ({name})",
        None,
    ),
)


def _newest(exp_dir: str, pattern: str) -> Optional[str]:
    files = sorted(glob.glob(os.path.join(exp_dir, pattern)))  # Tune reads the newest: max(name)
    return files[-1] if files else None


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _whole(path: str, kind: _Kind) -> bool:
    data = _read(path)
    return data is not None and kind.whole(data)


def problem(exp_dir: str) -> Optional[str]:
    """Why Tune's newest saved state (or search-algorithm state) in ``exp_dir`` cannot be read, or None (also
    when there is none)."""
    for kind in KINDS:
        cut = _newest(exp_dir, kind.pattern)
        if cut is not None and not _whole(cut, kind):
            return f"{os.path.basename(cut)} is cut short ({os.path.getsize(cut)} bytes{kind.detail}: a full disk?)"
    return None


def save(exp_dir: str) -> None:
    """Copy Tune's newest state and search-algorithm state to ``<prefix><name>`` each, when whole (aside, then
    renamed; one copy per kind, the newest). The bytes checked are the bytes written: Tune may be rewriting it."""
    for kind in KINDS:
        src = _newest(exp_dir, kind.pattern)
        data = _read(src) if src else None
        if data is None or not kind.whole(data):
            continue
        dst = os.path.join(exp_dir, kind.prefix + os.path.basename(src))
        try:
            write_atomically(dst, data)
            for old in glob.glob(os.path.join(exp_dir, kind.prefix + kind.pattern)):
                if old != dst:
                    os.remove(old)
        except OSError:  # a full disk: the previous copy stays
            pass


def restore(exp_dir: str) -> Optional[str]:
    """Put the kept copies in place of a cut newest state or search state, or of a state that is gone (set
    aside by an earlier resume that the full disk kept from putting the copy back); a note for the console,
    or None when there is nothing to restore (the files are whole, or no copy is). :class:`UsageError` when a
    copy cannot be written (the disk still full): the files stay as they were."""
    notes = []
    for kind in KINDS:
        cut = _newest(exp_dir, kind.pattern)
        if (cut is None and kind.missing_note is None) or (cut is not None and _whole(cut, kind)):
            continue
        name = _put_back(exp_dir, cut, kind)
        if name is not None:
            note = kind.missing_note if cut is None else kind.cut_note
            notes.append(note.format(cut=os.path.basename(cut or ""), name=name))
    return "; ".join(notes) or None


def _put_back(exp_dir: str, cut: Optional[str], kind: _Kind) -> Optional[str]:
    """Put the newest whole copy in place under its name without the prefix, then set
    the cut file (None: there is none) aside as ``DAMAGED`` (kept for inspection, no longer read by Tune);
    that name, or None when there is no whole copy. The copy is written first: a disk still full
    (were the state set aside first and the copy then failed, the next resume would find no state at all)
    raises :class:`UsageError` and changes nothing."""
    copies = [c for c in sorted(glob.glob(os.path.join(exp_dir, kind.prefix + kind.pattern))) if _whole(c, kind)]
    if not copies:
        return None
    name = os.path.basename(copies[-1])[len(kind.prefix) :]
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


class StateBackup(Callback):
    """After every result: keep a copy of the experiment's last whole Tune state."""

    def __init__(self, exp_dir: str) -> None:
        self.exp_dir = exp_dir
        self._seen = None  # (name, mtime, size) of the state last copied: a grid's results do not copy it again

    def _save(self) -> None:
        state = _newest(self.exp_dir, STATE_GLOB)
        try:
            key = (state, os.path.getmtime(state), os.path.getsize(state)) if state else None
        except OSError:
            return
        if key is not None and key != self._seen:
            save(self.exp_dir)
            self._seen = key

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self._save()

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info) -> None:
        self._save()
