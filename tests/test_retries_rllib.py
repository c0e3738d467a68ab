"""Retries through RLlib for real: ``tune.run("R3L")`` in which the policy's choices and reports are
scripted (``tests/scripted_rllib.py``), so reflections are valid and failed episodes are retried.
Retry and auxiliary items then travel runner -> driver -> learner, and the update moves the weights.
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.integration


def test_retries_reach_the_learner_through_tune(tmp_path):
    import ray
    from ray import tune

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import rllib_r3l  # noqa: F401  (registers "R3L")
    from rllib_r3l import R3LConfig
    from tests.scripted_rllib import RecordingLearner, ScriptedEnvRunner

    cfg = (
        R3LConfig()
        .environment("r3l/ToyCorridor", env_config={"num_rooms": 4, "max_turns": 6})
        .training(
            model="tiny",
            backend="transformers",
            group_size=4,
            tasks_per_iteration=2,
            aux_weight=0.5,
            aux_items=["reflection_sft", "retry_sft"],
            max_response_tokens=8,
            micro_batch_size=8,
            lr=1e-3,
            weight_decay=0.0,
            sampling_seed=0,
            num_threads=1,
        )
        .env_runners(env_runner_cls=ScriptedEnvRunner)
        .learners(learner_class=RecordingLearner)
        .debugging(seed=0)
    )
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        analysis = tune.run("R3L", config=cfg, stop={"training_iteration": 1}, storage_path=str(tmp_path), verbose=0)
    finally:
        ray.shutdown()
    trial = analysis.trials[0]
    assert trial.status == "TERMINATED", trial.error_file
    res = trial.last_result
    er = res["env_runners"]["r3l"]
    assert er["num_retries"] > 0
    assert er["reflection_valid_rate"] == 1.0 and er["retry_trigger_rate"] == 1.0
    assert er["retry_success_rate"] > 0
    # the driver built the batch with retry and auxiliary items ...
    assert res["r3l"]["batch"]["num_retry"] == er["num_retries"]
    assert res["r3l"]["batch"]["num_retry_sft"] > 0 and res["r3l"]["batch"]["num_reflection_sft"] > 0
    # each kind's credited tokens and share of the loss's weight (the shares of one batch add up to 1)
    b = res["r3l"]["batch"]
    shares = [b[f"loss_share_{k}"] for k in ("base", "retry", "reflection_sft", "retry_sft")]
    assert sum(shares) == pytest.approx(1.0) and b["loss_share_reflection_sft"] > 0
    assert b["credited_tokens_reflection_sft"] > 0 and b["credited_tokens_retry"] > 0
    # ... and they reached the learner, whose update moved the weights
    rec = _find(res["learners"], "r3l_test")
    assert rec is not None, res["learners"]
    assert rec["off_policy_rows"] > rec["aux_rows"] > 0  # retries (weight 1) and aux items (weight 0.5)
    assert rec["weight_delta"] > 0


def _find(tree, key):
    """The first value under ``key`` in a nested result dict (wherever RLlib nests learner metrics)."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        for v in tree.values():
            found = _find(v, key)
            if found is not None:
                return found
    return None
