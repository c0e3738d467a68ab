"""r3l/WebShop: what runs without WebShop's product data.

The official WebShop environment (its repository, product data and search index) cannot be set up
on this machine, so the adapter's episode logic runs here against a small stand-in engine with
WebShop's text-env interface; the error paths, action parsing and reward mapping are tested as is.
"""

import pytest

from environments import make
from environments.webshop import SPLIT_GOALS, WebShopEnv, episode_reward, goal_range, parse_action


def test_missing_webshop_names_the_variable_and_what_to_install(monkeypatch, tmp_path):
    monkeypatch.delenv("WEBSHOP_PATH", raising=False)
    with pytest.raises(FileNotFoundError) as e:
        make("r3l/WebShop")
    msg = str(e.value)
    assert "WEBSHOP_PATH" in msg and "webshop_path" in msg and "web_agent_site" in msg and "WebShop" in msg
    monkeypatch.setenv("WEBSHOP_PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no web_agent_site package"):
        make("r3l/WebShop")


def test_webshop_path_that_does_not_import_gives_a_clear_error(tmp_path):
    pkg = tmp_path / "web_agent_site" / "envs"
    pkg.mkdir(parents=True)
    (tmp_path / "web_agent_site" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "web_agent_text_env.py").write_text("raise FileNotFoundError('data/items_shuffle.json')\n")
    with pytest.raises(ImportError) as e:
        WebShopEnv(webshop_path=str(tmp_path))
    assert "WEBSHOP_PATH" in str(e.value) and "items_shuffle" in str(e.value)


def test_parse_action():
    assert parse_action("search[red running shoes]") == ("search", "red running shoes")
    assert parse_action("  Click[ Buy Now ] ") == ("click", "Buy Now")
    assert parse_action("I think I should buy it.\nclick[buy now]") == ("click", "buy now")
    for bad in ("buy it", "search[]", "click buy now", ""):
        with pytest.raises(ValueError):
            parse_action(bad)


def test_reward_mapping():
    assert episode_reward(0.0, ended=False, failure_reward=-0.1) == 0.0
    assert episode_reward(0.75, ended=True, failure_reward=-0.1) == 0.75
    assert episode_reward(1.0, ended=True, failure_reward=-0.1) == 1.0
    assert episode_reward(0.0, ended=True, failure_reward=-0.1) == -0.1
    assert episode_reward(0.0, ended=True, failure_reward=0.0) == 0.0


def test_goal_splits_are_disjoint():
    n = 12087
    folds = {s: set(goal_range(s, n)) for s in SPLIT_GOALS}
    assert len(folds["test"]) == 500 and len(folds["dev"]) == 1000 and len(folds["train"]) == n - 1500
    assert (
        not (folds["train"] & folds["dev"])
        and not (folds["train"] & folds["test"])
        and not (folds["dev"] & folds["test"])
    )


class StandInShop:
    """WebShop's text-env interface (reset/step/get_available_actions/get_instruction_text) over
    two products; buying the right one with the right size scores 1.0, the wrong size 0.5."""

    class server:
        goals = [{"instruction_text": f"goal {i}"} for i in range(2000)]

    def __init__(self):
        self.page, self.size, self.session = "search", None, None

    def reset(self, session=None):
        self.page, self.size, self.session = "search", None, session
        return self._obs(), None

    def get_instruction_text(self):
        return f"Instruction: i need blue shoes in size 9 (goal {self.session})"

    def get_available_actions(self):
        if self.page == "search":
            return {"has_search_bar": True, "clickables": ["search"]}
        if self.page == "results":
            return {"has_search_bar": False, "clickables": ["back to search", "b001", "b002"]}
        return {"has_search_bar": False, "clickables": ["back to search", "< prev", "8", "9", "buy now"]}

    def _obs(self):
        return {
            "search": "WebShop [SEP] Instruction: [SEP] i need blue shoes [SEP] Search",
            "results": "Back to Search [SEP] B001 [SEP] Blue shoes [SEP] B002 [SEP] Red shoes",
            "item": f"Back to Search [SEP] < Prev [SEP] size [SEP] 8 [SEP] 9 [SEP] Buy Now [SEP] {self.page}",
        }["item" if self.page.startswith("b") else self.page]

    def step(self, action):
        kind, arg = parse_action(action)
        if kind == "search":
            self.page = "results"
        elif arg == "back to search":
            self.page = "search"
        elif arg in ("b001", "b002"):
            self.page = arg
        elif arg in ("8", "9"):
            self.size = arg
        elif arg == "buy now":
            reward = (1.0 if self.size == "9" else 0.5) if self.page == "b001" else 0.0
            return "Thank you for shopping with us!", reward, True, None
        return self._obs(), 0.0, False, None


def _shop(**kw):
    return make("r3l/WebShop", dict(engine_factory=StandInShop, **kw))


def test_episode_with_stand_in_engine_since_no_product_data_here():
    env = _shop()
    assert env.max_turns == 15 and env.failure_reward == -0.1
    obs, info = env.reset(seed=3)
    assert info["session"] == 1503 and "blue shoes in size 9" in info["task"]
    assert info["admissible_actions"] is None  # a search bar: free text
    # invalid: a click on a search page, then bad format
    obs, r, term, _t, info = env.step("click[buy now]")
    assert info["invalid_action"] and r == 0 and not term and "search[query]" in obs
    obs, r, term, _t, info = env.step("buy the blue shoes")
    assert info["invalid_action"] and "search[query] or click[button text]" in obs
    _, _, _, _, info = env.step("search[blue shoes]")
    assert info["admissible_actions"] == ["click[b001]", "click[b002]", "click[back to search]"]
    obs, r, term, _t, info = env.step("click[b003]")
    assert info["invalid_action"] and "no button 'b003'" in obs and "click[b001]" in obs
    for a in ("click[b001]", "click[9]"):
        assert not env.step(a)[4]["invalid_action"]
    obs, r, term, trunc, info = env.step("click[buy now]")
    assert term and not trunc and r == 1.0 and info["won"]


def test_partial_and_failed_purchases_and_truncation():
    env = _shop(split="test")
    _, info = env.reset(seed=7)
    assert info["session"] == 7
    for a in ("search[shoes]", "click[b001]", "click[8]"):
        env.step(a)
    _o, r, term, _t, info = env.step("click[buy now]")
    assert term and r == 0.5 and not info["won"]
    env.reset(seed=7)
    for a in ("search[shoes]", "click[b002]"):
        env.step(a)
    assert env.step("click[buy now]")[1] == pytest.approx(-0.1)  # failure reward
    env = _shop(max_turns=2, failure_reward=-0.5)
    env.reset(seed=0)
    env.step("search[shoes]")
    _o, r, term, trunc, _info = env.step("click[b002]")
    assert trunc and not term and r == -0.5


def test_determinism_and_replay_with_stand_in_engine():
    env = _shop()
    actions = ["search[shoes]", "click[b001]", "click[9]"]
    observations = [env.reset(seed=1)[0]] + [env.step(a)[0] for a in actions]
    assert env.restore(1, actions[:2])[0] == observations[2]


def test_bad_env_config_names_the_field():
    with pytest.raises(ValueError, match="failure_reward"):
        _shop(failure_reward="low")
    with pytest.raises(ValueError, match="max_turns"):
        _shop(max_turns=0)
    with pytest.raises(ValueError, match="split"):
        _shop(split="val2")
