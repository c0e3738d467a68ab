"""Dynamic sampling (``dynamic_sampling_rounds``, DAPO §3.2): which task groups carry a learning
signal (hand-made groups, hand-derived advantages), and a real env runner exploring further rounds
of new tasks until one does."""

from __future__ import annotations

import pytest

from rllib_r3l.batch import carries_signal
from rllib_r3l.runner.explore import GroupResult
from rllib_r3l.trajectory import Kind
from tests.scripted import make_trajectory

PARTS = [("prompt", 3, 0), ("response", 2, 0), ("prompt", 2, 1), ("response", 2, 1)]
OPTS = dict(
    std_normalize=False,
    positive_amplification=True,
    alpha=3.0,
    success_reward=1.0,
    pivotal_credit=True,
    max_length=64,
    loss_aggregation="token_mean",
)


def group(rewards, gid="g", **kw):
    return GroupResult(gid, [make_trajectory(PARTS, reward=r, group_id=gid) for r in rewards], **kw)


def test_a_group_of_equal_failures_has_no_signal_and_one_success_gives_one():
    # rewards 0,0,0,0: mean baseline 0, every advantage 0 -> nothing for the learner
    assert not carries_signal(group([0.0, 0.0, 0.0, 0.0]), **OPTS)
    # 1,0,0,0: advantages 0.75, -0.25 x3 (then the success fixed at 1.0): a signal
    assert carries_signal(group([1.0, 0.0, 0.0, 0.0]), **OPTS)
    # partial credit counts too: 0.5,0,0,0 -> 0.375 x alpha, -0.125 x3
    assert carries_signal(group([0.5, 0.0, 0.0, 0.0]), **OPTS)


def test_an_all_success_group_has_a_signal_only_through_positive_amplification():
    # 1,1,1,1: group-relative advantages are all 0; positive amplification fixes successes at 1.0
    assert carries_signal(group([1.0] * 4), **OPTS)
    assert not carries_signal(group([1.0] * 4), **{**OPTS, "positive_amplification": False})


def test_an_auxiliary_item_alone_is_a_signal_and_an_incomplete_group_never_is():
    g = group([0.0, 0.0])
    g.trajectories.append(
        make_trajectory(PARTS, reward=1.0, group_id="g/retry_sft/1", kind=Kind.RETRY_SFT, fixed_advantage=1.0)
    )
    assert carries_signal(g, **OPTS)
    # a group that lost an episode is dropped by the driver (select_trainable): no signal
    assert not carries_signal(group([1.0, 0.0, 0.0], complete=False), **OPTS)
    # an item too long for the learner is dropped (drop_overlong): the success no longer counts
    assert not carries_signal(group([1.0, 0.0]), **{**OPTS, "max_length": 8})


def test_a_success_whose_tokens_are_all_before_the_pivot_carries_nothing():
    # credit starts at turn 2, after the last response: no credited token, so no signal
    trajs = [
        make_trajectory(PARTS, reward=1.0, group_id="g", credit_from_turn=2),
        make_trajectory(PARTS, reward=0.0, group_id="g", credit_from_turn=2),
    ]
    assert not carries_signal(GroupResult("g", trajs), **OPTS)
    assert carries_signal(GroupResult("g", trajs), **{**OPTS, "pivotal_credit": False})


def test_config_rejects_a_bad_number_of_rounds():
    from rllib_r3l import R3LConfig

    assert R3LConfig().dynamic_sampling_rounds == 0  # off: the paper, equal budgets
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="dynamic_sampling_rounds.*integer >= 0"):
            R3LConfig().training(dynamic_sampling_rounds=bad).validate_r3l()


# -- a real runner (tiny model, toy corridor, transformers backend) ---------------------------------------
def _runner(rounds, **env):
    from rllib_r3l import R3LConfig
    from rllib_r3l.runner.env_runner import R3LEnvRunner

    cfg = (
        R3LConfig()
        .environment("r3l/ToyCorridor", env_config=env)
        .training(
            model="tiny",
            group_size=4,
            tasks_per_iteration=2,
            backend="transformers",
            max_response_tokens=8,
            max_reflection_tokens=24,
            dynamic_sampling_rounds=rounds,
        )
        .debugging(seed=0)
    )
    return R3LEnvRunner(config=cfg)


@pytest.mark.slow
def test_runner_explores_every_extra_round_when_no_task_can_be_won():
    # the coin is never reachable in one turn of a 6-room corridor: no group can carry a signal
    runner = _runner(2, num_rooms=6, max_turns=1)
    try:
        groups = runner.sample()
        m = runner.get_metrics()
        assert len(groups) == 2 * 3  # 2 tasks, then 2 extra rounds of 2 new tasks
        assert len({g.group_id for g in groups}) == 6
        assert not any(t.success for g in groups for t in g.trajectories)
        ds = m["r3l"]["dynamic_sampling"]
        assert (ds["extra_rounds"], ds["rounds_exhausted"], ds["groups_without_signal"]) == (2, 1, 6)
        assert m["num_groups"] == 6 and m["num_episodes"] == 6 * 2  # every round's base episodes count
        assert runner.counters["progress_rounds"] == 2
    finally:
        runner.stop()


@pytest.mark.slow
def test_runner_stops_at_the_first_round_with_a_signal(monkeypatch):
    """The loop's stopping rule, with the signal test scripted: round 0 silent, round 1 not."""
    import rllib_r3l.batch as batch

    seen = []

    def scripted_signal(g, **opts):
        seen.append(g.group_id)
        return len(seen) > 2  # the first round's two groups are silent, the next round's are not

    monkeypatch.setattr(batch, "carries_signal", scripted_signal)
    runner = _runner(3, num_rooms=3)
    try:
        groups = runner.sample()
        ds = runner.get_metrics()["r3l"]["dynamic_sampling"]
        assert len(groups) == 4 and seen == [g.group_id for g in groups]
        assert (ds["extra_rounds"], ds["rounds_exhausted"], ds["groups_without_signal"]) == (1, 0, 2)
    finally:
        runner.stop()


@pytest.mark.slow
def test_runner_off_explores_one_round_and_still_counts_silent_groups():
    runner = _runner(0, num_rooms=6, max_turns=1)
    try:
        groups = runner.sample()
        ds = runner.get_metrics()["r3l"]["dynamic_sampling"]
        assert len(groups) == 2 and ds["groups_without_signal"] == 2 and "extra_rounds" not in ds
    finally:
        runner.stop()
