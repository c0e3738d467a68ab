"""``R3LDeepSpeedLearner``: the R3L learner on DeepSpeed ZeRO (``deepspeed={"stage": 2 or 3}``).

For models whose full-precision weights, gradients and AdamW moments do not fit one accelerator
per learner. Same loss and micro-batching as :class:`~rllib_r3l.learner.torch_learner.R3LTorchLearner`; what changes:

* the policy's ``lm`` is wrapped by ``deepspeed.initialize`` (ZeRO ``stage`` 0-3, optional
  ``offload_optimizer`` / ``offload_param`` to CPU, anything else under ``config``); RLlib does not
  wrap it in DDP; DeepSpeed reduces gradients (``managed_gradient_accumulation`` off: one optimizer
  step per batch, clipping with ``grad_clip``);
* ZeRO-2/3 reduce gradients inside every backward, so every learner runs the *same* number of
  micro-batches (the global maximum; a learner with fewer rows repeats a zero-weighted one);
  losses are scaled by the number of learners so DeepSpeed's averaging gives the whole batch's
  token-mean gradient; a NaN/inf on any learner skips the step on all;
* ZeRO-3 partitions the weights: after each update every learner joins one gather and the first
  keeps a CPU copy, which ``get_state`` returns (RLlib asks only the first learner for the state
  it syncs to the engines and checkpoints);
* checkpoints hold the module weights, not the (partitioned) optimizer state: restoring a
  DeepSpeed run restarts the AdamW moments.

On CPU (tests) DeepSpeed's CPU accelerator with gloo is used; its shared-memory all-reduce op
(a ~20-110 s JIT build) is not built.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict

import torch
from ray.rllib.core import COMPONENT_OPTIMIZER, COMPONENT_RL_MODULE
from ray.rllib.utils.annotations import override

from rllib_r3l.learner import distributed
from rllib_r3l.learner.torch_learner import R3LTorchLearner

logger = logging.getLogger(__name__)

def ds_config(options: Dict[str, Any], *, grad_clip: float | None, bf16: bool) -> Dict[str, Any]:
    """The DeepSpeed config of an R3L ``deepspeed`` option dict."""
    stage = int(options.get("stage", 2))
    zero: Dict[str, Any] = {"stage": stage}
    if options.get("offload_optimizer"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if options.get("offload_param") and stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    cfg: Dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,  # informational: R3L feeds micro-batches itself
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "zero_optimization": zero,
        "gradient_clipping": float(grad_clip or 0.0),
        "bf16": {"enabled": bool(bf16)},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    extra = dict(options.get("config") or {})
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    return cfg


def _ensure_process_group(device: torch.device) -> None:
    """DeepSpeed needs torch.distributed (RLlib starts it for num_learners > 1; a single local
    learner gets a one-process group) and ``LOCAL_RANK`` = the index of this learner's device."""
    import deepspeed

    if torch.distributed.is_initialized():
        os.environ.setdefault("RANK", str(torch.distributed.get_rank()))
        os.environ.setdefault("WORLD_SIZE", str(torch.distributed.get_world_size()))
    os.environ["LOCAL_RANK"] = str(device.index or 0) if device.type == "cuda" else "0"

    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        os.environ.setdefault("LOCAL_RANK", "0")
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                                             rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    if not torch.cuda.is_available():  # skip the CPU shared-memory comm op (slow JIT build)
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())


