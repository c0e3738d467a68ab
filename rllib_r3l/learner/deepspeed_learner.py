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
* checkpoints are complete: the module weights, and per module the optimizer state as DeepSpeed
  itself saves it (``engine.optimizer.state_dict()``: each learner's ZeRO partition of the fp32
  master weights and AdamW moments, or the whole AdamW state without ZeRO), the DeepSpeed LR
  scheduler (when ``config`` declares one) and the engine's step counters; ``set_state`` loads
  them with DeepSpeed's own ``load_state_dict`` (fp32 masters from the checkpoint, each learner
  its own partition), so a resumed run continues bit for bit. RLlib asks only the first learner
  for the state: with several learners every learner first joins
  :meth:`R3LDeepSpeedLearner.prepare_checkpoint` (a gather of the partitions,
  :func:`prepare_checkpoints` on the learner group); without that call the optimizer is left out
  (a warning) and a resume restarts the AdamW moments. Partitions load only into the same number
  of learners (DeepSpeed does not re-partition a rigid checkpoint); otherwise the moments restart,
  with a warning.

On CPU (tests) DeepSpeed's CPU accelerator with gloo is used; its shared-memory all-reduce op
(a ~20-110 s JIT build) is not built.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import time
from typing import Any, Dict, List, Optional

import torch
from ray.rllib.core import COMPONENT_OPTIMIZER, COMPONENT_RL_MODULE
from ray.rllib.utils.annotations import override

from rllib_r3l.learner import distributed
from rllib_r3l.learner.torch_learner import DEEPSPEED_OPTIMIZER_KEY, LR_TIMESTEP_KEY, R3LTorchLearner

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
        torch.distributed.init_process_group(
            "nccl" if torch.cuda.is_available() else "gloo",
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
        )
    if not torch.cuda.is_available():  # skip the CPU shared-memory comm op (slow JIT build)
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())


