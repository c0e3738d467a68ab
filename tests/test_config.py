"""R3LConfig: paper defaults, the GRPO baseline switch, and validation errors that name field and fix."""

import re

import pytest

from rllib_r3l import R3LConfig
from rllib_r3l.config import DEFAULT_ENV, DEFAULT_MODEL, R3L_OPTIONS


def test_defaults_are_the_embedded_cpu_default_with_paper_values():
    c = R3LConfig()
    assert c.model_id == DEFAULT_MODEL and c.env == DEFAULT_ENV
    assert c.group_size == 8 and c.amplification_alpha == 3.0 and c.success_reward == 1.0
    assert c.reflect and c.pivotal_credit and c.positive_amplification
    assert c.lr == 1e-6 and c.grad_clip == 1.0 and c.kl_coef == 0.0
    assert c.temperature == 1.0 and c.evaluation_temperature == 0.4
    assert not c.std_normalize and not c.use_importance_ratio
    # measured, not the paper's: the 135M policy's own reports swamp its updates (docs/benchmarks.md, 'Does R3L learn
    # better than GRPO here?')
    assert c.aux_items == ["retry_sft"]
    c.validate_r3l()


def test_training_sets_every_option_and_model_string():
    c = R3LConfig().training(model="tiny", group_size=4, amplification_alpha=5.0, lr=1e-5)
    assert c.model_id == "tiny" and c.group_size == 4 and c.amplification_alpha == 5.0 and c.lr == 1e-5
    for name in R3L_OPTIONS:
        assert hasattr(c, name)


def test_grpo_baseline_is_three_switches():
    c = R3LConfig().training(reflect=False, pivotal_credit=False, positive_amplification=False)
    assert c.is_grpo_baseline
    assert not R3LConfig().is_grpo_baseline


def test_update_from_dict_roundtrip_with_model_string():
    c = R3LConfig().update_from_dict({"model": "tiny", "group_size": 4, "env": "r3l/ToyCorridor", "lr": 1e-4})
    assert c.model_id == "tiny" and c.group_size == 4 and c.env == "r3l/ToyCorridor" and c.lr == 1e-4
    d = c.to_dict()
    c2 = R3LConfig().update_from_dict(d)
    assert c2.model_id == "tiny" and c2.group_size == 4


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("group_size", 0, "group_size: must be an integer >= 1"),
        ("group_size", 5, "must be a multiple of 1 + retries_per_failure = 2"),
        ("amplification_alpha", 0.5, "amplification_alpha: must be a number >= 1"),
        ("temperature", -1, "temperature: must be a number >= 0"),
        ("action_decoding", "beam", "action_decoding: must be one of"),
        ("backend", "tgi", "backend: must be one of"),
        (
            "aux_items",
            ["reflection"],
            "aux_items: must be a list of distinct kinds from ['reflection_sft', 'retry_sft']",
        ),
        ("aux_items", "retry_sft", "aux_items: must be a list"),
        ("loss_aggregation", "seq-mean", "loss_aggregation: must be one of ('token_mean', 'sequence_mean', 'paper')"),
        ("reflect_on", "successes", "reflect_on: must be one of ('all', 'failures')"),
        ("max_response_tokens", 9000, "must be smaller than max_context_tokens"),
        ("kl_coef", -0.1, "kl_coef: must be a number >= 0"),
        ("system_prompt", "no placeholder", "system_prompt: must contain the placeholder {task}"),
        # re-probe 11: passed validation, then every episode raised KeyError('bogus') and every group was lost
        (
            "system_prompt",
            "Do {task} and {bogus}",
            "system_prompt: has unknown placeholder(s) ['bogus']; allowed: {rules}, {task}",
        ),
        ("system_prompt", "Do {task} {0}", "unknown placeholder(s) ['0']"),
        ("system_prompt", "Do {task.x}", "unknown placeholder(s) ['task.x']"),
        ("system_prompt", "Do {task} {", "system_prompt: is not a valid format string"),
        ("system_prompt", "Do {task:d}", "system_prompt: cannot be filled in (ValueError"),
        ("system_prompt", 42, "system_prompt: must be a string"),
        (
            "guidance_template",
            "{suggestion} {0}",
            "guidance_template: guidance template has unknown placeholder(s) ['0']",
        ),
        ("guidance_template", "{suggestion} }", "guidance_template: guidance template is not a valid format string"),
        ("max_turns", 0, "max_turns"),
        (
            "backend_options",
            {"choice_tokenization": "chars"},
            "backend_options: choice_tokenization must be 'canonical'",
        ),
    ],
)
def test_validate_names_field_and_fix(field, value, needle):
    c = R3LConfig().training(**{field: value})
    with pytest.raises(ValueError) as e:
        c.validate_r3l()
    assert needle in str(e.value)
    assert "R3LConfig." in str(e.value)


