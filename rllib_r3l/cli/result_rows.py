"""A trial's row files stay readable across interruptions: ``result.json`` and ``progress.csv``.

A full disk can cut the last row mid-line; a resumed run would append its next row onto it (the
iteration could no longer be read). Tune's CSV logger writes a resumed run's rows under the header of
the first run even when the results now carry more keys (RLlib's ``timers/synch_env_connectors``
after a restore), which shifts every value after the first new key. :func:`drop_cut_rows` sets the cut
tail aside before a resume; :func:`rebuild_progress_csv` writes ``progress.csv`` again from
``result.json`` (the union of the keys as its header) when its rows do not fit its header.

A resume that runs iterations again moves their first rows into ``<file>.r3l-redone``
(:func:`set_aside_rows`); rows a killed driver left only in Ray's staging folder are found
(:func:`staged_trial_dir`) and copied back (:func:`recover_rows`).

It also holds the one reader of a metric from a result row (:func:`get_metric`, nested or flattened) and
its number coercers (:func:`finite`, :func:`number`),
which the console, the retry chain, the outcome and the main job's ``summary.json`` share.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import math
import os
import re
import shutil
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from rllib_r3l.cli.storage import write_atomically

CUT = ".r3l-cut"  # suffix of a cut last row set aside
REDONE = ".r3l-redone"  # suffix of the rows set aside: iterations a resume runs again
ROW_FILES = ("result.json", "progress.csv")


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
            f.write(data[len(keep) :] + b"\n")
        write_atomically(path, keep)
        cut.append(name)
    return cut


def flat(
    d: Mapping[str, Any], sep: str = "/", leaf: Callable[[dict], bool] = lambda v: False, prefix: str = ""
) -> Dict[str, Any]:
    """Nested keys joined by ``sep`` (``{"a": {"b": 1}}`` -> ``{"a/b": 1}``); a dict ``leaf`` accepts is one value
    (a Tune search space); an empty one vanishes unless ``leaf`` accepts it. The one flattener: result rows, saved
    specs, params, search spaces."""
    out: Dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and not leaf(v):
            out.update(flat(v, sep, leaf, f"{prefix}{k}{sep}"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def rebuild_progress_csv(tdir: str) -> bool:
    """Rewrite ``progress.csv`` from ``result.json`` when it does not hold ``result.json``'s rows: a row with
    more fields than its header, or, with as many fields, columns in another order (Tune's CSV logger after a
    resume writes its own column order under the old header; after a second resume the field counts agree
    and ``training_iteration`` read 1.89...); True when it was rewritten."""
    path, parsed = os.path.join(tdir, "progress.csv"), parsed_rows(tdir)
    try:
        with open(path, newline="", errors="replace") as f:
            rows = list(csv.reader(f))
    except OSError:
        return False
    if parsed is None or not rows:
        return False
    if all(len(r) == len(rows[0]) for r in rows[1:]) and _iterations_agree(rows, parsed):
        return False
    # without "config", as Tune's CSV logger leaves it out
    flat_rows = [flat({k: v for k, v in row.items() if k != "config"}) for _, row in parsed if row is not None]
    header: Dict[str, None] = {}
    for r in flat_rows:
        header.update(dict.fromkeys(r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(header), restval="")
    writer.writeheader()
    writer.writerows(flat_rows)
    write_atomically(path, buf.getvalue())
    return True


def _iterations_agree(rows: List[List[str]], parsed: List[Tuple[str, Optional[Dict[str, Any]]]]) -> bool:
    """Whether the CSV's ``training_iteration`` column reads ``result.json``'s iterations, row by row."""
    header = rows[0]
    if "training_iteration" not in header:
        return not parsed
    col = header.index("training_iteration")
    want = [str(row.get("training_iteration")) for _, row in parsed if row is not None]
    return [r[col] if col < len(r) else None for r in rows[1:]] == want


# --------------------------------------------------------------------------------------------------
# The rows of a trial, by iteration; the rows a resume runs again, set aside
# --------------------------------------------------------------------------------------------------
def get_metric(result: Mapping[str, Any], path: str, default: Any = None) -> Any:
    """``result["a"]["b"]`` for ``path = "a/b"``, or the flattened key ``"a/b"`` (Tune's form), else ``default``.
    The one getter of a metric by path: the console, the retry chain, the outcome and summary.json use it."""
    node: Any = result
    for p in path.split("/"):
        if not isinstance(node, Mapping) or p not in node:
            return result.get(path, default) if isinstance(result, Mapping) else default
        node = node[p]
    return node


def finite(v: Any) -> bool:
    """A real number a result logged (not a bool, not NaN or infinite)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def number(v: Any, default: float = 0.0) -> float:
    """A metric as a float; ``default`` where it is absent, NaN (not logged this iteration) or not a number."""
    return float(v) if finite(v) else default


def nonblank_lines(path: str) -> List[str]:
    """The non-blank lines of a row file (undecodable bytes replaced); [] when it cannot be read."""
    try:
        with open(path, errors="replace") as f:
            return [line for line in f if line.strip()]
    except OSError:
        return []


def parsed_rows(tdir: str) -> Optional[List[Tuple[str, Optional[Dict[str, Any]]]]]:
    """Each non-blank line of the trial's ``result.json`` (undecodable bytes replaced) and its row: None where
    the line is no JSON object (cut by a full disk, or edited); None when the file cannot be read. The one
    parser of ``result.json``: the rebuild, the set-aside rows, ``report``'s reader and resume's checks."""
    try:
        with open(os.path.join(tdir, "result.json"), errors="replace") as f:
            lines = [line for line in f if line.strip()]
    except OSError:
        return None
    out = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        out.append((line, row if isinstance(row, dict) else None))
    return out


def _json_rows(tdir: str) -> List[Tuple[str, Optional[int]]]:
    """``(line, training_iteration)`` of ``result.json``; a line that does not parse has iteration None."""
    out = []
    for line, row in parsed_rows(tdir) or []:
        it = row.get("training_iteration") if row else None
        out.append((line, it if isinstance(it, int) else None))
    return out


def _row(tdir: str, iteration: int) -> Optional[Dict[str, Any]]:
    rows = [json.loads(line) for line, it in _json_rows(tdir) if it == iteration]
    return rows[-1] if rows else None


def _iterations_after(tdir: str, iteration: int) -> List[int]:
    return sorted({it for _, it in _json_rows(tdir) if it is not None and it > iteration})


def set_aside_rows(tdir: str, iteration: int) -> Dict[str, int]:
    """Move the rows of iterations after ``iteration`` out of ``result.json`` and ``progress.csv`` into
    ``<file>.r3l-redone`` (appended: a second resume adds to them). Returns rows moved per file."""
    moved = {}
    rows = _json_rows(tdir)
    if rows:
        keep = [line for line, it in rows if it is None or it <= iteration]
        moved["result.json"] = _split(
            os.path.join(tdir, "result.json"),
            "".join(keep),
            "".join(line for line, it in rows if it is not None and it > iteration),
        )
    path = os.path.join(tdir, "progress.csv")
    if os.path.isfile(path):
        with open(path, newline="", errors="replace") as f:
            table = list(csv.reader(f))
        if table and "training_iteration" in table[0]:
            col = table[0].index("training_iteration")

            def later(r: List[str]) -> bool:
                try:
                    return int(float(r[col])) > iteration
                except (IndexError, ValueError):
                    return False

            moved["progress.csv"] = _split(
                path,
                _csv([table[0]] + [r for r in table[1:] if not later(r)]),
                _csv([table[0]] + [r for r in table[1:] if later(r)]),
                header=True,
            )
    return {k: n for k, n in moved.items() if n}


def _csv(rows: List[List[str]]) -> str:
    import io

    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    return buf.getvalue()


def _split(path: str, keep: str, redone: str, header: bool = False) -> int:
    """Append ``redone`` to ``path + REDONE`` (fsynced), then replace ``path`` by ``keep``; the rows moved."""
    n = redone.count("\n") - (1 if header else 0)
    if n <= 0:
        return 0
    aside = path + REDONE
    if header and os.path.isfile(aside) and os.path.getsize(aside) > 0:
        redone = redone.split("\n", 1)[1]  # the file has the header already
    with open(aside, "a") as f:
        f.write(redone)
        f.flush()
        os.fsync(f.fileno())
    write_atomically(path, keep)
    return n


# --------------------------------------------------------------------------------------------------
# Rows a killed driver left in its staging folder
# --------------------------------------------------------------------------------------------------
def staged_trial_dir(exp_dir: str, trial: str) -> Optional[str]:
    """The staging folder of ``trial`` (Tune writes rows there, then copies them to the storage folder
    now and then) whose ``result.json`` holds more iterations than the storage's and starts with them;
    None when there is none on this machine (another node, a cleaned ``/tmp``)."""
    from rllib_r3l import ray_internals

    root = ray_internals.ray_temp_dir()  # another Ray: RayInternalsError, not rows silently left behind
    exp = os.path.basename(os.path.normpath(exp_dir))
    stored = [it for _, it in _json_rows(os.path.join(exp_dir, trial))]
    while stored and stored[-1] is None:  # a last row cut short (a full disk): the staged copy is whole
        stored.pop()
    best, most = None, len(stored)
    for f in glob.glob(
        os.path.join(root, "session_*", "artifacts", "*", exp, "driver_artifacts", trial, "result.json")
    ):
        d = os.path.realpath(os.path.dirname(f))  # not via session_latest: it moves to the resuming session
        if not _staged_for(os.path.dirname(d), exp_dir):
            continue
        its = [it for _, it in _json_rows(d)]
        if len(its) > most and its[: len(stored)] == stored:
            best, most = d, len(its)
    return best


def _staged_for(driver_artifacts: str, exp_dir: str) -> bool:
    """Whether a staging folder may belong to the experiment stored in ``exp_dir``. A copy of the
    experiment resumed under another storage path has the same names, and its rows must not be taken for
    the original's. Tune's state there records its storage path: a folder is ruled out only when that is another
    path and the experiment is still there (a moved experiment keeps its staged rows)."""
    here = {os.path.dirname(os.path.abspath(exp_dir)), os.path.dirname(os.path.realpath(exp_dir))}
    name = os.path.basename(os.path.normpath(exp_dir))
    # the newest state is the one the session that staged these rows wrote: a resume copies the experiment's
    # older states in beside it (so a copy's staging folder holds the original's state too)
    states = sorted(glob.glob(os.path.join(driver_artifacts, "experiment_state-*.json")))
    recorded = set()
    try:
        with open(states[-1], "rb") as fh:
            recorded = recorded_storage_paths(fh.read())
    except (IndexError, OSError):
        pass
    if not recorded or recorded & here:
        return True
    return not any(os.path.isdir(os.path.join(r, name)) for r in recorded)


def recorded_storage_paths(state: bytes) -> set:
    """The ``storage_fs_path`` values in a Tune experiment state (each trial's StorageContext is pickled and
    hex-encoded in it): the str that follows the key, read by pickle's length-prefixed string opcodes."""
    raw = b"".join(bytes.fromhex(m.decode()) for m in re.findall(rb"(?:[0-9a-f]{2}){32,}", state))
    found = set()
    for m in re.finditer(rb"storage_fs_path\x94?", raw):
        i = m.end()
        sizes = {0x8C: 1, ord("X"): 4, 0x8D: 8}  # SHORT_BINUNICODE, BINUNICODE, BINUNICODE8
        if i >= len(raw) or raw[i] not in sizes:
            continue
        n = sizes[raw[i]]
        length = int.from_bytes(raw[i + 1 : i + 1 + n], "little")
        try:
            found.add(raw[i + 1 + n : i + 1 + n + length].decode())
        except UnicodeDecodeError:
            continue
    return found


def rows_only_staged(trial_dir: str) -> int:
    """How many more result rows of the trial Ray's staging folder holds than its storage folder (a driver
    that died before Tune copied them, a full disk): what ``--resume`` copies back; 0 when none."""
    trial_dir = os.path.normpath(trial_dir)
    staged = staged_trial_dir(os.path.dirname(trial_dir), os.path.basename(trial_dir))
    if staged is None:
        return 0
    stored = [it for _, it in _json_rows(trial_dir) if it is not None]
    return len([it for _, it in _json_rows(staged) if it is not None]) - len(stored)


def recover_rows(staged: str, tdir: str) -> None:
    """Copy the row files (and ``params.*`` where missing) of a staging folder into the storage's trial
    folder; the storage's own row files are kept as ``<file>.r3l-before-recovery``."""
    os.makedirs(tdir, exist_ok=True)
    for name in ROW_FILES + ("params.json", "params.pkl"):
        src, dst = os.path.join(staged, name), os.path.join(tdir, name)
        if not os.path.isfile(src) or (name.startswith("params") and os.path.isfile(dst)):
            continue
        if os.path.isfile(dst):
            shutil.copy2(dst, dst + ".r3l-before-recovery")
        write_atomically(dst, lambda tmp, src=src: shutil.copy2(src, tmp))  # copy2: the rows keep their mtime


def read_rows(tdir: str, live: bool = False) -> Tuple[List[Dict[str, Any]], List[str]]:
    """The trial's results, oldest first, and a note for each damage found (else a cut or missing
    ``result.json`` makes ``report`` show fewer iterations and INTERRUPTED, without a word).

    ``result.json``'s rows (nested keys joined with ``/``), plus ``progress.csv``'s rows of the
    iterations ``result.json`` lacks. A live trial (``live``) may be writing its last line: that one is
    no damage."""
    rows: Dict[float, Dict[str, Any]] = {}
    notes: List[str] = []
    parsed = parsed_rows(tdir)
    bad = 0
    for i, (line, row) in enumerate(parsed or []):
        it = row.get("training_iteration") if row else None
        if isinstance(it, bool) or not isinstance(it, (int, float)):
            # a live trial's last line without its newline is being written: no damage
            bad += not (live and i == len(parsed) - 1 and not line.endswith("\n"))
            continue
        rows[it] = flat(row)
    if not parsed:
        notes.append("result.json is " + ("missing" if parsed is None else "empty"))
    elif bad:
        notes.append(f"result.json has {bad} unreadable line(s) (cut by a full disk, or edited)")
    from_csv = []
    try:
        with open(os.path.join(tdir, "progress.csv"), newline="", errors="replace") as f:
            for rec in csv.DictReader(f):
                it = _number(rec.get("training_iteration"))
                if isinstance(it, (int, float)) and it not in rows:  # a damaged row is left out
                    rows[it] = {k: _number(v) if k != "done" else v == "True" for k, v in rec.items() if k}
                    from_csv.append(int(it))
    except (OSError, csv.Error, UnicodeDecodeError):
        pass
    if from_csv:
        notes.append(f"iteration(s) {', '.join(map(str, sorted(from_csv)))} taken from progress.csv")
    elif notes and not rows:
        notes.append("progress.csv has no rows either: the table has no metrics of this trial")
    return [rows[it] for it in sorted(rows)], notes


def _number(value: Optional[str]) -> Any:
    """A CSV cell as a number where it is one (Tune writes numbers with ``repr``), else the text."""
    if value is None or value == "":
        return None
    try:
        f = float(value)
    except ValueError:
        return value
    return int(f) if f.is_integer() and "." not in value and "e" not in value.lower() else f
