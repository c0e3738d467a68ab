"""r3l/TextWorld (games generated here with TextWorld's challenges) and r3l/ALFWorld.

ALFWorld's real games are only fetched by ``alfworld-download`` from a source this machine cannot
reach, so the ALFWorld adapter runs here on a handwritten miniature data folder
(``alfworld_mini.py``) that uses ALFWorld's own PDDL domain and grammar. Both environments share
the ``TextWorldGameEnv`` adapter code.
"""

import os
import subprocess
import sys

import pytest
from alfworld_mini import write_mini_alfworld
from envtest_helpers import ROOT, random_walk

from environments import make
from environments.alfworld_env import ALFWorldEnv
from environments.textworld_games import TextWorldEnv
from tests.hang_guard import HANG_GUARD_S


# ------------------------------------------------------------------------------ r3l/TextWorld
@pytest.fixture(scope="module")
def tw_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tw_games"))


@pytest.fixture(scope="module")
def tw(tw_cache):
    env = TextWorldEnv(cache_dir=tw_cache)
    yield env
    env.close()


@pytest.mark.subprocess
def test_textworld_empty_env_config_generates_a_game(tw_cache, monkeypatch):
    monkeypatch.setenv("RLLIB_R3L_CACHE", tw_cache)  # the default cache folder, redirected for the test
    env = make("r3l/TextWorld")
    try:
        assert env.challenge == "tw-coin_collector" and env.max_turns == 20 and env.split == "train"
        obs, info = env.reset(seed=0)
        assert info["game_file"].startswith(tw_cache) and info["game_file"].endswith(".z8")
        assert "$$" not in obs and not obs.rstrip().endswith(">")  # banner and prompt cleaned off
        assert info["task"] and "coin" in info["task"].lower()
        assert info["admissible_actions"] == sorted(info["admissible_actions"])
    finally:
        env.close()


@pytest.mark.subprocess
def test_textworld_gold_path_reaches_one(tw):
    gold = tw.gold_actions(0)
    assert gold
    tw.reset(seed=0)
    total, info, term = 0.0, {}, False
    for a in gold:
        _o, r, term, _t, info = tw.step(a)
        total += r
    assert term and info["won"] and total == pytest.approx(1.0)


@pytest.mark.subprocess
def test_textworld_determinism_restore_and_invalid_feedback(tw, tw_cache):
    actions, observations = random_walk(tw, seed=0, steps=6, rng_seed=3, avoid=("take",))
    other = TextWorldEnv(cache_dir=tw_cache)
    try:
        replayed = [other.reset(seed=0)[0]] + [other.step(a)[0] for a in actions]
        assert replayed == observations
    finally:
        other.close()
    obs, _ = tw.restore(0, actions[:3])
    assert obs == observations[3]
    _, info = tw.reset(seed=0)
    obs, r, term, _t, info2 = tw.step("sing a song")
    assert info2["invalid_action"] and r == 0 and not term
    assert "sing a song" in obs and "not an admissible command" in obs
    assert all(a in obs for a in info["admissible_actions"])


@pytest.mark.subprocess
def test_textworld_splits_use_disjoint_games_and_game_files_mode(tw, tw_cache):
    dev = TextWorldEnv(cache_dir=tw_cache, split="dev")
    try:
        train_file, dev_file = tw.game_for_seed(0), dev.game_for_seed(0)
        assert train_file != dev_file
        # the same files through game_files={split: ...}
        env = make("r3l/TextWorld", {"game_files": {"train": [train_file], "dev": [dev_file]}, "split": "dev"})
        try:
            assert env.games() == [dev_file]
            assert env.reset(seed=5)[0] == dev.reset(seed=0)[0]
        finally:
            env.close()
    finally:
        dev.close()


def test_textworld_bad_env_config_names_the_field(tmp_path):
    with pytest.raises(ValueError, match="challenge"):
        make("r3l/TextWorld", {"challenge": "tw-chess"})
    with pytest.raises(ValueError, match="game_files"):
        make("r3l/TextWorld", {"game_files": str(tmp_path / "nothing_here.z8")})
    with pytest.raises(ValueError, match="game_files"):
        make("r3l/TextWorld", {"game_files": str(tmp_path)})  # a folder without games
    with pytest.raises(ValueError, match="settings"):
        make("r3l/TextWorld", {"settings": ["level", 3]})
    env = make("r3l/TextWorld", {"settings": {"level": 3, "colour": "red"}, "cache_dir": str(tmp_path)})
    with pytest.raises(ValueError, match="settings"):
        env.reset(seed=0)