def test_unknown_training_option_suggests_closest():
    with pytest.raises(ValueError, match="did you mean 'amplification_alpha'"):
        R3LConfig().training(amplification_alfa=3.0)


def test_model_must_be_string():
    with pytest.raises(ValueError, match="model id or local path"):
        R3LConfig().training(model=123)


# ---------------------------------------------------------------------------- numeric ranges (issue 37, 1)
@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("grad_clip", -1.001, "grad_clip: must be None (no clipping) or a number > 0, got -1.001"),  # gradient ascent
        ("grad_clip", 0, "grad_clip: must be None (no clipping) or a number > 0"),
        (
            "lr",
            float("nan"),
            "lr: must be > 0 and < 1 (a number, or a schedule [[timestep, lr], ...]) (finite), got nan",
        ),
        ("lr", float("inf"), "lr: must be > 0 and < 1"),
        ("lr", 1e9, "lr: must be > 0 and < 1"),  # trained, wrecked the weights, and ended TERMINATED (re-probe)
        ("temperature", float("nan"), "temperature: must be a number >= 0 (finite)"),
        ("weight_decay", float("inf"), "weight_decay: must be a number >= 0 (finite)"),
        ("kl_coef", float("nan"), "kl_coef: must be a number >= 0"),
        ("success_reward", float("nan"), "success_reward: must be a number (finite)"),
        ("amplification_alpha", float("inf"), "amplification_alpha: must be a number >= 1"),
        ("clip_ratio_low", 1.5, "clip_ratio_low: must be in [0, 1)"),
        ("runner_restart_wait_s", float("inf"), "runner_restart_wait_s: must be a number >= 0"),
        ("num_threads", 0, "num_threads: must be None (torch's default) or an integer >= 1"),
        ("num_env_runners", -2, "num_env_runners: must be an integer >= 0"),
        ("num_learners", 1.5, "num_learners: must be an integer >= 0"),
        ("num_gpus_per_learner", -0.5, "num_gpus_per_learner: must be a number >= 0"),
        ("num_cpus_per_env_runner", -2, "num_cpus_per_env_runner: must be a number >= 0"),
        ("seed", -5, "seed: must be None (unseeded) or an integer in [0, 2147483647]"),
        # re-probe 11: passed --dry-run; every runner died on numpy's "Seed must be between 0 and 2**32 - 1"
        ("seed", 2**70, "seed: must be None (unseeded) or an integer in [0, 2147483647]"),
        ("replay_capacity", True, "replay_capacity: must be None"),
        ("micro_batch_tokens", 0, "micro_batch_tokens: must be None (no cap) or an integer >= 1"),
        # re-probe 9: RLlib's bare AssertionError in the trial (and "valid" at --dry-run)
        (
            "lr",
            [[0, 1e-5], [-10, 1e-6]],
            "lr: the timesteps of a schedule [[timestep, lr], ...] must be whole numbers >= 0 "
            "in increasing order (env steps sampled), starting at 0; -10 is not a whole "
            "number >= 0",
        ),
        (
            "lr",
            [[0, 1e-5], [0.5, 1e-6]],
            "lr: the timesteps of a schedule [[timestep, lr], ...] must be whole numbers >= 0 "
            "in increasing order (env steps sampled), starting at 0; 0.5 is not a whole "
            "number >= 0",
        ),
        (
            "lr",
            [[0, 1e-5], [500, 1e-6], [100, 1e-7]],
            "lr: the timesteps of a schedule [[timestep, lr], ...] must be "
            "whole numbers >= 0 in increasing order (env steps sampled), "
            "starting at 0; they are not in increasing order",
        ),
    ],
)
def test_every_numeric_option_has_its_range_checked(field, value, needle):
    c = R3LConfig()
    setattr(c, field, value)  # the attribute, as update_from_dict and Tune set it
    with pytest.raises(ValueError) as e:
        c.validate()
    assert f"R3LConfig.{needle}" in str(e.value)


