"""The lag held-out comparison (issue 47 item 6b): the arms differ in ``max_policy_lag`` only, and a real
lagged run on one remote env runner stops at its trajectory budget exactly and is evaluated on the
runners' test fold, game by game."""

from __future__ import annotations

import json

import pytest

from benchmarks import lag_heldout as lh
from benchmarks import learning_curves as lc
from benchmarks import learning_curves_report as lcr


@pytest.fixture
def installed(monkeypatch):
    monkeypatch.setattr(lc, "VARIANTS", dict(lc.VARIANTS))
    monkeypatch.setattr(lc, "PRIORITY", dict(lc.PRIORITY))
    lh.install()


def test_the_arms_differ_in_the_lag_only_and_both_sample_on_one_remote_runner(installed):
    diffs = lc.variant_diffs(dict(lh.SETTING), [lc.BASE, *lh.VARIANTS])
    from rllib_r3l.cli.main import MAIN_JOB_SETTINGS

    assert lh.VARIANTS["lag0"] == MAIN_JOB_SETTINGS  # R3L today, what scripts/main.sh trains
    extra = {k: v for k, v in diffs["lag1"].items() if diffs["lag0"].get(k, "unset") != v}
    assert extra == {"max_policy_lag": 1} and set(diffs["lag0"]) <= set(diffs["lag1"])
    for v in lh.VARIANTS:
        cfg = lc.build_config(dict(lh.SETTING), v, 0)
        assert cfg.num_env_runners == 1 and cfg.env_config["eval_split"] == "test"
    # v3-v5 settings keep sampling on the local runner
    assert lc.build_config(dict(lc.DEFAULT_SETTING), "lag0", 0).num_env_runners == 0
    assert lh.PAIRS == {"lag1": "lag0"}


def test_held_out_games_on_remote_runners_need_the_test_fold():
    class Algo:  # stands in for an algorithm with remote runners: only the refusal is checked here
        config = type("C", (), {"env_config": {"compact_observations": True}})()

    with pytest.raises(SystemExit, match="env_config.eval_split.*'test'"):
        lc.evaluate_on_runners(Algo(), 2)


@pytest.mark.integration
def test_a_lagged_run_stops_at_its_budget_and_is_evaluated_on_its_runner(tmp_path, tiny_model_dir, installed):
    """Real R3L (oracle reflector, transformers) on the tiny model with one remote runner and
    max_policy_lag=1: every iteration trains groups one update old, the run spends exactly its budget,
    and the held-out games run on the remote runner's engine (the local runner has none)."""
    setting = dict(
        lc.DEFAULT_SETTING,
        env="r3l/ToyCorridor",
        env_config={"num_rooms": 3, "eval_split": "test"},
        model="tiny",
        backend="transformers",
        group_size=4,
        lr=1e-4,
        micro_batch_tokens=None,
        budget=16,
        max_iterations=6,
        eval_episodes=3,
        num_threads=None,
        num_env_runners=1,
        # no extra rounds: an iteration spends at most 2 tasks x 4, so the budget takes several iterations
        training={
            "max_response_tokens": 8,
            "max_reflection_tokens": 24,
            "reflector": "oracle",
            "dynamic_sampling_rounds": 0,
        },
    )
    final = lc.run_one(tmp_path, setting, "lag1", 0)
    header, recs = lcr.read_curve(lcr.run_dir(tmp_path, "lag1", 0))
    assert header["options"]["max_policy_lag"] == 1
    assert final["samples"] == recs[-1]["samples_cumulative"] == 16  # the budget, exactly
    assert len(recs) >= 2 and [r["policy_lag_max"] for r in recs[1:]] == [1.0] * (len(recs) - 1)  # one update behind
    games = final["eval_games"]
    assert [g["seed"] for g in games] == [0, 1, 2] and final["eval_lost"] == 0
    assert sum(g["success"] for g in games) == final["eval_successes"]
    assert set(games[0]) == {"seed", "success", "reward", "turns", "status"}
    json.dumps(final)  # final.json as written


def test_the_timing_table_sums_each_runs_iterations_and_pairs_the_budgets_seconds_by_seed(tmp_path):
    walls = {("lag0", 0): [100, 80, 60], ("lag0", 1): [90, 90], ("lag1", 0): [100, 40, 10], ("lag1", 1): [90, 45]}
    for (v, s), ws in walls.items():
        d = lcr.run_dir(tmp_path, v, s)
        d.mkdir(parents=True)
        lag = {"lag0": None, "lag1": 1.0}[v]
        recs = [{"iteration": i + 1, "wall_s": w, "policy_lag_max": 0.0 if i == 0 else lag} for i, w in enumerate(ws)]
        lc._write_curve(d, {"variant": v, "seed": s}, recs)
    lines = lh.timing_lines(tmp_path, ["lag0", "lag1"], [0, 1])
    assert "| lag0 | 2 | 76.7 | 240, 180 | [0] |" in lines  # (80 + 60 + 90) / 3 after the first iterations
    assert "| lag1 | 2 | 31.7 | 150, 135 | [0, 1] |" in lines
    # seed 0: 240 / 150 = 1.6, seed 1: 180 / 135 = 4/3; harness.fmt_interval shows their mean, 1.47
    assert any(
        x.startswith("lag1 spends the budget 1.47 [") and x.endswith("as fast as lag0 (paired by seed)") for x in lines
    )
