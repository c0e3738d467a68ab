"""Population-based training in an experiment folder: which trial's curve is spliced from a clone.

On an exploit, Tune's PBT restarts the lower trial from the upper trial's checkpoint with a
perturbed config: from then on the lower trial's result rows continue the OTHER trial's run, under
its own name. Tune records every exploit in the experiment folder's ``pbt_global.txt``, one JSON list
per line: ``[target tag, clone tag, target iteration, clone iteration, clone's config, new config]``.

Its two iterations are the trials' last results when Tune wrote the line; the trial whose result
triggered the exploit has not had that result recorded yet, so one of them is stale (``0`` at the
first perturbation). Where the clone continued is read from the target's rows instead: the first row
whose config holds the new (perturbed) values. Tags are matched to trial folders through Tune's
``experiment_state-*.json`` (a perturbed trial's tag is ``<first tag>@perturbed[...]``), else through
the trial index Tune puts in both the tag and the folder name.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from rllib_r3l.cli.result_rows import flat, nonblank_lines, read_rows

PBT_GLOBAL = "pbt_global.txt"


@dataclass
class Splice:
    """An exploit into a trial: from row ``iteration`` on (None: no row after it) its curve continues
    the run of trial folder ``source`` (cloned from its checkpoint of the iteration before)."""

    source: str
    iteration: Optional[int]
    changed: Dict[str, Tuple[Any, Any]]  # config key -> (the source's value, the trial's new value)

    def describe(self, name: Callable[[str], str]) -> str:
        """In words; ``name``: a trial folder's name as the report shows it."""
        src = name(self.source)
        changes = ", ".join(f"{k} {_fmt(a)} -> {_fmt(b)}" for k, (a, b) in self.changed.items())
        if self.iteration is None:
            where = f"after its last row PBT restarted it from {src}'s checkpoint"
        else:
            where = (
                f"from iteration {self.iteration} on it continues {src}'s run (PBT cloned {src}'s checkpoint "
                f"of iteration {self.iteration - 1} into it)"
            )
        return where + (f"; perturbed {changes}" if changes else "")


def splices(trial_dirs: List[str]) -> Dict[str, List[Splice]]:
    """Trial folder -> its splices, oldest first, for every experiment folder (a trial folder's parent)
    holding a ``pbt_global.txt``; trials never exploited are left out."""
    out: Dict[str, List[Splice]] = {}
    by_exp: Dict[str, List[str]] = {}
    for d in trial_dirs:
        by_exp.setdefault(os.path.dirname(d), []).append(d)
    for exp_dir in by_exp:
        exploits = _read_exploits(os.path.join(exp_dir, PBT_GLOBAL))
        if not exploits:
            continue
        folder_of = _folders_by_tag(exp_dir)
        rows_of: Dict[str, List[Dict[str, Any]]] = {}
        after: Dict[str, int] = {}  # where the next splice of a trial is looked for in its rows
        for target_tag, clone_tag, clone_config, new_config in exploits:
            target, source = folder_of(target_tag), folder_of(clone_tag)
            if target is None:
                continue
            old, new = flat(clone_config), flat(new_config)
            changed = {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v and not k.startswith("__")}
            if target not in rows_of:
                rows_of[target] = sorted(read_rows(target)[0], key=lambda r: r["training_iteration"])
            rows = rows_of[target]
            i = _first_row_at(rows, changed, after.get(target, 1))
            if i is not None:  # a splice the rows cannot place leaves the next one findable
                after[target] = i + 1
            it = rows[i]["training_iteration"] if i is not None else None
            out.setdefault(target, []).append(
                Splice(source=source or clone_tag, iteration=int(it) if it is not None else None, changed=changed)
            )
    return out


def _first_row_at(rows: List[Dict[str, Any]], changed: Dict[str, Tuple[Any, Any]], start: int) -> Optional[int]:
    """Where the clone's run begins in ``rows``, from ``start``: the first row after a restart
    (``iterations_since_restore`` 1: the trial restored the clone's checkpoint there) that holds every new
    value; rows without that count (older results): the first row whose config holds every new value and
    whose previous row does not. An exploit that changed nothing (a perturbation that drew the same
    value) is found by the restart alone. None when no row tells."""

    def at_new(row: Dict[str, Any]) -> bool:
        return all(row.get(f"config/{k}") == v for k, (_a, v) in changed.items())

    for i in range(max(start, 1), len(rows)):
        if rows[i].get("iterations_since_restore") == 1 and at_new(rows[i]):
            return i
    if not changed:
        return None
    for i in range(max(start, 1), len(rows)):
        if at_new(rows[i]) and not at_new(rows[i - 1]):
            return i
    return None


def _read_exploits(path: str) -> List[Tuple[str, str, Dict[str, Any], Dict[str, Any]]]:
    """``(target tag, clone tag, clone's config, new config)`` per line Tune wrote; lines it could not
    have written (cut, edited) are skipped."""
    out = []
    for line in nonblank_lines(path):
        try:
            target, clone, _ti, _ci, old, new = json.loads(line)
        except (ValueError, TypeError):
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            out.append((str(target), str(clone), old, new))
    return out


def _folders_by_tag(exp_dir: str):
    """A function: PBT tag -> trial folder of ``exp_dir`` (None when neither Tune's state nor the
    names tell); the clone may be a trial the report was not asked about."""
    try:
        dirs = [
            os.path.join(exp_dir, x) for x in sorted(os.listdir(exp_dir)) if os.path.isdir(os.path.join(exp_dir, x))
        ]
    except OSError:
        dirs = []
    by_tag: Dict[str, str] = {}
    try:
        states = sorted(f for f in os.listdir(exp_dir) if f.startswith("experiment_state-") and f.endswith(".json"))
        if states:
            with open(os.path.join(exp_dir, states[-1])) as f:
                for entry in json.load(f).get("trial_data", []):
                    trial = json.loads(entry[0])
                    tag = str(trial.get("experiment_tag") or "").split("@perturbed[")[0]
                    path = os.path.join(exp_dir, os.path.basename(str(trial["relative_logdir"])))
                    if tag and path in dirs:
                        by_tag[tag] = path
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass  # Tune's own format; the names below still tell
    by_index = {}
    for d in dirs:  # "<trainable>_<env>_<exp id>_<5-digit trial id>_<index>_<tag rest>_<date>"
        m = re.search(r"_\d{5}_(\d+)(?:_|$)", os.path.basename(d))
        if m:
            by_index.setdefault(m.group(1), d)

    def folder(tag: str) -> Optional[str]:
        if tag in by_tag:
            return by_tag[tag]
        m = re.match(r"(\d+)(?:_|$)", tag)
        return by_index.get(m.group(1)) if m else None

    return folder


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else repr(v) if isinstance(v, str) else str(v)
