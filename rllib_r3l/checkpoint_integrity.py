"""Complete checkpoints only: written aside and renamed into place, checked before anything resumes from one.

RLlib's ``Checkpointable.save_to_path`` (ray/rllib/utils/checkpoints.py, Ray 2.60) writes straight into
the folder it is given: the metadata file first (``rllib_checkpoint.json`` / ``metadata.json``), then
each component's folder, then the top-level state file (``algorithm_state.pkl``) last. A crash or a full
disk in between leaves a folder that looks like a checkpoint and cannot be restored. So:

* the main job saves into ``checkpoint.partial`` beside ``checkpoint``, writes :data:`MARKER` (every
  file with its size, the iteration) last and fsyncs, then renames the old ``checkpoint`` to
  ``checkpoint.previous``, the new one into place, and removes the old one (:func:`save_atomically`):
  at every instant one complete checkpoint is on disk;
* :func:`problem` says why a folder is not a complete checkpoint (its marker's files missing or of
  another size; without a marker, RLlib's own structure: each component's metadata JSON, the state
  and constructor files it names, no empty file, every pickle ending on pickle's STOP opcode), and
  :func:`newest_complete` picks the newest complete one of several and names the ones it skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

MARKER = "r3l_checkpoint.json"  # written last: the files and sizes of a complete checkpoint
ROOT_METADATA = "rllib_checkpoint.json"  # Algorithm.METADATA_FILE_NAME
COMPONENT_METADATA = "metadata.json"  # Checkpointable.METADATA_FILE_NAME
PARTIAL, PREVIOUS = ".partial", ".previous"
_PICKLE_STOP = b"."  # every pickle ends with the STOP opcode; a truncated one almost never does


def _files(root: str) -> List[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def _read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def _marker_problem(root: str) -> Optional[str]:
    try:
        files = _read_json(os.path.join(root, MARKER))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{MARKER}: unreadable"
    for rel, size in sorted(files.items()):
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            return f"{rel}: missing"
        if os.path.getsize(path) != size:
            return f"{rel}: {os.path.getsize(path)} bytes, {size} were written"
    return None


def _last_byte(path: str) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)


def _structure_problem(root: str) -> Optional[str]:
    """RLlib's layout: every folder is a Checkpointable with its metadata, constructor and state files."""
    if not os.path.isfile(os.path.join(root, ROOT_METADATA)):
        return f"{ROOT_METADATA}: missing"
    if not os.path.isdir(os.path.join(root, "learner_group")):
        return "learner_group/: missing"
    for d, _dirs, names in os.walk(root):
        rel = os.path.relpath(d, root)
        at = "" if rel == "." else rel + "/"
        for n in sorted(names):
            p = os.path.join(d, n)
            if os.path.getsize(p) == 0:
                return f"{at}{n}: empty file"
            if n.endswith(".pkl") and _last_byte(p) != _PICKLE_STOP:
                return f"{at}{n}: truncated (no pickle end)"
        meta_name = ROOT_METADATA if rel == "." else COMPONENT_METADATA
        try:
            meta = _read_json(os.path.join(d, meta_name))
        except OSError:
            return f"{at}{meta_name}: missing"
        except ValueError:
            return f"{at}{meta_name}: not valid JSON"
        state = meta.get("state_file") if isinstance(meta, dict) else None
        if state and not any(os.path.isfile(os.path.join(d, state + ext)) for ext in (".pkl", ".msgpack")):
            return f"{at}{state}.pkl: missing"
        ctor = meta.get("class_and_ctor_args_file") if isinstance(meta, dict) else None
        if ctor and not os.path.isfile(os.path.join(d, ctor)):
            return f"{at}{ctor}: missing"
    return None


SMALL_STATE = 1 << 16  # a module's weights are never this small: such a module_state.pkl is read and checked


