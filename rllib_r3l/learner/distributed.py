"""Data parallelism over several learners (``num_learners > 1``; gloo on CPU, NCCL on GPU).

RLlib wraps the module in DDP and shards the batch (``ShardBatchIterator``: contiguous slices of
``ceil(n / num_learners)`` rows). Letting DDP's reducer all-reduce inside ``backward`` would hang
the group as soon as two learners run a different number of micro-batches (uneven shards, an
empty shard, a micro-batch without credited tokens, a NaN that breaks the loop early). So the R3L
learner runs its forward/backward passes on the unwrapped module and then calls
:func:`allreduce_gradients` exactly once per update, on every learner:

* the loss of every learner is normalised by the credited-token count of the *whole* batch
  (:func:`global_sum`), and gradients are summed, so the step equals the one-learner token-mean
  step over the whole batch (not a mean of per-shard means);
* a NaN/inf anywhere makes every learner skip the step (the flag rides along in the all-reduce),
  so the replicas never diverge;
* gradients travel in flat buckets (one collective per bucket, not one per parameter).

:func:`pad_batch_for_learners` pads the driver's batch with zero-credit rows to a multiple of
``num_learners`` so that no learner gets an empty shard.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import torch

_BUCKET_BYTES = 64 << 20


def is_distributed() -> bool:
    return (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )


def global_sum(value: float, op: str = "sum") -> float:
    """``value`` summed (``op="max"``: the largest) over all learners (itself when not distributed)."""
    if not is_distributed():
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64)
    if torch.distributed.get_backend() == "nccl":
        t = t.cuda()
    torch.distributed.all_reduce(
        t, op=torch.distributed.ReduceOp.MAX if op == "max" else torch.distributed.ReduceOp.SUM
    )
    return float(t.item())


@torch.no_grad()
def allreduce_gradients(
    params: Sequence[torch.nn.Parameter], nonfinite: bool = False, bucket_bytes: int = _BUCKET_BYTES
) -> bool:
    """Sum the gradients of ``params`` (those with ``requires_grad``) over all learners in place;
    returns True when any learner saw a non-finite loss or gradient. A parameter without a gradient
    on this learner contributes zeros (its ``.grad`` is created)."""
    params = [p for p in params if p.requires_grad]
    if not is_distributed():
        return bool(nonfinite)
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flag = torch.tensor([1.0 if nonfinite else 0.0], dtype=torch.float32, device=params[0].device if params else "cpu")
    torch.distributed.all_reduce(flag)
    buckets: List[List[torch.nn.Parameter]] = []
    cur: List[torch.nn.Parameter] = []
    size = 0
    for p in params:
        nbytes = p.grad.numel() * p.grad.element_size()
        if cur and (
            size + nbytes > bucket_bytes or p.grad.dtype != cur[0].grad.dtype or p.grad.device != cur[0].grad.device
        ):
            buckets.append(cur)
            cur, size = [], 0
        cur.append(p)
        size += nbytes
    if cur:
        buckets.append(cur)
    for bucket in buckets:
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        torch.distributed.all_reduce(flat)
        offset = 0
        for p in bucket:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n
    any_bad = float(flag.item()) > 0
    if not any_bad:
        any_bad = any(not torch.isfinite(p.grad).all() for p in params)
    return any_bad


def pad_batch_for_learners(batch: Dict[str, np.ndarray], num_learners: int) -> Dict[str, np.ndarray]:
    """Pad with copies of row 0 that carry no credit (``loss_mask``, ``num_loss_tokens``,
    ``advantages`` and ``weights`` zero) to a multiple of ``num_learners`` rows (at least one each)."""
    n = len(batch["input_ids"])
    w = max(int(num_learners), 1)
    target = max(w, -(-n // w) * w)
    extra = target - n
    if extra <= 0 or n == 0:
        return batch
    out = {}
    for k, v in batch.items():
        pad = np.repeat(v[:1], extra, axis=0)
        if k in ("loss_mask", "num_loss_tokens", "advantages", "weights"):
            pad = np.zeros_like(pad)
        out[k] = np.concatenate([v, pad], axis=0)
    return out
