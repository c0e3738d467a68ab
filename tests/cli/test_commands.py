"""The ``rllib-r3l`` command line: train -> evaluate -> export -> reload -> report, and its errors.

Integration tests share one Ray runtime per module and shrink every run with ``--set`` overrides
(tiny model, transformers backend, one iteration): the whole module takes a few minutes on 2 cores.
Error tests start nothing: a wrong key or flag must exit with code 2 and name the key and the fix.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import subprocess
import sys

import pytest

from rllib_r3l.cli import commands as cli
from tests import REPO_ROOT

ROOT = str(REPO_ROOT)
CPU_DIR = os.path.join(ROOT, "tuned_examples", "cpu")
TOY = os.path.join(CPU_DIR, "toy_corridor_tiny.yaml")
CPU_FILES = sorted(glob.glob(os.path.join(CPU_DIR, "*.yaml")))
# Small enough for a 2-core machine: one iteration of a few short episodes with the tiny model.
TINY = [
    "--set",
    "model=tiny",
    "--set",
    "backend=transformers",
    "--set",
    "group_size=4",
    "--set",
    "tasks_per_iteration=1",
    "--set",
    "max_response_tokens=8",
    "--set",
    "max_reflection_tokens=16",
    "--set",
    "max_context_tokens=2048",
    "--stop",
    "training_iteration=1",
    "--verbose",
    "0",
    "--quiet-workers",
    # seeded, so that the one iteration has a learning signal (a run that trains on nothing exits 1)
    "--set",
    "sampling_seed=1",
    "--set",
    "seed=1",
]
COIN_SMALL = ["--set", "env_config={num_locations: 2, max_turns: 3}"]


def run_cli(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ==================================================================================================
# Errors: exit code 2, the key/flag and the fix named, no traceback (no Ray, no model)
# ==================================================================================================
def _write(tmp_path, text, name="exp.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


GOOD = """
exp:
  run: R3L
  stop: {training_iteration: 1}
  config:
    model: tiny
    env: r3l/ToyCorridor
    env_config: {num_rooms: 3}
    group_size: 4
