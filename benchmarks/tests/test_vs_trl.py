"""The pure parts of ``benchmarks/vs_trl.py`` (issue 13): both systems see the same prompts, the
same reward and matching hyperparameters. Fast; TRL is optional (its part skips without it)."""

from __future__ import annotations

import importlib.util

import pytest

from benchmarks import vs_trl


@pytest.fixture(scope="module", params=sorted(vs_trl.TASKS))
def settings(request):
    return vs_trl.task_settings(request.param)


@pytest.fixture(scope="module")
def countdown():
    return vs_trl.task_settings("countdown")


def test_default_task_is_arithmetic_and_unknown_tasks_are_refused():
    s = vs_trl.Settings()
    assert (s.env, s.env_config, s.max_completion_tokens) == ("r3l/Math", {"difficulty": 0, "max_attempts": 1}, 96)
    assert vs_trl.task_settings("countdown", max_completion_tokens=12).max_completion_tokens == 12
    with pytest.raises(SystemExit, match="--task"):
        vs_trl.task_settings("chess")


def test_our_grpo_form_is_a_valid_config(settings):
    from rllib_r3l import R3LConfig

    cfg = (
        R3LConfig()
        .environment(settings.env, env_config=dict(settings.env_config))
        .training(**vs_trl.ours_training_options(settings))
    )
    cfg.validate_r3l()
    assert cfg.is_grpo_baseline and cfg.std_normalize and not cfg.aux_items
    assert (cfg.lr, cfg.grad_clip, cfg.weight_decay, cfg.temperature) == (settings.lr, 1.0, 0.01, 1.0)
    assert cfg.backend_options == {"dtype": "bfloat16"}
    assert vs_trl.ours_training_options(settings, "ours_fp32")["backend_options"] == {"dtype": "float32"}
    assert vs_trl.ours_training_options(settings, "ours_compiled")["backend_options"] == {
        "dtype": "bfloat16",
        "enforce_eager": False,
    }


def test_task_seeds_are_what_our_runner_draws(settings):
    """The TRL dataset is built from the seeds our local env runner draws per iteration."""
    from rllib_r3l import R3LConfig
    from rllib_r3l.runner.env_runner import R3LEnvRunner

    cfg = (
        R3LConfig()
        .environment(settings.env, env_config=dict(settings.env_config))
        .training(**vs_trl.ours_training_options(settings))
        .debugging(seed=7)
    )
    runner = R3LEnvRunner(config=cfg)
    drawn = [[int(s) for s in runner._rng.integers(0, 2**31 - 1, size=2)] for _ in range(3)]
    assert drawn == vs_trl.train_task_seeds(7, 3, 2)
    assert vs_trl.train_task_seeds(8, 3, 2) != drawn


def test_trl_prompt_tokens_equal_ours(settings, tiny_tokenizer):
    """TRL applies the chat template to both messages at once; ours concatenates segments."""
    assert vs_trl.check_prompt_tokens(tiny_tokenizer, settings, [0, 1, 12345]) == 3
    msgs = vs_trl.prompt_messages(vs_trl.make_env(settings, "train"), settings, 0)
    assert "Your task: " in msgs[0]["content"] and msgs[0]["content"].endswith("then the final answer.")
    if settings.env == "r3l/Countdown":
        assert msgs[0]["content"].startswith("Countdown:") and "{" not in msgs[0]["content"]
        assert msgs[1]["content"].endswith("<answer>expression</answer>.")
    else:
        assert msgs[0]["content"].startswith("Solve the math problem.") and "What is " in msgs[1]["content"]


def test_arithmetic_reward_is_the_environments_own():
    s = vs_trl.task_settings("arithmetic")
    env = vs_trl.make_env(s, "train")
    env.reset(seed=5)
    gold = env.reference_answer()
    reward = vs_trl.TaskReward(s)
    conv = [
        [{"role": "assistant", "content": f"It is \\boxed{{{gold}}}."}],
        [{"role": "assistant", "content": f"It is {int(gold) + 1}."}],
        [{"role": "assistant", "content": ""}],
    ]
    assert reward(prompts=None, completions=conv, task_seed=[5, 5, 5]) == [1.0, 0.0, 0.0]
    assert vs_trl.env_reward(env, 5, f"The answer is {gold}") == 1.0


