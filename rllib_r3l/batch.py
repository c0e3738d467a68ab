"""From explored task groups to the learner's batch: advantages, credit masks, amplification (§4)."""

from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from rllib_r3l import core_algos
from rllib_r3l.trajectory import KINDS, Kind, Trajectory, collate


def select_trainable(groups: Sequence, *, drop_partial_groups: bool = True) -> Tuple[List[Trajectory], Counter]:
    """Trajectories to train on, and counts of what was left out and why.

    A group that lost an episode (environment or generation error) is incomplete: its baseline
    would be computed from a different set than sampled. With ``drop_partial_groups`` the whole
    group is left out (counted); otherwise its surviving members are trained on (counted).
    """
    counts: Counter = Counter()
    out: List[Trajectory] = []
    for g in groups:
        counts["groups"] += 1
        counts["episodes_lost"] += len(g.lost)
        if not g.complete:
            counts["partial_groups"] += 1
            if drop_partial_groups:
                counts["episodes_dropped_with_partial_group"] += len(g.trajectories)
                continue
        out.extend(g.trajectories)
    return out, counts


def drop_overlong(trajectories: Sequence[Trajectory], max_length: int) -> Tuple[List[Trajectory], int]:
    """Items that cannot fit the learner's context are left out (and counted by the caller) rather
    than failing the whole update. Episodes never exceed it (the runner stops them: context
    overflow); an auxiliary item could, and the explorer already drops those (counted)."""
    kept = [t for t in trajectories if t.num_tokens <= max_length]
    return kept, len(trajectories) - len(kept)


def train_batch_options(config) -> Dict[str, object]:
    """``build_train_batch``'s keyword arguments (all but the pad token) from an ``R3LConfig``: the one
    place the driver's credit step and the runners' dynamic sampling read them from."""
    return dict(
        std_normalize=config.std_normalize,
        positive_amplification=config.positive_amplification,
        alpha=config.amplification_alpha,
        success_reward=config.success_reward,
        pivotal_credit=config.pivotal_credit,
        max_length=config.max_context_tokens,
        loss_aggregation=config.loss_aggregation,
    )


def carries_signal(group, **options) -> bool:
    """Would this task group put anything in the learner's batch? (``options``: ``train_batch_options``)

    The same steps as the driver's: an incomplete group is left out, overlong items are dropped,
    then an item counts if it has credited tokens and a non-zero advantage. A group whose episodes
    all scored the same and that yielded no auxiliary item has none (dynamic sampling, DAPO §3.2).
    """
    if not group.complete:
        return False
    trajectories, _ = drop_overlong(group.trajectories, int(options["max_length"]))
    if not trajectories:
        return False
    batch, _ = build_train_batch(trajectories, pad_token_id=0, **options)
    return len(batch["input_ids"]) > 0


def build_train_batch(
    trajectories: Sequence[Trajectory],
    *,
    pad_token_id: int,
    std_normalize: bool,
    positive_amplification: bool,
    alpha: float,
    success_reward: float,
    pivotal_credit: bool,
    max_length: int,
    skip_zero_advantage: bool = True,
    loss_aggregation: str = "token_mean",
) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
    """Advantages (group-relative by ``group_id``, then amplified) and the padded batch.

    Auxiliary items carry a fixed advantage of 1.0 and are alone in their group. Amplification uses
    each trajectory's ``success`` verdict (set once by the explorer, ``core_algos.is_success``).
    Returns ``(batch, advantages)``; items without credited tokens are kept out of the batch, and
    with ``skip_zero_advantage`` so are items whose advantage is exactly 0 (e.g. a group whose
    rewards are all equal): they contribute no gradient, and leaving them out saves their
    forward/backward pass; the token-mean is then over the tokens that carry a signal.
    ``loss_aggregation`` folds the loss's aggregation into the kept items' weights
    (``core_algos.loss_aggregation_weights``).
    """
    rewards = [t.reward for t in trajectories]
    gids = [t.group_id for t in trajectories]
    fixed = [t.fixed_advantage for t in trajectories]
    success = [core_algos.is_success(t.reward, t.success, success_reward=success_reward) for t in trajectories]
    adv = core_algos.compute_advantages(
        rewards,
        gids,
        std_normalize=std_normalize,
        amplify=positive_amplification,
        alpha=alpha,
        success_reward=success_reward,
        fixed=fixed,
        success=success,
    )
    batch = collate(trajectories, adv, pad_token_id=pad_token_id, pivotal_credit=pivotal_credit, max_length=max_length)
    keep = batch["num_loss_tokens"] > 0
    if skip_zero_advantage:
        keep &= batch["advantages"] != 0
    if not keep.all():
        batch = {k: v[keep] for k, v in batch.items()}
    aux = np.isin(batch["kind"], [KINDS.index(Kind.REFLECTION_SFT), KINDS.index(Kind.RETRY_SFT)])
    # the paper's L_RL averages over every RL trajectory of the groups, the zero-advantage ones left out above too
    num_rl = sum(1 for t in trajectories if t.kind in (Kind.BASE, Kind.RETRY))
    factors = core_algos.loss_aggregation_weights(
        batch["num_loss_tokens"], loss_aggregation, is_aux=aux, num_rl_trajectories=num_rl
    )
    batch["weights"] = (batch["weights"] * factors).astype(batch["weights"].dtype)
    return batch, adv


