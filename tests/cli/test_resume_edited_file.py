"""``--resume`` of an experiment whose file was edited since it started is refused, naming the changes
(re-probe 5: `reflect: false` and a lower stop written into the file, then `--resume` trained on with
reflection to the old stop, exit 0, and `--dry-run` showed the new values). Overrides given at the start
(``--stop``/``--set``, which the resume command drops) are not changes of the file."""

from __future__ import annotations

import glob
import signal
import time

import pytest
import yaml

from rllib_r3l.cli import commands as cli
from rllib_r3l.cli.saved_spec import SPEC_FILE
from tests.cli.tiny_runs import cli_process


@pytest.mark.subprocess
def test_resume_of_an_edited_file_is_refused_and_of_the_same_file_planned(tmp_path, capsys):
    spec = {
        "edited": {
            "run": "R3L",
            "stop": {"training_iteration": 3},
            "checkpoint_config": {"checkpoint_at_end": True},
            "config": {
                "model": "tiny",
                "env": "r3l/ToyCorridor",
                "env_config": {"num_rooms": 3, "max_turns": 3},
                "group_size": 4,
                "tasks_per_iteration": 1,
                "reflect": True,
                "max_response_tokens": 8,
                "max_reflection_tokens": 24,
                "max_context_tokens": 2048,
                "backend": "transformers",
                "num_env_runners": 0,
                "num_learners": 0,
            },
        }
    }
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(spec))
    storage = str(tmp_path / "runs")
    # interrupted after its first checkpoint (a finished experiment has nothing to resume: refused as such)
    proc = cli_process(
        [
            "train",
            str(f),
            "--storage-path",
            storage,
            "--stop",
            "training_iteration=500",
            "--num-cpus",
            "4",
            "--checkpoint-freq",
            "1",
            "--quiet-workers",
            "--verbose",
            "0",
        ]
    )
    first = str(tmp_path / "runs" / "edited" / "*" / "checkpoint_000000" / "rllib_checkpoint.json")
    deadline = time.time() + 600
    while proc.poll() is None and not glob.glob(first) and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None and glob.glob(first), proc.communicate()[1][-3000:] if proc.poll() is not None else ""
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err[-3000:]
    assert (tmp_path / "runs" / "edited" / SPEC_FILE).is_file()
    resume = ["train", str(f), "--storage-path", storage, "--resume", "--dry-run"]
    assert cli.main(resume) == 0, capsys.readouterr().err  # the file as it started: --stop at the start is no change
    assert "# edited: would resume" in capsys.readouterr().out
    spec["edited"]["config"]["reflect"] = False
    spec["edited"]["stop"]["training_iteration"] = 2
    f.write_text(yaml.safe_dump(spec))
    code = cli.main(resume)
    err = capsys.readouterr().err
    assert (
        code == 2
        and f"--resume: experiment 'edited' in {f} changed since the run started (config.reflect: "
        "True -> False; stop.training_iteration: 3 -> 2)"
        in err
    ), err
    assert "--new" in err and len(err.strip().splitlines()) == 1, err
    # re-probe 10 (silently wrong, twice): an edited checkpoint_config resumed with the saved one, and its
    # num_to_keep deleted checkpoints the file now says to keep
    spec["edited"]["config"]["reflect"] = True
    spec["edited"]["stop"]["training_iteration"] = 3
    spec["edited"]["checkpoint_config"]["num_to_keep"] = 1
    f.write_text(yaml.safe_dump(spec))
    code = cli.main(resume)
    err = capsys.readouterr().err
    assert (
        code == 2
        and "(checkpoint_config.num_to_keep: (not set) -> 1)" in err
        and "checkpoint_config it started with" in err
    ), err


def test_a_copy_saved_before_checkpoint_config_was_kept_is_not_called_changed(tmp_path):
    import json

    from rllib_r3l.cli import saved_spec

    (tmp_path / SPEC_FILE).write_text(json.dumps({"config": {"lr": 1e-6}, "stop": {"training_iteration": 2}}))
    spec = {"config": {"lr": 1e-6}, "stop": {"training_iteration": 2}, "checkpoint_config": {"num_to_keep": 1}}
    assert saved_spec.changes(str(tmp_path), spec) == []
    saved_spec.save(str(tmp_path), spec)
    assert saved_spec.changes(str(tmp_path), {**spec, "checkpoint_config": {"num_to_keep": 2}}) == [
        "checkpoint_config.num_to_keep: 1 -> 2"
    ]
