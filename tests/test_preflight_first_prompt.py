"""``max_context_tokens`` below the first prompt is refused up front (issue 37, item 4): a run whose every
episode overflows at turn 0 trains on nothing, and used to find out only at the end. The check builds the
runner's own first prompt (task seed 0) with the policy's tokenizer and chat template, without weights.
Tiny model directory, the default environment (TextWorldExpress coin collector)."""

from __future__ import annotations

import re

import pytest

from rllib_r3l import R3LConfig, preflight

REFUSED = re.compile(
    r"R3LConfig\.max_context_tokens: (\d+) is below the first prompt of r3l/CoinCollector \((\d+) "
    r"tokens: .*\) plus max_response_tokens \((\d+)\) = (\d+): every episode would overflow at turn 0"
    r".*set max_context_tokens to \4 or more"
)


@pytest.fixture(autouse=True)
def fresh_measurement(monkeypatch):
    monkeypatch.setattr(preflight, "_PROMPTS", {})


def _config(model, **training):
    return R3LConfig().training(model=model, **training)  # env: the default, r3l/CoinCollector


def _first_prompt_by_hand(tokenizer) -> int:
    """The same prompt rendered in one go (system message + first observation, assistant opening)."""
    import environments
    from rllib_r3l.runner.chat import ChatFormat
    from rllib_r3l.runner.rollout import format_observation, system_text

    env = environments.make("r3l/CoinCollector", {"split": "train"})
    try:
        obs, info = env.reset(seed=0)
        system = system_text(None, env.rules, str(info.get("task", "")))
        user = format_observation(obs, info.get("admissible_actions"))
    finally:
        env.close()
    return len(ChatFormat(tokenizer).prompt([{"role": "system", "content": system}, {"role": "user", "content": user}]))


@pytest.mark.subprocess
def test_max_context_tokens_below_the_first_prompt_is_refused_and_above_accepted(
    tiny_model_dir, tiny_tokenizer, monkeypatch
):
    import transformers

    def no_weights(*a, **k):
        raise AssertionError("the first-prompt check loaded model weights")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    with pytest.raises(ValueError) as refused:
        preflight.check_config(_config(tiny_model_dir, max_context_tokens=100, max_response_tokens=48))
    m = REFUSED.search(str(refused.value))
    assert m, refused.value
    limit, prompt, response, need = map(int, m.groups())
    assert (limit, response) == (100, 48) and need == prompt + response
    assert prompt == _first_prompt_by_hand(tiny_tokenizer)  # the runner's prompt, measured exactly
    with pytest.raises(ValueError, match=REFUSED):
        preflight.check_config(_config(tiny_model_dir, max_context_tokens=need - 1, max_response_tokens=48))
    preflight.check_config(_config(tiny_model_dir, max_context_tokens=need, max_response_tokens=48))
    preflight.check_config(_config(tiny_model_dir))  # the defaults (4096) fit


class _ResetOnly:
    """An environment whose reset is all the check may use without a tokenizer (it counts the calls)."""

    def __init__(self, obs):
        self.obs, self.resets = obs, 0

    def reset(self, seed=None):
        self.resets += 1
        return self.obs, {}


def test_a_tokenizer_not_on_this_machine_skips_the_token_count_not_the_reset(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = _config("no-such-org/no-such-model", max_context_tokens=10, max_response_tokens=8)
    env = _ResetOnly("You are in a kitchen.")
    assert preflight.first_prompt_tokens(config, env=env) is None and env.resets == 1
    preflight.check_first_prompt(config, None)  # nothing measured: nothing refused
    with pytest.raises(
        preflight.EnvResetError,
        match=r"fails at reset\(seed=0\) \(TypeError: environment returned "
        r"a list observation, expected str\)",
    ):
        preflight.first_prompt_tokens(config, env=_ResetOnly(["not", "text"]))


@pytest.mark.subprocess
def test_dry_run_and_the_main_job_refuse_it_before_ray_starts(tmp_path, capsys, tiny_model_dir):
    from rllib_r3l.cli import commands, main

    code = commands.main(
        [
            "train",
            "tuned_examples/cpu/coin_collector.yaml",
            "--set",
            f"model={tiny_model_dir}",
            "--set",
            "max_context_tokens=120",
            "--dry-run",
            "--storage-path",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "max_context_tokens" in err and "below the first prompt of r3l/CoinCollector" in err, err
    assert "Traceback" not in err
    rc = main.main(["--out", str(tmp_path / "run"), "--set", f"model={tiny_model_dir}", "max_context_tokens=120"])
    err = capsys.readouterr().err
    assert rc == 2 and "R3LConfig.max_context_tokens: 120 is below the first prompt" in err, err
    assert not (tmp_path / "run").exists()  # refused before anything was written
