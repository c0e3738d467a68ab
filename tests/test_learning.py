"""Learning signal: a tiny randomly initialised model learns a trivial one-turn task.

Proves the sign of the gradient, the masks and the weight sync end to end: with 4 admissible words
the untrained policy succeeds ~25 % of the time; after a bounded number of R3L updates (GRPO-style
exploration, positive amplification on) it says the target word almost always.
"""

import os

import numpy as np
import pytest

pytestmark = pytest.mark.integration


def test_tiny_model_learns_one_turn_task():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from rllib_r3l import R3LConfig

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    cfg = (
        R3LConfig()
        .environment("r3l/ToyWord", env_config={"fixed_target": "river"})
        .training(
            model="tiny",
            group_size=8,
            tasks_per_iteration=4,
            backend="transformers",
            reflect=False,
            max_response_tokens=8,
            micro_batch_size=32,
            lr=3e-3,
            weight_decay=0.0,
            sampling_seed=0,
        )  # seeded sampling: the same run every time, CI cannot flake
        .debugging(seed=0)
    )
    algo = cfg.build_algo()
    try:
        success = [algo.train()["env_runners"]["success_rate"] for _ in range(12)]
    finally:
        algo.stop()
        ray.shutdown()
    # Only iteration 1 samples the untrained policy (metrics are per iteration, window=1); the second
    # already follows one update at lr 3e-3 and can be past 0.5 (CI saw 0.66). 32 draws at p=0.25:
    # P(>= 0.6) < 1e-4, so this bound tests "starts near chance" without flaking.
    assert success[0] < 0.6, success
    assert np.mean(success[-3:]) > 0.85, success
    assert np.mean(success[-3:]) - success[0] > 0.3, success