"""


def assert_usage_error(code, err, *needles):
    assert code == 2, err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, f"{n!r} not in {err!r}"


def test_dry_run_prints_final_config(tmp_path, capsys):
    f = _write(tmp_path, GOOD)
    code, out, err = run_cli(
        capsys,
        "train",
        f,
        "--dry-run",
        "--set",
        "env_config.num_rooms=5",
        "--set",
        "lr=1e-5",
        "--stop",
        "training_iteration=3",
    )
    assert code == 0, err
    assert "num_rooms: 5" in out and "lr: 1.0e-05" in out and "training_iteration: 3" in out


@pytest.mark.parametrize(
    "text,needles",
    [
        (GOOD.replace("group_size: 4", "gruop_size: 4"), ["gruop_size", "did you mean 'group_size'"]),
        (GOOD.replace("group_size: 4", "group_size: 3"), ["group_size", "got 3"]),
        (GOOD.replace("group_size: 4", 'lr: "1e-6"'), ["lr", "1.0e-6"]),
        (GOOD.replace("group_size: 4", "reflect: maybe"), ["reflect", "true or false"]),
        (GOOD.replace("r3l/ToyCorridor", "r3l/ToyCoridor"), ["env", "r3l/ToyCorridor"]),
        (GOOD.replace("num_rooms: 3", "num_room: 3"), ["env_config.num_room", "num_rooms"]),
        (GOOD.replace("group_size: 4", "model_config: {}"), ["_model_config"]),
        (GOOD.replace("run: R3L", "run: PPO"), ["run", "R3L"]),
        (GOOD.replace("  stop:", "  stopp:"), ["stopp", "did you mean 'stop'"]),
        (GOOD.replace("group_size: 4", "group_size: 4\n   bad: [indent"), ["line", "YAML"]),
        ("just a string\n", ["expected a mapping"]),
        ("", ["holds no experiment", "NAME: {run: R3L"]),  # re-probe 7: "expected a mapping ..., got NoneType"
        ("{}\n", ["holds no experiment"]),  # re-probe 7: "... got dict"
    ],
)
def test_yaml_errors(tmp_path, capsys, text, needles):
    code, _out, err = run_cli(capsys, "train", _write(tmp_path, text), "--dry-run")
    assert_usage_error(code, err, *needles)


def test_a_file_that_is_not_utf8_is_one_line(tmp_path, capsys):
    # re-probe 7 (R1): a UnicodeDecodeError traceback, exit 1
    p = tmp_path / "f.yaml"
    p.write_bytes(b"\xff\xfe garbage")
    code, _out, err = run_cli(capsys, "train", str(p), "--dry-run")
    assert_usage_error(code, err, "f.yaml: not a text file in UTF-8 (byte 0")


@pytest.mark.parametrize(
    "flags,needles",
    [
        (["--set", "gruop_size=4"], ["--set gruop_size", "group_size"]),
        (["--set", "group_size"], ["--set", "KEY=VALUE"]),
        (["--set", "max_response_tokens=99999"], ["max_response_tokens", "max_context_tokens"]),
        (["--set", "env_config.num_room=3"], ["--set env_config.num_room", "num_rooms"]),
        (["--set", "model=7"], ["model"]),
        (["--stop", "training_iteration"], ["--stop", "KEY=VALUE"]),
        (["--experiment", "nope"], ["--experiment 'nope'", "exp"]),
        (["--num-cpus", "0"], ["--num-cpus"]),
        (
            ["--max-concurrent", "-1"],
            ["--max-concurrent -1: must be >= 0 (0 or leaving it out: no limit)"],
        ),  # re-probe 12
    ],
)
def test_flag_errors(tmp_path, capsys, flags, needles):
    code, _out, err = run_cli(capsys, "train", _write(tmp_path, GOOD), "--dry-run", *flags)
    assert_usage_error(code, err, *needles)


def test_missing_file_and_unknown_flag(tmp_path, capsys):
    code, _out, err = run_cli(capsys, "train", str(tmp_path / "nope.yaml"))
    assert_usage_error(code, err, "nope.yaml", "no such file")
    code, _out, err = run_cli(capsys, "train", _write(tmp_path, GOOD), "--bogus")
    assert_usage_error(code, err, "--bogus")
    code, _out, err = run_cli(capsys)
    assert code == 2


@pytest.mark.parametrize("module,flag", [("wandb", "--wandb"), ("mlflow", "--mlflow")])
def test_missing_logger_package(tmp_path, capsys, module, flag):
    import importlib.util

    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed")
    code, _out, err = run_cli(capsys, "train", _write(tmp_path, GOOD), flag, "x", "--dry-run")
    assert_usage_error(code, err, flag, f"pip install {module}")


def test_an_environment_option_at_the_top_level_points_to_env_config(tmp_path, capsys):
    """Re-probe 9: `--set num_rooms=3` said "did you mean 'num_epochs'", an option R3L refuses."""
    code, _out, err = run_cli(capsys, "train", _write(tmp_path, GOOD), "--set", "num_rooms=3", "--dry-run")
    assert_usage_error(
        code, err, "--set num_rooms=...", "option of the environment r3l/ToyCorridor", "--set env_config.num_rooms=..."
    )
    assert "num_epochs" not in err
    code, _out, err = run_cli(
        capsys, "train", _write(tmp_path, GOOD.replace("group_size: 4", "num_rooms: 4")), "--dry-run"
    )
    assert_usage_error(code, err, "exp.config.num_rooms", "under config.env_config")
    code, _out, err = run_cli(capsys, "train", _write(tmp_path, GOOD), "--set", "num_epoch=3", "--dry-run")
    assert_usage_error(code, err, "unknown config key 'num_epoch'")
    assert "did you mean 'num_epochs'" not in err


def test_a_misspelt_checkpoint_score_attribute_is_refused(tmp_path, capsys):
    """Re-probe 9 (silently wrong, twice): `checkpoint_score_attribute: training_iteraton` with `num_to_keep: 1`
    ranked nothing and deleted the best checkpoint, exit 0, no warning."""
    bad = GOOD + "  checkpoint_config: {num_to_keep: 1, checkpoint_score_attribute: training_iteraton}\n"
    code, _out, err = run_cli(capsys, "train", _write(tmp_path, bad), "--dry-run")
    assert_usage_error(
        code,
        err,
        "exp.checkpoint_config.checkpoint_score_attribute",
        "'training_iteraton'",
        "did you mean 'training_iteration'",
        "num_to_keep would delete the best",
    )
    good = bad.replace("training_iteraton", "env_runners/success_rate")
    code, out, err = run_cli(capsys, "train", _write(tmp_path, good), "--dry-run")
    assert code == 0 and "valid" in out, err


@pytest.mark.parametrize(
    "line,needle",
    [
        ("{checkpoint_at_end: 'false'}", "checkpoint_config.checkpoint_at_end: must be true or false, got 'false'"),
        ("{num_to_keep: 2.5}", "checkpoint_config.num_to_keep: must be an integer >= 1 or null, got 2.5"),
    ],
)
def test_checkpoint_config_switches_and_counts_are_typed(tmp_path, capsys, line, needle):
    """Re-probe 10 (silently wrong, twice): checkpoint_at_end: 'false' was true, and the final checkpoint written."""
    code, _out, err = run_cli(capsys, "train", _write(tmp_path, GOOD + f"  checkpoint_config: {line}\n"), "--dry-run")
    assert_usage_error(code, err, f"exp.{needle}")


def test_a_tracking_uri_without_mlflow_is_refused_not_ignored(tmp_path, capsys):
    """Re-probe 9: `--mlflow-tracking-uri` without `--mlflow` passed and nothing was logged anywhere."""
    code, _out, err = run_cli(
        capsys, "train", _write(tmp_path, GOOD), "--mlflow-tracking-uri", "http://x:5000", "--dry-run"
    )
    assert_usage_error(code, err, "--mlflow-tracking-uri", "--mlflow EXPERIMENT")


def test_evaluate_export_report_errors(tmp_path, capsys):
    code, _out, err = run_cli(capsys, "evaluate", str(tmp_path / "missing"))
    assert_usage_error(code, err, "no such checkpoint")
    code, _out, err = run_cli(capsys, "evaluate", str(tmp_path), "--env-config", "{bad")
    assert_usage_error(code, err, "--env-config", "JSON")
    code, _out, err = run_cli(capsys, "evaluate", str(tmp_path), "--env", "r3l/Nope")
    assert_usage_error(code, err, "--env", "r3l/Nope")
    code, _out, err = run_cli(capsys, "evaluate", str(tmp_path), "--episodes", "0")
    assert_usage_error(code, err, "--episodes")
    code, _out, err = run_cli(capsys, "evaluate", str(tmp_path))
    assert_usage_error(code, err, "not an R3L checkpoint")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("x")
    code, _out, err = run_cli(capsys, "export", str(tmp_path), "--out", str(tmp_path / "out"))
    assert_usage_error(code, err, "--out", "--force")
    code, _out, err = run_cli(capsys, "report", str(tmp_path / "out"))
    assert_usage_error(code, err, "no Tune trials")
    code, _out, err = run_cli(capsys, "report", str(tmp_path / "out" / "x"))  # re-probe 11: "no such directory"
    assert_usage_error(code, err, "x: a file, not a directory (pass a Tune experiment directory")
    code, _out, err = run_cli(capsys, "report", str(tmp_path / "nope"))
    assert_usage_error(code, err, "nope: no such directory")


@pytest.mark.subprocess
def test_options_and_module_entry_point(capsys):
    code, out, _err = run_cli(capsys, "options")
    assert code == 0 and "amplification_alpha" in out and "model " in out
    r = subprocess.run(
        [sys.executable, "-m", "rllib_r3l.cli.commands", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 0 and "train" in r.stdout and "evaluate" in r.stdout and "report" in r.stdout


# ==================================================================================================
# Integration: train -> evaluate -> export -> reload -> report (one Ray runtime for the module)
# ==================================================================================================
@pytest.fixture(scope="module")
def trained(ray_session, tmp_path_factory):
    """Both experiments of the smallest CPU example, one iteration each, checkpointed at the end."""
    storage = tmp_path_factory.mktemp("ray_results")
    code = cli.main(["train", TOY, "--storage-path", str(storage)] + TINY)
    assert code == 0
    ckpts = sorted(glob.glob(str(storage / "*" / "*" / "checkpoint_*")))
    return {"storage": str(storage), "checkpoints": ckpts}


@pytest.mark.integration
def test_train_writes_results_checkpoints_and_tensorboard(trained):
    exps = sorted(os.listdir(trained["storage"]))
    assert exps == ["toy-corridor-tiny-no-reflect", "toy-corridor-tiny-r3l"]
    assert len(trained["checkpoints"]) == 2
    for exp in exps:
        (trial,) = [d for d in glob.glob(os.path.join(trained["storage"], exp, "*")) if os.path.isdir(d)]
        with open(os.path.join(trial, "result.json")) as f:
            last = json.loads(f.readlines()[-1])
        assert last["training_iteration"] == 1
        assert "episode_return_mean" in last["env_runners"]
        assert glob.glob(os.path.join(trial, "events.out.tfevents*")), "TensorBoard logger wrote nothing"


@pytest.mark.integration
def test_a_finished_experiment_is_not_advised_a_resume_that_does_nothing(trained, capsys):
    """Re-probe 7 (M4, issue 37): a plain rerun of a finished experiment advised "pass --resume to continue
    it"; that --resume trained nothing, exit 0."""
    argv = ["train", TOY, "--storage-path", trained["storage"], *TINY, "--dry-run"]
    code, _out, err = run_cli(capsys, *argv)
    assert_usage_error(code, err, "every trial of it finished (reached its stop criterion)", "--new")
    assert "pass --resume" not in err, err
    code, _out, err = run_cli(capsys, "train", TOY, "--storage-path", trained["storage"], "--dry-run", "--resume")
    assert_usage_error(code, err, "--resume: nothing to continue, every trial of", "finished")


