"""The math of R3L as small pure functions (numpy for per-trajectory values, torch for per-token losses).

Every function here is side-effect free and has a uniform signature so that estimators and losses can
be swapped and tested against hand-computed values (see ``tests/test_core_algos.py``).

Paper references (arXiv 2601.03715): §3 GRPO, §4 "Pivotal Credit Assignment", §4 "Positive
Amplification", §4 "Objective", appendix K.1 (defaults: alpha = 3.0, success reward 1.0).
"""

from __future__ import annotations

from typing import Dict, Hashable, Optional, Sequence

import numpy as np
import torch

__all__ = [
    "SUCCESS_TOLERANCE",
    "ADVANTAGE_TOLERANCE",
    "is_success",
    "group_relative_advantages",
    "positive_amplification",
    "compute_advantages",
    "pivotal_credit_mask",
    "LOSS_AGGREGATIONS",
    "loss_aggregation_weights",
    "policy_gradient_loss",
    "kl_penalty",
]


# Rewards are float sums of per-step increments: a ScienceWorld success can sum to 0.9999999999999999,
# and a group of equal partial scores (0.7, 0.1, ...) can leave advantages of +-1e-16. One tolerance
# each, used everywhere success or a zero advantage is decided.
SUCCESS_TOLERANCE = 1e-6
ADVANTAGE_TOLERANCE = 1e-9


def is_success(
    reward: float, won: bool = False, *, success_reward: float = 1.0, tol: float = SUCCESS_TOLERANCE
) -> bool:
    """Whether a trajectory counts as a success (amplification, auxiliary items and metrics alike).

    The environment's own verdict (``won``) decides where it gives one; otherwise the return must
    reach ``success_reward`` within ``tol`` (a float sum of increments may fall short by rounding).
    """
    return bool(won) or float(reward) >= float(success_reward) - tol


