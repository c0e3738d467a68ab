"""Why a trial failed, in one line, from Ray's ``error.txt``.

Tune reports a failed trial as ``ERROR`` plus the path of a file holding the traceback; the
project's own message (``R3LConfig.<field>: ...``, "the tokenizer has no chat_template ...") is its
last exception line. ``rllib-r3l train`` prints that line on the console so the reason is not one
file away.
"""

from __future__ import annotations

import os
import re
from typing import Optional

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# an exception line of a traceback: "ValueError: ...", "ray.exceptions.RayTaskError(ValueError): ..."
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(\([\w.]+\))?: \S")
MAX_CHARS = 400


def reason_from_text(text: str) -> Optional[str]:
    """The last exception line (with its unindented continuation lines, joined), or None."""
    lines = [_ANSI.sub("", line.rstrip()) for line in (text or "").splitlines()]
    starts = [i for i, line in enumerate(lines) if _EXCEPTION.match(line) and not line.startswith("ray::")]
    if not starts:
        return None
    i = starts[-1]
    parts = [lines[i]]
    for line in lines[i + 1 :]:  # a message over several lines ends where the next traceback block starts
        if not line.strip() or line.startswith(("Traceback", "During handling", "The above exception")):
            break
        parts.append(line.strip())
    reason = " ".join(" ".join(parts).split())
    return reason if len(reason) <= MAX_CHARS else reason[: MAX_CHARS - 3] + "..."


def disk_full_advice(reason: Optional[str], folder: Optional[str]) -> Optional[str]:
    """What to do when ``reason`` is a full disk (errno 28): the folder, its free bytes, and the resume."""
    if not reason or not ("No space left on device" in reason or "Errno 28" in reason):
        return None
    free = ""
    if folder:
        import shutil

        d = folder
        while d and not os.path.isdir(d):
            d = os.path.dirname(d)
        try:
            free = f" ({shutil.disk_usage(d).free / 1e6:.0f} MB free on its disk now)"
        except OSError:
            pass
    return (
        f"the disk of {folder}{free} is full; free space (or move the experiment), then continue with "
        "--resume: it takes the newest complete checkpoint and skips the one cut short"
    )


def trial_reason(error_file: Optional[str], trial_dir: Optional[str] = None) -> Optional[str]:
    """The reason from ``error_file`` (Ray's copy) or ``trial_dir/error.txt``; None when neither reads."""
    for path in (error_file, os.path.join(trial_dir, "error.txt") if trial_dir else None):
        if not path:
            continue
        try:
            with open(path, errors="replace") as f:
                reason = reason_from_text(f.read())
        except OSError:
            continue
        if reason:
            return reason
    return None
