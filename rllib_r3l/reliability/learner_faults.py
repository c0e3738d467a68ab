"""Learner faults (a testing aid, ``faults.inject``): NaN losses and inf gradients, injected by a learner
subclass the config picks only when a plan names them, so R3L's own update path has no fault code.

``R3LConfig.get_default_learner_class`` returns :class:`FaultInjectingLearner` when the plan has
``nan_loss_*`` or ``nan_grad_*``. Per update (``_update``), a seeded trigger decides which faults fire
and counts them (``r3l/faults/injected_<kind>``); ``nan_loss`` turns the update's first micro-batch
loss into NaN (``compute_loss_for_module``); ``nan_grad`` sets one entry of the first gradient that
backward produces to +inf (a tensor hook on each trained parameter). What R3L does with them, skip the
update and count it, is the learner's real code (``skip_nonfinite_updates``).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List

import torch

from rllib_r3l.learner.torch_learner import R3LTorchLearner
from rllib_r3l.reliability import faults

logger = logging.getLogger(__name__)


class FaultInjectingLearner(R3LTorchLearner):
    """``R3LTorchLearner`` with the plan's learner faults injected (never in a real training run)."""

    def build(self) -> None:
        super().build()
        trigger = faults.Trigger(faults.fault_plan(self.config), faults.LEARNER_FAULTS, [2])
        self.arm(trigger, [p for m in self.module.values() for p in m.parameters() if p.requires_grad])

    def arm(self, trigger: Any, params: List[torch.Tensor]) -> None:
        """Inject what ``trigger.next()`` names at each update; ``nan_grad`` hooks onto ``params``."""
        self._r3l_fault_trigger = trigger
        self._r3l_faults: set = set()
        for p in params:
            p.register_hook(self._poison_grad)

    def _update(self, batch: Dict[str, Any]):
        self._r3l_faults = set(self._r3l_fault_trigger.next())
        for kind in self._r3l_faults:
            self.metrics.log_value(("r3l", "faults", f"injected_{kind}"), 1, reduce="sum")
        out = super()._update(batch)
        if "nan_grad" in self._r3l_faults:
            logger.warning("fault injection nan_grad: no gradient in this update to poison")
        return out

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        loss = super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
        if "nan_loss" in self._r3l_faults:  # the first micro-batch of a chosen update
            self._r3l_faults.discard("nan_loss")
            return loss * float("nan")
        return loss

    def _poison_grad(self, grad: torch.Tensor) -> torch.Tensor:
        if "nan_grad" not in self._r3l_faults:
            return grad
        self._r3l_faults.discard("nan_grad")
        grad = grad.clone()
        grad.view(-1)[0] = float("inf")
        return grad
