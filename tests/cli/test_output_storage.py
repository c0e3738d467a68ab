"""Where `export`, `evaluate` and `report` write (issue 37, re-probe 2): a read-only or full `--out` is
one line naming the flag, said before the work where it can be, and never leaves a half-written model
or CSV. Real small filesystems (tmpfs, mounted by the test; skipped where mounting needs root)."""

from __future__ import annotations

import os

import pytest

from rllib_r3l.cli import commands as cli
from tests.cli.fake_checkpoints import module_checkpoint, tiny_state


def _one_clean_line(err: str) -> bool:
    return "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.subprocess
def test_export_to_a_read_only_out_is_refused_before_the_checkpoint_is_loaded(tmp_path, tmpfs, capsys):
    ro = tmpfs("ro", "size=1m,ro")
    missing = str(tmp_path / "no-checkpoint-here")  # checked later than --out: the --out error must come first
    code = cli.main(["export", missing, "--out", str(ro / "model")])
    err = capsys.readouterr().err
    assert code == 2 and f"--out {ro / 'model'}: cannot write there" in err and _one_clean_line(err), err


@pytest.mark.subprocess
def test_export_without_room_says_the_numbers_and_writes_nothing(tmp_path, tmpfs, capsys):
    small = tmpfs("small", "size=1m")  # the tiny model's weights are ~13 MB
    ckpt = module_checkpoint(tmp_path, tiny_state())
    code = cli.main(["export", ckpt, "--out", str(small / "model")])
    err = capsys.readouterr().err
    assert code == 2 and "free, the exported weights need" in err and _one_clean_line(err), err
    assert os.listdir(small) == []


@pytest.mark.subprocess
def test_a_disk_that_fills_during_export_leaves_out_as_it_was(tmp_path, tmpfs, capsys):
    # room for the weights (so the space check passes), not for the tokenizer written after them:
    # before, --out was left holding a model folder without its tokenizer and a traceback was printed
    disk = tmpfs("disk", "size=15m")
    ckpt = module_checkpoint(tmp_path, tiny_state())
    code = cli.main(["export", ckpt, "--out", str(disk / "model")])
    err = capsys.readouterr().err
    assert code == 2 and "could not be written" in err and "nothing was left half-written" in err, err
    assert _one_clean_line(err), err
    assert not (disk / "model").exists() and os.listdir(disk) == []


@pytest.mark.subprocess
def test_evaluate_refuses_an_unwritable_or_folder_out_before_evaluating(tmp_path, tmpfs, capsys):
    ro = tmpfs("ro", "size=1m,ro")
    missing = str(tmp_path / "no-checkpoint-here")  # evaluation never starts: the --out error comes first
    code = cli.main(["evaluate", missing, "--out", str(ro / "episodes.csv")])
    err = capsys.readouterr().err
    assert code == 2 and "--out" in err and "cannot write there" in err and _one_clean_line(err), err
    code = cli.main(["evaluate", missing, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "is a folder; give a file name" in err and _one_clean_line(err), err


@pytest.mark.subprocess
def test_report_into_a_read_only_experiment_folder_asks_for_out(tmp_path, tmpfs, capsys):
    import json
    import subprocess

    exp = tmpfs("exp", "size=1m")
    trial = exp / "R3L_0"
    trial.mkdir()
    (trial / "params.json").write_text(json.dumps({"group_size": 4}))
    (trial / "result.json").write_text(
        json.dumps({"training_iteration": 1, "env_runners": {"success_rate": 0.5}}) + "\n"
    )
    subprocess.run(["mount", "-o", "remount,ro", str(exp)], check=True)
    code = cli.main(["report", str(exp)])
    err = capsys.readouterr().err
    assert code == 2 and "--out (default EXPERIMENT_DIR/report)" in err and "cannot write there" in err, err
    assert _one_clean_line(err), err
    out = tmp_path / "elsewhere"
    assert cli.main(["report", str(exp), "--out", str(out)]) == 0
    assert (out / "summary.csv").is_file()
