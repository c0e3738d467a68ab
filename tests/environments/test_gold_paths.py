"""Each environment's own solution solves it through our adapter, also after restore() at every
prefix (the retry path): a sample of ``benchmarks/gold_paths.py`` (issue 14 item 10)."""

import pytest

from alfworld_mini import write_mini_alfworld
from environments import make
from environments._gold import check_solution


def _assert_solves_everywhere(env, seed, solution):
    r = check_solution(env, seed, solution, stride=1)
    assert r.passed, r
    assert r.prefixes_checked == r.steps and r.prefixes_failed == [], r


@pytest.mark.parametrize("game", ["coin", "cookingworld", "sorting"])
def test_twx_gold_paths_solve_after_restore_at_every_prefix(game):
    env = make("r3l/TextWorldExpress", {"game": game})
    try:
        for seed in (0, 1):
            _assert_solves_everywhere(env, seed, env.gold_actions(seed))
    finally:
        env.close()


def test_scienceworld_gold_sequence_solves_after_restore_at_every_prefix():
    env = make("r3l/ScienceWorld", {"tasks": ["find-non-living-thing"], "split": "dev"})
    try:
        _assert_solves_everywhere(env, 0, env.gold_actions(0))
    finally:
        env.close()


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
