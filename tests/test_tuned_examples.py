"""Every YAML file under tuned_examples/ parses and builds a validated R3LConfig.

No training: no model is resolved and Ray is not started. Also checks that the paper files carry
the K.1 hyperparameters, that the ablations switch exactly one component off, that plain
``yaml.safe_load`` (what ``tune.run_experiments(yaml.safe_load(f))`` uses) reads the same values as
the CLI, and that the generated files are up to date with tuned_examples/generate.py.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest
import yaml

from rllib_r3l.cli import commands as cli
from tests import REPO_ROOT

ROOT = str(REPO_ROOT)
EXAMPLES = os.path.join(ROOT, "tuned_examples")
FILES = sorted(glob.glob(os.path.join(EXAMPLES, "**", "*.yaml"), recursive=True))
PAPER = [f for f in FILES if os.sep + "paper" + os.sep in f]
MODELS = {"Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen3-4B", "meta-llama/Llama-3.2-3B-Instruct"}


def _rel(path: str) -> str:
    return os.path.relpath(path, EXAMPLES)


def test_there_are_examples():
    dirs = {_rel(f).split(os.sep)[0] for f in FILES}
    assert {"paper", "ablations", "cpu", "search"} <= dirs
    assert len(PAPER) >= 6 * 4 * 2  # 6 settings x 4 models, R3L and GRPO


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_example_validates(path):
    experiments = cli.prepare_experiments(path)
    assert experiments
    for name, spec in experiments.items():
        assert spec["run"] == "R3L"
        assert spec.get("stop"), f"{name}: no stop criterion"
        cfg = cli.validate_config(spec["config"], where=name)
        assert cfg.model_id and cfg.env


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_plain_safe_load_reads_the_same(path):
    with open(path) as f:
        plain = yaml.safe_load(f)
    assert plain == cli.load_yaml_file(path)  # no 1e-6-style strings: tune.run_experiments sees floats
    with open(path) as f:
        assert f.readline().startswith("#"), "each file starts with a comment header"


# The paper's values (arXiv 2601.03715), each with where the paper states it. Rows marked "R3L" hold
# for R3L configs, "GRPO" for the GRPO baselines, "both" for either.
PAPER_VALUES = [
    ("lr", 1e-6, "both", "K.1: AdamW, lr 1e-6"),
    ("group_size", 8, "both", "K.1: group size N = 8"),
    ("tasks_per_iteration", 96, "both", "K.1: batch of 96 tasks"),
    ("max_context_tokens", 20480, "both", "K.1: maximum context 20,480 tokens"),
    ("max_reflection_tokens", 4096, "both", "K.1: 4,096 tokens for reflections"),
    ("temperature", 1.0, "both", "K.1: training temperature 1.0"),
    ("evaluation_temperature", 0.4, "both", "K.1: test temperature 0.4"),
    ("grad_clip", 1.0, "both", "K.1: gradient clipping 1.0"),
    ("amplification_alpha", 3.0, "both", "K.1 / C.1: alpha = 3"),
    ("aux_items", ["reflection_sft", "retry_sft"], "both", "§4 'Data construction': both auxiliary items"),
    ("reflection_style", "paper", "both", "§4, appendix K: the policy reflects freely under a Reflector prompt"),
    ("reflection_context", "log", "both", "appendix K: the Reflector reads the episode's log"),
    ("reflection_temperature", 0.7, "both", "K.1: reflection temperature 0.7"),
    ("reflect_on", "failures", "both", "§3: unsuccessful samples are diagnosed"),
    ("loss_aggregation", "paper", "both", "§4 'Objective', Algorithm 1: the paper's objective"),
    ("kl_coef", 0.0, "R3L", "§4 'Objective': R3L drops the KL and the reference model"),
    ("use_importance_ratio", False, "R3L", "§4 'Objective': no importance sampling for R3L"),
    ("kl_coef", 0.01, "GRPO", "implementation appendix: GRPO's KL coefficient 0.01"),
    ("use_importance_ratio", True, "GRPO", "implementation appendix: GRPO's clipped importance ratio"),
    ("clip_ratio_low", 0.2, "GRPO", "implementation appendix: ratio clipped at 0.2"),
    ("clip_ratio_high", 0.2, "GRPO", "implementation appendix: ratio clipped at 0.2"),
]


@pytest.mark.parametrize("path", PAPER, ids=_rel)
def test_paper_hyperparameters(path):
    (spec,) = cli.load_yaml_file(path).values()
    c = spec["config"]
    math = c["env"] == "r3l/Math"
    grpo = path.endswith("-grpo.yaml")
    assert c["model"] in MODELS
    for key, value, who, where in PAPER_VALUES:
        if who == "both" or who == ("GRPO" if grpo else "R3L"):
            assert c[key] == value, f"{key}: the paper says {value!r} ({where})"
    assert isinstance(c["lr"], float)
    assert c["max_response_tokens"] == (4096 if math else 512)  # K.1: 512 agentic, 4,096 math
    assert c["backend"] == "vllm" and c["num_gpus_per_env_runner"] >= 1 and c["num_gpus_per_learner"] >= 1
    assert c["gradient_checkpointing"] is True
    flags = (c["reflect"], c["pivotal_credit"], c["positive_amplification"], c["std_normalize"])
    assert flags == ((False, False, False, True) if grpo else (True, True, True, False))
    assert "aux_tasks" not in c


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(EXAMPLES, "ablations", "*.yaml"))), ids=_rel)
def test_ablations_switch_one_component_off(path):
    experiments = cli.load_yaml_file(path)
    (full_name,) = [n for n in experiments if n.endswith("-r3l")]
    full = experiments[full_name]["config"]
    switches = ("reflect", "pivotal_credit", "positive_amplification", "std_normalize")
    grpo_only = ("kl_coef", "use_importance_ratio")  # the paper's GRPO adds its KL and clipped ratio
    diffs = {}
    for name, spec in experiments.items():
        c = spec["config"]
        same = switches + grpo_only
        assert {k: v for k, v in c.items() if k not in same} == {k: v for k, v in full.items() if k not in same}
        diffs[name.split("-", 1)[1]] = {k for k in same if c[k] != full[k]}
    assert diffs["no-reflect"] == {"reflect"}
    assert diffs["no-pivotal-credit"] == {"pivotal_credit"}
    assert diffs["no-positive-amplification"] == {"positive_amplification"}
    assert diffs["grpo"] == set(switches) | set(grpo_only)


def test_search_grid_matches_paper_c1():
    (spec,) = cli.load_yaml_file(os.path.join(EXAMPLES, "search", "alpha_group_size.yaml")).values()
    c = spec["config"]
    assert c["amplification_alpha"] == {"grid_search": [1.0, 3.0, 5.0]}
    assert c["group_size"] == {"grid_search": [4, 8, 16]}
    assert len(cli.expand_variants(c, "search")) == 9


def test_cpu_examples_run_offline():
    cpu = {os.path.basename(f): cli.load_yaml_file(f) for f in FILES if os.sep + "cpu" + os.sep in f}
    configs = [s["config"] for exps in cpu.values() for s in exps.values()]
    assert any(c["model"] == "tiny" and c["env"] == "r3l/ToyCorridor" for c in configs)
    assert any(c["env"] == "r3l/CoinCollector" and c["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" for c in configs)
    assert {c["reflect"] for c in configs} == {True, False}
    assert all(c.get("num_gpus_per_learner", 0) == 0 and c.get("num_gpus_per_env_runner", 0) == 0 for c in configs)


@pytest.mark.subprocess
def test_generated_files_are_up_to_date():
    r = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "generate.py"), "--check"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