def group_relative_advantages(
    rewards: Sequence[float], group_ids: Sequence[Hashable], *, std_normalize: bool = False, eps: float = 1e-6
) -> np.ndarray:
    """Group-relative advantages (paper §3, GRPO): ``A_i = r_i - mean(r_group)``.

    With ``std_normalize`` the score is further divided by ``std(r_group) + eps`` (GRPO; unbiased std
    as in common GRPO implementations). R3L's default follows the authors' code: mean baseline only.
    A singleton group has no peers to compare with, so its baseline is 0 (``A = r``) and it is never
    std-normalised. Groups are formed by equality of ``group_ids``; order is preserved.
    A group whose rewards are equal within ``ADVANTAGE_TOLERANCE`` carries no signal: its
    advantages are exactly 0 (float rounding would otherwise leave +-1e-16, which std-normalisation
    would blow up to +-1).
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"rewards must be 1-D, got shape {r.shape}")
    if len(group_ids) != len(r):
        raise ValueError(f"group_ids has {len(group_ids)} entries but rewards has {len(r)}")
    if not np.all(np.isfinite(r)):
        raise ValueError("rewards contain NaN or inf; fix the environment's reward")
    members: Dict[Hashable, list] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    adv = np.zeros_like(r)
    for idx in members.values():
        gr = r[idx]
        if len(idx) == 1:
            adv[idx] = gr
            continue
        if float(gr.max() - gr.min()) <= ADVANTAGE_TOLERANCE:
            adv[idx] = 0.0
            continue
        score = gr - gr.mean()
        score[np.abs(score) <= ADVANTAGE_TOLERANCE] = 0.0
        if std_normalize:
            score = score / (gr.std(ddof=1) + eps)
        adv[idx] = score
    return adv


def positive_amplification(
    advantages: Sequence[float],
    rewards: Sequence[float],
    *,
    alpha: float = 3.0,
    success_reward: float = 1.0,
    success: Optional[Sequence[bool]] = None,
) -> np.ndarray:
    """Positive Amplification (paper §4, K.1).

    - a successful trajectory gets advantage exactly ``1.0``;
    - any other trajectory with a non-negative advantage gets ``advantage * alpha``;
    - negative advantages are left unchanged.

    ``success`` is the per-trajectory verdict (``is_success``: the environment's ``won`` or the
    return within tolerance of ``success_reward``); without it, ``is_success`` on the rewards alone.
    """
    a = np.asarray(advantages, dtype=np.float64).copy()
    r = np.asarray(rewards, dtype=np.float64)
    if a.shape != r.shape:
        raise ValueError(f"advantages {a.shape} and rewards {r.shape} differ in shape")
    if success is None:
        success = r >= success_reward - SUCCESS_TOLERANCE
    else:
        success = np.asarray(success, dtype=bool)
        if success.shape != r.shape:
            raise ValueError(f"success {success.shape} and rewards {r.shape} differ in shape")
    nonneg = (a >= 0) & ~success
    a[nonneg] = a[nonneg] * alpha
    a[success] = 1.0
    return a


def compute_advantages(
    rewards: Sequence[float],
    group_ids: Sequence[Hashable],
    *,
    std_normalize: bool = False,
    amplify: bool = True,
    alpha: float = 3.0,
    success_reward: float = 1.0,
    fixed: Optional[Sequence[Optional[float]]] = None,
    success: Optional[Sequence[bool]] = None,
) -> np.ndarray:
    """Advantages for a batch of trajectories: group-relative, then (optionally) amplified.

    ``success`` (optional, per item): the success verdicts amplification uses (``is_success``).

    ``fixed[i]`` (when not None) overrides the computed value for item ``i``: auxiliary
    reflection/retry-SFT items are positive items with a fixed advantage of 1.0 (authors' code).
    Fixed items never take part in the group statistics of other items.
    """
    n = len(rewards)
    fixed = list(fixed) if fixed is not None else [None] * n
    if len(fixed) != n:
        raise ValueError(f"fixed has {len(fixed)} entries but rewards has {n}")
    if success is not None and len(success) != n:
        raise ValueError(f"success has {len(success)} entries but rewards has {n}")
    free = [i for i in range(n) if fixed[i] is None]
    adv = np.zeros(n, dtype=np.float64)
    if free:
        fr = [rewards[i] for i in free]
        fg = [group_ids[i] for i in free]
        a = group_relative_advantages(fr, fg, std_normalize=std_normalize)
        if amplify:
            fs = [bool(success[i]) for i in free] if success is not None else None
            a = positive_amplification(a, fr, alpha=alpha, success_reward=success_reward, success=fs)
        adv[free] = a
    for i in range(n):
        if fixed[i] is not None:
            adv[i] = float(fixed[i])
    return adv


def pivotal_credit_mask(response_mask: np.ndarray, turn_ids: np.ndarray, pivot: int) -> np.ndarray:
    """Pivotal Credit Assignment (paper §4): response tokens of turns before ``pivot`` carry no credit.

    ``response_mask`` marks generated tokens, ``turn_ids`` gives each token's turn index. With
    ``pivot = 0`` the mask is the response mask itself.
    """
    response_mask = np.asarray(response_mask, dtype=bool)
    turn_ids = np.asarray(turn_ids)
    if response_mask.shape != turn_ids.shape:
        raise ValueError(f"response_mask {response_mask.shape} and turn_ids {turn_ids.shape} differ")
    if pivot < 0:
        raise ValueError(f"pivot must be >= 0, got {pivot}")
    return response_mask & (turn_ids >= pivot)


LOSS_AGGREGATIONS = ("token_mean", "sequence_mean", "paper")


def loss_aggregation_weights(
    num_loss_tokens: Sequence[float],
    mode: str = "token_mean",
    is_aux: Optional[Sequence[bool]] = None,
    num_rl_trajectories: Optional[int] = None,
) -> np.ndarray:
    """Per-item factors on the token weights so that ``policy_gradient_loss``'s token mean (the sum
    over the batch's N credited tokens, divided by N) aggregates as ``mode``:

    - ``token_mean`` (the authors' code): every credited token counts once, so an item weighs by its
      length (a 100-token reflection report as much as ~30 three-token actions);
    - ``sequence_mean`` (verl's ``seq-mean-token-mean``): each item's token mean, averaged over the
      B items with credited tokens; factor ``N / (B * n_i)``, 0 for an item without credited tokens;
    - ``paper`` (paper §4 "Objective", Algorithm 1): the RL term is the mean over the RL items
      (base and retry trajectories) of each item's token mean, and the auxiliary items (``is_aux``)
      form a separate SFT term, the mean over them of each item's token mean of -log pi (their
      advantage is 1.0); factor ``N / (B_rl * n_i)`` on RL items, ``N / (B_aux * n_i)`` on auxiliary
      ones, so the loss is ``L_RL + L_SFT``. The paper's L_RL averages over the group's trajectories,
      ``-(1/|G|) sum_{tau in G} (1/|tau|) sum_t A log pi``: a trajectory whose advantage is 0 adds nothing
      but still counts in |G|. ``num_rl_trajectories`` is that count (summed over the batch's groups)
      when the batch has left such items out (``batch.build_train_batch`` skips them); B_rl is then
      ``num_rl_trajectories``.

    As factors on the weights, the aggregation survives micro-batching and data-parallel shards
    (each uses the whole batch's N).
    """
    n = np.asarray(num_loss_tokens, dtype=np.float64)
    if mode == "token_mean":
        return np.ones_like(n)
    if mode not in LOSS_AGGREGATIONS:
        raise ValueError(f"loss_aggregation={mode!r}: use one of {LOSS_AGGREGATIONS}")
    credited = n > 0
    out = np.zeros_like(n)
    if mode == "sequence_mean":
        parts = [credited]
    else:
        if is_aux is None:
            raise ValueError("loss_aggregation='paper' needs is_aux: which items are auxiliary SFT items")
        aux = np.asarray(is_aux, dtype=bool)
        if aux.shape != n.shape:
            raise ValueError(f"is_aux has {aux.shape[0]} entries for {n.shape[0]} items")
        parts = [credited & ~aux, credited & aux]
    for i, part in enumerate(parts):
        if part.any():
            count = part.sum()
            if mode == "paper" and i == 0 and num_rl_trajectories is not None:
                if num_rl_trajectories < count:
                    raise ValueError(f"num_rl_trajectories={num_rl_trajectories} is below the {count} RL items given")
                count = num_rl_trajectories
            out[part] = n.sum() / (count * n[part])
    return out


def ratio_selection(
    on_policy: torch.Tensor,
    has_behaviour: torch.Tensor,
    policy_lag: torch.Tensor,
    *,
    use_importance_ratio: bool,
    clip: tuple,
    stale_clip: tuple,
):
    """Which credited tokens take the clipped importance ratio, and its clip bounds (§4; issue 47 item 3).

    Per token (bool masks, ``policy_lag`` in learner updates): base tokens with the behaviour model's
    log-probs, with ``use_importance_ratio`` (bounds ``clip``); and base tokens from older weights
    (``policy_lag > 0``, max_policy_lag) always, with bounds ``stale_clip``. Retry and auxiliary tokens
    never (R3L's off-policy rule, §4). Returns ``(mask or None, clip_low, clip_high)``: the bounds are
    floats, or per-token tensors where both kinds of bounds apply.
    """
    stale = on_policy & has_behaviour & (policy_lag > 0)
    any_stale = bool(stale.any())
    if not any_stale:
        return ((on_policy & has_behaviour) if use_importance_ratio else None), clip[0], clip[1]
    mask = (on_policy & has_behaviour) if use_importance_ratio else stale
    dtype = policy_lag.dtype if policy_lag.is_floating_point() else torch.float32

    def bound(fresh: float, old: float) -> torch.Tensor:
        return torch.where(stale, torch.tensor(float(old), dtype=dtype), torch.tensor(float(fresh), dtype=dtype))

    return mask, bound(clip[0], stale_clip[0]), bound(clip[1], stale_clip[1])


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL estimate between the policy and a frozen reference (GRPO §3).

    ``k1 = log p - log q``; ``k2 = 0.5 (log p - log q)^2``; ``k3 = exp(q - p) - (q - p) - 1``
    (unbiased, non-negative; Schulman's approximation used by GRPO).
    """
    d = logprobs - ref_logprobs
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        return torch.exp(-d) + d - 1.0
    raise ValueError(f"unknown KL estimator {kind!r}; use 'k1', 'k2' or 'k3'")


def policy_gradient_loss(
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    normalizer: Optional[float] = None,
    weights: Optional[torch.Tensor] = None,
    old_logprobs: Optional[torch.Tensor] = None,
    ratio_mask: Optional[torch.Tensor] = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logprobs: Optional[torch.Tensor] = None,
    kl_mask: Optional[torch.Tensor] = None,
    kl_coef: float = 0.0,
    kl_kind: str = "k3",
) -> tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Policy-gradient loss over credited response tokens: the sum over tokens divided by ``normalizer``
    (paper §4 "Objective"; how items are averaged is in the weights, ``loss_aggregation_weights``).

    All tensors are per token with the same shape (``advantages`` already broadcast per token).

    - Default (R3L): ``-A * log pi`` with no importance ratio, no clipping.
    - Where ``ratio_mask`` is set (on-policy base data with ``use_importance_ratio``): the clipped
      surrogate ``-min(rho A, clip(rho, 1-clip_low, 1+clip_high) A)`` with
      ``rho = exp(log pi - old_logprobs)``. Retry data never takes this branch (§4).
    - ``kl_coef > 0`` adds ``kl_coef * KL`` on tokens where ``kl_mask`` is set (base data only).
    - ``weights`` scales tokens (auxiliary items use ``aux_weight``).

    The sum is divided by ``normalizer`` (the number of credited tokens in the *whole* batch, so that
    gradient accumulation over micro-batches gives the same gradient as one big batch); by default
    the number of credited tokens in these tensors.
    """
    mask = loss_mask.to(logprobs.dtype)
    if normalizer is None:
        normalizer = float(mask.sum().clamp(min=1.0))
    adv = advantages.to(logprobs.dtype)
    pg = -adv * logprobs
    stats: Dict[str, torch.Tensor] = {}
    if ratio_mask is not None and old_logprobs is not None:
        log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
        ratio = torch.exp(log_ratio)
        clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
        surrogate = -torch.minimum(ratio * adv, clipped * adv)
        rm = ratio_mask.to(torch.bool) & loss_mask.to(torch.bool)
        pg = torch.where(rm, surrogate, pg)
        n_rm = rm.sum().clamp(min=1)
        stats["clip_fraction"] = (((ratio - clipped).abs() > 0) & rm).sum().detach() / n_rm
        stats["mean_ratio"] = (ratio * rm).sum().detach() / n_rm
    per_token = pg
    if kl_coef > 0.0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs (a frozen reference model)")
        kl = kl_penalty(logprobs, ref_logprobs, kl_kind)
        km = (kl_mask if kl_mask is not None else loss_mask).to(logprobs.dtype)
        per_token = per_token + kl_coef * kl * km
        stats["kl"] = (kl * km * mask).sum().detach() / max(normalizer, 1.0)
    if weights is not None:
        per_token = per_token * weights.to(logprobs.dtype)
    loss = (per_token * mask).sum() / normalizer
    stats["pg_loss"] = (pg * mask).sum().detach() / normalizer
    return loss, stats
