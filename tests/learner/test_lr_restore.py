"""A learner restored from another learner's state trains at its OWN learning rate (issue 49).

Population-based training restores the donor trial's checkpoint into a trial whose config holds
another ``lr``; torch's ``load_state_dict`` brings the donor's param-group lr along, and RLlib sets
the configured one only after the next update. The restored learner's optimizer must hold its own
lr (or its own schedule's value at the restored timestep) before that first update.
"""

from __future__ import annotations

import pytest

from tests.learner.helpers import optimizer_lrs, update_at
from tests.scripted_rllib import build_learner


@pytest.mark.parametrize("how", ["set_state", "restore_from_path"])
def test_a_restored_learner_keeps_its_own_fixed_lr(tiny_model_dir, tmp_path, how):
    donor = build_learner(lr=5e-6)
    assert update_at(donor, timestep=100) == 5e-6
    assert optimizer_lrs(donor) == [5e-6]
    trial = build_learner(lr=1e-6)
    if how == "set_state":
        trial.set_state(donor.get_state())
    else:  # what Algorithm.restore_from_path (a Tune restore, a PBT exploit) does per learner
        donor.save_to_path(str(tmp_path / "learner"))
        trial.restore_from_path(str(tmp_path / "learner"))
    # the donor's AdamW moments came along (the clone is real) ...
    (opt,) = trial._named_optimizers.values()
    assert all(int(s["step"]) == 1 for s in opt.state.values())
    # ... and the first update after the restore runs at the trial's own lr (before the fix: 5e-6)
    assert optimizer_lrs(trial) == [1e-6]
    assert update_at(trial, timestep=200) == 1e-6


def test_a_restored_learner_takes_its_own_schedules_value_at_the_restored_timestep(tiny_model_dir):
    donor = build_learner(lr=[[0, 1e-5], [1000, 1e-6]])
    update_at(donor, timestep=500)
    assert optimizer_lrs(donor) == [pytest.approx(5.5e-6)]  # the donor's schedule at 500
    trial = build_learner(lr=[[0, 4e-5], [1000, 2e-5]])
    assert optimizer_lrs(trial) == [pytest.approx(4e-5)]  # a fresh learner: its schedule's start
    trial.set_state(donor.get_state())
    # its own schedule, at the timestep the donor's schedule had reached (before the fix: 5.5e-6)
    assert optimizer_lrs(trial) == [pytest.approx(3e-5)]
    (sched,) = trial._optimizer_lr_schedules.values()
    assert float(sched.get_current_value()) == pytest.approx(3e-5)
    assert update_at(trial, timestep=600) == pytest.approx(
        3e-5
    )  # RLlib's own metric would say 2.8e-5 (the next step's)


def test_a_state_without_the_optimizer_leaves_the_lr_alone(tiny_model_dir):
    """Weights alone (RLlib's ``components="rl_module"``, e.g. a weight sync) touch no optimizer."""
    trial = build_learner(lr=[[0, 4e-5], [1000, 2e-5]])
    update_at(trial, timestep=500)
    trial.set_state(build_learner(lr=1e-6).get_state(components="rl_module"))
    assert optimizer_lrs(trial) == [pytest.approx(3e-5)]


_DEEPSPEED = r"""
import json, sys
from tests.learner.helpers import optimizer_lrs, update_at
from tests.scripted_rllib import build_learner
ckpt = sys.argv[1]
donor = build_learner(lr=5e-6, deepspeed={"stage": 2}, micro_batch_size=2, num_threads=1)
update_at(donor, timestep=100)
donor.save_to_path(ckpt)
trial = build_learner(lr=1e-6, deepspeed={"stage": 2}, micro_batch_size=2, num_threads=1)
trial.restore_from_path(ckpt)
engine = trial._engines["default_policy"]
print("RESULT " + json.dumps({"registered": optimizer_lrs(trial),
                              "engine": [g["lr"] for g in engine.optimizer.param_groups],
                              "steps": engine.global_steps}))
"""


@pytest.mark.slow  # a DeepSpeed engine: ~10-60 s on 2 shared cores
def test_a_restored_deepspeed_learner_keeps_its_own_lr(tiny_model_dir, tmp_path):
    """DeepSpeed's ZeRO optimizer loads the saved param-group lr as torch's does; in its own process
    (DeepSpeed leaves a torch.distributed group behind)."""
    pytest.importorskip("deepspeed")
    from tests.learner.deepspeed_checks import result_of, run_python

    r = result_of(run_python(_DEEPSPEED, str(tmp_path / "ckpt")))
    assert r["steps"] == 1  # the donor's optimizer state came along
    assert r["registered"] == [1e-6] and r["engine"] == [1e-6], r  # before the fix: 5e-6
