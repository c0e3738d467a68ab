"""r3l/ScienceWorld on the real ScienceWorld JVM."""

import psutil
import pytest
from envtest_helpers import java_children

from environments import make
from environments.sciworld import ScienceWorldEnv, task_names

pytestmark = pytest.mark.subprocess  # every test here runs a JVM environment (one gateway per process)

TASKS = ["find-living-thing", "4-3"]  # short gold paths (8-12 steps); a name and a task id


@pytest.fixture(scope="module")
def sw():
    env = make("r3l/ScienceWorld", {"tasks": TASKS, "split": "dev"})
    yield env
    env.close()


def test_defaults_from_empty_env_config():
    env = make("r3l/ScienceWorld")
    try:
        assert env.max_turns == 30 and env.split == "train"
        assert env.tasks == task_names() and len(env.tasks) == 30
        assert env.jvm_pid is None  # the JVM starts on the first reset, not in the constructor
    finally:
        env.close()


def test_gold_path_reaches_one_and_rewards_are_score_over_100(sw):
    gold = sw.gold_actions(0)
    assert 0 < len(gold) <= sw.max_turns
    _obs, info = sw.reset(seed=0)
    assert info["task_name"] == "find-living-thing" and "living thing" in info["task"]
    rewards, step_info, term = [], {}, False
    for a in gold:
        _o, r, term, trunc, step_info = sw.step(a)
        rewards.append(r)
        if term or trunc:
            break
    assert term and step_info["won"] is True
    assert sum(rewards) == pytest.approx(1.0)
    assert all(abs(r * 100 - round(r * 100)) < 1e-6 for r in rewards)  # whole score points / 100
    assert any(0 < r < 1 for r in rewards)


def test_determinism_across_instances_replay_restore_and_close_stops_the_jvm(sw):
    before = java_children()
    _obs, info = sw.reset(seed=3)
    assert info["task_name"] == "find-plant"
    assert info["admissible_actions"] and info["admissible_actions"] == sorted(info["admissible_actions"])
    actions = ["look around", "open door to outside", "go to outside", "look around"]
    observations = [sw.reset(seed=3)[0]] + [sw.step(a)[0] for a in actions]
    obs, _ = sw.restore(3, actions[:2])
    assert obs == observations[2]
    other = ScienceWorldEnv(tasks=TASKS, split="dev")
    again = [other.reset(seed=3)[0]] + [other.step(a)[0] for a in actions]
    assert again == observations
    pid = other.jvm_pid
    assert pid in java_children()
    other.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert java_children() - before == set()
    other.close()  # idempotent


def test_invalid_actions_get_feedback_and_ambiguous_ones_ask_for_a_number(sw):
    sw.reset(seed=0)
    sw.step("look around")  # the first step carries the start state's score, if any
    obs, r, term, _t, info = sw.step("fly to the moon")
    assert info["invalid_action"] and r == 0 and not term
    assert "invalid action" in obs.lower() and "no known action" in obs.lower()
    # ambiguous: the options are listed and their numbers are the admissible actions for one turn
    obs, _r, _term, _t, info = sw.step("open door")
    assert not info["invalid_action"] and info["ambiguous"] and "open door between" in obs
    assert info["admissible_actions"] == [str(i) for i in range(len(info["admissible_actions"]))]
    assert len(info["admissible_actions"]) >= 2 and "1:" in obs
    # anything else cancels the request (invalid, with the options named); the engine acts normally again
    obs, _r, _term, _t, info = sw.step("look around")
    assert info["invalid_action"] and "cancelled" in obs and not info["ambiguous"]
    assert "look around" in info["admissible_actions"]
    obs, _r, _term, _t, info = sw.step("look around")
    assert not info["invalid_action"] and "this room is called" in obs.lower()
    # a number picks the option
    sw.step("open door")
    obs, _r, _term, _t, info = sw.step("0")
    assert not info["invalid_action"] and not info["ambiguous"] and "door" in obs.lower()


def test_grow_plant_gold_sequence_answers_an_ambiguous_request_and_wins_also_after_restore():
    # regression: the adapter used to cancel "Ambiguous request" prompts, so grow-plant ended at 0.14
    env = ScienceWorldEnv(tasks=["grow-plant"], split="train")
    try:
        gold = env.gold_actions(0)
        assert any(a.isdigit() for a in gold)  # ScienceWorld's own answer to a disambiguation
        _obs, info = env.reset(seed=0)
        env.max_turns = len(gold)
        total, amb = 0.0, 0
        for a in gold:
            _o, r, term, trunc, info = env.step(a)
            total += r
            amb += info["ambiguous"]
            if term or trunc:
                break
        assert amb >= 1 and term and info["won"] and total == pytest.approx(1.0)
        # restored right after the ambiguous request (a retry's replay), the question is still open
        j = next(i for i, a in enumerate(gold) if a.isdigit())
        obs, info = env.restore(0, gold[:j])
        assert info["ambiguous"] and gold[j] in info["admissible_actions"] and "Ambiguous request" in obs
        for a in gold[j:]:
            _o, r, term, trunc, info = env.step(a)
            if term or trunc:
                break
        assert term and info["won"] and info["score"] == pytest.approx(1.0)
    finally:
        env.close()


def test_split_variations_are_disjoint(sw):
    for task in TASKS:
        folds = {s: set(sw.split_variations(task, s)) for s in ("train", "dev", "test")}
        assert all(folds.values())
        assert not (folds["train"] & folds["dev"]) and not (folds["train"] & folds["test"])
        assert not (folds["dev"] & folds["test"])
    for seed in range(4):
        task, var = sw.task_for_seed(seed)
        assert var in sw.split_variations(task, "dev")


def test_bad_env_config_names_the_field():
    with pytest.raises(ValueError, match="tasks"):
        make("r3l/ScienceWorld", {"tasks": "juggle-chainsaws"})
    with pytest.raises(ValueError, match="split"):
        make("r3l/ScienceWorld", {"split": "everything"})
    with pytest.raises(ValueError, match="simplifications"):
        make("r3l/ScienceWorld", {"simplifications": "easy,fly"})
    with pytest.raises(ValueError, match="java_max_heap"):
        make("r3l/ScienceWorld", {"java_max_heap": "lots"})
