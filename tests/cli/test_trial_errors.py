"""A trial that fails inside Ray shows the project's own one-line reason on the console, not only
``ERROR`` and a path to Ray's error.txt (issue 37, item 7). Tune is stubbed (as in test_exit_codes)."""

from __future__ import annotations

import os
import types

import pytest

from rllib_r3l.cli import commands as cli
from rllib_r3l.cli import trial_errors
from tests import REPO_ROOT

TOY = os.path.join(str(REPO_ROOT), "tuned_examples", "cpu", "toy_corridor_tiny.yaml")
REASON = (
    "ValueError: the tokenizer has no chat_template; R3L needs an instruct/chat model (set "
    "training(model=...) to a chat model or give the tokenizer a template)"
)
# the shape of Ray's error.txt for an exception in the trial (shortened from a real one)
RAY_ERROR = f"""Failure # 1 (occurred at 2026-12-05_03-00-01)
\x1b[36mray::R3L.train()\x1b[39m (pid=25748, ip=192.0.2.2, actor_id=95, repr=R3L(env=r3l/ToyCorridor))
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/x/ray/tune/trainable/trainable.py", line 329, in train
    raise skipped from exception_cause(skipped)
  File "/x/rllib_r3l/runner/chat.py", line 21, in __init__
    raise ValueError(
{REASON}
"""
ACTOR_DIED = """Failure # 1 (occurred at 2026-12-05_03-00-01)
ray.exceptions.RayActorError: The actor died because of an error raised in its creation task, \x1b[36mray::R3L.__init__()\x1b[39m (pid=1)
  File "/x/rllib_r3l/algorithm.py", line 52, in setup
    preflight.check_config(self.config)
ValueError: R3LConfig.grad_clip: must be a number
  with a second line of the message
"""


def test_reason_is_the_last_exception_line():
    assert trial_errors.reason_from_text(RAY_ERROR) == REASON
    assert trial_errors.reason_from_text(ACTOR_DIED) == (
        "ValueError: R3LConfig.grad_clip: must be a number with a second line of the message"
    )
    assert trial_errors.reason_from_text("") is None


@pytest.mark.integration
def test_failed_trial_prints_its_reason(monkeypatch, tmp_path, capsys):
    import ray
    from ray import tune

    import rllib_r3l

    err_file = tmp_path / "error.txt"
    err_file.write_text(RAY_ERROR)

    class Trial:
        experiment_dir_name, status, trial_id = "exp", "ERROR", "exp_00000"
        last_result = {}
        path, remote_experiment_path, checkpoint = str(tmp_path), str(tmp_path), None
        error_file = str(err_file)

        def __str__(self):
            return "R3L_exp_00000"

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(rllib_r3l, "register", lambda: None)
    monkeypatch.setattr(tune, "Experiment", lambda name, run, **kw: types.SimpleNamespace(name=name))
    monkeypatch.setattr(
        tune, "run", lambda exp, **kw: types.SimpleNamespace(trials=[Trial()], experiment_path=str(tmp_path))
    )
    code = cli.main(
        [
            "train",
            TOY,
            "--experiment",
            "toy-corridor-tiny-r3l",
            "--set",
            "model=tiny",
            "--verbose",
            "0",
            "--storage-path",
            str(tmp_path),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 1
    # before: "rllib-r3l train: R3L_exp_00000: ERROR" and the path only
    assert f"rllib-r3l train: R3L_exp_00000: ERROR: {REASON}" in err
    assert f"  reason:     {REASON}" in out and f"  error:      {err_file}" in out