def mark_policy_lag(batch: Dict[str, np.ndarray], learner_updates: int) -> int:
    """Add ``policy_lag`` [B] (float): learner updates since the weights that generated each item (0 where
    the version was not recorded). The learner takes the clipped importance ratio on base items with a lag
    (``stale_clip_ratio_*``; max_policy_lag). Returns how many items have one."""
    version = np.asarray(batch["policy_version"], dtype=np.int64)
    lag = np.where(version >= 0, int(learner_updates) - version, 0).clip(min=0).astype(np.float32)
    batch["policy_lag"] = lag
    return int((lag > 0).sum())


def log_batch_metrics(m, trajectories: Sequence[Trajectory], batch: Dict[str, np.ndarray], adv: np.ndarray) -> None:
    """The batch's numbers into the algorithm's MetricsLogger ``m``: trained tokens, items, advantages, and
    per kind its items, credited tokens and share of the loss."""
    samples = [t for t in trajectories if t.kind.value in ("base", "retry")]
    trained = float(batch["num_loss_tokens"].sum())
    m.log_value(("r3l", "trained_tokens"), trained, reduce="sum")
    m.log_value(("r3l", "trained_tokens_per_sample"), trained / max(len(samples), 1), reduce="mean", window=1)
    m.log_value(("r3l", "batch", "items"), len(batch["input_ids"]), reduce="sum")
    m.log_value(("r3l", "batch", "zero_advantage_items"), int(np.sum(adv == 0)), reduce="sum")
    m.log_value(("r3l", "advantage_mean"), float(np.mean(adv)), reduce="mean", window=1)
    for kind, n in kind_counts(trajectories).items():
        m.log_value(("r3l", "batch", f"num_{kind}"), n, reduce="sum")
    for kind, share in loss_share_by_kind(batch).items():
        m.log_value(("r3l", "batch", f"credited_tokens_{kind}"), share["credited_tokens"], reduce="sum")
        m.log_value(("r3l", "batch", f"loss_share_{kind}"), share["loss_share"], reduce="mean", window=1)


def kind_counts(trajectories: Sequence[Trajectory]) -> Dict[str, int]:
    c = Counter(t.kind.value for t in trajectories)
    return {k.value: c.get(k.value, 0) for k in Kind}


def loss_share_by_kind(batch: Dict[str, np.ndarray]) -> Dict[str, Dict[str, float]]:
    """Per item kind: its credited tokens and its share of the loss's weight, the sum over credited
    tokens of ``|advantage x weight|`` divided by the batch's (the token-mean loss gives every
    credited token the same denominator, so this is each kind's share of the gradient's scale
    before the model's own log-prob gradients). Shows when auxiliary SFT items, whose advantage is
    fixed at 1.0, outweigh the policy-gradient items (docs/benchmarks.md, 'Does R3L learn better than GRPO here?')."""
    n = np.asarray(batch["num_loss_tokens"], dtype=np.float64)
    mass = (
        np.abs(np.asarray(batch["advantages"], dtype=np.float64) * np.asarray(batch["weights"], dtype=np.float64)) * n
    )
    total = float(mass.sum())
    kinds = np.asarray(batch["kind"])
    out: Dict[str, Dict[str, float]] = {}
    for i, k in enumerate(KINDS):
        sel = kinds == i
        out[k.value] = {
            "credited_tokens": float(n[sel].sum()),
            "loss_share": float(mass[sel].sum()) / total if total > 0 else 0.0,
        }
    return out


def plan_micro_batches(
    lengths: Sequence[int], *, max_sequences: int, max_tokens: Optional[int] = None
) -> List[List[int]]:
    """Group trajectory indices into micro-batches for gradient accumulation.

    Longest first, so each micro-batch holds trajectories of similar length (little padding); a
    micro-batch holds at most ``max_sequences`` trajectories and, when ``max_tokens`` is set, at
    most ``max_tokens`` *padded* tokens (``len(group) * longest``). A trajectory longer than
    ``max_tokens`` gets a micro-batch of its own. Activation memory grows with padded tokens, so
    the token budget, not the trajectory count, is what bounds a learner's peak memory.
    """
    if max_sequences < 1:
        raise ValueError(f"max_sequences must be >= 1, got {max_sequences}")
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    plan: List[List[int]] = []
    for i in order:
        cur = plan[-1] if plan else None
        if (
            cur is not None
            and len(cur) < max_sequences
            and (max_tokens is None or (len(cur) + 1) * int(lengths[cur[0]]) <= max_tokens)
        ):
            cur.append(i)
        else:
            plan.append([i])
    return plan
