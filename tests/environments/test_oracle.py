"""Oracle pivots and gold actions (issue 11): hand-built episodes on every environment with an oracle."""

import random

import pytest

from environments import make
from environments.base import follow_plan, minimize_plan, repair_candidates
from environments.countdown import CountdownEnv
from environments.toy import ToyCorridorEnv, ToyWordEnv


# ------------------------------------------------------------------------------------------- pure helpers
def test_follow_plan_keeps_on_plan_actions_and_asks_replan_for_the_others():
    asked = []

    def replan(n, plan, a):
        asked.append((n, list(plan), a))
        return ["c"] if a == "x" else None  # "x" is an equally good detour, anything else is not

    assert follow_plan(["a", "b", "c"], ["a", "b", "c"], replan) == (None, [])
    assert asked == []
    assert follow_plan(["a", "x", "c"], ["a", "b", "c"], replan) == (None, [])
    assert follow_plan(["a", "y", "c"], ["a", "b", "c"], replan) == (1, ["b", "c"])  # the plan at the pivot
    assert follow_plan([], ["a"], replan) == (None, ["a"])
    assert follow_plan(["a", "b"], ["a"], replan)[0] == 1  # acting after the plan ended


def test_repair_candidates_and_minimize_plan():
    assert repair_candidates(["a", "b", "c"], "b") == [["a", "c"], ["b", "c"]]
    assert repair_candidates(["a", "b", "c"], "z") == [["b", "c"]]
    assert repair_candidates(["a"], "z") == [[]]

    def wins(acts):  # the task: "key" then "door"; wins as soon as both were done in that order
        seen = []
        for i, a in enumerate(acts):
            seen.append(a)
            if "key" in seen and a == "door" and seen.index("key") < i:
                return i + 1
        return None

    assert minimize_plan(["look", "key", "look", "door", "dance"], wins) == ["key", "door"]
    with pytest.raises(RuntimeError):
        minimize_plan(["door", "key"], wins)


# ------------------------------------------------------------------------------------------- toys
def test_toy_corridor_oracle_on_hand_built_episodes():
    env = ToyCorridorEnv(num_rooms=5)
    seed = next(s for s in range(100) if (lambda p, c: c - p == 2)(*env._layout(s)))  # coin 2 rooms right
    optimal = ["move right", "move right", "take coin"]
    assert env.oracle_pivot(seed, optimal) is None
    assert env.oracle(seed, ["move right", "move left", "move right"]) == (1, "move right")
    assert env.oracle(seed, ["take coin"]) == (0, "move right")  # no coin here
    assert env.oracle(seed, ["Move right", "move right", "inventory"]) == (2, "take coin")
    assert env.oracle_action(seed, []) == "move right"
    assert env.oracle_action(seed, ["move right", "move right"]) == "take coin"
    assert env.oracle_action(seed, ["move left"]) is None  # already off every optimal path
    # the gold actions solve it through the environment
    env.reset(seed=seed)
    for a in optimal:
        _o, r, term, _t, info = env.step(a)
    assert term and info["won"]


def test_toy_word_oracle():
    env = ToyWordEnv()
    target = random.Random(7).choice(env.vocabulary)
    assert env.oracle_pivot(7, [target]) is None
    wrong = next(w for w in env.vocabulary if w != target)
    assert env.oracle(7, [wrong]) == (0, target)
    assert env.oracle_action(7, []) == target


# ------------------------------------------------------------------------------------------- attempts
def test_countdown_oracle_is_the_first_failed_attempt_and_gold_answer_solves_it():
    env = CountdownEnv()
    env.reset(seed=3)
    solution = env.solution()
    assert env.oracle_pivot(3, [f"<answer>{solution}</answer>"]) is None
    pivot, gold = env.oracle(3, ["<answer>1 + 1</answer>", f"<answer>{solution}</answer>"])
    assert pivot == 0 and gold == f"<answer>{solution}</answer>"
    assert env.oracle_action(3, []) == gold
    env.reset(seed=3)
    _o, r, term, _t, info = env.step(gold)
    assert info["won"] and r == 1.0


def test_math_oracle_gold_answer_is_accepted_by_the_verifier():
    env = make("r3l/Math")
    env.reset(seed=5)
    answer = env.reference_answer()
    assert env.oracle_pivot(5, [f"so \\boxed{{{answer}}}"]) is None
    pivot, gold = env.oracle(5, ["\\boxed{-1}"])
    assert pivot == 0
    env.reset(seed=5)
    assert env.step(gold)[4]["won"]
    assert env.oracle_pivot(5, []) is None  # nothing answered yet: nothing to fix


