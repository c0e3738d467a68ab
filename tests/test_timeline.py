"""``r3l/timeline`` (rllib_r3l/timeline.py): when each phase of an iteration ran, in seconds since the run's
first phase; the lagged sampler's overlap with the learner is checked on a real run in tests/runner/test_lagged.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_r3l import timeline
from rllib_r3l.cli.iteration_record import iteration_record


def _clock(monkeypatch, *times):
    ticks = iter(times)
    monkeypatch.setattr(timeline, "_now", lambda: next(ticks))


def test_phases_are_logged_in_seconds_since_the_first_phase_also_when_one_raises(monkeypatch):
    algo = SimpleNamespace(metrics=MetricsLogger())
    # origin 100.0; explore 100.0 -> 103.5; update 104.0 -> raises at 106.25; sample taken from runner clocks
    _clock(monkeypatch, 100.0, 100.0, 103.5, 104.0, 106.25)
    with timeline.phase(algo, "explore"):
        pass
    with pytest.raises(RuntimeError), timeline.phase(algo, "update"):
        raise RuntimeError("learner lost")
    timeline.log(algo, "sample", 99.0, 101.5)  # a request that started before the first phase
    got = {k: v.peek() for k, v in algo.metrics.reduce()["r3l"]["timeline"].items()}
    assert got == {
        "explore_start": 0.0,
        "explore_end": 3.5,
        "update_start": 4.0,
        "update_end": 6.25,
        "sample_start": -1.0,
        "sample_end": 1.5,
    }


def test_the_timeline_reaches_summary_json_and_is_absent_without_one():
    result = {"time_this_iter_s": 5.0, "r3l": {"timeline": {"update_start": 1.0, "update_end": 2.0}}}
    assert iteration_record(1, result)["timeline"] == {"update_start": 1.0, "update_end": 2.0}
    assert "timeline" not in iteration_record(1, {"time_this_iter_s": 5.0})
