"""Storage faults before training (issue 37): a folder that cannot be written, or has no room for one
checkpoint, is refused before Ray starts, with the path and the numbers. Real small filesystems: a
1 MB tmpfs and a read-only one, mounted by the test (root only; skipped where mounting is not allowed)."""

from __future__ import annotations

import os

import pytest

from rllib_r3l.cli import commands as cli
from rllib_r3l.cli import main as main_job
from rllib_r3l.cli.storage import CHECKPOINT_BYTES_PER_PARAM, checkpoint_bytes
from tests import REPO_ROOT

TOY = os.path.join(str(REPO_ROOT), "tuned_examples", "cpu", "toy_corridor_tiny.yaml")


@pytest.fixture
def small_fs(tmpfs):
    """A 1 MB tmpfs and a read-only tmpfs."""
    return {"small": tmpfs("small", "size=1m"), "readonly": tmpfs("readonly", "size=1m,ro")}


def test_checkpoint_size_is_weights_and_adam_moments_in_fp32(tiny_model_dir, tmp_path):
    weights = sum(
        os.path.getsize(os.path.join(tiny_model_dir, f))
        for f in os.listdir(tiny_model_dir)
        if f.endswith((".safetensors", ".bin"))
    )
    # fp32 weights on disk; the tied head (vocab 49152 x hidden 64) is saved twice by the module, once in AdamW
    assert checkpoint_bytes(tiny_model_dir) == int((weights / 4 + 49152 * 64 / 3) * CHECKPOINT_BYTES_PER_PARAM)
    assert checkpoint_bytes(str(tmp_path)) is None and checkpoint_bytes(None) is None


@pytest.mark.integration
@pytest.mark.subprocess
def test_the_estimate_covers_a_real_checkpoint_of_the_tiny_model(ray_session, tiny_model_dir, tmp_path):
    """Re-probe 3 (M6): the estimate was 42.8 MB for a 50 MB checkpoint, so a 45 MB disk passed the check
    and the save failed. A real checkpoint of the tiny model (learner state: module and AdamW)."""
    from tests.scripted_rllib import tiny_config

    algo = tiny_config().build_algo()
    try:
        algo.train()  # AdamW's moments exist after the first update
        path = algo.save_to_path(str(tmp_path / "ckpt"))
    finally:
        algo.stop()
    real = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    assert real <= checkpoint_bytes(tiny_model_dir) <= 1.3 * real, (real, checkpoint_bytes(tiny_model_dir))


@pytest.mark.integration
@pytest.mark.subprocess
def test_main_job_refuses_an_out_without_room_for_a_checkpoint(small_fs, capsys, tiny_model_dir):
    code = main_job.main(["--out", str(small_fs["small"] / "run"), "--set", "model=tiny", "--iterations", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--out" in err and "free" in err and "one checkpoint of this model needs about" in err
    assert not (small_fs["small"] / "run").exists()  # nothing was written


@pytest.mark.integration
@pytest.mark.subprocess
def test_main_job_refuses_an_out_it_cannot_write(small_fs, capsys, tiny_model_dir):
    code = main_job.main(["--out", str(small_fs["readonly"] / "run"), "--set", "model=tiny", "--iterations", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot write there" in err and str(small_fs["readonly"]) in err, err


@pytest.mark.integration
@pytest.mark.subprocess
@pytest.mark.parametrize(
    "which,needle", [("small", "one checkpoint of this model needs about"), ("readonly", "cannot write there")]
)
def test_train_refuses_a_storage_path_before_ray_starts(small_fs, capsys, which, needle, tiny_model_dir):
    code = cli.main(["train", TOY, "--storage-path", str(small_fs[which]), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "--storage-path" in err, err


@pytest.mark.integration
@pytest.mark.parametrize("door", ["train", "main job"])
def test_a_file_where_the_folder_should_be_is_refused_before_ray_starts(tmp_path, capsys, door, tiny_model_dir):
    """Re-probe 9: `--storage-path FILE` passed --dry-run ("would start FILE/EXP") and the real run ended in
    a NotADirectoryError traceback from writing the experiment's spec."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    if door == "train":
        code = cli.main(["train", TOY, "--storage-path", str(a_file), "--dry-run"])
        flag = "--storage-path"
    else:
        code = main_job.main(["--out", str(a_file / "run"), "--set", "model=tiny", "--iterations", "1"])
        flag = "--out"
    err = capsys.readouterr().err
    assert code == 2 and flag in err and f"{a_file} is a file, not a folder" in err, err
    assert a_file.read_text() == "mine"


@pytest.mark.integration
@pytest.mark.subprocess
def test_a_disk_that_fills_mid_run_ends_train_with_one_line_and_the_resume_advice(tmp_path, tiny_model_dir):
    """Re-probe (issue 37): a storage disk that fills up during `rllib-r3l train` printed 355 lines of
    tracebacks (the trial's failed checkpoint copy, then the run plot and Tune's progress table failing on
    the same full disk inside Tune's callbacks). An 80 MB tmpfs: room for the first checkpoint of the tiny
    model (~50 MB), not for the second."""
    import subprocess
    import sys

    disk = tmp_path / "disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=80m", "tmpfs", str(disk)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip()}); needs root")
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "rllib_r3l.cli.commands",
                "train",
                TOY,
                "--experiment",
                "toy-corridor-tiny-no-reflect",
                "--set",
                "tasks_per_iteration=1",
                "--num-cpus",
                "4",
                "--checkpoint-freq",
                "1",
                "--storage-path",
                str(disk),
                "--stop",
                "training_iteration=4",
            ],
            cwd=str(REPO_ROOT),
            capture_output=True,
            text=True,
            timeout=600,
            env=dict(os.environ, RAY_AUTH_MODE="disabled", RAY_CHDIR_TO_TRIAL_DIR="0"),
        )
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = proc.stderr.splitlines()
    assert "No space left on device" in line and "is full" in line and "--resume" in line, line
    assert "plot not written (No space left on device)" in proc.stdout
    assert "the log is not written any more (No space left on device)" in proc.stdout
