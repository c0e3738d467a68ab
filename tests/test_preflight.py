"""``preflight.check_model`` on local directories and ``preflight.check_resources`` (issue 37, items 3
and 7): what --dry-run and the algorithm's build catch before Ray waits or a trial dies."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from rllib_r3l import preflight


@pytest.fixture(scope="module")
def tiny_dir():
    from rllib_r3l.models import resolve_model

    return resolve_model("tiny")


def _copy(src, dst, drop=(), config=None):
    os.makedirs(dst)
    for name in os.listdir(src):
        if name not in drop and not name.startswith("."):
            shutil.copy(os.path.join(src, name), dst)
    if config is not None:
        with open(os.path.join(dst, "config.json"), "w") as f:
            json.dump(config, f)
    return str(dst)


def test_a_real_model_directory_passes(tiny_dir):
    preflight.check_model(tiny_dir)


def test_config_json_without_model_type_is_not_a_model(tmp_path, tiny_dir):
    d = _copy(tiny_dir, tmp_path / "m", config={"hidden_size": 8})
    with pytest.raises(ValueError, match=r"R3LConfig.model_id: .*config.json has no model_type"):
        preflight.check_model(d)


def test_a_directory_without_weights_is_not_a_model(tmp_path, tiny_dir):
    d = _copy(tiny_dir, tmp_path / "m", drop=("model.safetensors",))
    with pytest.raises(ValueError, match=r"R3LConfig.model_id: .*no weights"):
        preflight.check_model(d)


def test_a_truncated_weights_file_is_refused_up_front(tmp_path, tiny_dir, capsys):
    """Re-probe (issue 37): `--dry-run` passed a model folder whose model.safetensors was cut short (an
    interrupted copy); the run then died inside the trial. The header says how long the file must be."""
    d = _copy(tiny_dir, tmp_path / "m")
    weights = os.path.join(d, "model.safetensors")
    whole = os.path.getsize(weights)
    with open(weights, "r+b") as f:
        f.truncate(whole - 1000)
    with pytest.raises(
        ValueError,
        match=rf"R3LConfig.model_id: .*model.safetensors: truncated: {whole - 1000} bytes, "
        rf"its header says {whole}; copy or download the model again",
    ):
        preflight.check_model(d)
    from rllib_r3l.cli import commands as cli
    from tests.cli.tiny_runs import TOY

    code = cli.main(["train", TOY, "--dry-run", "--storage-path", str(tmp_path / "s"), "--set", f"model={d}"])
    err = capsys.readouterr().err
    assert code == 2 and "truncated" in err and len(err.strip().splitlines()) == 1, err


def test_a_sharded_model_needs_every_shard_its_index_names(tmp_path, tiny_dir):
    from rllib_r3l.model_check import weights_problem

    d = _copy(tiny_dir, tmp_path / "m")
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}, f)
    with pytest.raises(ValueError, match=r"index.json: names shard\(s\) that are not there: model-00002-of-00002"):
        preflight.check_model(d)
    assert weights_problem(os.path.join(d, "model.safetensors")) is None  # the whole file passes
    cut = tmp_path / "pytorch_model.bin"
    cut.write_bytes(b"PK\x03\x04" + b"\0" * 100)  # a zip's first bytes, its end missing
    assert weights_problem(str(cut)) == "truncated (a PyTorch zip without its central directory)"


def test_a_config_json_that_contradicts_the_weights_is_refused_up_front(tmp_path, tiny_dir, capsys):
    """Re-probe 6 (issue 37): a config.json whose vocab_size is not the embedding's rows passed --dry-run,
    and the trial built the config's model until it was killed for memory."""
    with open(os.path.join(tiny_dir, "config.json")) as f:
        config = json.load(f)
    rows, width = config["vocab_size"], config["hidden_size"]
    d = _copy(tiny_dir, tmp_path / "m", config={**config, "vocab_size": 10**9})
    with pytest.raises(
        ValueError,
        match=rf"R3LConfig.model_id: .*config.json does not fit the weights: "
        rf"model.embed_tokens.weight is \[{rows}, {width}\] in the weights, "
        rf"config.json makes it \[1000000000, {width}\]",
    ):
        preflight.check_model(d)
    from rllib_r3l.cli import commands as cli
    from tests.cli.tiny_runs import TOY

    code = cli.main(["train", TOY, "--dry-run", "--storage-path", str(tmp_path / "s"), "--set", f"model={d}"])
    err = capsys.readouterr().err
    assert code == 2 and "does not fit the weights" in err and len(err.strip().splitlines()) == 1, err
    # a config transformers cannot build at all is named too; a whole folder, copied, passes
    d2 = _copy(tiny_dir, tmp_path / "m2", config={**config, "hidden_act": "no-such-activation"})
    with pytest.raises(ValueError, match=r"transformers cannot build a causal LM from its config.json"):
        preflight.check_model(d2)
    preflight.check_model(_copy(tiny_dir, tmp_path / "m3"))
    # re-probe 9 (silently wrong, twice): more layers than the weights hold passed, and trained with the
    # extra layers initialised at random
    d4 = _copy(tiny_dir, tmp_path / "m4", config={**config, "num_hidden_layers": config["num_hidden_layers"] + 2})
    extra = config["num_hidden_layers"]
    with pytest.raises(
        ValueError,
        match=rf"config.json describes \d+ tensor\(s\) the weights lack "
        rf"\(e.g. model.layers.{extra}\..*initialise at random",
    ):
        preflight.check_model(d4)
    # re-probe 10 (silently wrong, twice): fewer layers than the weights hold trained a cut model
    d5 = _copy(tiny_dir, tmp_path / "m5", config={**config, "num_hidden_layers": config["num_hidden_layers"] - 1})
    with pytest.raises(
        ValueError,
        match=rf"the weights hold \d+ tensor\(s\) config.json has no place for "
        rf"\(e.g. model.layers.{extra - 1}\..*would drop",
    ):
        preflight.check_model(d5)