def _content_problem(root: str) -> Optional[str]:
    """Whole files with the wrong content (a pickled ``{}`` written over ``algorithm_state.pkl``
    restores as iteration 0; over a module's ``module_state.pkl`` it passes ``--resume --dry-run``, then
    the trial fails): the algorithm state must hold its iteration, each module's state some weights.
    Only small files are unpickled (the algorithm state is kilobytes; weights are not read)."""
    import pickle

    def small_pickle(p: str) -> Any:
        with open(p, "rb") as f:
            return pickle.load(f)

    top = os.path.join(root, "algorithm_state.pkl")
    if os.path.isfile(top):
        try:
            state = small_pickle(top)
        except Exception as e:  # noqa: BLE001 - any failure to read it is the finding
            return f"algorithm_state.pkl: cannot be read ({type(e).__name__})"
        if not isinstance(state, dict) or "training_iteration" not in state:
            return "algorithm_state.pkl: holds no training_iteration (not the state R3L saved)"
    for d, _dirs, names in os.walk(root):
        p = os.path.join(d, "module_state.pkl")
        # rl_module/<module id>/module_state.pkl holds a module's weights (rl_module/module_state.pkl is {})
        if (
            "module_state.pkl" in names
            and os.path.basename(os.path.dirname(d)) == "rl_module"
            and os.path.getsize(p) < SMALL_STATE
        ):
            try:
                weights = small_pickle(p)
            except Exception as e:  # noqa: BLE001
                return f"{os.path.relpath(p, root)}: cannot be read ({type(e).__name__})"
            if not weights:
                return f"{os.path.relpath(p, root)}: holds no weights ({os.path.getsize(p)} bytes)"
    return None


def problem(path: str) -> Optional[str]:
    """None for a complete checkpoint folder, else why not, in a few words (the file and what is wrong)."""
    if not os.path.isdir(path):
        return "missing" if not os.path.exists(path) else "not a directory"
    if os.path.isfile(os.path.join(path, MARKER)):
        found = _marker_problem(path)
        if found:
            return found
    return _structure_problem(path) or _content_problem(path)


def is_complete(path: str) -> bool:
    return problem(path) is None


def marker(path: str) -> dict:
    """The checkpoint's marker (``iteration``, ``saved_at``, ``files``); {} without one."""
    try:
        data = _read_json(os.path.join(path, MARKER))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_marker(path: str, iteration: Optional[int]) -> None:
    """Fsync every file of the finished folder ``path``, then write and fsync :data:`MARKER` (last)."""
    files = {}
    for rel in _files(path):
        _fsync(os.path.join(path, rel))
        files[rel] = os.path.getsize(os.path.join(path, rel))
    with open(os.path.join(path, MARKER), "w") as f:
        json.dump({"iteration": iteration, "saved_at": time.time(), "files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync(path)


def save_atomically(save: Callable[[str], Any], path: str, iteration: Optional[int] = None) -> str:
    """``save(folder)`` into ``PATH.partial``, marked complete, then renamed to ``path``; the checkpoint
    that was at ``path`` stays until the new one is complete. A failing save removes the partial folder
    (a full disk gets its space back) and raises."""
    path = os.path.abspath(path)
    partial, previous = path + PARTIAL, path + PREVIOUS
    shutil.rmtree(partial, ignore_errors=True)  # a crashed save's leftovers (adopt() promoted a complete one)
    try:
        save(partial)
        write_marker(partial, iteration)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if os.path.exists(path):
        shutil.rmtree(previous, ignore_errors=True)
        os.rename(path, previous)
    os.rename(partial, path)
    _fsync(os.path.dirname(path))
    shutil.rmtree(previous, ignore_errors=True)
    return path


def candidates(path: str) -> List[str]:
    """Where a checkpoint saved by :func:`save_atomically` at ``path`` can be after a crash."""
    return [p for p in (path, path + PARTIAL, path + PREVIOUS) if os.path.exists(p)]


def _age_key(path: str) -> Tuple[float, float]:
    m = marker(path)
    it = m.get("iteration")
    saved = m.get("saved_at")
    return (
        float(it) if isinstance(it, (int, float)) else -1.0,
        float(saved) if isinstance(saved, (int, float)) else os.path.getmtime(path),
    )


def newest_complete(paths: Sequence[str]) -> Tuple[Optional[str], List[Tuple[str, str]]]:
    """``(the newest complete checkpoint or None, [(path, why not complete), ...])``: newest by the
    marker's iteration, then its time (the folder's time without a marker)."""
    complete, skipped = [], []
    for p in paths:
        why = problem(p)
        if why:
            skipped.append((p, why))
        else:
            complete.append(p)
    return (max(complete, key=_age_key) if complete else None), skipped


def adopt(path: str, chosen: str) -> None:
    """Put the checkpoint a resume chose back at ``path`` (after a crash it can be PATH.partial or
    PATH.previous); what was at ``path`` was incomplete or older and goes."""
    if os.path.abspath(chosen) == os.path.abspath(path):
        return
    stale = path + ".stale"
    shutil.rmtree(stale, ignore_errors=True)
    if os.path.exists(path):
        os.rename(path, stale)
    os.rename(chosen, path)
    shutil.rmtree(stale, ignore_errors=True)


def skipped_note(path: str, why: str) -> str:
    return f"skipping incomplete checkpoint {path} ({why})"