def test_reward_is_the_environments_own(countdown):
    settings = countdown
    env = vs_trl.make_env(settings, "train")
    env.reset(seed=3)
    sol = env.solution()
    a, b = env._meta["numbers"]
    wrong = f"{a} + {b}" if env._meta["target"] != a + b else f"{a} * {b}"
    reward = vs_trl.TaskReward(settings)
    conv = [
        [{"role": "assistant", "content": f" so: <answer>{sol}</answer>\n"}],
        [{"role": "assistant", "content": f"<answer>{wrong}</answer>"}],
        [{"role": "assistant", "content": ""}],
    ]
    assert reward(prompts=None, completions=conv, task_seed=[3, 3, 3]) == [1.0, 0.0, 0.0]
    assert reward.calls == [[1.0, 0.0, 0.0]]
    assert vs_trl.env_reward(env, 3, f"{sol} = {env._meta['target']}") == 1.0


def test_trl_config_matches_ours(settings):
    kw = vs_trl.trl_config_kwargs(settings, "/tmp/unused", seed=1)
    ours = vs_trl.ours_training_options(settings)
    assert kw["learning_rate"] == ours["lr"] and kw["max_grad_norm"] == ours["grad_clip"]
    assert kw["weight_decay"] == ours["weight_decay"] and kw["temperature"] == ours["temperature"]
    assert kw["max_completion_length"] == ours["max_response_tokens"] and kw["num_generations"] == ours["group_size"]
    assert kw["beta"] == 0.0 and kw["loss_type"] == "dapo" and kw["scale_rewards"] == "group"
    assert kw["num_iterations"] == 1 and not kw["vllm_importance_sampling_correction"]
    # one optimizer step per generation batch of prompts_per_step x group_size completions
    assert kw["per_device_train_batch_size"] * kw["gradient_accumulation_steps"] == settings.batch_size
    assert kw["steps_per_generation"] == kw["gradient_accumulation_steps"]
    assert kw["lr_scheduler_type"] == "constant" and not kw["bf16"] and not kw["gradient_checkpointing"]
    if importlib.util.find_spec("trl") is None:
        pytest.skip("trl not installed (benchmark-only: requirements/bench.txt); GRPOConfig not checked")
    from trl import GRPOConfig

    args = GRPOConfig(**dict(kw, use_vllm=False))
    assert args.generation_batch_size == settings.batch_size
    assert args.learning_rate == settings.lr and args.adam_beta2 == 0.999 and args.adam_epsilon == 1e-8


def test_summary_ratios_are_paired_by_seed():
    def run(cpu, wall, held, train=0.0):
        return {
            "steps": [
                {"cpu_s": 99.0, "wall_s": 99.0, "reward_mean": 0.0, "train_cpu_s": 50.0},
                {"cpu_s": cpu, "wall_s": wall, "reward_mean": 0.5, "train_cpu_s": train},
            ],
            "eval": {"eval_reward_mean": held},
        }

    runs = {
        "ours": {0: run(10.0, 6.0, 0.2, train=4.0), 1: run(20.0, 10.0, 0.3, train=8.0)},
        "trl": {0: run(20.0, 12.0, 0.2, train=12.0), 1: run(20.0, 10.0, 0.1, train=12.0)},
    }
    s = vs_trl.summarize(runs, skip_first=True)
    r = s["ratio_ours_over_trl"]
    assert r["speedup_cpu_s_per_step"][0] == pytest.approx(1.5)  # (2.0 + 1.0) / 2, first step left out
    assert r["speedup_wall_s_per_step"][0] == pytest.approx(1.5)
    assert r["heldout_reward"][0] == pytest.approx(2.0)  # (1.0 + 3.0) / 2
    assert r["heldout_diff"][0] == pytest.approx(0.1)
    # only steps with a reward spread count as equal work (the 0-reward step's 50 s is left out)
    assert r["speedup_train_cpu_s_per_signal_step"][0] == pytest.approx((3.0 + 1.5) / 2)
    assert s["ours"]["signal_steps"][0] == 1
    assert s["ours"]["cpu_s_per_step"][0] == pytest.approx(15.0)
