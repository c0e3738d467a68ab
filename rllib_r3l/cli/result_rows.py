"""A trial's row files stay readable across interruptions: ``result.json`` and ``progress.csv``.

A full disk can cut the last row mid-line; a resumed run would append its next row onto it (the
iteration could no longer be read). Tune's CSV logger writes a resumed run's rows under the header of
the first run even when the results now carry more keys (RLlib's ``timers/synch_env_connectors``
after a restore), which shifts every value after the first new key. :func:`drop_cut_rows` sets the cut
tail aside before a resume; :func:`rebuild_progress_csv` writes ``progress.csv`` again from
``result.json`` (the union of the keys as its header) when its rows do not fit its header.
"""

from __future__ import annotations

import csv
import io
import json
import os
from typing import Any, Dict, List, Optional

from rllib_r3l.cli.storage import write_atomically

CUT = ".r3l-cut"  # suffix of a cut last row set aside


def drop_cut_rows(tdir: str) -> List[str]:
    """Set aside the unterminated last line of each row file (into ``<file>.r3l-cut``); the files cut."""
    cut = []
    for name in ("result.json", "progress.csv"):
        path = os.path.join(tdir, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        if not data or data.endswith(b"\n"):
            continue
        keep = data[: data.rfind(b"\n") + 1]
        with open(path + CUT, "ab") as f:
            f.write(data[len(keep):] + b"\n")
        with open(path + ".tmp", "wb") as f:
            f.write(keep)
        os.replace(path + ".tmp", path)
        cut.append(name)
    return cut


def _flat(d: Dict[str, Any], prefix: str = "", out: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    out = {} if out is None else out
    for k, v in d.items():
        if isinstance(v, dict):
            _flat(v, f"{prefix}{k}/", out)
        else:
            out[f"{prefix}{k}"] = v
    return out


def rebuild_progress_csv(tdir: str) -> bool:
    """Rewrite ``progress.csv`` from ``result.json`` when a row of it has more fields than its header
    (Tune's logger after a resume); True when it was rewritten."""
    path, results = os.path.join(tdir, "progress.csv"), os.path.join(tdir, "result.json")
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        with open(results) as f:
            lines = [line for line in f if line.strip()]
    except OSError:
        return False
    if not rows or all(len(r) == len(rows[0]) for r in rows[1:]):
        return False
    flat = []
    for line in lines:
        try:
            row = json.loads(line)
            row.pop("config", None)  # as Tune's CSV logger leaves it out
            flat.append(_flat(row))
        except (ValueError, AttributeError):
            continue
    header: Dict[str, None] = {}
    for r in flat:
        header.update(dict.fromkeys(r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(header), restval="")
    writer.writeheader()
    writer.writerows(flat)
    write_atomically(path, buf.getvalue())
    return True
