"""Held-out evaluation (runner/evaluation.py, ``R3L.evaluate()``): the pure row/summary/split functions
against hand values, and the Algorithm's evaluation on the tiny model through a real Ray runtime."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from rllib_r3l.runner.evaluation import episode_row, split_seeds, summarize
from rllib_r3l.trajectory import Status


def _traj(reward, won, turns, status, actions):
    return SimpleNamespace(reward=reward, success=won, num_turns=turns, status=status, actions=actions)


def test_episode_row_reads_the_trajectory():
    row = episode_row(7, _traj(1.0, True, 3, Status.OK, ["go east", "take coin"]), success_reward=1.0)
    assert row == {"seed": 7, "return": 1.0, "success": True, "turns": 3, "status": "ok", "last_action": "take coin"}
    lost = episode_row(8, _traj(0.0, False, 0, Status.ENV_ERROR, []), success_reward=1.0)
    assert lost["success"] is False and lost["status"] == "env_error" and lost["last_action"] == ""


def test_summary_of_rows_by_hand():
    rows = [
        {"return": 1.0, "success": True, "turns": 3, "status": "done"},
        {"return": 0.0, "success": False, "turns": 10, "status": "truncated"},
        {"return": 0.5, "success": False, "turns": 4, "status": "done"},
        {"return": 0.0, "success": False, "turns": 0, "status": "generation_error"},
    ]
    s = summarize(rows)
    # 1 success of 4 (the lost episode counts as a failure), returns 1.5/4, turns 17/4, 1 lost
    assert s == {"episodes": 4, "success_rate": 0.25, "mean_return": 0.375, "mean_turns": 4.25, "errors": 1}
    empty = summarize([])
    assert empty["episodes"] == 0 and empty["errors"] == 0 and math.isnan(empty["success_rate"])


def test_seeds_split_into_contiguous_shares():
    assert split_seeds(range(7), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_seeds([4, 5], 3) == [[4], [5], []]
    assert split_seeds(range(4), 1) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="parts must be >= 1"):
        split_seeds([1], 0)


@pytest.mark.integration
def test_algorithm_evaluate_matches_the_cli_on_a_checkpoint_and_runs_with_evaluation_interval(ray_session, tmp_path):
    """``algo.evaluate()`` raised RLlib's AttributeError (re-probe leftover). Greedy (evaluation_temperature=0)
    so both sides are deterministic: the held-out success of the weights in training equals
    ``rllib-r3l evaluate CHECKPOINT --split dev`` on a checkpoint of the same weights; with
    ``evaluation_interval=1`` every ``train()`` reports it under ``evaluation``; evaluating does not move
    the training task stream."""
    from rllib_r3l.cli.evaluate import evaluate
    from tests.scripted_rllib import tiny_config

    def build():
        return (
            tiny_config(evaluation_temperature=0.0, sampling_seed=0)
            .evaluation(evaluation_interval=1, evaluation_duration=5)
            .build_algo()
        )

    algo = build()
    try:
        first = algo.train()
        held = first["evaluation"]["env_runners"]
        assert held["num_episodes"] == 5 and held["split"] == "dev" and held["temperature"] == 0.0
        assert held["policy_updates"] == 1 and held["lost_episodes"] == 0
        # the main job's summary.json keeps them per iteration (re-probe 7, M7: they were on the console only)
        from rllib_r3l.cli.iteration_record import iteration_record

        record = iteration_record(1, first)["held_out"]
        assert record["success_rate"] == held["success_rate"] and record["num_episodes"] == 5
        assert "held_out" not in iteration_record(1, {k: v for k, v in first.items() if k != "evaluation"})
        again = algo.evaluate()["env_runners"]
        assert again["success_rate"] == held["success_rate"] and again["episode_len_mean"] == held["episode_len_mean"]
        ckpt = algo.save_to_path(str(tmp_path / "ckpt"))
        summary, df = evaluate(ckpt, episodes=5, split="dev", temperature=0.0, seed=0, backend="transformers")
        assert summary["split"] == "dev" and list(df["seed"]) == [0, 1, 2, 3, 4]
        assert summary["success_rate"] == held["success_rate"], (summary, held)
        assert summary["mean_turns"] == held["episode_len_mean"], (summary, held)
        trained = algo.train()["env_runners"]["r3l"]
    finally:
        algo.stop()
    plain = tiny_config(evaluation_temperature=0.0, sampling_seed=0).build_algo()
    try:
        plain.train()
        same = plain.train()["env_runners"]["r3l"]
    finally:
        plain.stop()
    # the second iteration's episodes are the same whether or not evaluations ran between them
    assert same["generated_tokens"] == trained["generated_tokens"], (same, trained)
