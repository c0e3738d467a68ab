"""Environment options are checked by their declaration (constructor annotation, ``option_bounds``) before
anything is built: a value of the wrong type names its key, at every door (issue 49, item 5)."""

from __future__ import annotations

import inspect
import os

import pytest

import environments
from environments import registry
from environments.option_check import bad_option, bounds_of, describe
from rllib_r3l import R3LConfig
from rllib_r3l.cli import commands as cli
from tests import REPO_ROOT

TOY = os.path.join(str(REPO_ROOT), "tuned_examples", "cpu", "toy_corridor_tiny.yaml")


@pytest.mark.parametrize("env_id", environments.registered())
def test_every_environment_s_defaults_fit_its_own_declaration(env_id):
    factory = registry.resolve(env_id)
    defaults = {
        k: p.default
        for k, p in inspect.signature(factory).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    assert bad_option(env_id, factory, defaults) is None
    for key in bounds_of(factory):  # every declared bound names an option the constructor has
        assert key in inspect.signature(factory).parameters or key in (
            "max_turns",
            "max_attempts",
            "max_listed_actions",
            "max_repeats",
        ), key


@pytest.mark.parametrize(
    "env_id, env_config, key, expected",
    [
        ("r3l/ToyCorridor", {"num_rooms": "three"}, "num_rooms", "'num_rooms' must be an integer >= 1, got 'three'"),
        ("r3l/ToyCorridor", {"num_rooms": 2.5}, "num_rooms", "must be an integer >= 1, got 2.5"),
        ("r3l/ToyCorridor", {"num_rooms": 0}, "num_rooms", "must be an integer >= 1, got 0"),
        ("r3l/ToyCorridor", {"max_turns": True}, "max_turns", "must be an integer >= 1, got True"),
        ("r3l/ToyCorridor", {"split": 3}, "split", "must be a string, got 3"),
        ("r3l/ToyWord", {"vocabulary": "apple"}, "vocabulary", "must be a list of strings or None, got 'apple'"),
        ("r3l/ToyWord", {"vocabulary": ["a", 2]}, "vocabulary", "a list of strings"),
        ("r3l/CoinCollector", {"num_distractor_items": -1}, "num_distractor_items", "must be an integer >= 0, got -1"),
        ("r3l/CoinCollector", {"include_doors": "yes"}, "include_doors", "must be true or false, got 'yes'"),
        ("r3l/CoinCollector", {"java_max_heap": 512}, "java_max_heap", "must be a string or None, got 512"),
        ("r3l/Countdown", {"num_numbers": 9}, "num_numbers", "must be an integer in [2, 8], got 9"),
        ("r3l/Math", {"difficulty": 4}, "difficulty", "must be an integer in [0, 3], got 4"),
        ("r3l/ScienceWorld", {"tasks": 4}, "tasks", "must be None, a string or a list of strings, got 4"),
    ],
)
def test_a_value_outside_its_declaration_names_its_key(env_id, env_config, key, expected):
    found = bad_option(env_id, registry.resolve(env_id), env_config)
    assert found is not None and found[0] == key, found
    assert found[1].startswith(f"{env_id} option {key!r}") and expected in found[1], found[1]


@pytest.mark.parametrize(
    "env_id, env_config",
    [
        ("r3l/ToyCorridor", {"num_rooms": 3, "max_turns": 5, "split": "dev", "eval_split": "test"}),
        ("r3l/ToyWord", {"vocabulary": ["a", "b"], "fixed_target": None}),
        ("r3l/CoinCollector", {"num_locations": 8, "java_max_heap": None, "include_doors": True}),
        ("r3l/Math", {"data_files": {"train": "a.jsonl"}, "difficulty": 0}),
        ("r3l/ScienceWorld", {"tasks": ["boil", "melt"]}),
        ("r3l/TextWorldExpress", {"game_params": {"numLocations": 3}}),
    ],
)
def test_values_that_fit_pass(env_id, env_config):
    assert bad_option(env_id, registry.resolve(env_id), env_config) is None


def test_describe_reads_like_a_sentence():
    from typing import List, Optional

    assert describe(Optional[int]) == "an integer or None"
    assert describe(List[str]) == "a list of strings"
    assert describe(bool) == "true or false"


def test_the_cli_names_the_key_before_ray_starts(tmp_path, capsys):
    for value, needle in (("three", "got 'three'"), ("2.5", "got 2.5")):
        code = cli.main(
            [
                "train",
                TOY,
                "--experiment",
                "toy-corridor-tiny-r3l",
                "--dry-run",
                "--storage-path",
                str(tmp_path),
                "--set",
                f"env_config.num_rooms={value}",
            ]
        )
        err = capsys.readouterr().err
        assert code == 2, err
        assert (
            err.startswith(
                "rllib-r3l train: error: --set env_config.num_rooms=...: r3l/ToyCorridor option 'num_rooms' "
                "must be an integer >= 1"
            )
            and needle in err
        ), err
        assert "Traceback" not in err and "TypeError" not in err


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_python_door_names_the_key():
    cfg = R3LConfig().environment("r3l/ToyCorridor", env_config={"num_rooms": "three"}).training(model="tiny")
    with pytest.raises(
        ValueError,
        match=r"R3LConfig.env_config: r3l/ToyCorridor option 'num_rooms' must be an "
        r"integer >= 1, got 'three'; fix env_config.num_rooms",
    ):
        cfg.build_algo()