class R3LDeepSpeedLearner(R3LTorchLearner):
    """R3L learner whose policy is a DeepSpeed ZeRO engine."""

    @override(R3LTorchLearner)
    def build(self) -> None:
        if self._is_built:  # RLlib's build_learner already built it: keep the engines
            return
        self._engines: Dict[str, Any] = {}
        self._gathered: Dict[str, Dict[str, torch.Tensor]] = {}
        self._state_seq = 0  # bumped by every update and restore: a gathered optimizer snapshot's age
        self._optim_snapshot: Optional[tuple] = None
        super().build()
        for mod in self.module.values():  # several forward calls per micro-batch: not verified under ZeRO
            if getattr(mod, "share_prefixes", False):
                logger.warning(
                    "share_prefixes off under the DeepSpeed learner (not verified with ZeRO "
                    "partitioning); every sequence runs on its own"
                )
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
        self.register_optimizer(
            module_id=module_id, optimizer=optimizer, params=params, lr_or_lr_schedule=self.config.lr
        )
        cfg = ds_config(
            self.config.deepspeed, grad_clip=self.config.grad_clip, bf16=self.config.model_dtype == "bfloat16"
        )
        engine, _, _, _ = deepspeed.initialize(model=module.lm, optimizer=optimizer, config=cfg)
        self._engines[module_id] = engine  # module.lm stays the (now ZeRO-managed) model

    # ------------------------------------------------------------------------------------------------
    @override(R3LTorchLearner)
    def _update(self, batch: Dict[str, Any]):
        t0 = time.perf_counter()
        torch.set_num_threads(int(self.config.num_threads or os.cpu_count() or 1))
        self._reset_step_stats()
        self._state_seq += 1
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
            n_all = int(
                distributed.global_sum(n_micro, op="max")
            )  # same count on every learner (ZeRO-2/3 reduce per backward)
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
        for engine in self._engines.values():
            if skip:
                engine.optimizer.zero_grad(set_to_none=True)
                engine.zero_grad()
            else:
                self.log_step_lr([engine.optimizer])
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
        self.metrics.log_value(
            ("r3l", "learner", "trained_tokens_per_s"), trained_tokens / max(dt, 1e-9), reduce="mean", window=1
        )
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

    # -- checkpoint state -------------------------------------------------------------------------------
    @override(R3LTorchLearner)
    def get_state(self, components=None, *, not_components=None, **kwargs):
        state = super().get_state(components, not_components=not_components, **kwargs)
        if self._stage == 3 and COMPONENT_RL_MODULE in state:
            for mid in state[COMPONENT_RL_MODULE]:
                if mid in self._gathered:
                    state[COMPONENT_RL_MODULE][mid] = dict(self._gathered[mid])
        if state.get(COMPONENT_OPTIMIZER, True) is None:  # several learners, no gathered snapshot
            state.pop(COMPONENT_OPTIMIZER)
        return state

    def prepare_checkpoint(self) -> None:
        """Collective (every learner calls it, e.g. through :func:`prepare_checkpoints`): the first
        learner keeps every learner's optimizer partition, which its next ``get_state`` returns."""
        local = self._local_optimizer_states()
        world = torch.distributed.get_world_size()
        gathered: Optional[List[Any]] = [None] * world if torch.distributed.get_rank() == 0 else None
        torch.distributed.gather_object(local, gathered, dst=0)
        self._optim_snapshot = (self._state_seq, gathered) if gathered is not None else None

    def _local_optimizer_states(self) -> Dict[str, Any]:
        """This learner's optimizer state per module, as DeepSpeed saves it (CPU copies)."""
        out = {}
        for mid, engine in self._engines.items():
            sched = getattr(engine, "lr_scheduler", None)
            out[mid] = {
                "optimizer": _cpu_copy(engine.optimizer.state_dict()),
                "lr_scheduler": _cpu_copy(sched.state_dict()) if sched is not None else None,
                "global_steps": engine.global_steps,
                "global_samples": engine.global_samples,
                "skipped_steps": engine.skipped_steps,
            }
        return out

    @override(R3LTorchLearner)
    def _get_optimizer_state(self):
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        if world == 1:
            per_rank = [self._local_optimizer_states()]
        elif self._optim_snapshot is not None and self._optim_snapshot[0] == self._state_seq:
            per_rank = self._optim_snapshot[1]
        else:
            logger.warning(
                "DeepSpeed with %d learners: the optimizer state is partitioned and no learner "
                "joined prepare_checkpoint() since the last update; the state holds the weights "
                "only (a resume restarts the AdamW moments)",
                world,
            )
            return None
        return {
            DEEPSPEED_OPTIMIZER_KEY: {
                mid: {
                    "stage": self._stage,
                    "world_size": len(per_rank),
                    "partitioned": _partitioned(engine.optimizer),
                    "ranks": [r[mid] for r in per_rank],
                }
                for mid, engine in self._engines.items()
            }
        }

    @override(R3LTorchLearner)
    def _set_optimizer_state(self, state) -> None:
        saved = (state or {}).get(DEEPSPEED_OPTIMIZER_KEY)
        if saved is None:
            if state:
                logger.warning(
                    "the checkpoint's optimizer state is not a DeepSpeed one (another learner kind): "
                    "the AdamW moments restart"
                )
            return
        world = torch.distributed.get_world_size()
        rank = torch.distributed.get_rank()
        for mid, entry in saved.items():
            engine = self._engines.get(mid)
            if engine is None:
                continue
            if entry["stage"] != self._stage or entry["world_size"] != world:
                logger.warning(
                    "DeepSpeed optimizer state saved at ZeRO stage %s with %s learners, resumed at "
                    "stage %s with %s: not loadable, the AdamW moments restart",
                    entry["stage"],
                    entry["world_size"],
                    self._stage,
                    world,
                )
                continue
            mine = entry["ranks"][rank]
            opt = engine.optimizer
            prologue = getattr(opt, "checkpoint_event_prologue", None)
            if prologue is not None:  # ZeRO-3: every parameter partitioned before loading
                prologue()
            if entry["partitioned"]:  # each learner its own partition; fp32 masters from the checkpoint
                opt.load_state_dict(
                    state_dict_list=[r["optimizer"] for r in entry["ranks"]],
                    load_optimizer_states=True,
                    load_from_fp32_weights=True,
                )
            else:
                opt.load_state_dict(mine["optimizer"])
            epilogue = getattr(opt, "checkpoint_event_epilogue", None)
            if epilogue is not None:
                epilogue()
            if mine.get("lr_scheduler") is not None and getattr(engine, "lr_scheduler", None) is not None:
                engine.lr_scheduler.load_state_dict(mine["lr_scheduler"])
            engine.global_steps = mine["global_steps"]
            engine.global_samples = mine["global_samples"]
            engine.skipped_steps = mine["skipped_steps"]

    @override(R3LTorchLearner)
    def set_state(self, state) -> None:
        state = dict(state)
        optim = state.pop(COMPONENT_OPTIMIZER, None)
        self._state_seq += 1
        with self._module_writable(COMPONENT_RL_MODULE in state):
            super().set_state(state)
        if COMPONENT_RL_MODULE in state:
            self._refresh_masters()
        if optim is not None:  # after the module: the checkpoint's fp32 masters and partitions win
            self._set_optimizer_state(optim)
            self.apply_own_lr(state.get(LR_TIMESTEP_KEY))  # DeepSpeed loads the saved param-group lr too
        if self._stage == 3:
            self._gather_states()

    @override(R3LTorchLearner)
    def _restore_all_subcomponents_from_path(self, *args, **kwargs):
        """``restore_from_path`` loads the module from its own folder before ``set_state`` (the
        rest): under ZeRO-3 into gathered parameters, and the fp32 masters follow it (without
        that, the next step would continue from the masters' old values)."""
        self._state_seq += 1
        with self._module_writable(True):
            super()._restore_all_subcomponents_from_path(*args, **kwargs)
        self._refresh_masters()
        if self._stage == 3:
            self._gather_states()

    def _module_writable(self, needed: bool):
        """ZeRO-3: the full parameters, written back into every learner's partition on exit."""
        if self._stage != 3 or not needed:
            return contextlib.nullcontext()
        import deepspeed

        params = [p for mid in self._engines for p in self.module[mid].lm.parameters()]
        return deepspeed.zero.GatheredParameters(params, modifier_rank=0)

    def _refresh_masters(self) -> None:
        """DeepSpeed's fp32 master weights (ZeRO, bf16) copied from the module's weights."""
        for engine in self._engines.values():
            refresh = getattr(engine.optimizer, "refresh_fp32_params", None)
            if refresh is not None:
                refresh()


