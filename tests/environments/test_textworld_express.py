"""r3l/CoinCollector and r3l/TextWorldExpress on the real TextWorldExpress JVM."""

import os
from pathlib import Path

import psutil
import pytest
from envtest_helpers import java_children, random_walk

from environments import make
from environments.twx import COIN_DEFAULT_PARAMS, CoinCollectorEnv, TextWorldExpressEnv, params_to_string

pytestmark = pytest.mark.subprocess  # every test here runs a JVM environment (one gateway per process)


@pytest.fixture(scope="module")
def coin():
    env = make("r3l/CoinCollector")
    yield env
    env.close()


def test_coin_defaults_from_empty_env_config(coin):
    assert isinstance(coin, CoinCollectorEnv)
    assert coin.max_turns == 10 and coin.split == "train"
    assert coin.game == "coin" and coin.game_params == params_to_string(COIN_DEFAULT_PARAMS)
    obs, info = coin.reset(seed=3)
    assert "kitchen" in obs.lower() or "you are in" in obs.lower()
    assert "coin" in info["task"].lower()
    assert (
        info["admissible_actions"] == sorted(info["admissible_actions"]) and "look around" in info["admissible_actions"]
    )
    assert info["game_seed"] in coin.fold_seeds()


def test_same_seed_same_episode_across_instances_and_close_stops_the_jvm(coin):
    before = java_children()
    actions, observations = random_walk(coin, seed=11, steps=10)
    other = CoinCollectorEnv()
    obs, _ = other.reset(seed=11)
    replayed = [obs]
    for a in actions:
        replayed.append(other.step(a)[0])
    assert replayed == observations
    pid = other.jvm_pid
    assert pid in java_children()
    other.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert java_children() - before == set()
    other.close()  # idempotent


def test_game_jvms_start_with_quick_start_options_and_the_users_win(coin, monkeypatch):
    """TWX JVMs get C1-only compilation, the serial collector and the heap cap through
    JAVA_TOOL_OPTIONS, which is restored afterwards; the user's own settings of those win."""
    from environments._common import QUICK_START_OPTIONS, java_heap

    coin.reset(seed=1)
    environ = Path(f"/proc/{coin.jvm_pid}/environ").read_text()  # read and closed
    env_vars = dict(e.split("=", 1) for e in environ.split("\0") if "=" in e)
    opts = env_vars["JAVA_TOOL_OPTIONS"].split()
    assert set(QUICK_START_OPTIONS) <= set(opts) and "-Xmx512m" in opts
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Xmx2g -XX:+UseParallelGC")
    with java_heap("512m", quick_start=True):
        assert os.environ["JAVA_TOOL_OPTIONS"].split() == ["-Xmx2g", "-XX:+UseParallelGC", "-XX:TieredStopAtLevel=1"]
    assert os.environ["JAVA_TOOL_OPTIONS"] == "-Xmx2g -XX:+UseParallelGC"
    monkeypatch.delenv("JAVA_TOOL_OPTIONS")
    with java_heap("768m"):  # ScienceWorld's long-lived JVM: the heap cap only
        assert os.environ["JAVA_TOOL_OPTIONS"] == "-Xmx768m"
    assert "JAVA_TOOL_OPTIONS" not in os.environ


def test_restore_equals_recorded_observation(coin):
    actions, observations = random_walk(coin, seed=5, steps=8, rng_seed=1)
    for k in (0, 3, len(actions)):
        obs, info = coin.restore(5, actions[:k])
        assert obs == observations[k]
        assert "admissible_actions" in info


def test_invalid_action_gets_language_feedback(coin):
    _, info = coin.reset(seed=2)
    obs, r, term, trunc, info2 = coin.step("dance wildly")
    assert info2["invalid_action"] is True and r == 0.0 and not term
    assert "invalid action" in obs.lower() and "dance wildly" in obs
    for a in info["admissible_actions"]:
        assert a in obs  # the feedback lists what is valid
    obs, *_rest, info3 = coin.step("Look around.")  # case and final period are forgiven
    assert info3["invalid_action"] is False


def test_gold_path_reaches_one(coin):
    # TWX's gold path for coin explores at random (its length varies between calls): take one short enough
    seed, gold = next((s, g) for s in range(50) for g in [coin.gold_actions(s)] if len(g) <= coin.max_turns)
    coin.reset(seed=seed)
    total, info = 0.0, {}
    for a in gold:
        _obs, r, term, trunc, info = coin.step(a)
        total += r
    assert term and not trunc and info["won"] is True
    assert total == pytest.approx(1.0)


def test_truncates_at_max_turns(coin):
    coin.reset(seed=0)
    trunc = False
    for _ in range(coin.max_turns):
        _obs, _r, term, trunc, _info = coin.step("inventory")
    assert trunc and not term
    with pytest.raises(RuntimeError):
        coin.step("inventory")


