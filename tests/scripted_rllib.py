"""RLlib-level scripted pieces, injected through RLlib's own config hooks (no hook in rllib_r3l):

- ``ScriptedEnvRunner`` (``config.env_runners(env_runner_cls=...)``): the real ``R3LEnvRunner``
  (engine, weight sync, environments, explorer, metrics) whose episodes and reflections are
  answered by ``tests.scripted.ScriptedBackend``, so reflections are valid and retries happen;
  the real engine still receives every weight sync.
- ``RecordingLearner`` (``config.training(learner_class=...)``): the real ``R3LTorchLearner``
  that also reports what reached it: rows by kind signature and how far the update moved the
  weights (under ``r3l_test/`` in the learner results).
"""

from __future__ import annotations

import os

import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_r3l.learner.torch_learner import R3LTorchLearner
from rllib_r3l.runner.env_runner import R3LEnvRunner
from tests.scripted import ScriptedBackend, corridor_policy


class ScriptedEnvRunner(R3LEnvRunner):
    def _setup(self) -> None:
        if self._explorer is not None:
            return
        super()._setup()
        scripted = ScriptedBackend(self._tokenizer, policy=corridor_policy, pivot=1, outcome="failure")
        self._episodes.backend = scripted
        self._explorer.reflector = scripted


class RecordingLearner(R3LTorchLearner):
    def _update(self, batch):
        b = batch[DEFAULT_MODULE_ID]
        before = {k: p.detach().clone() for k, p in self._params.items()}
        out = super()._update(batch)
        rows = torch.as_tensor(b["num_loss_tokens"]) > 0
        off = (torch.as_tensor(b["on_policy"]) == 0) & rows
        aux = off & (torch.as_tensor(b["weights"]) != 1.0)
        delta = sum(float((p.detach() - before[k]).pow(2).sum()) for k, p in self._params.items()) ** 0.5
        for key, value in (
            ("rows", int(rows.sum())),
            ("off_policy_rows", int(off.sum())),
            ("aux_rows", int(aux.sum())),
            ("weight_delta", delta),
        ):
            self.metrics.log_value(("r3l_test", key), value, reduce="sum")
        return out


def tiny_config(**training):
    """The smallest real R3L run: the tiny model on ToyCorridor (3 rooms), transformers backend, seeded."""
    from rllib_r3l import R3LConfig

    opts = dict(
        model="tiny",
        group_size=4,
        tasks_per_iteration=2,
        backend="transformers",
        max_response_tokens=8,
        max_reflection_tokens=24,
        micro_batch_size=4,
        lr=1e-4,
    )
    opts.update(training)
    return R3LConfig().environment("r3l/ToyCorridor", env_config={"num_rooms": 3}).training(**opts).debugging(seed=0)


def resume_config():
    """``tiny_config`` seeded for a bit-exact resume (``sampling_seed=7``, one thread) with one remote env runner:
    the run a killed driver resumes from its checkpoint (tests/reliability/test_reliability.py)."""
    return tiny_config(sampling_seed=7, num_threads=1).env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)


def build_learner(**training):
    """A real ``R3LTorchLearner`` on the tiny model, built outside Ray (``lr=1e-3`` unless given, no weight
    decay)."""
    import gymnasium as gym
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_r3l import R3LConfig

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cfg = R3LConfig().training(
        **{"model": "tiny", "backend": "transformers", "lr": 1e-3, "weight_decay": 0.0, **training}
    )
    space = (gym.spaces.Text(max_length=8), gym.spaces.Text(max_length=8))
    learner = cfg.build_learner(env=None, spaces={"__env__": space, DEFAULT_MODULE_ID: space})
    learner.build()
    return learner


def grads_after_update(learner, batch):
    """The flat gradient that one ``_update`` on ``batch`` leaves in the learner's parameters."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    learner._update({DEFAULT_MODULE_ID: {k: v.clone() for k, v in batch.items()}})
    return torch.cat([p.grad.detach().flatten() for p in learner._params.values() if p.grad is not None])
