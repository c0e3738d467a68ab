"""Each environment's own solution solves it through our adapter, also after restore() at every
prefix (the retry path): a sample of ``scripts/gold_paths.py``."""

import pytest
from alfworld_mini import write_mini_alfworld

from environments import make
from environments._gold import check_solution


def _assert_solves_everywhere(env, seed, solution):
    r = check_solution(env, seed, solution, stride=1)
    assert r.passed, r
    assert r.prefixes_checked == r.steps and r.prefixes_failed == [], r


@pytest.mark.subprocess
@pytest.mark.parametrize("game", ["coin", "cookingworld", "sorting"])
def test_twx_gold_paths_solve_after_restore_at_every_prefix(game):
    env = make("r3l/TextWorldExpress", {"game": game})
    try:
        for seed in (0, 1):
            _assert_solves_everywhere(env, seed, env.gold_actions(seed))
    finally:
        env.close()


@pytest.mark.subprocess
def test_scienceworld_gold_sequence_solves_after_restore_at_every_prefix():
    env = make("r3l/ScienceWorld", {"tasks": ["find-non-living-thing"], "split": "dev"})
    try:
        _assert_solves_everywhere(env, 0, env.gold_actions(0))
    finally:
        env.close()


@pytest.mark.subprocess
def test_textworld_and_alfworld_solutions_solve_after_restore_at_every_prefix(tmp_path):
    tw = make("r3l/TextWorld", {"challenge": "tw-simple", "cache_dir": str(tmp_path / "tw")})
    try:
        _assert_solves_everywhere(tw, 0, tw.gold_actions(0))
    finally:
        tw.close()
    alf = make("r3l/ALFWorld", {"data_path": write_mini_alfworld(tmp_path / "alf")})
    try:
        for seed in (0, 1):
            _assert_solves_everywhere(alf, seed, alf.gold_actions(seed))
    finally:
        alf.close()


class _FlakyTiming:
    """A task an engine scores and finishes at other times from the same actions (as ScienceWorld's
    power-component wins after 8 or 9 gold actions, and mendelian-genetics scores at other steps):
    the first episode scores half at 'switch on' and wins at the first 'wait', later ones score half
    at the first 'wait' and win at the second."""

    max_turns = 10

    def __init__(self):
        self.resets = 0

    def reset(self, seed=None):
        self.resets += 1
        self.need, self.waits, self.started, self.score = (1 if self.resets == 1 else 2), 0, False, 0.0
        return "start", {"won": False, "score": 0.0}

    def step(self, action):
        before = self.score
        self.started |= action == "switch on"
        self.waits += action == "wait" and self.started
        won = self.started and self.waits >= self.need
        half = self.started and (self.need == 1 or self.waits >= 1)
        self.score = 1.0 if won else (0.5 if half else 0.0)
        return "ok", self.score - before, won, False, {"won": won, "score": self.score}

    def restore(self, seed, actions):
        obs, info = self.reset(seed)
        for a in actions:
            obs, _r, _t, _tr, info = self.step(a)
        return obs, info


def test_check_solution_plays_the_whole_rest_of_the_solution_after_a_restore():
    # regression: the check used to replay only as many actions as the first play needed, and to
    # add the first play's rewards before the prefix to the restored episode's
    r = check_solution(_FlakyTiming(), 0, ["switch on", "wait", "wait"], stride=1)
    assert r.passed and r.steps == 2 and r.prefixes_checked == 2 and r.prefixes_failed == []
