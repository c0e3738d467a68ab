"""``rllib-r3l train`` exits 1 when a trial fails, 0 when all terminate (Tune itself stubbed: the
exit-code contract, in milliseconds; the real train path is covered by tests/cli/test_commands.py)."""

from __future__ import annotations

import os
import types

import pytest

from rllib_r3l.cli import commands as cli
from tests import REPO_ROOT

ROOT = str(REPO_ROOT)
TOY = os.path.join(ROOT, "tuned_examples", "cpu", "toy_corridor_tiny.yaml")


class _Trial:
    def __init__(self, name, status):
        self.experiment_dir_name = name
        self.status = status
        self.trial_id = f"{name}_00000"
        self.last_result = {
            "training_iteration": 1,
            "done": status == "TERMINATED",
            "env_runners": {"episode_return_mean": 0.5, "success_rate": 0.5},
        }
        self.path = f"/tmp/{name}/trial"
        self.remote_experiment_path = f"/tmp/{name}"
        self.checkpoint = None
        self.error_file = f"/tmp/{name}/trial/error.txt" if status == "ERROR" else None

    def __str__(self):
        return f"R3L_{self.experiment_dir_name}_00000"


@pytest.fixture
def stub_tune(monkeypatch):
    """Tune without Ray: each experiment's trial ends with the next status from ``statuses``."""
    import ray
    from ray import tune

    import rllib_r3l

    statuses = []
    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # cmd_train starts/stops no Ray
    monkeypatch.setattr(rllib_r3l, "register", lambda: None)
    monkeypatch.setattr(tune, "Experiment", lambda name, run, **kw: types.SimpleNamespace(name=name))

    def run(exp, **kw):
        assert kw.get("raise_on_failed_trial") is False  # the summary is printed, then the exit code
        return types.SimpleNamespace(trials=[_Trial(exp.name, statuses.pop(0))], experiment_path=f"/tmp/{exp.name}")

    monkeypatch.setattr(tune, "run", run)
    return statuses


@pytest.mark.integration
@pytest.mark.parametrize(
    "statuses, code", [(["TERMINATED", "TERMINATED"], 0), (["TERMINATED", "ERROR"], 1), (["ERROR", "TERMINATED"], 1)]
)
def test_train_exit_code_follows_trial_status(stub_tune, capsys, tmp_path, statuses, code):
    stub_tune.extend(statuses)
    assert cli.main(["train", TOY, "--set", "model=tiny", "--verbose", "0", "--storage-path", str(tmp_path)]) == code
    out = capsys.readouterr().out
    assert not stub_tune  # both experiments ran
    assert out.count(": TERMINATED,") == statuses.count("TERMINATED")
    assert out.count(": ERROR,") == statuses.count("ERROR")