def test_every_numeric_option_is_in_the_range_table():
    from rllib_r3l.options import RANGES

    numeric = {n for n, (d, _h) in R3L_OPTIONS.items() if isinstance(d, (int, float)) and not isinstance(d, bool)}
    numeric_or_none = {
        "max_turns",
        "reflection_max_chars",
        "micro_batch_tokens",
        "replay_capacity",
        "replay_groups_per_update",
        "replay_max_uses",
        "num_threads",
        "sampling_seed",
    }
    assert numeric | numeric_or_none <= set(RANGES)
    assert {"lr", "grad_clip", "num_env_runners", "num_learners", "num_gpus_per_learner", "seed"} <= set(RANGES)
    c = R3LConfig()
    for name, rng in RANGES.items():  # every default is inside its own range
        assert getattr(c, name) == "auto" or rng.contains(getattr(c, name)), name


def test_an_lr_schedule_is_checked_entry_by_entry():
    R3LConfig().training(lr=[[0, 1e-5], [100, 1e-6]]).validate()
    with pytest.raises(ValueError, match=r"R3LConfig\.lr: .*schedule.*-1e-05"):
        R3LConfig().training(lr=[[0, 1e-5], [100, -1e-5]]).validate()


def _suggestion(msg):
    import re

    m = re.search(r"e\.g\. (-?[0-9.]+)", msg)
    return None if m is None else float(m.group(1))


@pytest.mark.parametrize("field", ["lr", "grad_clip", "temperature"])
def test_a_number_given_as_a_string_is_named_before_rllibs_schedule_message_re_probe_83b(field):
    c = R3LConfig()
    setattr(c, field, "1e-6")
    with pytest.raises(ValueError, match=rf"R3LConfig\.{field}: must be a number, got the string '1e-6' \(YAML"):
        c.validate()


@pytest.mark.parametrize("field", ["grad_clip", "success_reward", "seed", "lr", "temperature", "num_learners"])
def test_the_minus_one_advice_never_suggests_an_invalid_value(field):
    """-1 is RLlib's DEPRECATED_VALUE (dropped by get_state); the advice used to be '-1.001' for every field,
    which for grad_clip is gradient ascent."""
    c = R3LConfig()
    setattr(c, field, -1)
    with pytest.raises(ValueError) as e:
        c.validate()
    msg = str(e.value)
    assert msg.startswith(f"R3LConfig.{field}: "), msg
    if field == "grad_clip":
        assert "-1.001" not in msg and "> 0" in msg
    suggested = _suggestion(msg)
    if suggested is not None:  # the value it suggests must itself validate
        setattr(c, field, suggested)
        c.validate()


def test_minus_one_on_a_field_where_it_is_valid_suggests_a_valid_neighbour():
    c = R3LConfig().training(success_reward=-1)
    with pytest.raises(ValueError, match=r"R3LConfig\.success_reward: the value -1 cannot be used") as e:
        c.validate()
    assert _suggestion(str(e.value)) == -1.001
    c.success_reward = -1.001
    c.validate()


# ---------------------------------------------------------------------------- RLlib options R3L ignores (issue 37, 6)
@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("num_epochs", 3, "micro_batch_size"),
        ("minibatch_size", 4, "micro_batch_tokens"),
        ("train_batch_size", 64, "tasks_per_iteration"),
        ("train_batch_size_per_learner", 64, "group_size"),
        ("gamma", 0.5, "no discounting"),
        ("evaluation_num_env_runners", 1, "training env runners"),
        ("evaluation_config", {"evaluation_temperature": 1.0}, "env_config.eval_split instead"),  # re-probe 6 (P3)
        ("evaluation_parallel_to_training", True, "between iterations"),  # re-probe 6 (P2): RLlib's advice misled
        # re-probe 10 (P45): accepted, and a run with explore=False or num_envs_per_env_runner=4 was the default's
        ("explore", False, "--greedy"),
        ("num_envs_per_env_runner", 4, "one environment per episode"),
        ("batch_mode", "truncate_episodes", "whole episodes"),
        ("clip_rewards", True, "reward - group mean"),
        ("sample_timeout_s", 5.0, "runner_restart_wait_s"),
        ("observation_filter", "MeanStdFilter", "text"),
    ],
)
def test_rllib_options_r3l_does_not_use_are_refused_with_the_r3l_option(field, value, needle):
    c = R3LConfig().training(model="tiny")
    setattr(c, field, value)
    with pytest.raises(ValueError) as e:
        c.validate()
    msg = str(e.value)
    assert msg.startswith(f"R3LConfig.{field}: R3L does not use RLlib's {field}") and needle in msg, msg


