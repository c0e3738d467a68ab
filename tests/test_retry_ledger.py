"""The retry ledger's pure parts (rllib_r3l.retry_ledger): the funnel and the control comparison by hand,
the file's round trip and a resume's truncation."""

import math

import pytest

from rllib_r3l import retry_ledger


def row(
    reflection,
    *,
    valid=True,
    pivot=1,
    oracle=0,
    changed=False,
    status="ok",
    success=False,
    control=None,
    iteration=1,
    attempt=0,
    reported=None,
):
    return {
        "iteration": iteration,
        "group_id": "g",
        "reflection": reflection,
        "attempt": attempt,
        "valid": valid,
        "reported_pivot": pivot if reported is None else reported,
        "pivot": pivot if status != "none" else None,
        "oracle_pivot": oracle,
        "action_changed": changed if status in ("ok", "empty", "lost") else None,
        "retry_status": status,
        "retry_success": success if status != "none" else None,
        "control_success": control,
    }


def test_the_funnel_counts_each_link_by_hand():
    rows = [
        row(0, pivot=0, oracle=0, changed=True, success=True),  # in time, exact, changed, success
        row(1, pivot=1, oracle=0, changed=False),  # late: replays the mistake
        row(2, pivot=2, oracle=3, changed=True),  # early: in time, not exact
        row(3, valid=False, status="none", reported=None),  # invalid: no retry
        row(4, pivot=1, oracle=None, status="skipped"),  # no oracle; the replay mismatched
        row(5, pivot=0, oracle=0, changed=True, success=True, attempt=0),
        row(5, pivot=0, oracle=0, changed=False, success=False, attempt=1),  # a second retry of reflection 5
    ]
    f = retry_ledger.funnel(rows)
    assert f == {
        "reflections": 6,
        "valid": 5,
        "pivot_scored": 4,
        "pivot_in_time": 3,
        "pivot_exact": 2,
        "retried": 5,
        "action_compared": 5,
        "action_changed": 3,
        "retry_success": 2,
    }


def test_the_control_comparison_is_paired_over_tasks():
    rows = [row(i, success=s, control=c) for i, (s, c) in enumerate([(1, 0), (1, 1), (0, 0), (1, 0), (0, 1)])]
    rows.append(row(9, success=True, control=None))  # no control: not a pair
    c = retry_ledger.control_comparison(rows)
    assert (c["pairs"], c["retry_successes"], c["control_successes"]) == (5, 3, 2)
    assert c["ratio"] == pytest.approx(1.5) and c["difference"] == pytest.approx(0.2)
    # differences 1, 0, 0, 1, -1: sd = sqrt(0.7), t(0.975, 4) = 2.7764
    half = 2.776445 * math.sqrt(0.7) / math.sqrt(5)
    assert c["difference_low"] == pytest.approx(0.2 - half, abs=1e-5)
    lines = retry_ledger.funnel_lines(rows)
    assert lines[0].startswith("retry chain: 6 reflections -> 6 valid -> ") and "3/5 vs 2/5" in lines[1]


def test_append_read_replace_and_adopt(tmp_path):
    path = str(tmp_path / "sub" / retry_ledger.LEDGER_FILE)
    assert retry_ledger.append(path, 1, [{"a": 1}, {"a": 2}]) == 2
    assert retry_ledger.append(path, 2, [{"a": 3}]) == 1 and retry_ledger.append(path, 3, []) == 0
    with open(path, "a") as f:
        f.write('{"iteration": 3, "a"')  # a crash mid-write: the cut last line is left out
    assert [r["a"] for r in retry_ledger.read(path)] == [1, 2, 3]
    algo = type("Algo", (), {"retry_ledger_path": path})()
    retry_ledger.adopt(algo, str(tmp_path / "run" / "r.jsonl"), restored=True)  # a restore's rows move along
    assert [r["a"] for r in retry_ledger.read(algo.retry_ledger_path)] == [1, 2, 3]
    retry_ledger.adopt(algo, str(tmp_path / "fresh.jsonl"), restored=False)  # a fresh run starts empty
    assert retry_ledger.read(algo.retry_ledger_path) == [] and algo.retry_ledger_path.endswith("fresh.jsonl")
    assert retry_ledger.read(str(tmp_path / "none.jsonl")) == []