def test_a_tokenizer_without_chat_template_is_refused_up_front(tmp_path, tiny_dir):
    d = _copy(tiny_dir, tmp_path / "m", drop=("chat_template.jinja",))
    with open(os.path.join(d, "tokenizer_config.json")) as f:
        tok = json.load(f)
    tok.pop("chat_template", None)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tok, f)
    with pytest.raises(ValueError, match=r"R3LConfig.model_id: .*no chat template"):
        preflight.check_model(d)


# --------------------------------------------------------------------------------------------------
# Resources a run can never get (item 3): refused, naming the option and what there is
# --------------------------------------------------------------------------------------------------
def _config(**updates):
    from rllib_r3l import R3LConfig

    return R3LConfig().training(model="tiny").update_from_dict(updates)


def test_a_gpu_learner_on_a_machine_without_gpus_is_refused():
    with pytest.raises(ValueError, match=r"R3LConfig.num_gpus_per_learner: .*1 GPU.* has 0"):
        preflight.check_resources(_config(num_gpus_per_learner=1), cpus=4, gpus=0)
    with pytest.raises(ValueError, match=r"R3LConfig.num_gpus_per_env_runner: .*has 0"):
        preflight.check_resources(_config(num_env_runners=1, num_gpus_per_env_runner=1), cpus=4, gpus=0)
    preflight.check_resources(_config(num_gpus_per_learner=1), cpus=4, gpus=1)


def test_more_cpus_than_ray_has_are_refused():
    with pytest.raises(ValueError, match=r"R3LConfig.num_env_runners: .*2 CPUs.*--num-cpus 1 gives 1"):
        preflight.check_resources(_config(num_env_runners=1), cpus=1, gpus=0, source="--num-cpus 1")
    preflight.check_resources(_config(num_env_runners=1), cpus=2, gpus=0)
    # without Tune (build_algo) the driver holds no CPU: one runner fits in one CPU
    preflight.check_resources(_config(num_env_runners=1), cpus=1, gpus=0, count_driver=False)


def test_the_python_doors_cpu_advice_is_for_ray_not_a_cli_flag():
    # re-probe 2: build_algo()/tune.run on a small Ray cluster were told to "use --num-cpus", a flag they lack
    with pytest.raises(
        ValueError,
        match=r"the Ray cluster gives 1; start Ray with 2 logical CPUs or more "
        r"\(ray.init\(num_cpus=2\)",
    ) as e:
        preflight.check_resources(_config(num_env_runners=1), cpus=1, gpus=0, source="the Ray cluster")
    assert "--num-cpus 2 or more" not in str(e.value)
    with pytest.raises(ValueError, match=r"use --num-cpus 2 or more"):
        preflight.check_resources(_config(num_env_runners=1), cpus=1, gpus=0, source="--num-cpus 1")


def test_check_config_refuses_gpus_the_ray_cluster_lacks(monkeypatch):
    # what R3L.setup meets in build_algo() after ray.init() on a CPU machine
    monkeypatch.setattr(preflight, "ray_capacity", lambda: (4.0, 0.0))
    with pytest.raises(ValueError, match=r"R3LConfig.num_gpus_per_learner: .*the Ray cluster has 0"):
        preflight.check_config(_config(env="r3l/ToyCorridor", env_config={"num_rooms": 3}, num_gpus_per_learner=1))