@pytest.mark.parametrize("field", ["train_batch_size_per_learner", "num_epochs", "evaluation_num_env_runners"])
def test_the_plain_dict_door_names_the_r3l_option_too(field):
    """tune.run("R3L", config={...}): not an "unknown key", the same error as R3LConfig.validate()."""
    with pytest.raises(ValueError, match=rf"R3LConfig\.{field}: R3L does not use RLlib's {field}"):
        R3LConfig().update_from_dict({"model": "tiny", field: 2}).validate()


def test_rllib_options_left_at_their_defaults_pass():
    c = R3LConfig().training(model="tiny")
    c.evaluation_interval = 0  # "off", like None
    c.validate()
    R3LConfig().update_from_dict(R3LConfig().to_dict()).validate()  # a round trip keeps every default


@pytest.mark.parametrize("value", [0, 5.5])
def test_evaluation_duration_out_of_range_gets_r3ls_message_not_rllibs(value):
    # re-probe 7 (M1): RLlib's message, which advises config.experimental(_validate_config=False)
    with pytest.raises(
        ValueError, match=rf"^R3LConfig.evaluation_duration: must be an integer >= 1 .*got {value}$"
    ) as e:
        R3LConfig().training(model="tiny").evaluation(evaluation_duration=value).validate()
    assert "_validate_config" not in str(e.value)


def test_evaluation_takes_evaluation_temperature_and_sends_other_r3l_options_to_training():
    # re-probe 7 (M3): evaluation(evaluation_temperature=0.3) was Python's "unexpected keyword argument"
    c = R3LConfig().evaluation(evaluation_temperature=0.3, evaluation_interval=2)
    assert (c.evaluation_temperature, c.evaluation_interval) == (0.3, 2)
    with pytest.raises(ValueError, match=r"'group_size' is an R3L option; set it with .training\(group_size=...\)"):
        R3LConfig().evaluation(group_size=4)
    with pytest.raises(
        ValueError,
        match=r"unknown evaluation option 'evaluation_intervall' \(did you mean "
        r"'evaluation_interval'\?\)",
    ):
        R3LConfig().evaluation(evaluation_intervall=2)


# ---------------------------------------------------------------------------- runs that cannot learn (issue 37, 4)
def test_temperature_zero_is_refused_for_training_with_the_reason():
    with pytest.raises(ValueError) as e:
        R3LConfig().training(temperature=0).validate()
    msg = str(e.value)
    assert msg.startswith("R3LConfig.temperature: 0") and "advantages" in msg and "1.0" in msg, msg
    R3LConfig().training(evaluation_temperature=0).validate()  # greedy evaluation is fine


@pytest.mark.parametrize("value", [0, -2, 1.5])
def test_env_config_max_turns_below_one_is_refused(value):
    with pytest.raises(ValueError, match=r"R3LConfig\.env_config: max_turns must be an integer >= 1"):
        R3LConfig().environment("r3l/ToyCorridor", env_config={"num_rooms": 3, "max_turns": value}).validate()
    R3LConfig().environment("r3l/ToyCorridor", env_config={"num_rooms": 3, "max_turns": 2}).validate()


def test_backend_option_values_are_checked_before_any_runner_starts():
    """Re-probe 10 (a hang, twice): backend_options {max_batch_size: -1} passed --dry-run and the transformers
    backend returned nothing, so the first iteration never ended. A CUDA device passes here: the runners may
    run on other machines."""
    c = R3LConfig().training(model="tiny", backend="transformers", backend_options={"max_batch_size": -1})
    with pytest.raises(ValueError, match=r"R3LConfig.backend_options: max_batch_size must be an integer >= 1, got -1"):
        c.validate_r3l()
    R3LConfig().training(model="tiny", backend="transformers", backend_options={"device": "cuda"}).validate_r3l()


