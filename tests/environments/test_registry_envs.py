"""Every R3L environment id is registered, builds lazily and rejects unknown env_config keys."""

import pytest
from envtest_helpers import java_children

from environments import make, registered

IDS = [
    "r3l/CoinCollector",
    "r3l/TextWorldExpress",
    "r3l/ScienceWorld",
    "r3l/TextWorld",
    "r3l/ALFWorld",
    "r3l/WebShop",
    "r3l/Math",
    "r3l/Countdown",
]


def test_all_ids_registered():
    assert set(IDS) <= set(registered())


@pytest.mark.parametrize(
    "env_id",
    ["r3l/CoinCollector", "r3l/TextWorldExpress", "r3l/ScienceWorld", "r3l/TextWorld", "r3l/Math", "r3l/Countdown"],
)
def test_empty_env_config_builds_without_starting_processes(env_id):
    before = java_children()
    env = make(env_id)
    try:
        assert env.max_turns >= 1 and env.rules and env.split == "train"
        assert java_children() == before  # JVMs start on the first reset, not in the constructor
    finally:
        env.close()


@pytest.mark.parametrize("env_id", IDS)
def test_unknown_env_config_key_is_named(env_id):
    with pytest.raises(ValueError, match="no_such_option"):
        make(env_id, {"no_such_option": 1})


@pytest.mark.parametrize(
    "vocabulary, refused_by", [([], "env"), ("apple", "declaration"), ([""], "env"), ([3], "declaration")]
)
def test_toy_word_refuses_a_vocabulary_it_cannot_draw_from(vocabulary, refused_by):
    """``vocabulary: []`` fell back to the four default words without a word. A value of the wrong type is
    refused by the option's declaration (a list of strings), an empty list or word by the environment."""
    from rllib_r3l.preflight import check_env

    message = (
        r"R3LConfig.env_config: r3l/ToyWord cannot be created .*vocabulary must be a non-empty list of words"
        if refused_by == "env"
        else r"R3LConfig.env_config: r3l/ToyWord option 'vocabulary' must be a list of strings or None, got .*; "
        r"fix env_config.vocabulary"
    )
    with pytest.raises(ValueError, match=message):
        check_env("r3l/ToyWord", {"vocabulary": vocabulary})
    check_env("r3l/ToyWord", {"vocabulary": ["sun"]})
