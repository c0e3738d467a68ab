"""Training a run further than its stop: ``rllib-r3l train FILE --resume --stop KEY=VALUE``.

A trial that reached its stop criterion is TERMINATED in Tune's saved state, and a plain ``--resume``
leaves it so. With ``--stop`` a resume continues every trial of the experiment, finished ones too,
from its last checkpoint through Tune's own ``ResumeConfig(finished=RESUME)``: the same trial folder,
iteration counter, weights, optimizer and sampling state go on, and the rows are appended to
``result.json``/``progress.csv``. Tune keeps each trial's stop criteria in its saved state and checks
them after every iteration, so :func:`new_stop_callback` (a Tune callback) puts the keys ``--stop``
names into the criteria of the restored trials before they start; Tune then saves them with the
trial, and a later plain ``--resume`` keeps them. The keys ``--stop`` does not name stay as the run
had them.

Tune stops a trial once ``result[key] >= value``; a value a trial has already reached would stop it
after one more iteration, so :func:`check_new_stop` refuses it, naming what was reached.

``--new`` is the other way on from an existing experiment, and it continues nothing: :func:`fresh_run`
says what it does wherever it is advised.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from rllib_r3l.cli.resume_from import fresh_run  # noqa: F401 - the advice resume.py and commands.py give too
from rllib_r3l.errors import UsageError


def parse_stops(stops: Sequence[str]) -> Dict[str, Any]:
    """``--stop`` flags as a dict (the last one of a key wins, as on a fresh run)."""
    from rllib_r3l.cli.experiments import parse_assignment

    return dict(parse_assignment(s, "--stop") for s in stops)


def _last_row(exp_dir: str, trial: str) -> Dict[str, Any]:
    """The trial's last readable result row (where a killed driver left more rows in Ray's staging folder
    than in the experiment, which the resume copies back first, the staged one); {} when it has none."""
    from rllib_r3l.cli.result_rows import _json_rows, staged_trial_dir

    for line, it in reversed(_json_rows(staged_trial_dir(exp_dir, trial) or os.path.join(exp_dir, trial))):
        if it is not None:
            return json.loads(line)
    return {}


def reached(exp_dir: str) -> List[Tuple[str, Dict[str, Any], Dict[str, Any]]]:
    """``(trial folder name, its saved stop criteria, its last result row)`` per trial of Tune's saved state."""
    from rllib_r3l.cli.resume_from import saved_stops

    return [(trial, stop, _last_row(exp_dir, trial)) for trial, stop in sorted(saved_stops(exp_dir).items())]


def _number(value: Any) -> Optional[float]:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else None


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _reached_iteration(exp_dir: str) -> Optional[int]:
    its = [row.get("training_iteration") for _t, _s, row in reached(exp_dir)]
    its = [it for it in its if isinstance(it, int)]
    return max(its) if its else None


def extend_hint(exp_dir: str) -> str:
    """``"to train it further from its last checkpoint: --resume --stop training_iteration=N (N above 3, the
    iteration it reached)"``."""
    it = _reached_iteration(exp_dir)
    above = f" (N above {it}, the iteration it reached)" if it is not None else ""
    return (
        f"to train it further from its last checkpoint, give a higher stop: --resume --stop training_iteration=N{above}"
    )


def check_new_stop(name: str, exp_dir: str, overrides: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Per trial the stop criteria it continues to (its saved ones, the keys of ``overrides`` replaced).
    :class:`UsageError` when a trial has already reached one of them: it would stop after one more
    iteration (a key ``--stop`` names: give a higher value; a key kept from the run's stop: override it too)."""
    from rllib_r3l.cli.result_rows import get_metric

    out = {}
    for trial, saved, row in reached(exp_dir):
        stop = {**saved, **overrides}
        for key, value in stop.items():
            got = _number(get_metric(row, key)) if row else None
            if got is None or _number(value) is None or got < value:
                continue
            if key in overrides:
                raise UsageError(
                    f"--stop {key}={_show(value)}: trial {trial} of experiment {name!r} already reached "
                    f"{key} {_show(got)} (its last result), so it would stop after one more iteration; "
                    f"give a value above {_show(got)} to train it further"
                    + (f", e.g. --stop {key}={got + 10}" if key == "training_iteration" else "")
                )
            raise UsageError(
                f"--resume --stop: trial {trial} of experiment {name!r} already reached {key} "
                f"{_show(got)}, and its stop keeps {key}: {_show(value)} (from the run's stop), so it "
                f"would stop after one more iteration; give that key a value above {_show(got)} too: "
                f"--stop {key}=VALUE"
            )
        out[trial] = stop
    return out


def new_stop_callback(stop: Dict[str, Any]):
    """A Tune callback that puts ``stop``'s keys into the stop criteria of every trial of the resumed
    experiment before it starts (Tune restores each trial with the criteria it saved, and checks those
    after each iteration). Ray is imported here: the CLI's other commands do not need it."""
    from ray.tune import Callback

    class NewStop(Callback):
        def on_step_begin(self, iteration, trials, **info) -> None:
            for trial in trials:
                if any(trial.stopping_criterion.get(k) != v for k, v in stop.items()):
                    trial.stopping_criterion = {**trial.stopping_criterion, **stop}
                    trial.invalidate_json_state()  # Tune caches the JSON it saves of a trial

    return NewStop()
