"""An exact trajectory budget (``R3L.episode_cap``, ``sample(max_episodes=...)``, ``Explorer.explore(max_episodes)``):
comparisons at equal budgets stop every run at exactly the same number of base and retry episodes started
(issue 46, item 6). Scripted episodes for the explorer; the tiny model through a real algorithm for the plumbing."""

from __future__ import annotations

import pytest

from rllib_r3l.runner.dispatch import episode_shares
from rllib_r3l.trajectory import Kind
from tests.scripted import make_explorer

SEED = 11  # ToyCorridor(4 rooms): every unguided base fails, every guided retry from turn 1 succeeds


@pytest.mark.parametrize(
    "cap, bases, retries, cut", [(None, 4, 4, 0), (8, 4, 4, 0), (6, 4, 2, 2), (4, 4, 0, 4), (3, 3, 0, 3), (0, 0, 0, 0)]
)
def test_explore_starts_at_most_max_episodes_bases_first(tiny_tokenizer, cap, bases, retries, cut):
    ex, _ = make_explorer(tiny_tokenizer, reflect_on="failures")  # 2 tasks x 2 base episodes, one retry each
    groups = ex.explore([SEED, SEED], ["g0", "g1"], max_episodes=cap)
    got = [t for g in groups for t in g.trajectories]
    assert sum(t.kind == Kind.BASE for t in got) == bases and sum(t.kind == Kind.RETRY for t in got) == retries
    assert ex.counters["episodes_started"] == bases + retries and ex.counters["retries_cut_by_budget"] == cut
    rows = [r for g in groups for r in g.ledger]
    assert sum(r["retry_status"] == "cut" for r in rows) == cut and len(rows) == bases
    assert all(g.trajectories for g in groups)  # a task the budget never reached is not returned as a group


def test_the_cap_is_split_over_runners_like_their_groups():
    assert episode_shares(None, {1: 2, 2: 1}) == {1: None, 2: None}
    assert episode_shares(10, {1: 2, 2: 1}) == {1: 7, 2: 3}  # 6 + 3, the remainder to the first runner
    assert episode_shares(1, {1: 1, 2: 1}) == {1: 1, 2: 0}
    assert sum(episode_shares(17, {1: 3, 2: 3, 3: 2}).values()) == 17


@pytest.mark.integration
def test_an_iteration_starts_no_more_than_the_cap(ray_session):
    """The cap is a ceiling: an iteration whose plan needs fewer starts fewer, and the harness caps the next one
    with what is left, so a run ends at its budget exactly."""
    from tests.scripted_rllib import tiny_config

    algo = tiny_config(sampling_seed=0, dynamic_sampling_rounds=2).build_algo()
    try:
        algo.episode_cap = 3  # two tasks of 2 base episodes (+ retries, + dynamic rounds) would start more
        r = algo.train()
        assert r["env_runners"]["r3l"]["episodes_started"] == 3
        algo.episode_cap = None
        r = algo.train()
        assert r["env_runners"]["r3l"]["episodes_started"] >= 4  # uncapped: at least every base episode
    finally:
        algo.stop()