def test_vllm_tensor_parallel_over_more_gpus_than_there_are_is_refused():
    cfg = _config(backend="vllm", backend_options={"tensor_parallel_size": 2})
    with pytest.raises(ValueError, match=r"R3LConfig.backend_options: tensor_parallel_size=2 .*2 GPUs.* has 0"):
        preflight.check_resources(cfg, cpus=4, gpus=0)
    preflight.check_resources(_config(backend="vllm", backend_options={"tensor_parallel_size": 1}), cpus=4, gpus=0)


def test_a_cuda_generation_device_without_a_gpu_is_refused():
    """Re-probe 11: backend_options {device: cuda} passed --dry-run on a CPU machine, then every runner
    failed with "Torch not compiled with CUDA enabled". The cluster's (or this machine's) GPUs decide."""
    cfg = _config(backend="transformers", backend_options={"device": "cuda:0"})
    with pytest.raises(
        ValueError,
        match=r"R3LConfig.backend_options: device='cuda:0' puts the generation engines on a "
        r"GPU, the Ray cluster has none; use 'cpu' or drop it \(None\)",
    ):
        preflight.check_resources(cfg, cpus=4, gpus=0, source="the Ray cluster")
    preflight.check_resources(cfg, cpus=4, gpus=1, source="the Ray cluster")  # a cluster with a GPU (no GPU here)
    preflight.check_resources(_config(backend="transformers", backend_options={"device": "cpu"}), cpus=4, gpus=0)


@pytest.mark.integration
def test_build_algo_refuses_a_gpu_learner_the_ray_cluster_lacks(monkeypatch):
    import ray

    from rllib_r3l import R3LConfig

    if ray.is_initialized():
        pytest.skip("needs a Ray runtime of its own")
    ray.init(address="local", num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
    try:
        config = (
            R3LConfig()
            .environment("r3l/ToyCorridor", env_config={"num_rooms": 3})
            .training(model="tiny", backend="transformers")
            .learners(num_gpus_per_learner=1)
        )
        with pytest.raises(ValueError, match=r"R3LConfig.num_gpus_per_learner: .*the Ray cluster has 0"):
            config.build_algo()
    finally:
        ray.shutdown()


@pytest.mark.integration
def test_build_algo_without_ray_refuses_a_gpu_local_learner_this_process_cannot_see():
    """Re-probe 83a: ``build_algo()`` with no Ray started gave RLlib's raw ``local_gpu_idx`` assertion;
    the local learner runs in this process, which sees no GPU: the one-line refusal instead."""
    import ray

    from rllib_r3l import R3LConfig

    if ray.is_initialized():
        pytest.skip("needs no Ray runtime started")
    if preflight.machine_gpus():
        pytest.skip("this machine has a GPU")
    config = (
        R3LConfig()
        .environment("r3l/ToyCorridor", env_config={"num_rooms": 3})
        .training(model="tiny", backend="transformers")
        .learners(num_gpus_per_learner=1)
    )
    try:
        with pytest.raises(ValueError, match=r"R3LConfig.num_gpus_per_learner: 1 GPU\(s\) for the local learner"):
            config.build_algo()
    finally:
        if ray.is_initialized():
            ray.shutdown()


@pytest.mark.integration
def test_build_algo_without_ray_refuses_a_cuda_engine_and_a_seed_numpy_cannot_take():
    """Re-probe 11: with no Ray started (everything runs on this machine) ``build_algo()`` passed
    ``backend_options={"device": "cuda"}`` on a CPU machine and ``train()`` died in the runner with "Torch not
    compiled with CUDA enabled"; ``seed=2**70`` got RLlib's "Seed must be between 0 and 2**32 - 1"."""
    import ray

    from rllib_r3l import R3LConfig

    if ray.is_initialized():
        pytest.skip("needs no Ray runtime started")
    if preflight.machine_gpus():
        pytest.skip("this machine has a GPU")
    base = (
        R3LConfig()
        .environment("r3l/ToyCorridor", env_config={"num_rooms": 3})
        .training(model="tiny", backend="transformers")
    )
    try:
        with pytest.raises(
            ValueError,
            match=r"R3LConfig.backend_options: device='cuda' puts the generation engines "
            r"on a GPU, this machine has none",
        ):
            base.copy().training(backend_options={"device": "cuda"}).build_algo()
        with pytest.raises(
            ValueError,
            match=r"R3LConfig.seed: must be None \(unseeded\) or an integer in "
            r"\[0, 2147483647\], got 1180591620717411303424",
        ):
            base.copy().debugging(seed=2**70).build_algo()
    finally:
        if ray.is_initialized():
            ray.shutdown()


def test_a_model_folder_without_tokenizer_files_is_refused_up_front(tmp_path, tiny_dir):
    """Re-probe 2: a folder with weights and config but no tokenizer passed `--dry-run`; the trial then
    failed loading the tokenizer (the console showed only ERROR)."""
    d = _copy(tiny_dir, tmp_path / "m", drop=("tokenizer.json",))
    with pytest.raises(ValueError, match=r"R3LConfig.model_id: .*no tokenizer \(tokenizer.json, vocab.json, "):
        preflight.check_model(d)


def test_a_corrupt_tokenizer_or_chat_template_is_refused_up_front(tmp_path, tiny_dir, capsys):
    """Re-probe 3 leftover: a cut tokenizer.json or a chat template that does not parse passed `--dry-run`
    and failed in every runner; the check loads the tokenizer and renders R3L's turns with the template."""
    from rllib_r3l.cli import commands as cli
    from tests.cli.tiny_runs import TOY

    cut = _copy(tiny_dir, tmp_path / "cut")
    with open(os.path.join(cut, "tokenizer.json"), "r+") as f:
        f.truncate(1000)
    with pytest.raises(ValueError, match=r"R3LConfig.model_id: .*cut: its tokenizer does not load \(\w+"):
        preflight.check_model(cut)
    bad = _copy(tiny_dir, tmp_path / "bad")
    with open(os.path.join(bad, "chat_template.jinja"), "w") as f:
        f.write("{% for m in messages %}{{ m.content ")
    code = cli.main(["train", TOY, "--dry-run", "--storage-path", str(tmp_path / "s"), "--set", f"model={bad}"])
    err = capsys.readouterr().err
    assert code == 2 and "its chat template cannot render a conversation (TemplateSyntaxError" in err, err
    assert len(err.strip().splitlines()) == 1, err
    preflight.check_model(tiny_dir)  # the intact folder passes


def test_evaluate_of_an_exported_folder_with_damaged_or_missing_weights_is_one_line(tmp_path, tiny_dir, capsys):
    """Re-probe 2: `evaluate EXPORTED_DIR` with a cut weights file was a safetensors traceback."""
    from rllib_r3l.cli import commands as cli

    d = _copy(tiny_dir, tmp_path / "m")
    weights = os.path.join(d, "model.safetensors")
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) // 2)
    code = cli.main(["evaluate", d, "--env", "r3l/ToyCorridor", "--episodes", "1", "--backend", "transformers"])
    err = capsys.readouterr().err
    assert code == 2 and "model.safetensors: truncated" in err and len(err.strip().splitlines()) == 1, err
    os.remove(weights)
    code = cli.main(["evaluate", d, "--env", "r3l/ToyCorridor", "--episodes", "1", "--backend", "transformers"])
    err = capsys.readouterr().err
    assert code == 2 and "no weights" in err and len(err.strip().splitlines()) == 1, err