def test_an_unknown_backend_option_names_the_near_one_and_the_backend():
    """Before: the key reached the backend's constructor inside every runner (a TypeError after the model
    loaded, shown by Tune as ERROR and a path to error.txt)."""
    from rllib_r3l import R3LConfig
    from rllib_r3l.generation import backend_option_names

    cfg = R3LConfig().training(model="tiny", backend="vllm", backend_options={"gpu_mem_util": 0.5})
    with pytest.raises(
        ValueError,
        match=r"R3LConfig.backend_options: 'gpu_mem_util' is not an option of the vllm "
        r"backend \(did you mean 'gpu_memory_utilization'\?\)",
    ):
        cfg.validate()
    hf = R3LConfig().training(model="tiny", backend="transformers", backend_options={"kv_cache_gib": 1})
    with pytest.raises(ValueError, match="'kv_cache_gib' is not an option of the transformers backend"):
        hf.validate()
    assert "kv_cache_gib" in backend_option_names("vllm") and "max_batch_size" in backend_option_names("transformers")
    R3LConfig().training(model="tiny", backend="transformers", backend_options={"max_batch_size": 4}).validate()


# ---------------------------------------------------------------------------- switches are bools (re-probe 5)
@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("reflect", "false", "must be True or False, got 'false' (the string 'false' would read as true)"),
        ("pivotal_credit", "no", "must be True or False, got 'no'"),
        ("positive_amplification", 0, "must be True or False, got 0"),
        ("reflection_structured", "yes", "must be True, False or None, got 'yes'"),
    ],
)
def test_a_switch_given_as_a_string_or_number_is_refused(field, value, needle):
    """``training(reflect="false")`` validated and trained WITH reflection (a non-empty string is true)."""
    with pytest.raises(ValueError, match=re.escape(f"R3LConfig.{field}: {needle}")):
        R3LConfig().training(model="tiny", **{field: value}).validate()
    with pytest.raises(ValueError, match=re.escape(f"R3LConfig.{field}: {needle}")):  # tune.run's dict door
        R3LConfig().update_from_dict({"model": "tiny", field: value}).validate()
    R3LConfig().training(model="tiny", reflection_structured=None, reflect=False).validate()


def test_a_callbacks_function_that_needs_arguments_is_refused(tmp_path, capsys):
    """Re-probe 9: `callbacks: os.system` passed --dry-run (RLlib takes any callable) and the trial failed with a
    TypeError that named no option; a function RLlib can call with no arguments still passes."""
    import os

    with pytest.raises(ValueError, match=r"R3LConfig.callbacks: posix.system cannot be called without arguments"):
        R3LConfig().callbacks(os.system).validate_r3l()
    R3LConfig().callbacks(lambda: None).validate_r3l()
    from rllib_r3l.cli import commands as cli
    from tests.cli.tiny_runs import TOY

    code = cli.main(["train", TOY, "--dry-run", "--storage-path", str(tmp_path), "--set", "callbacks=os.system"])
    err = capsys.readouterr().err
    assert code == 2 and "--set callbacks=" in err and "RLlibCallback subclass" in err, err


def test_rllibs_own_lr_schedule_example_passes():
    """Re-probe 10 (P16): RLlib's message for a bad schedule gives [(0, 0.001), (1e6, 0.0001)] as its example,
    and R3L refused the float 1e6 as "not an integer"."""
    c = R3LConfig().training(model="tiny")
    c.lr = [[0, 1e-3], [1e6, 1e-4]]
    c.validate_r3l()


@pytest.mark.parametrize(
    "make,needle",
    [
        (
            lambda: R3LConfig().api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False),
            "R3LConfig.api_stack: R3L runs on RLlib's new API stack only",
        ),
        (
            lambda: R3LConfig().multi_agent(policies={"a", "b"}, policy_mapping_fn=lambda agent_id, *a, **k: "a"),
            "R3LConfig.multi_agent: R3L trains one policy",
        ),
    ],
)
def test_the_old_api_stack_and_multi_agent_are_refused_at_validate(make, needle):
    """Re-probe 10 (R3, R4): both passed validate() and --dry-run, then build_algo() raised RLlib's
    AttributeError ('NoneType' object has no attribute 'update') or RuntimeError (dtype of dict)."""
    with pytest.raises(ValueError) as e:
        make().training(model="tiny").validate()
    assert str(e.value).startswith(needle), str(e.value)


