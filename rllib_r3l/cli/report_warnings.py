"""The warnings under ``rllib-r3l report``'s table: trials that failed, trained on nothing, lost episodes or
still have rows in Ray's staging folder, and PBT splices: what the table's averages hide."""

from __future__ import annotations

import math
import os
from typing import List, Optional

from rllib_r3l.cli import driver_mark
from rllib_r3l.cli.result_rows import rows_only_staged


def error_text(trial_dir: str) -> Optional[str]:
    """The last line of the trial's ``error.txt`` (the exception), or None when it has none."""
    path = os.path.join(trial_dir, "error.txt")
    if not os.path.isfile(path):
        return None
    with open(path, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[-1][:300] if lines else "(empty error.txt)"


def _count(value) -> Optional[int]:
    """A table cell as a count; ``None`` when the trial never logged it (pandas fills such cells with NaN)."""
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else int(value)


def warnings(table) -> List[str]:
    """One line per trial that failed, trained on nothing or lost episodes: what the table's averages hide."""
    out = []
    dirs = table.attrs.get("trial_dirs") or [None] * len(table)
    for (_, row), trial_dir in zip(table.iterrows(), dirs):
        if row.get("status") == "ERROR":
            error = error_text(trial_dir) if trial_dir else None
            where = os.path.join(trial_dir, "error.txt") if error else "Tune's experiment state"
            out.append(
                f"warning: {row['trial']} ended in ERROR{': ' + error if error else ''} (see {where}); "
                "its metrics stop where it failed"
            )
        iters, empty, lost = (
            _count(row.get("iterations")),
            _count(row.get("empty_batches")),
            _count(row.get("episodes_lost")),
        )
        if iters and empty is not None and empty >= iters:
            out.append(
                f"warning: {row['trial']} trained on nothing: all {iters} iteration(s) had an empty batch "
                f"({lost or 0} episodes lost, {_count(row.get('env_errors')) or 0} environment errors, "
                f"{_count(row.get('generation_errors')) or 0} generation errors)"
            )
        elif lost:
            out.append(
                f"warning: {row['trial']} lost {int(lost)} episode(s) (environment/generation errors; "
                "see docs/reliability.md)"
            )
        notes = table.attrs.get("row_notes", {}).get(trial_dir)
        if notes:  # the table holds what could be read; said, not silently fewer iterations
            out.append(f"warning: {row['trial']}: {'; '.join(notes)}")
        staged = rows_only_staged(trial_dir) if trial_dir else 0
        pid = driver_mark.running_pid(os.path.dirname(trial_dir)) if staged > 0 else None
        if pid is not None:  # a live run: Tune copies them as it goes (and --resume is refused while it runs)
            out.append(
                f"note: {row['trial']}: the run is still going (its driver, process {pid}, runs on this "
                f"host); {staged} more iteration(s) are in Ray's staging folder until Tune copies them into "
                "the experiment: run report again later, or once the run has ended"
            )
        elif staged > 0:  # the table counts the storage's rows only
            out.append(
                f"warning: {row['trial']}: {staged} more iteration(s) are only in Ray's staging folder on this "
                "machine (the driver ended, or the disk filled, before Tune copied them); `rllib-r3l train "
                "... --resume` copies them back"
            )
    return out
