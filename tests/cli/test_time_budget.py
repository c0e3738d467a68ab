"""An experiment file's ``time_budget_s`` ends its trials like a stop criterion (re-probe 5, P36): Tune's
own budget stopped the trial mid-run with no final checkpoint and the CLI reported it interrupted
(exit 130, "no checkpoint was saved yet") after two trained iterations."""

from __future__ import annotations

import glob
import os

import pytest
import yaml

from tests.cli.tiny_runs import cli_process


@pytest.mark.subprocess
def test_a_time_budget_ends_the_trial_terminated_with_a_final_checkpoint(tmp_path):
    # 30 s: the trial's start (Ray, the model) counts against the budget; 15 s ran out before the first
    # iteration on a loaded 2-core machine
    spec = {
        "budget": {
            "run": "R3L",
            "time_budget_s": 30,
            "stop": {"training_iteration": 100000},
            "checkpoint_config": {"checkpoint_frequency": 0, "checkpoint_at_end": True},
            "config": {
                "model": "tiny",
                "env": "r3l/ToyCorridor",
                "env_config": {"num_rooms": 3, "max_turns": 3},
                "group_size": 4,
                "tasks_per_iteration": 1,
                "reflect": False,
                "max_response_tokens": 8,
                "max_context_tokens": 2048,
                "action_decoding": "choice",
                "backend": "transformers",
                "num_env_runners": 0,
                "num_learners": 0,
                "lr": 1e-3,
            },
        }
    }
    f = tmp_path / "budget.yaml"
    f.write_text(yaml.safe_dump(spec))
    proc = cli_process(
        [
            "train",
            str(f),
            "--storage-path",
            str(tmp_path / "runs"),
            "--num-cpus",
            "4",
            "--quiet-workers",
            "--verbose",
            "0",
        ]
    )
    out, err = proc.communicate(timeout=600)
    assert proc.returncode in (0, 1), err[-3000:]  # 1: a run that never updated (TRAINED ON NOTHING) is not success
    assert "time_budget_s 30 reached: 1 trial(s) stopped at the end of an iteration" in out + err, (out + err)[-3000:]
    assert "INTERRUPTED" not in out + err and "no checkpoint" not in out + err, (out + err)[-3000:]
    (ckpt,) = glob.glob(str(tmp_path / "runs" / "budget" / "R3L_*" / "checkpoint_*"))
    assert os.path.isfile(os.path.join(ckpt, "rllib_checkpoint.json"))
