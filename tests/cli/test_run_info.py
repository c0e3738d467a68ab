"""What the console's header reports about a run and the machine (``rllib_r3l.cli.run_info``)."""

import os

from rllib_r3l import R3LConfig
from rllib_r3l.cli.run_info import cpu_model, expected_episodes, learner_precision, run_info


def test_run_info_counts_base_episodes_and_retries_as_the_explorer_will():
    cfg = R3LConfig().training(
        model="tiny", backend="transformers", group_size=8, tasks_per_iteration=3, retries_per_failure=1
    )
    info = run_info(cfg, title="t", log="/x/main.log")
    # group 8 with one retry per failure: 4 base episodes a task and up to 4 retries
    assert (info["base_per_task"], info["max_retries_per_task"], info["tasks"]) == (4, 4, 3)
    assert expected_episodes(info) == 12
    assert info["backend"] == "transformers" and info["engine_dtype"] == "float32"
    assert info["cores"] == os.cpu_count() and info["log"] == "/x/main.log"
    grpo = run_info(R3LConfig().training(model="tiny", backend="transformers", group_size=8, reflect=False))
    assert (grpo["base_per_task"], grpo["max_retries_per_task"]) == (8, 0)


def test_cpu_model_is_the_kernels_model_name():
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.lower().startswith("model name")]
    assert cpu_model() == (names[0] if names else cpu_model())
    assert cpu_model()


def test_learner_precision_names_the_mixed_precision_setting():
    assert learner_precision(R3LConfig().training(model="tiny", mixed_precision="none")) == "fp32, mixed_precision=none"
    forced = R3LConfig().training(model="tiny", mixed_precision="bfloat16")
    assert learner_precision(forced) == "bf16 autocast (fp32 weights), mixed_precision=bfloat16"
