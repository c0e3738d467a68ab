"""Each offline environment family runs a short R3L training iteration for real (tiny model, CPU)."""

import pytest

pytestmark = pytest.mark.integration

ENVS = [
    ("r3l/CoinCollector", {}),
    ("r3l/TextWorldExpress", {"game": "sorting"}),
    ("r3l/ScienceWorld", {"list_actions": False}),
    ("r3l/Math", {}),
    ("r3l/Countdown", {}),
]


@pytest.mark.parametrize("env_id,env_config", ENVS, ids=[e[0] for e in ENVS])
def test_one_r3l_iteration(ray_session, env_id, env_config):
    from rllib_r3l import R3LConfig

    cfg = (
        R3LConfig()
        .environment(env_id, env_config=env_config)
        .training(
            model="tiny",
            group_size=2,
            tasks_per_iteration=1,
            backend="transformers",
            max_turns=3,
            max_response_tokens=12,
            max_reflection_tokens=24,
            lr=1e-4,
        )
        .debugging(seed=0)
    )
    algo = cfg.build_algo()
    try:
        r = algo.train()
    finally:
        algo.stop()
    er = r["env_runners"]
    assert er["num_episodes"] == 1  # group_size 2 with reflection: one base rollout (+ up to one retry)
    assert er["r3l"]["faults"]["env_errors"] == 0 and er["r3l"]["faults"]["episodes_lost"] == 0
    assert 1 <= er["episode_len_mean"] <= 3
    # the base rollout was reflected on, unless it succeeded (reflect_on="failures": passed over, counted)
    assert er["r3l"].get("reflection_total", 0) + er["r3l"]["reflections_skipped_successes"] == 1
