"""benchmarks/phase_timeline.py against hand values: the lanes, the split of the loss, the text timeline."""

from __future__ import annotations

import math

import pytest

from benchmarks.phase_timeline import gantt, lanes, split_loss, work_rates


def _row(**phases):
    return {"timeline": {f"{p}_{edge}": v for p, (s, e) in phases.items() for edge, v in (("start", s), ("end", e))}}


BASE = [  # lag 0: explore 10 s, then update 5 s + sync 1 s
    _row(explore=(0, 10), update=(11, 16), sync=(16, 17)),
    _row(explore=(18, 28), update=(29, 34), sync=(34, 35)),
]
LAGGED = [  # lag 1: the request (12 s: slowed by 2 s beside the learner), 1 s idle between requests
    _row(explore=(0, 0.5), sample=(0, 12), update=(2, 8), sync=(8, 13)),
    _row(explore=(13, 13.5), sample=(13, 25), update=(15, 21), sync=(21, 26)),
    _row(explore=(26, 26.5), sample=(26, 38), update=(28, 34), sync=(34, 39)),
]


def test_the_runner_lane_is_the_request_where_there_is_one_else_exploring():
    assert lanes(BASE)["runner"] == [(0, 10), (18, 28)]
    assert lanes(LAGGED)["runner"] == [(0, 12), (13, 25), (26, 38)]
    assert lanes([_row(explore=(0, 1))])["update"] == []  # an iteration without an update


def test_the_loss_against_the_ideal_splits_into_contention_and_the_runners_wait():
    got = split_loss(BASE, LAGGED)
    want = {
        "E0": 10,
        "L0": 6,
        "ideal": 10,
        "period": 13,  # (28 - 2) / 2
        "loss": 3,
        "E1": 12,
        "contention": 2,
        "runner_gap": 1,  # 13 - 12, 26 - 25
        "runner_slack": 0,
        "L1": 6,
        "learner_contention": 1,  # 6 against 5 alone
        "learner_gap": 7,  # 15 - 8, 28 - 21
    }
    assert got == pytest.approx(want)
    assert got["loss"] == pytest.approx(got["contention"] + got["runner_gap"] - got["runner_slack"])
    assert math.isnan(split_loss(BASE, LAGGED[:1])["period"])  # one update: no period


def test_the_text_timeline_paints_each_phase_where_it_covers_the_character():
    lines = gantt([_row(sample=(0, 4), update=(1, 3), sync=(3, 4))], width=4)
    assert lines[0] == "runner  |SSSS|" and lines[1] == "learner |.UUw|"
    assert "1 character = 1.00 s" in lines[2]
    assert gantt([{"timeline": {}}]) == []


def test_work_rates_divide_each_sides_work_by_its_own_seconds():
    rows = [
        dict(_row(update=(0, 4)), learner_forward_tokens=400, runner_engine_tokens=90, runner_engine_s=3),
        dict(_row(update=(10, 16)), learner_forward_tokens=600, runner_engine_tokens=110, runner_engine_s=2),
        dict(_row(explore=(20, 21)), learner_forward_tokens=0, runner_engine_tokens=0, runner_engine_s=0),  # no update
    ]
    assert work_rates(rows) == pytest.approx({"learner_tokens_per_s": 100.0, "engine_tokens_per_s": 40.0})
    assert all(math.isnan(v) for v in work_rates(LAGGED).values())  # rows from before the fields were kept
