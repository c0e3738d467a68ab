"""An experiment file's ``time_budget_s``, ending trials the way a stop criterion does.

Tune's own budget (``TimeoutStopper``) stops every trial the moment the time is up: no final
checkpoint (``checkpoint_at_end`` applies to trials that reach a stop criterion), so the iterations
since the last periodic checkpoint are lost and ``rllib-r3l train`` reports the trials as interrupted.
:class:`TimeBudget` stops each running trial at its first result past the budget
(Tune then saves it and marks it TERMINATED, like any stop criterion) and ends the experiment once no
started trial is still running; trials that had not started by then never start.
"""

from __future__ import annotations

import time
from typing import Set

from ray.tune import Callback
from ray.tune.stopper import Stopper


class TimeBudget(Stopper, Callback):
    """Both Tune's stopper (the decisions) and a callback (which trials run: the experiment ends only when
    every started trial has finished, so no final save is cut short)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)
        self._start = time.monotonic()
        self._started: Set[str] = set()
        self._finished: Set[str] = set()
        self.stopped: Set[str] = set()  # trials this budget stopped

    def reached(self) -> bool:
        return time.monotonic() - self._start >= self.seconds

    # -- Stopper ------------------------------------------------------------------------------------------
    def __call__(self, trial_id: str, result: dict) -> bool:
        if self.reached():
            self.stopped.add(trial_id)
            return True
        return False

    def stop_all(self) -> bool:
        return self.reached() and self._started <= self._finished

    # -- Callback -----------------------------------------------------------------------------------------
    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self._started.add(trial.trial_id)

    def on_trial_restore(self, iteration, trials, trial, **info) -> None:
        self._started.add(trial.trial_id)

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._finished.add(trial.trial_id)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._finished.add(trial.trial_id)