# ------------------------------------------------------------------------------------------- TextWorldExpress
@pytest.fixture(scope="module")
def coin():
    env = make("r3l/CoinCollector")
    yield env
    env.close()


@pytest.mark.subprocess
def test_coin_oracle_is_exact_search_on_hand_built_episodes(coin):
    # a game whose coin is two moves away
    seed = next(s for s in range(40) if len(coin._gold_plan(s)) == 3)
    plan = coin._gold_plan(seed)
    assert plan[-1] == "take coin" and all(a.startswith("move") for a in plan[:-1])
    assert coin.oracle_pivot(seed, plan) is None
    assert coin.oracle(seed, ["look around"] + plan) == (0, plan[0])  # a wasted turn
    assert coin.oracle(seed, [plan[0], "inventory"]) == (1, plan[1])
    _obs, info = coin.reset(seed=seed)
    wrong = next(a for a in info["admissible_actions"] if a.startswith("move") and a != plan[0])
    back = {"north": "south", "south": "north", "east": "west", "west": "east"}[wrong.split()[-1]]
    assert coin.oracle(seed, [wrong, f"move {back}"] + plan) == (0, plan[0])
    assert coin.oracle_action(seed, plan[:1]) == plan[1]
    assert coin.oracle_action(seed, [wrong]) is None
    # the oracle's plan solves the game through the adapter
    coin.reset(seed=seed)
    for a in plan:
        _o, _r, term, _t, info = coin.step(a)
    assert term and info["won"]


@pytest.mark.subprocess
def test_twx_gold_path_oracle_on_arithmetic():
    env = make("r3l/TextWorldExpress", {"game": "arithmetic"})
    try:
        plan = env._gold_plan(0)
        gold = [a for a in env.gold_actions(0)]
        assert len(plan) <= len(gold) and plan[-1].startswith("put ")
        assert env.oracle_pivot(0, plan) is None
        assert env.oracle(0, plan[:2] + ["look around"] + plan[2:]) == (2, plan[2])
        wrong_put = plan[:-1] + ["put math problem in box"]
        assert env.oracle(0, wrong_put)[0] == len(plan) - 1
        assert env.oracle_action(0, plan[:1]) == plan[1]
    finally:
        env.close()


# ------------------------------------------------------------------------------------------- ScienceWorld
@pytest.mark.subprocess
def test_scienceworld_oracle_on_hand_built_episodes():
    env = make("r3l/ScienceWorld", {"tasks": ["4-3"], "split": "dev"})  # find-plant: a 12-step gold
    try:
        plan = env._gold_plan(0)
        assert 5 <= len(plan) <= 15
        assert env.oracle_pivot(0, plan) is None
        i = next(i for i, a in enumerate(plan) if a.startswith("focus on"))  # a step no plan can skip
        assert env.oracle(0, plan[:i] + ["inventory"] + plan[i:]) == (i, plan[i])  # a wasted turn
        assert env.oracle(0, ["focus on door to outside"]) == (0, plan[0])  # a wrong focus fails the task
        assert env.oracle_action(0, plan[:3]) == plan[3]
    finally:
        env.close()


# ------------------------------------------------------------------------------------------- TextWorld / ALFWorld
def test_alfworld_oracle_on_hand_built_episodes(tmp_path):
    from alfworld_mini import write_mini_alfworld

    env = make("r3l/ALFWorld", {"data_path": write_mini_alfworld(tmp_path)})
    try:
        plan = env._gold_plan(0)
        assert plan == [
            "go to countertop 1",
            "take apple 1 from countertop 1",
            "go to fridge 1",
            "open fridge 1",
            "move apple 1 to fridge 1",
        ]
        assert env.oracle_pivot(0, plan) is None
        assert env.oracle(0, ["look"] + plan) == (0, plan[0])  # a wasted turn
        assert env.oracle(0, plan[:2] + ["go to countertop 2"] + plan[2:]) == (2, plan[2])  # a detour
        assert env.oracle(0, plan[:1] + ["take mug 1 from countertop 2"] + plan[1:]) == (1, plan[1])  # invalid
        assert env.oracle_action(0, plan[:2]) == plan[2]
    finally:
        env.close()