@pytest.mark.integration
def test_evaluate_checkpoint(trained, capsys, tmp_path):
    ckpt = [c for c in trained["checkpoints"] if "tiny-r3l" in c][0]
    csv = tmp_path / "new" / "episodes.csv"  # re-probe 11: a folder not there yet failed after the evaluation
    code, out, err = run_cli(capsys, "evaluate", ckpt, "--episodes", 3, "--max-turns", 2, "--out", csv)
    assert code == 0, err
    assert "success_rate" in out and "mean_return" in out and "mean_turns" in out and "r3l/ToyCorridor" in out
    import pandas as pd

    df = pd.read_csv(csv)
    assert len(df) == 3 and (df["turns"] <= 2).all() and set(df["seed"]) == {0, 1, 2}
    # A Tune trial directory stands for its latest checkpoint.
    from rllib_r3l.cli.export import find_checkpoint

    assert find_checkpoint(os.path.dirname(ckpt)) == ckpt


@pytest.mark.integration
def test_export_reloads_with_transformers_and_evaluates(trained, capsys, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt = [c for c in trained["checkpoints"] if "tiny-r3l" in c][0]
    out_dir = tmp_path / "exported"
    code, out, err = run_cli(capsys, "export", ckpt, "--out", out_dir)
    assert code == 0, err
    for name in ("config.json", "model.safetensors", "tokenizer.json", "r3l_export.json"):
        assert (out_dir / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(str(out_dir))
    tok = AutoTokenizer.from_pretrained(str(out_dir))
    assert tok.chat_template, "chat template missing"
    with open(
        os.path.join(ckpt, "learner_group", "learner", "rl_module", "default_policy", "module_state.pkl"), "rb"
    ) as f:
        state = pickle.load(f)
    sd = model.state_dict()
    for k, v in state.items():
        assert torch.equal(sd[k[len("lm.") :]], v), k  # the trained weights, not the base model's
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    gen = model.generate(**ids, max_new_tokens=3, do_sample=False)
    assert ids["input_ids"].shape[1] < gen.shape[1] <= ids["input_ids"].shape[1] + 3
    # The export is evaluated with the training's env and prompts (read from r3l_export.json).
    code, out, err = run_cli(capsys, "evaluate", out_dir, "--episodes", 2, "--max-turns", 2)
    assert code == 0, err
    assert "r3l/ToyCorridor" in out


@pytest.mark.integration
def test_report_table_and_pngs(trained, capsys, tmp_path):
    out_dir = tmp_path / "report"
    code, out, err = run_cli(capsys, "report", trained["storage"], "--out", out_dir)
    assert code == 0, err
    import pandas as pd

    table = pd.read_csv(out_dir / "summary.csv")
    assert len(table) == 2
    assert {"reward", "success_rate", "trained_tokens_per_sample", "time_total_s", "reflect"} <= set(table.columns)
    assert sorted(table["reflect"]) == [False, True]  # the varied hyperparameter is a column
    pngs = sorted(p.name for p in out_dir.glob("*.png"))
    assert "reward.png" in pngs and "tokens_per_sample.png" in pngs
    assert (out_dir / "reward.png").stat().st_size > 1000
    assert "reward" in out


@pytest.mark.integration
@pytest.mark.parametrize("path", [f for f in CPU_FILES if f != TOY], ids=os.path.basename)
def test_every_cpu_example_trains_one_iteration(ray_session, tmp_path, capsys, path):
    # a file whose one seed-1 iteration has no signal (its remote runner draws other episodes): its own seed
    seed = {"coin_collector_async.yaml": 2}.get(os.path.basename(path), 1)
    seeds = ["--set", f"sampling_seed={seed}", "--set", f"seed={seed}"]
    code, out, err = run_cli(capsys, "train", path, "--storage-path", tmp_path, *TINY, *COIN_SMALL, *seeds)
    assert code == 0, out[-3000:] + err[-3000:]
    assert glob.glob(str(tmp_path / "*" / "*" / "checkpoint_*"))
    assert "TERMINATED" in out


@pytest.mark.integration
def test_every_cpu_example_is_covered():
    assert TOY in CPU_FILES and len(CPU_FILES) >= 3


@pytest.mark.integration
def test_export_merges_lora_adapters(tmp_path):
    """A LoRA-trained module exports as a plain model with the adapters merged (same logits)."""
    pytest.importorskip("peft")
    import gymnasium as gym
    import torch

    from rllib_r3l.cli import export as ex
    from rllib_r3l.learner.rl_module import R3LCausalLMModule

    space = gym.spaces.Text(max_length=8)
    module = R3LCausalLMModule(
        observation_space=space,
        action_space=space,
        model_config={"model_id": "tiny", "lora": {"r": 4, "target_modules": ["q_proj", "v_proj"]}},
    )
    with torch.no_grad():
        for name, p in module.lm.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn_like(p) * 0.5)  # adapters that change the output
    module.save_to_path(str(tmp_path / "module"))
    model, _tok, _cfg = ex.load_module_dir(str(tmp_path / "module"))
    assert not hasattr(model, "peft_config")
    x = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert torch.allclose(module.lm(input_ids=x).logits, model(input_ids=x).logits, atol=1e-4)


@pytest.mark.integration
def test_report_warnings_read_cells_a_trial_never_logged_as_missing():
    """A trial that never logged a count gets NaN in the joint table (pandas); that is 'unknown', not a crash
    (CI failed on exactly this: one trial with an empty batch, one without, in one report)."""
    import pandas as pd

    from rllib_r3l.cli import report_warnings

    table = pd.DataFrame(
        [
            {
                "trial": "a",
                "iterations": 2,
                "empty_batches": 2,
                "episodes_lost": 3,
                "env_errors": 3,
                "generation_errors": None,
            },
            {"trial": "b", "iterations": 1, "empty_batches": None, "episodes_lost": None},
            {"trial": "c", "iterations": 4, "empty_batches": 1, "episodes_lost": 2},
        ]
    )
    lines = report_warnings.warnings(table)
    assert lines == [
        "warning: a trained on nothing: all 2 iteration(s) had an empty batch "
        "(3 episodes lost, 3 environment errors, 0 generation errors)",
        "warning: c lost 2 episode(s) (environment/generation errors; see docs/reliability.md)",
    ]