def prepare_checkpoints(learner_group: Any) -> None:
    """Before saving an Algorithm whose remote learners are DeepSpeed learners: every learner joins
    :meth:`R3LDeepSpeedLearner.prepare_checkpoint` (RLlib then asks only the first for the state).
    A no-op for a local learner group (one learner holds the whole state)."""
    if learner_group is None or learner_group.is_local:
        return
    learner_group.foreach_learner(
        lambda learner: learner.prepare_checkpoint() if hasattr(learner, "prepare_checkpoint") else None
    )


def _partitioned(optimizer: Any) -> bool:
    """True for DeepSpeed's partitioned optimizers (ZeRO 1-3, its bf16 optimizer): their
    ``load_state_dict`` takes every learner's state and picks its own."""
    try:
        return "state_dict_list" in inspect.signature(optimizer.load_state_dict).parameters
    except (TypeError, ValueError):
        return False


def _cpu_copy(x: Any) -> Any:
    """A detached CPU copy of the tensors in a (nested) state dict; other values as they are."""
    if torch.is_tensor(x):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, dict):
        out = x.copy()  # keeps the mapping's type (OrderedDict, defaultdict)
        for k, v in x.items():
            out[k] = _cpu_copy(v)
        return out
    if isinstance(x, list):
        return [_cpu_copy(v) for v in x]
    return x
