"""Resource requests the machine cannot meet are refused before Ray starts, by ``train`` (also with
--dry-run) and by the main job, instead of waiting forever on a blank console (issue 37, item 3)."""

from __future__ import annotations

import os

import pytest

from rllib_r3l import preflight
from rllib_r3l.cli import commands as cli
from tests import REPO_ROOT

TOY = os.path.join(str(REPO_ROOT), "tuned_examples", "cpu", "toy_corridor_tiny.yaml")


@pytest.fixture(autouse=True)
def no_gpus(monkeypatch):
    monkeypatch.setattr(preflight, "machine_gpus", lambda: 0, raising=False)  # raising: absent before the fix


@pytest.mark.parametrize(
    "flags, needles",
    [
        (["--set", "num_gpus_per_learner=1"], ["num_gpus_per_learner", "has 0"]),
        (
            ["--num-cpus", "1", "--set", "num_env_runners=1"],
            ["num_env_runners", "--num-cpus 1 gives 1", "--num-cpus 2"],
        ),
    ],
)
@pytest.mark.parametrize("dry", [True, False])
def test_train_refuses_resources_it_cannot_get(capsys, tmp_path, flags, needles, dry):
    code = cli.main(
        ["train", TOY, "--set", "model=tiny", "--storage-path", str(tmp_path), *flags] + (["--dry-run"] if dry else [])
    )
    err = capsys.readouterr().err
    assert code == 2, err
    for n in needles:
        assert n in err, (n, err)
    assert not os.listdir(tmp_path)  # nothing started


@pytest.mark.subprocess
def test_main_job_refuses_a_gpu_learner_on_a_cpu_machine(tmp_path, capsys):
    from rllib_r3l.cli import main

    rc = main.main(["--out", str(tmp_path), "--set", "model=tiny", "num_gpus_per_learner=1"])
    err = capsys.readouterr().err
    assert rc == 2 and "num_gpus_per_learner" in err and "has 0" in err, err
