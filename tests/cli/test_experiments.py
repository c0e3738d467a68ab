"""Experiment files (rllib_r3l.cli.experiments): what YAML would silently keep or drop is refused
before anything starts, with the file, the line and the key (issue 37, 8)."""

from __future__ import annotations

import os

import pytest

from rllib_r3l.cli.experiments import load_yaml_file, parse_assignment, prepare_experiments
from rllib_r3l.errors import UsageError
from tests import REPO_ROOT

TOY = os.path.join(str(REPO_ROOT), "tuned_examples", "cpu", "toy_corridor_tiny.yaml")


def _refused(tmp_path, text):
    f = tmp_path / "exp.yaml"
    f.write_text(text)
    with pytest.raises(UsageError) as e:
        load_yaml_file(str(f))
    return str(f), str(e.value)


def test_a_repeated_option_is_refused_with_file_line_and_key(tmp_path):
    path, msg = _refused(tmp_path, "exp:\n  run: R3L\n  config:\n    lr: 1.0e-6\n    group_size: 4\n    lr: 0.5\n")
    assert msg.startswith(f"{path}:6: duplicate key 'lr'") and "line 4" in msg, msg
    assert "\n" not in msg


def test_a_repeated_experiment_name_is_refused(tmp_path):
    path, msg = _refused(tmp_path, "a:\n  run: R3L\n  config: {lr: 1.0e-6}\nb:\n  run: R3L\na:\n  run: R3L\n")
    assert msg.startswith(f"{path}:6: duplicate key 'a'") and "line 1" in msg, msg


def test_a_repeated_key_at_any_depth_and_in_flow_style_is_refused(tmp_path):
    _path, msg = _refused(
        tmp_path, "exp:\n  run: R3L\n  config:\n    env_config:\n      num_rooms: 3\n      num_rooms: 4\n"
    )
    assert ":6: duplicate key 'num_rooms'" in msg, msg
    _path, msg = _refused(tmp_path, "exp:\n  run: R3L\n  stop: {training_iteration: 2, training_iteration: 9}\n")
    assert ":3: duplicate key 'training_iteration'" in msg, msg


def test_merge_keys_may_still_be_overridden():
    """`<<: *toy` then `reflect: false` is an override YAML defines, not a duplicate."""
    exps = load_yaml_file(TOY)
    assert exps["toy-corridor-tiny-no-reflect"]["config"]["reflect"] is False
    assert exps["toy-corridor-tiny-r3l"]["config"]["reflect"] is True


def test_a_set_value_with_a_repeated_key_is_refused():
    with pytest.raises(
        UsageError,
        match=r"^--set 'env_config=\{num_rooms: 3, num_rooms: 4\}': duplicate key "
        r"'num_rooms' in the value; write each key once$",
    ):
        parse_assignment("env_config={num_rooms: 3, num_rooms: 4}", "--set")
    assert parse_assignment("env_config={num_rooms: 3}", "--set") == ("env_config", {"num_rooms": 3})


# ---------------------------------------------------------------------------- RLlib options R3L ignores (issue 37, 6)
@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("num_epochs", 4, "micro_batch_size"),
        ("minibatch_size", 2, "micro_batch_tokens"),
        ("train_batch_size", 64, "tasks_per_iteration"),
        ("train_batch_size_per_learner", 64, "group_size"),
        ("gamma", 0.9, "no discounting"),
        ("evaluation_num_env_runners", 1, "evaluation_interval"),
    ],
)
def test_an_ignored_rllib_option_in_a_file_is_refused(tmp_path, key, value, needle):
    f = tmp_path / "exp.yaml"
    f.write_text(f"exp:\n  run: R3L\n  config: {{model: tiny, env: r3l/ToyCorridor, group_size: 4, {key}: {value}}}\n")
    with pytest.raises(UsageError) as e:
        prepare_experiments(str(f))
    msg = str(e.value)
    assert msg.startswith(f"{f}: exp.config.{key}: R3L does not use RLlib's {key}") and needle in msg, msg
    assert "override with --set" not in msg  # the fix is to remove it, not to set another value