def test_an_eval_split_the_environment_lacks_is_refused_up_front():
    """Re-probe 6 (P4): `env_config.eval_split=bogus` passed --dry-run; every held-out episode was lost."""
    from rllib_r3l import R3LConfig

    config = R3LConfig().environment("r3l/ToyCorridor", env_config={"num_rooms": 3, "eval_split": "bogus"})
    with pytest.raises(
        ValueError,
        match=r"R3LConfig.env_config: eval_split='bogus' \(the held-out tasks of "
        r"R3L.evaluate\(\)\): .*split must be one of train, dev, test",
    ):
        preflight.check_config(config.training(model="tiny"))


def test_a_task_split_the_environment_lacks_is_blamed_on_task_split(tmp_path, capsys):
    """Re-probe 9: `task_split='nope'` was reported as `R3LConfig.env_config: ... (fix it ... --set env_config=...)`,
    showing an env_config that holds no split."""
    from rllib_r3l import R3LConfig

    config = R3LConfig().environment("r3l/ToyCorridor", env_config={"num_rooms": 3}).training(task_split="nope")
    with pytest.raises(
        ValueError,
        match=r"^R3LConfig.task_split: r3l/ToyCorridor has no task split 'nope' "
        r"\(.*split must be one of train, dev, test",
    ):
        preflight.check_config(config.training(model="tiny"))
    from rllib_r3l.cli import commands as cli
    from tests.cli.tiny_runs import TOY

    code = cli.main(["train", TOY, "--dry-run", "--storage-path", str(tmp_path / "s"), "--set", "task_split=nope"])
    err = capsys.readouterr().err
    assert code == 2 and "--set task_split" in err and "env_config" not in err, err
