"""Evidence v5 (issue 46 item 6): the v5 variants (one lever each on top of
R3L today, every R3L variant with the fresh control), the control outside the trajectory budget, and the
report's retry chain from each run's ledger."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import evidence_v5 as v5
from benchmarks import learning_curves as lc
from benchmarks import learning_curves_report as lcr


# ---------------------------------------------------------------------------------------------------
# the v5 variants
@pytest.fixture
def v5_installed(monkeypatch):
    monkeypatch.setattr(lc, "VARIANTS", dict(lc.VARIANTS))
    monkeypatch.setattr(lc, "PRIORITY", dict(lc.PRIORITY))
    v5.install()


def test_each_lever_is_one_option_on_top_of_r3l_today_with_the_control(v5_installed):
    diffs = lc.variant_diffs(dict(v5.V5_SETTING), [lc.BASE, *v5.VARIANTS])
    r3l = diffs["r3l"]
    assert r3l["retry_control"] is True and r3l["env_config"] == v5.V5_SETTING["env_config"]
    from rllib_r3l.cli.main import MAIN_JOB_SETTINGS

    assert v5.R3L_TODAY == {**MAIN_JOB_SETTINGS, "retry_control": True}  # what scripts/main.sh trains, + the control
    expected = {
        "r3l_exclude": {"pivot_action": "exclude_failed"},
        "r3l_hindsight": {"pivot_selector": "hindsight"},
        "r3l_backoff": {"pivot_backoff": 1},
        "r3l_pivot_temp": {"pivot_temperature": 1.2},
        "r3l_hindsight_exclude": {"pivot_selector": "hindsight", "pivot_action": "exclude_failed"},
        "r3l_oracle_exclude": {"reflector": "oracle", "pivot_action": "exclude_failed"},
    }
    for v, lever in expected.items():
        extra = {k: x for k, x in diffs[v].items() if r3l.get(k, "unset") != x}
        assert extra == lever and set(r3l) <= set(diffs[v]), v
    assert "retry_control" not in diffs["grpo_paper"] and "retry_control" not in diffs[lc.BASE]
    assert set(v5.PAIRS) == {"r3l", *expected} and v5.PAIRS["r3l"] == "grpo_paper"
    # the screening's order: r3l, r3l_exclude, r3l_hindsight first, the oracle diagnostic last
    order = [v for v, s in lc.next_runs(Path("/nonexistent"), list(v5.VARIANTS), [0]) if s == 0]
    assert order[:4] == [lc.BASE, "r3l", "r3l_exclude", "r3l_hindsight"] and order[-1] == "r3l_oracle_exclude"


def test_v4_s_variants_are_untouched_by_importing_v5():
    assert "retry_control" not in lc.VARIANTS["r3l"] and "r3l_exclude" not in lc.VARIANTS


# ---------------------------------------------------------------------------------------------------
# the control costs no trajectory of the budget and never trains
@pytest.mark.parametrize("cap", [2, 3, 4, None])
def test_the_control_is_outside_the_trajectory_budget(tiny_tokenizer, cap):
    from rllib_r3l.trajectory import Kind
    from tests.scripted import SEED, make_explorer

    got = {}
    for control in (False, True):
        ex, _ = make_explorer(tiny_tokenizer, reflect_on="failures", retry_control=control)
        [group] = ex.explore([SEED], ["g0"], max_episodes=cap)
        trained = [t for t in group.trajectories + group.lost if t.kind in (Kind.BASE, Kind.RETRY)]  # episodes
        started = [r for r in group.ledger if r["retry_status"] in ("ok", "lost", "empty")]
        assert ex.counters["episodes_started"] == len(trained)  # what the budget counts is what trains
        assert not any("control" in t.group_id for t in trained)
        assert ex.counters["control_episodes"] == (len(started) if control else 0)  # one per started retry
        assert all((r["control_success"] is not None) == (control and r in started) for r in group.ledger)
        got[control] = (ex.counters["episodes_started"], sorted(t.kind.value for t in trained))
        if cap is not None:
            assert ex.counters["episodes_started"] <= cap
        assert any(t.kind == Kind.BASE for t in trained)
    assert got[True] == got[False]


# ---------------------------------------------------------------------------------------------------
# the report: the chain from each run's ledger
def _ledger_run(out: Path, variant: str, seed: int, rows, k: int = 4) -> None:
    d = lcr.run_dir(out, variant, seed)
    d.mkdir(parents=True)
    it = {
        "iteration": 1,
        "samples_cumulative": 64,
        "cpu_s": 10.0,
        "wall_s": 10.0,
        "success_rate": 0.25,
        "num_retries": 2.0,
        "trained_tokens": 100.0,
    }
    (d / "curve.jsonl").write_text(json.dumps({"header": {"variant": variant}}) + "\n" + json.dumps(it) + "\n")
    (d / "final.json").write_text(json.dumps({"eval_successes": k, "eval_episodes": 32}))
    (d / "retries.jsonl").write_text("".join(json.dumps({"iteration": 1, **r}) + "\n" for r in rows))


def _row(group, refl, pivot, oracle, changed, ok, control, status="ok"):
    return {
        "group_id": group,
        "reflection": refl,
        "valid": True,
        "pivot": pivot,
        "reported_pivot": pivot,
        "oracle_pivot": oracle,
        "retry_status": status,
        "action_changed": changed,
        "retry_success": ok,
        "control_success": control,
    }


def test_the_report_shows_each_run_s_funnel_and_retry_against_control(tmp_path):
    _ledger_run(tmp_path, "r3l", 0, [_row("g0", 0, 1, 0, False, False, False), _row("g0", 1, 0, 0, True, True, False)])
    _ledger_run(tmp_path, "r3l", 1, [_row("g0", 0, 0, 0, True, True, True), _row("g1", 0, 2, 1, True, False, False)])
    _ledger_run(tmp_path, "r3l_exclude", 0, [_row("g0", 0, 0, 0, True, True, False)], k=6)
    _ledger_run(tmp_path, "grpo_paper", 0, [], k=5)
    (lcr.run_dir(tmp_path, "grpo_paper", 0) / "retries.jsonl").unlink()  # GRPO keeps no ledger
    ch = lcr.chain_summary(tmp_path, ["grpo_paper", "r3l", "r3l_exclude"], [0, 1])
    assert set(ch) == {"r3l", "r3l_exclude"}
    s0 = ch["r3l"]["per_seed"]["0"]
    assert (
        s0["reflections"],
        s0["valid"],
        s0["pivot_scored"],
        s0["pivot_in_time"],
        s0["retried"],
        s0["action_changed"],
        s0["retry_success"],
    ) == (2, 2, 2, 1, 2, 1, 1)
    a = ch["r3l"]["all"]  # both seeds' group g0 stay two tasks
    assert (a["reflections"], a["retried"], a["retry_success"]) == (4, 4, 2)
    assert (
        a["control"]["pairs"],
        a["control"]["tasks"],
        a["control"]["retry_successes"],
        a["control"]["control_successes"],
        a["control"]["ratio"],
    ) == (4, 3, 2, 1, 2.0)
    text = lcr.report(tmp_path, ["grpo_paper", "r3l", "r3l_exclude"], [0, 1], v5.PAIRS)
    assert "| r3l | 0 | 2 | 2 | 1/2 (1 exact) | 2 | 1/2 | 1/2 | 1/2 vs 0/2 |" in text
    assert "| **r3l** | all | 4 | 4 |" in text and "| r3l_exclude | 0 | 1 | 1 |" in text
    assert "| r3l_exclude | r3l | 0 |" in text and "| r3l | grpo_paper | 0 |" in text  # v5's pairs
    assert json.loads((tmp_path / "summary.json").read_text())["chain"]["r3l"]["all"]["retried"] == 4


def test_a_folder_without_ledgers_reports_as_before(tmp_path):
    _ledger_run(tmp_path, "r3l", 0, [], k=3)
    (lcr.run_dir(tmp_path, "r3l", 0) / "retries.jsonl").unlink()
    text = lcr.report(tmp_path, ["r3l"], [0])
    assert "retry chain" not in text and "chain" not in json.loads((tmp_path / "summary.json").read_text())
    assert not math.isnan(lcr.summarize(tmp_path, ["r3l"], [0])["variants"]["r3l"]["eval_success"]["mean"])