def test_an_ignored_rllib_option_at_its_default_passes(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text(
        "exp:\n  run: R3L\n  config: {model: tiny, env: r3l/ToyCorridor, group_size: 4, num_epochs: 1,"
        " gamma: 0.99, evaluation_interval: null}\n"
    )
    prepare_experiments(str(f))


@pytest.mark.parametrize(
    "line,needle",
    [
        ("num_samples: 0", "num_samples: 0: must be an integer >= 1"),
        ("num_samples: two", "num_samples: 'two': must be an integer >= 1"),
        ("num_samples: true", "num_samples: True: must be an integer >= 1"),
        ("num_samples: -1", "num_samples: -1: must be an integer >= 1"),  # re-probe 6 (P23): no trial, exit 0
        ("time_budget_s: -5", "time_budget_s: -5: must be a number of seconds > 0"),
        ("time_budget_s: .inf", "time_budget_s: inf: must be a number of seconds > 0"),
        ("max_failures: -2", "max_failures: -2: must be an integer >= 0"),
    ],
)
def test_tunes_numeric_experiment_keys_are_checked(tmp_path, line, needle):
    """Re-probe 5 (P34, P35, P37): num_samples 0 ran no trial and exited 0; 'two' was Tune's TypeError
    inside the run; a negative time budget stopped the run at once, called interrupted."""
    f = tmp_path / "exp.yaml"
    f.write_text(f"exp:\n  run: R3L\n  {line}\n  config: {{model: tiny, env: r3l/ToyCorridor, group_size: 4}}\n")
    with pytest.raises(UsageError) as e:
        prepare_experiments(str(f))
    assert str(e.value).startswith(f"{f}: experiment 'exp': {needle}"), str(e.value)


def test_valid_numeric_experiment_keys_pass(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text(
        "exp:\n  run: R3L\n  num_samples: 2\n  time_budget_s: 60\n  max_failures: -1\n"
        "  config: {model: tiny, env: r3l/ToyCorridor, group_size: 4}\n"
    )
    prepare_experiments(str(f))


def test_a_misspelt_rllib_key_gets_the_closest_name_of_all(tmp_path):
    """Re-probe 6: `evaluation_intervall` was offered `evaluation_temperature` (R3L's options were tried first)."""
    f = tmp_path / "exp.yaml"
    f.write_text("exp:\n  run: R3L\n  config: {model: tiny, env: r3l/ToyCorridor, evaluation_intervall: 2}\n")
    with pytest.raises(
        UsageError, match=r"unknown config key 'evaluation_intervall' \(did you mean 'evaluation_interval'\?\)"
    ):
        prepare_experiments(str(f))
    f.write_text("exp:\n  run: R3L\n  config: {model: tiny, env: r3l/ToyCorridor, gruop_size: 2}\n")
    with pytest.raises(UsageError, match=r"did you mean 'group_size'"):
        prepare_experiments(str(f))


def test_a_resume_whose_model_is_gone_advises_putting_it_back_not_set_or_an_edit(tmp_path):
    """Re-probe 10 (P78): after the run's model folder moved away, --resume advised "fix it in the file or override
    with --set model=VALUE", and both are refused on a resume."""
    from rllib_r3l.cli.experiments import RESUME_ADVICE, check_resources
    from rllib_r3l.errors import UsageError

    gone = str(tmp_path / "moved-away")
    experiments = {"exp": {"run": "R3L", "config": {"model": gone, "env": "r3l/ToyCorridor"}}}
    with pytest.raises(UsageError) as e:
        check_resources(experiments, "f.yaml", resume=True)
    assert "f.yaml: exp.config.model" in str(e.value) and gone in str(e.value)
    assert RESUME_ADVICE in str(e.value) and "--set model=VALUE" not in str(e.value)
    with pytest.raises(UsageError, match=r"--set model=VALUE"):
        check_resources(experiments, "f.yaml")
