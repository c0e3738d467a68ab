"""A SIGTERM while ``train`` starts Ray is not lost when its KeyboardInterrupt is (CI on 0416fb4: the run
trained to its end with exit 0 after a SIGTERM 0.3 s into Ray's start). The handler records the signal; the
driver checks the record before Tune starts, and the console callback hands it to Tune's SIGINT handler at
Tune's first step."""

from __future__ import annotations

import os
import signal
import sys
import time

from rllib_r3l.cli import launch, signals
from rllib_r3l.cli.output_routing import Console


def test_a_sigterm_whose_keyboardinterrupt_is_swallowed_is_still_recorded(monkeypatch):
    monkeypatch.setattr(signals, "_STOPS_BEFORE_TUNE", [])
    previous = signal.getsignal(signal.SIGTERM)
    try:
        signals.interrupt_on_sigterm()
        assert not signals.stop_requested_before_tune()
        try:  # what a library's `except BaseException: pass` while Ray starts does to it
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(2)
        except BaseException:  # noqa: BLE001 - the swallow under test
            pass
        assert signals.stop_requested_before_tune()
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_console_callback_hands_a_recorded_sigterm_to_tunes_handler_once(monkeypatch, tmp_path):
    monkeypatch.setattr(signals, "_STOPS_BEFORE_TUNE", [signal.SIGTERM])
    calls = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))  # stands for Tune's
    try:
        cb = launch.ConsoleCallback(Console(sys.stdout))
        cb.on_step_begin(0, [])
        cb.on_step_begin(1, [])
        assert calls == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_without_a_recorded_sigterm_tunes_handler_is_left_alone(monkeypatch):
    monkeypatch.setattr(signals, "_STOPS_BEFORE_TUNE", [])
    calls = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        launch.ConsoleCallback(Console(sys.stdout)).on_step_begin(0, [])
        assert calls == []
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_sigterm_inside_noted_is_seen_whatever_handler_took_it_and_swallowed_it():
    """CI on dcaf4ac: the SIGTERM arrived inside ray.init, whose own handler (sys.exit) replaced ours; its
    SystemExit was swallowed on the way out and the run trained to its end with exit 0."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # Ray's handler
    arrived, quiet = [], []
    try:
        with signals.noted(arrived):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(2)
            except SystemExit:  # swallowed, as inside ray.init
                pass
        with signals.noted(quiet):
            pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert signal.SIGTERM in arrived and quiet == []


class _StopsInDel:
    """Where Python cannot raise: an exception in ``__del__`` goes to ``sys.unraisablehook``, as Ray's handler's
    ``SystemExit`` did inside logging's fork hook (CI on 5c24906: "Exception ignored in: <function
    _releaseLock>" and its Traceback on the console of a run that then said "interrupted", exit 130)."""

    def __init__(self, exc):
        self.exc = exc

    def __del__(self):
        raise self.exc


def test_a_stop_python_cannot_raise_while_ray_starts_prints_no_traceback_and_other_errors_still_do(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: seen.append(type(unraisable.exc_value)))
    with signals.unraisable_stops_quiet():
        _StopsInDel(SystemExit(signal.SIGTERM))
        _StopsInDel(KeyboardInterrupt())
        _StopsInDel(ValueError("a real bug"))
    assert seen == [ValueError]  # the stops are quiet (noted() records the signal); a bug is not hidden
    _StopsInDel(SystemExit(signal.SIGTERM))
    assert seen == [ValueError, SystemExit]  # outside the block, the previous hook is back