def test_an_env_config_that_is_not_a_mapping_names_the_field_in_python():
    """Re-probe 10 (R5): environment(env_config=[1]) was RLlib's AttributeError from its dict merge."""
    with pytest.raises(ValueError, match=r"R3LConfig.env_config: must be a mapping .*got \[1\]"):
        R3LConfig().environment(env_config=[1])
    c = R3LConfig().training(model="tiny")
    c.env_config = "num_rooms=3"  # as update_from_dict and Tune set it
    with pytest.raises(ValueError, match=r"R3LConfig.env_config: must be a mapping"):
        c.validate()


def test_an_empty_env_config_is_no_options():
    """Re-probe 11: YAML's empty ``env_config:`` (None), or ``--set env_config=null``, was RLlib's
    ``AttributeError: 'NoneType' object has no attribute 'items'`` naming no field."""
    c = R3LConfig().update_from_dict({"env": "r3l/ToyCorridor", "env_config": None})
    assert c.env_config == {}
    kept = R3LConfig().environment("r3l/ToyCorridor", env_config={"num_rooms": 3}).environment(env_config=None)
    assert kept.env_config == {"num_rooms": 3}  # adds nothing, like env_config={}


def test_rllibs_new_api_stack_notice_is_not_printed_for_r3l(caplog):
    """Re-probe 11: the main job's --resume printed RLlib's "You are running R3L on the new API stack!" on the
    console (the train command filtered it, nothing else did). Other RLlib config warnings still pass."""
    import logging

    caplog.set_level(logging.INFO, logger="ray.rllib.algorithms.algorithm_config")
    R3LConfig().training(model="tiny").validate()
    assert not [r for r in caplog.records if "new API stack" in r.getMessage()]
    logging.getLogger("ray.rllib.algorithms.algorithm_config").warning("another RLlib warning")
    assert [r for r in caplog.records if r.getMessage() == "another RLlib warning"]


@pytest.mark.parametrize(
    "key, needles",
    [
        ("iterations", ["not in the config", "--stop training_iteration=N", "the main job's --iterations N"]),
        ("training_iteration", ["--stop training_iteration=N"]),
        ("stop", ["tune.run(stop=...)"]),
        ("greedy", ["evaluation_temperature=0", "rllib-r3l evaluate --greedy"]),
        ("episodes", ["tasks_per_iteration task groups of group_size episodes"]),
    ],
)
def test_every_door_says_where_what_an_unknown_key_asks_for_lives(key, needles):
    """The main job and tune.run dicts named 'tasks_per_iteration' for training_iteration, 'seed' for greedy."""
    from rllib_r3l.config import check_config_keys

    with pytest.raises(ValueError) as e:
        check_config_keys({key: 3})
    assert str(e.value).startswith(f"R3LConfig.{key}: unknown config key {key!r}: ") and "did you mean" not in str(
        e.value
    )
    for n in needles:
        assert n in str(e.value), n


def test_training_says_where_a_run_length_lives():
    from rllib_r3l import R3LConfig

    with pytest.raises(ValueError, match=r"unknown training option 'stop': how long a run trains is set where it runs"):
        R3LConfig().training(model="tiny", stop=3)


@pytest.mark.parametrize(
    "option, value",
    [
        ("retry_control", True),
        ("pivot_action", "exclude_failed"),
        ("pivot_backoff", 1),
        ("pivot_selector", "hindsight"),
        ("pivot_temperature", 1.5),
    ],
)
def test_a_retry_option_without_reflection_is_refused(option, value):
    """reflect=False runs no retry: the option would change nothing without a word."""
    from rllib_r3l import R3LConfig

    cfg = R3LConfig().training(model="tiny", reflect=False, **{option: value})
    with pytest.raises(ValueError, match=rf"R3LConfig.{option}: .* acts on retries, and reflect=False runs none"):
        cfg.validate()
    R3LConfig().training(model="tiny", reflect=True, **{option: value}).validate()