# ------------------------------------------------------------------------------ r3l/ALFWorld
def test_alfworld_without_data_names_alfworld_data_and_download_command(monkeypatch, tmp_path):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(FileNotFoundError) as e:
        make("r3l/ALFWorld")
    assert "ALFWORLD_DATA" in str(e.value) and "alfworld-download" in str(e.value)
    # a data folder with zero games fails before any reset (ALFWorld's own reset would loop forever)
    (tmp_path / "json_2.1.1" / "train").mkdir(parents=True)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError) as e:
        make("r3l/ALFWorld")
    assert "zero" in str(e.value) and "ALFWORLD_DATA" in str(e.value) and "alfworld-download" in str(e.value)
    with pytest.raises(FileNotFoundError, match="valid_unseen"):
        make("r3l/ALFWorld", {"split": "test"})


@pytest.fixture(scope="module")
def alf_data(tmp_path_factory):
    return write_mini_alfworld(tmp_path_factory.mktemp("alfworld"))


def test_alfworld_adapter_on_handwritten_mini_games_since_real_data_cannot_be_fetched(alf_data, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", alf_data)
    env = make("r3l/ALFWorld")
    try:
        assert env.max_turns == 25
        games = env.games()
        assert len(games) == 2  # the unsolvable and the 'movable' games are left out, as ALFWorld does
        assert env.games("dev") != games and env.games("test") != games
        obs, info = env.reset(seed=0)
        assert "Welcome to TextWorld" not in obs and "countertop 1" in obs
        assert info["task"] == "put some apple in fridge."
        assert "go to fridge 1" in info["admissible_actions"]
        gold = env.gold_actions(0)
        assert gold[-1].startswith("move apple")
        env.reset(seed=0)
        total, step_info, term = 0.0, {}, False
        for a in gold:
            _o, r, term, _t, step_info = env.step(a)
            total += r
        assert term and step_info["won"] and total == 1.0
        # invalid action: feedback, the episode goes on
        env.reset(seed=0)
        obs, r, term, _t, step_info = env.step("teleport to the moon")
        assert step_info["invalid_action"] and not term and "Nothing happens" in obs and "go to fridge 1" in obs
        # replay
        actions = ["go to countertop 2", "take apple 1 from countertop 2", "go to fridge 1"]
        observations = [env.reset(seed=0)[0]] + [env.step(a)[0] for a in actions]
        assert env.restore(0, actions[:2])[0] == observations[2]
    finally:
        env.close()


def test_alfworld_reference_protocol_options(alf_data):
    env = ALFWorldEnv(data_path=alf_data, end_on_invalid=True, max_repeats=3)
    try:
        env.reset(seed=1)
        obs, r, term, _t, info = env.step("dance")
        assert term and r == 0 and info["invalid_action"] and "episode ends" in obs
        env.reset(seed=1)
        for _ in range(3):
            obs, r, term, _t, info = env.step("look")
        assert term and info["repeated"] and not info["won"] and "3 times" in obs
    finally:
        env.close()


@pytest.mark.subprocess
def test_alfworld_observations_do_not_depend_on_the_hash_seed(alf_data):
    # retries may replay in another worker process: the text must not depend on PYTHONHASHSEED
    actions = ["go to countertop 1", "go to countertop 2", "take mug 1 from countertop 2", "inventory"]
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from environments.alfworld_env import ALFWorldEnv\n"
        "e = ALFWorldEnv(data_path=sys.argv[2])\n"
        "o, i = e.reset(seed=0); out = [o, repr(i['admissible_actions'])]\n"
        f"for a in {actions!r}:\n"
        "    out.append(e.step(a)[0])\n"
        "print('\\n'.join(out))\n"
    )
    env = ALFWorldEnv(data_path=alf_data)
    o, i = env.reset(seed=0)
    here = "\n".join([o, repr(i["admissible_actions"])] + [env.step(a)[0] for a in actions]) + "\n"
    env.close()
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    res = subprocess.run(
        [sys.executable, "-c", script, ROOT, alf_data],
        env=dict(os.environ, PYTHONHASHSEED=seed),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout == here and "mug" in here


def test_alfworld_bad_env_config_names_the_field(alf_data):
    with pytest.raises(ValueError, match="task_types"):
        make("r3l/ALFWorld", {"data_path": alf_data, "task_types": [9]})
    with pytest.raises(ValueError, match="max_repeats"):
        make("r3l/ALFWorld", {"data_path": alf_data, "max_repeats": 0})
    with pytest.raises(ValueError, match="data_path"):
        make("r3l/ALFWorld", {"data_path": 42})