def test_splits_are_disjoint_folds(coin):
    seeds = {s: set(coin.fold_seeds(s)) for s in ("train", "dev", "test")}
    assert seeds["train"] and seeds["dev"] and seeds["test"]
    assert not (seeds["train"] & seeds["dev"]) and not (seeds["train"] & seeds["test"])
    assert not (seeds["dev"] & seeds["test"])
    _, info = coin.reset(seed=7)
    assert info["game_seed"] in seeds["train"] and info["split"] == "train"


def test_other_game_reward_is_normalised_to_one():
    # arithmetic has a raw max score of 2: increments are normalised, the gold path sums to 1.0
    env = make("r3l/TextWorldExpress", {"game": "arithmetic", "split": "dev", "max_turns": 40})
    try:
        gold = env.gold_actions(4)
        _, info = env.reset(seed=4)
        assert info["split"] == "dev" and info["game_seed"] in env.fold_seeds()
        assert not set(env.fold_seeds()) & set(env.fold_seeds("train"))
        rewards, info = [], {}
        for a in gold:
            _o, r, term, _t, info = env.step(a)
            rewards.append(r)
        assert info["won"] and term
        assert sum(rewards) == pytest.approx(1.0)
        assert any(0 < r < 1 for r in rewards)
    finally:
        env.close()


def test_game_params_as_string_or_dict():
    a = TextWorldExpressEnv(game="coin", game_params="numLocations=2, includeDoors=0")
    b = TextWorldExpressEnv(game="coin", game_params={"numLocations": 2, "includeDoors": False})
    assert a.game_params == b.game_params == "numLocations=2,includeDoors=0"
    with pytest.raises(ValueError, match="game_params"):
        TextWorldExpressEnv(game="coin", game_params={"numLocations": "four"})


def test_bad_env_config_names_the_field():
    with pytest.raises(ValueError, match="game"):
        make("r3l/TextWorldExpress", {"game": "chess"})
    with pytest.raises(ValueError, match="split"):
        make("r3l/CoinCollector", {"split": "holdout"})
    with pytest.raises(ValueError, match="num_locations"):
        make("r3l/CoinCollector", {"num_locations": 0})
    with pytest.raises(ValueError, match="max_turns"):
        make("r3l/CoinCollector", {"max_turns": 0})
    with pytest.raises(ValueError, match="gameFold"):
        make("r3l/CoinCollector", {"gameFold": "train"})
    before = java_children()
    env = make("r3l/TextWorldExpress", {"game": "coin", "game_params": "rooms=3"})
    try:
        with pytest.raises(ValueError, match="game_params"):
            env.reset(seed=0)
        assert java_children() - before == set()  # the JVM started to check them is stopped again
    finally:
        env.close()


def test_compact_observation_drops_furniture_and_keeps_room_coin_exits_and_feedback():
    from environments.twx import compact_observation

    corridor = (
        "You are in the corridor. In one part of the room you see a key holder, that has nothing on it. "
        "There is also a shoe cabinet that is closed. You also see a umbrella stand, that has nothing on it. "
        "In another part of the room you see a hat rack, that has nothing on it. There is also a coin. "
        "\nTo the North you see the kitchen. To the West you see the bedroom. "
    )
    assert compact_observation(corridor) == (
        "You are in the corridor. There is also a coin.\n"
        "To the North you see the kitchen. To the West you see the bedroom."
    )
    assert compact_observation("You take the coin.") == "You take the coin."
    bad = (
        "Invalid action 'move west': Unknown action: I'm not sure what you mean. It is not one of the valid "
        "actions. Valid actions now: inventory, look around, move north, move south."
    )
    assert compact_observation(bad) == bad
    assert compact_observation("Inventory: \n  Your inventory is currently empty.\n") == (
        "Inventory:\nYour inventory is currently empty."
    )


def test_compact_coin_collector_plays_the_same_game_in_fewer_tokens(coin):
    assert coin.compact_observations  # the default
    compact, coin = coin, make("r3l/CoinCollector", {"compact_observations": False})
    try:
        seed = next(s for s in range(40) if len(coin._gold_plan(s)) == 3)  # the coin two moves away
        plan = coin._gold_plan(seed)
        full_obs, full_info = coin.reset(seed=seed)
        obs, info = compact.reset(seed=seed)
        assert info == full_info and obs.startswith("You are in the ") and len(obs) < len(full_obs) / 2
        seen, rewards = [obs], []
        for a in plan:
            full = coin.step(a)
            step = compact.step(a)
            assert step[1:] == full[1:]  # reward, termination and info: the same game
            seen.append(step[0])
            rewards.append(step[1])
        assert "coin" in seen[-2].lower() and sum(rewards) == 1.0 and step[2]  # the coin is shown, then taken
        assert compact.oracle(seed, plan) == coin.oracle(seed, plan) == (None, None)
    finally:
        coin.close()
    with pytest.raises(ValueError, match="compact_observations"):
        make("r3l/CoinCollector", {"compact_observations": "yes"})
