"""One source for every default: each R3L option is declared once (rllib_r3l.options) and every consumer
(R3LConfig, ExploreOptions, RolloutOptions, the batch options, the CLI) takes its values from there."""

import dataclasses
import subprocess
import sys

import pytest

from rllib_r3l import R3LConfig, options
from rllib_r3l.batch import train_batch_options
from rllib_r3l.not_options import REMOVED
from rllib_r3l.options import R3L_OPTIONS
from rllib_r3l.runner.explore import ExploreOptions
from rllib_r3l.runner.rollout import RolloutOptions
from tests import REPO_ROOT

ROOT = REPO_ROOT
# ExploreOptions fields that are a config value transformed (name -> the config value it must equal)
DERIVED = {
    "score_behaviour": lambda c, ev: bool(c.use_importance_ratio) and not ev,
    "reflect": lambda c, ev: bool(c.reflect) and not ev,
    "reflection_context": lambda c, ev: c.resolved_reflection_context(),
    "reflection_structured": lambda c, ev: c.resolved_reflection_structured(),
    "aux_items": lambda c, ev: tuple(c.aux_items),
}


def test_every_option_is_declared_once_with_default_and_help():
    for name, entry in R3L_OPTIONS.items():
        assert isinstance(entry, tuple) and len(entry) == 2, name
        default, help_text = entry
        assert isinstance(help_text, str) and len(help_text) > 10, name
    assert set(options.CHOICES) <= set(R3L_OPTIONS)
    for name, allowed in options.CHOICES.items():
        assert R3L_OPTIONS[name][0] in allowed, name
    assert not set(REMOVED) & set(R3L_OPTIONS)
    # the loss's aggregations are defined by the math; the option offers exactly those
    from rllib_r3l.core_algos import LOSS_AGGREGATIONS

    assert options.CHOICES["loss_aggregation"] == LOSS_AGGREGATIONS


def test_the_config_holds_every_default_and_fresh_copies():
    a, b = R3LConfig(), R3LConfig()
    for name in R3L_OPTIONS:
        assert getattr(a, name) == options.default(name), name
    a.aux_items.append("reflection_sft")
    a.backend_options["dtype"] = "bfloat16"
    assert b.aux_items == ["retry_sft"] and b.backend_options == {} and options.default("aux_items") == ["retry_sft"]


def _consumer_fields(cls):
    return [f.name for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("evaluation", [False, True])
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        dict(
            group_size=4,
            reflect_on="all",
            aux_items=["reflection_sft", "retry_sft"],
            max_reflection_tokens=99,
            temperature=0.7,
            evaluation_temperature=0.2,
            use_importance_ratio=True,
            reflector="some/reflector",
            reflection_context="auto",
            max_context_tokens=1000,
            verify_replay=False,
            top_p=0.9,
            max_turns=7,
        ),
        dict(reflection_style="paper", reflection_temperature=0.7, max_reflection_tokens=300),
    ],
)
def test_each_consumers_effective_values_equal_the_configs(overrides, evaluation):
    c = R3LConfig().training(**overrides)
    eo = ExploreOptions.from_config(c, evaluation=evaluation)
    for name in _consumer_fields(ExploreOptions):
        want = DERIVED[name](c, evaluation) if name in DERIVED else getattr(c, name)
        assert getattr(eo, name) == want, name
    ro = RolloutOptions.from_config(c, evaluation=evaluation)
    for name in _consumer_fields(RolloutOptions):
        want = c.evaluation_temperature if (name == "temperature" and evaluation) else getattr(c, name)
        assert getattr(ro, name) == want, name
    bo = train_batch_options(c)
    assert bo == dict(
        std_normalize=c.std_normalize,
        positive_amplification=c.positive_amplification,
        alpha=c.amplification_alpha,
        success_reward=c.success_reward,
        pivotal_credit=c.pivotal_credit,
        max_length=c.max_context_tokens,
        loss_aggregation=c.loss_aggregation,
    )


def test_the_consumers_own_defaults_are_the_configs():
    # ExploreOptions() / RolloutOptions() without arguments (tests, scripts) mean the same as R3LConfig()
    assert ExploreOptions() == ExploreOptions.from_config(R3LConfig())
    assert RolloutOptions() == RolloutOptions.from_config(R3LConfig())


@pytest.mark.parametrize("removed", sorted(REMOVED))
def test_a_removed_option_is_an_error_that_names_its_replacement(removed):
    value = {"aux_tasks": False, "reflector_model": "x", "fault_injection": {}, "reflection_outcome": "reward"}[removed]
    for build in (
        lambda: R3LConfig().training(**{removed: value}),
        lambda: R3LConfig().update_from_dict({removed: value}),
    ):
        with pytest.raises(ValueError) as e:
            build()
        assert f"R3LConfig.{removed}: this option was removed" in str(e.value)
    assert "aux_items=[]" in REMOVED["aux_tasks"] and "reflector=" in REMOVED["reflector_model"]
    assert "faults.inject" in REMOVED["fault_injection"] and "drop the option" in REMOVED["reflection_outcome"]


@pytest.mark.subprocess
def test_a_removed_option_in_a_yaml_file_is_refused_before_ray_starts(tmp_path):
    f = tmp_path / "old.yaml"
    f.write_text("old:\n  run: R3L\n  config:\n    model: tiny\n    env: r3l/ToyCorridor\n    aux_tasks: false\n")
    r = subprocess.run(
        [sys.executable, "-m", "rllib_r3l.cli", "train", str(f), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert r.returncode != 0
    assert "aux_tasks" in r.stderr + r.stdout and "aux_items=[]" in r.stderr + r.stdout


@pytest.mark.subprocess
def test_the_cli_lists_every_option_once():
    r = subprocess.run(
        [sys.executable, "-m", "rllib_r3l.cli", "options"], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    listed = [line.split()[0] for line in r.stdout.splitlines() if line[:1].isalpha() and line.split()]
    for name in R3L_OPTIONS:
        assert listed.count("model" if name == "model_id" else name) == 1, name
    for name in REMOVED:
        assert name not in listed
