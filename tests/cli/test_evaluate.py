"""``rllib-r3l evaluate`` and ``export``: flag checks and checkpoint/model mismatches (issue 37, items 9
and 10). No Ray: the checkpoints here are written by hand, the tiny model is the base."""

from __future__ import annotations

import json
import os

import pytest

from rllib_r3l.cli import commands as cli
from rllib_r3l.cli import evaluate as ex_eval
from rllib_r3l.cli import export as ex
from tests.cli.fake_checkpoints import module_checkpoint, tiny_state


@pytest.mark.parametrize("flag", ["--max-turns", "--max-response-tokens"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_evaluate_refuses_non_positive_limits(tmp_path, capsys, flag, value):
    # before: 0 was read as "not given" and the training value was used without a word
    code = cli.main(["evaluate", str(tmp_path), flag, value])
    err = capsys.readouterr().err
    assert code == 2 and f"{flag} {value}: must be >= 1" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["nan", "inf", "-0.5"])
def test_evaluate_refuses_a_temperature_that_is_not_a_finite_number_at_least_0(tmp_path, capsys, value):
    # re-probe 5 (P80): nan and inf ran every episode into torch.multinomial's traceback, then a table of NaN
    code = cli.main(["evaluate", str(tmp_path), "--temperature", value])
    err = capsys.readouterr().err
    assert code == 2 and f"--temperature {float(value)}: must be a finite number >= 0" in err, err
    assert "Traceback" not in err


def test_evaluate_refuses_greedy_with_a_temperature(tmp_path, capsys):
    # re-probe 2: --greedy --temperature 0.5 evaluated at temperature 0, exit 0, no word about 0.5
    code = cli.main(["evaluate", str(tmp_path), "--greedy", "--temperature", "0.5"])
    err = capsys.readouterr().err
    assert code == 2 and "--greedy and --temperature 0.5 exclude each other" in err and "Traceback" not in err


# ==================================================================================================
# Checkpoint/model mismatches (item 9): hand-written checkpoints around the tiny model
# ==================================================================================================
def test_weights_of_another_model_are_one_line_in_export_and_evaluate(tmp_path, capsys):
    state = tiny_state()
    key = "lm.model.embed_tokens.weight"
    state[key] = state[key][:, :-1].clone()  # another model's hidden size
    ckpt = module_checkpoint(tmp_path, state)
    capsys.readouterr()  # the test's own from_pretrained above may show transformers' loading bar
    # before: RuntimeError "size mismatch for ..." (40 lines) from load_state_dict
    code = cli.main(["export", ckpt, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "do not fit base model 'tiny'" in err and "--base-model" in err, err
    assert len(err.strip().splitlines()) == 1
    code = cli.main(["evaluate", ckpt, "--episodes", "1", "--backend", "transformers"])
    err = capsys.readouterr().err
    assert code == 2 and "do not fit base model 'tiny'" in err and len(err.strip().splitlines()) == 1, err


def test_a_checkpoint_without_weights_is_called_damaged_not_another_model(tmp_path, capsys):
    """Re-probe 6 (M5, issue 37): a module_state.pkl that is a pickle of {} was called "weights that do not
    fit base model 'tiny' ... pass the right --base-model": the base model was right, the file damaged."""
    ckpt = module_checkpoint(tmp_path, {})
    for argv in (
        ["export", ckpt, "--out", str(tmp_path / "out")],
        ["evaluate", ckpt, "--episodes", "1", "--backend", "transformers"],
    ):
        code = cli.main(argv)
        err = capsys.readouterr().err
        assert code == 2 and "the checkpoint's module state holds no weights (damaged" in err, err
        assert "--base-model" not in err and len(err.strip().splitlines()) == 1, err


def test_evaluate_takes_base_model_when_the_checkpoints_has_moved(tmp_path, capsys):
    ckpt = module_checkpoint(tmp_path, tiny_state(), model_id=str(tmp_path / "moved-away"))
    code = cli.main(["evaluate", ckpt, "--episodes", "1", "--backend", "transformers"])
    err = capsys.readouterr().err
    assert code == 2 and "--base-model" in err, err
    # before: evaluate had no --base-model (its own advice was an unknown flag)
    code = cli.main(
        ["evaluate", ckpt, "--episodes", "1", "--max-turns", "1", "--backend", "transformers", "--base-model", "tiny"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "episodes" in out and "r3l/ToyCorridor" in out


@pytest.mark.slow
def test_env_config_changes_only_the_keys_it_names(tmp_path, capsys):
    """Re-probe 7 (S1, issue 37): --env-config replaced the checkpoint's env_config: '{}' or
    '{"eval_split": "test"}' evaluated a checkpoint trained with max_turns 6 at the environment's default 8,
    exit 0, and the table did not say. Now the flag's keys go over the training env_config, and the
    env_config used is printed."""
    ckpt = module_checkpoint(tmp_path, tiny_state())
    capsys.readouterr()
    for flag, want in (
        ("{}", {"num_rooms": 3}),
        ('{"eval_split": "dev"}', {"num_rooms": 3}),
        ('{"num_rooms": 4}', {"num_rooms": 4}),
    ):
        code = cli.main(["evaluate", ckpt, "--episodes", "1", "--backend", "transformers", "--env-config", flag])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert f"env_config {json.dumps(want)}" in out, out
    summary, _ = ex_eval.evaluate(ckpt, episodes=1, backend="transformers", env_config={"max_turns": 2})
    assert summary["env_config"] == {"num_rooms": 3, "max_turns": 2} and summary["split"] == "test"


def test_config_json_without_model_type_is_not_called_an_exported_model(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    assert not ex.is_hf_model_dir(str(tmp_path))
    for argv in (["evaluate", str(tmp_path)], ["export", str(tmp_path), "--out", str(tmp_path / "o")]):
        code = cli.main(argv)
        err = capsys.readouterr().err
        assert code == 2 and "model_type" in err and "Traceback" not in err, err


def test_export_of_a_plain_model_folder_says_it_needs_no_export(tiny_model_dir, tmp_path, capsys):
    # re-probe 3 leftover: it said "config.json without model_type" of a folder whose config.json has one
    code = cli.main(["export", tiny_model_dir, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "is a Hugging Face model folder (model_type 'llama')" in err, err
    assert f"rllib-r3l evaluate {tiny_model_dir}" in err and "without model_type" not in err, err
    assert not (tmp_path / "o").exists()


def test_an_unknown_backend_option_is_one_line_before_the_model_loads(tmp_path, capsys):
    # re-probe 2: `evaluate --backend-options '{"gpu_mem_util": 0.5}'` was a TypeError traceback from the
    # backend's constructor, after the weights had loaded
    ckpt = module_checkpoint(tmp_path, {})  # no weights at all: the option must be refused before they are read
    code = cli.main(["evaluate", ckpt, "--backend", "transformers", "--backend-options", '{"max_batch_sise": 4}'])
    err = capsys.readouterr().err
    assert code == 2 and "--backend-options: 'max_batch_sise' is not an option of the transformers backend" in err
    assert "did you mean 'max_batch_size'" in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "options,needle",
    [
        ('{"max_batch_size": -1}', "max_batch_size must be an integer >= 1, got -1"),  # was: no episode ever ended
        ('{"num_threads": 0}', "num_threads must be None or an integer >= 1, got 0"),  # was: torch's RuntimeError
        ('{"device": "bogus"}', "device must be None (the GPU where there is one), 'cpu' or 'cuda[:N]'"),
        ('{"dtype": "int8"}', "dtype must be None or one of 'auto', 'float32'"),  # was: ignored, exit 0
    ],
)
def test_a_backend_option_value_that_cannot_work_is_one_line_before_the_model_loads(tmp_path, capsys, options, needle):
    """Re-probe 10 (issue 37): values of --backend-options were never checked (a hang, tracebacks, ignored)."""
    ckpt = module_checkpoint(tmp_path, {})
    code = cli.main(["evaluate", ckpt, "--backend", "transformers", "--backend-options", options])
    err = capsys.readouterr().err
    assert code == 2 and f"--backend-options: {needle}" in err and "Traceback" not in err, err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the machine has a GPU: 'cuda' is valid here")
def test_a_cuda_device_on_this_machine_without_a_gpu_is_one_line(tmp_path, capsys):
    ckpt = module_checkpoint(tmp_path, {})
    code = cli.main(["evaluate", ckpt, "--backend", "transformers", "--backend-options", '{"device": "cuda"}'])
    err = capsys.readouterr().err
    assert code == 2 and "this machine has no CUDA GPU" in err and "Traceback" not in err, err


def test_the_dtype_of_backend_options_is_used_for_a_checkpoint_in_memory(tmp_path, monkeypatch):
    """Re-probe 10 (silently wrong, 3 times): the transformers backend got the checkpoint's model in memory
    and ignored backend_options' dtype."""
    import functools

    import torch

    from rllib_r3l.generation.hf_backend import HFBackend

    seen = []
    real_init = HFBackend.__init__

    @functools.wraps(real_init)  # the same signature: the backend's options are read from it
    def record_dtype(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        seen.append(self.dtype)

    monkeypatch.setattr(HFBackend, "__init__", record_dtype)
    ckpt = module_checkpoint(tmp_path, tiny_state())
    ex_eval.evaluate(ckpt, episodes=1, backend="transformers", backend_options={"dtype": "bfloat16"}, max_turns=1)
    assert seen == [torch.bfloat16]


def test_a_bad_split_is_blamed_on_the_split_flag_not_the_checkpoint(tmp_path, capsys):
    # re-probe 2 (M-6): "--split bogus" was reported as "the env_config of checkpoint ...: ... split"
    ckpt = module_checkpoint(tmp_path, {})
    code = cli.main(["evaluate", ckpt, "--env", "r3l/Countdown", "--split", "bogus", "--backend", "transformers"])
    err = capsys.readouterr().err
    assert code == 2 and "error: --split: " in err and "bogus" in err and "the env_config of" not in err, err


@pytest.mark.parametrize("flag,value", [("--batch-size", "-1"), ("--batch-size", "0"), ("--seed", "-1")])
def test_evaluate_refuses_batch_sizes_and_seeds_that_would_change_the_episodes(tmp_path, capsys, flag, value):
    # re-probe 3 (S4, R1, R2): --batch-size -1 ran 1 of 2 episodes and -2 repeated seeds (exit 0); 0 was a
    # KeyError; --seed -1 was a gymnasium traceback per episode, counted in the table, exit 0
    code = cli.main(["evaluate", str(tmp_path), flag, value])
    err = capsys.readouterr().err
    assert code == 2 and f"{flag} {value}: must be >= " in err and "Traceback" not in err, err


@pytest.mark.parametrize("env_id", ["r3l/ToyCorridor", "r3l/ToyWord"])
def test_the_toy_environments_refuse_a_split_that_is_not_one(env_id):
    # re-probe 3 (S3): `evaluate --split bogus` ran the toy environments and labelled the table "bogus"
    import environments

    with pytest.raises(ValueError, match="split must be one of train, dev, test; got 'tset'"):
        environments.make(env_id, {"split": "tset"})
    assert environments.make(env_id, {"split": "valid"}).split == "dev"


def test_a_checkpoint_without_its_training_config_is_refused_not_run_with_defaults(tmp_path, capsys):
    """Re-probe 10 (P73): without the checkpoint's class_and_ctor_args.pkl, evaluate advised --env, and
    following it ran with every default (another backend, max_turns 8 for a run trained at 6), exit 0;
    export wrote an empty rollout section."""
    ckpt = module_checkpoint(tmp_path, tiny_state())
    os.remove(os.path.join(ckpt, "class_and_ctor_args.pkl"))
    for argv in (["evaluate", ckpt, "--env", "r3l/ToyCorridor"], ["export", ckpt, "--out", str(tmp_path / "x")]):
        code = cli.main(argv)
        err = capsys.readouterr().err
        assert code == 2 and "class_and_ctor_args.pkl (the training config) is missing" in err, err
    assert not (tmp_path / "x").exists() or not os.listdir(tmp_path / "x")


@pytest.mark.parametrize("command", ["evaluate", "export"])
def test_half_a_checkpoint_and_a_storage_folder_say_what_to_pass(tmp_path, capsys, command):
    """Re-probe 11: a checkpoint missing rllib_checkpoint.json (or learner_group/) and the parent of several
    experiments were both "not an R3L checkpoint ... no checkpoint_* directories in it"."""

    def run(path):
        extra = ["--out", str(tmp_path / "o")] if command == "export" else []
        code = cli.main([command, str(path), *extra])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err, err
        return err

    half = tmp_path / "half"
    (half / "learner_group").mkdir(parents=True)
    assert "a damaged checkpoint: rllib_checkpoint.json is missing" in run(half)
    only_meta = tmp_path / "meta"
    only_meta.mkdir()
    (only_meta / "rllib_checkpoint.json").write_text("{}")
    assert "a damaged checkpoint: learner_group/ is missing" in run(only_meta)
    storage = tmp_path / "storage"
    for exp in ("exp-a", "exp-b"):
        ckpt = storage / exp / "R3L_toy_00000" / "checkpoint_000000"
        (ckpt / "learner_group").mkdir(parents=True)
        (ckpt / "rllib_checkpoint.json").write_text("{}")
    assert "holds 2 experiment folder(s) with checkpoints; pass one of them (or a trial in it): exp-a, exp-b" in run(
        storage
    )