class R3LDeepSpeedLearner(R3LTorchLearner):
    """R3L learner whose policy is a DeepSpeed ZeRO engine."""

    @override(R3LTorchLearner)
    def build(self) -> None:
        self._engines: Dict[str, Any] = {}
        self._gathered: Dict[str, Dict[str, torch.Tensor]] = {}
        super().build()
        for mod in self.module.values():  # several forward calls per micro-batch: not verified under ZeRO
            if getattr(mod, "share_prefixes", False):
                logger.warning("share_prefixes off under the DeepSpeed learner (not verified with ZeRO "
                               "partitioning); every sequence runs on its own")
                mod.share_prefixes = False
        if self._stage == 3:  # every learner builds: the first gather (for the initial weight sync)
            self._gather_states()

    @override(R3LTorchLearner)
    def _make_modules_ddp_if_necessary(self) -> None:
        pass  # DeepSpeed does the data parallelism

    @property
    def _stage(self) -> int:
        return int(self.config.deepspeed.get("stage", 2))

    @override(R3LTorchLearner)
    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        import deepspeed

        _ensure_process_group(torch.device(self._device))
        module = self._module[module_id]
        params = [p for p in self.get_parameters(module) if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=self.config.weight_decay)
        self.register_optimizer(module_id=module_id, optimizer=optimizer, params=params,
                                lr_or_lr_schedule=self.config.lr)
        cfg = ds_config(self.config.deepspeed, grad_clip=self.config.grad_clip,
                        bf16=self.config.model_dtype == "bfloat16")
        engine, _, _, _ = deepspeed.initialize(model=module.lm, optimizer=optimizer, config=cfg)
        self._engines[module_id] = engine  # module.lm stays the (now ZeRO-managed) model

    # ------------------------------------------------------------------------------------------------
    @override(R3LTorchLearner)
    def _update(self, batch: Dict[str, Any]):
        t0 = time.perf_counter()
        torch.set_num_threads(int(self.config.num_threads or os.cpu_count() or 1))
        self._reset_step_stats()
        world = torch.distributed.get_world_size()
        total_loss: Dict[str, torch.Tensor] = {}
        fwd_out: Dict[str, Any] = {}
        trained_tokens = 0
        nonfinite = False
        for mid, b in batch.items():
            engine = self._engines[mid]
            module = self.module[mid]
            trained_tokens += int(b["num_loss_tokens"].sum())
            normalizer = max(distributed.global_sum(float(b["num_loss_tokens"].sum())), 1.0)
            subs = self.micro_batches(b)
            n_micro = len(subs)
            n_all = int(_global_max(n_micro))  # same count on every learner (ZeRO-2/3 reduce per backward)
            acc = torch.zeros((), dtype=torch.float32)
            for i in range(n_all):
                sub = dict(subs[i] if i < n_micro else subs[0])
                scale = float(world) if i < n_micro else 0.0  # extra micro-batches only keep the collectives in step
                sub["normalizer"] = normalizer
                with self.autocast():
                    out = module.forward_train(sub)
                    loss = self.compute_loss_for_module(module_id=mid, config=self.config, batch=sub, fwd_out=out)
                if not torch.isfinite(loss):
                    nonfinite = True
                    loss = out["logprobs"].sum() * 0.0 if torch.isfinite(out["logprobs"]).all() else loss * 0.0
                engine.backward(loss * scale, scale_wrt_gas=False)
                if i < n_micro:
                    acc = acc + loss.detach().float()
            total_loss[mid] = acc
            fwd_out[mid] = {}
        skip = distributed.global_sum(1.0 if nonfinite else 0.0) > 0 and self.config.skip_nonfinite_updates
        for mid, engine in self._engines.items():
            if skip:
                engine.optimizer.zero_grad(set_to_none=True)
                engine.zero_grad()
            else:
                engine.step()
        if skip:
            self._skipped += 1
            self.metrics.log_value(("r3l", "faults", "nonfinite_updates_skipped"), 1, reduce="sum")
        else:
            self._updates += 1
        if self._stage == 3:
            self._gather_states()
        dt = time.perf_counter() - t0
        self.metrics.log_value(("r3l", "learner", "trained_tokens"), trained_tokens, reduce="sum")
        self.metrics.log_value(("r3l", "learner", "update_seconds"), dt, reduce="mean", window=1)
        self.metrics.log_value(("r3l", "learner", "trained_tokens_per_s"), trained_tokens / max(dt, 1e-9),
                               reduce="mean", window=1)
        self._log_step_stats()
        return fwd_out, total_loss, {}

    # ------------------------------------------------------------------------------------------------
    def _gather_states(self) -> None:
        """ZeRO-3: every learner joins the gather; all keep a CPU copy (rank 0's is the one used)."""
        import deepspeed

        for mid in self._engines:
            lm = self.module[mid].lm
            with deepspeed.zero.GatheredParameters(list(lm.parameters()), modifier_rank=None):
                self._gathered[mid] = {"lm." + k: v.detach().to("cpu", copy=True) for k, v in lm.state_dict().items()}

    @override(R3LTorchLearner)
    def get_state(self, components=None, *, not_components=None, **kwargs):
        # the optimizer state is partitioned per learner (and DeepSpeed owns its param groups):
        # not part of the state
        excluded = [not_components] if isinstance(not_components, str) else list(not_components or [])
        state = super().get_state(components, not_components=excluded + [COMPONENT_OPTIMIZER], **kwargs)
        if self._stage == 3 and COMPONENT_RL_MODULE in state:
            for mid, st in state[COMPONENT_RL_MODULE].items():
                if mid in self._gathered:
                    state[COMPONENT_RL_MODULE][mid] = dict(self._gathered[mid])
        return state

    @override(R3LTorchLearner)
    def set_state(self, state) -> None:
        state = dict(state)
        state.pop(COMPONENT_OPTIMIZER, None)
        if self._stage != 3:
            return super().set_state(state)
        import deepspeed

        params = [p for mid in self._engines for p in self.module[mid].lm.parameters()]
        with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
            super().set_state(state)
        self._gather_states()


def _global_max(value: int) -> float:
    if not distributed.is_distributed():
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64)
    if torch.distributed.get_backend() == "nccl":
        t = t.cuda()
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return float(t.item())
