"""The math of R3L against hand-computed values (paper §3, §4, K.1)."""

import numpy as np
import pytest
import torch

from rllib_r3l import core_algos as ca


def test_group_mean_baseline_no_std():
    adv = ca.group_relative_advantages([1.0, 0.0, 0.0, 0.0], ["a"] * 4)
    np.testing.assert_allclose(adv, [0.75, -0.25, -0.25, -0.25])


def test_groups_are_independent_and_order_is_kept():
    adv = ca.group_relative_advantages([1.0, 0.0, 0.5, 0.5, 0.2], ["a", "a", "b", "b", "c"])
    np.testing.assert_allclose(adv, [0.5, -0.5, 0.0, 0.0, 0.2])  # singleton "c": baseline 0


def test_std_normalize_uses_unbiased_std():
    r = [1.0, 0.0, 0.0, 0.0]
    adv = ca.group_relative_advantages(r, ["g"] * 4, std_normalize=True, eps=0.0)
    std = np.std(r, ddof=1)  # sqrt(0.25) = 0.5
    assert std == pytest.approx(0.5)
    np.testing.assert_allclose(adv, [1.5, -0.5, -0.5, -0.5])


def test_all_equal_rewards_give_zero_advantage_even_with_std():
    adv = ca.group_relative_advantages([0.3] * 4, ["g"] * 4, std_normalize=True)
    np.testing.assert_allclose(adv, 0.0)


def test_amplification_rules():
    # rewards: success, partial above mean, partial below mean, failure
    r = np.array([1.0, 0.6, 0.2, 0.0])
    a = ca.group_relative_advantages(r, ["g"] * 4)  # mean 0.45
    np.testing.assert_allclose(a, [0.55, 0.15, -0.25, -0.45])
    amp = ca.positive_amplification(a, r, alpha=3.0, success_reward=1.0)
    np.testing.assert_allclose(amp, [1.0, 0.45, -0.25, -0.45])


def test_amplification_zero_advantage_stays_zero_and_success_is_one():
    amp = ca.positive_amplification([0.0, 0.0], [0.5, 1.0], alpha=3.0, success_reward=1.0)
    np.testing.assert_allclose(amp, [0.0, 1.0])


def test_all_failures_all_successes():
    a = ca.compute_advantages([0.0] * 4, ["g"] * 4, amplify=True)
    np.testing.assert_allclose(a, 0.0)
    a = ca.compute_advantages([1.0] * 4, ["g"] * 4, amplify=True)
    np.testing.assert_allclose(a, 1.0)  # successes are fixed at 1.0 even with zero group advantage
    a = ca.compute_advantages([1.0] * 4, ["g"] * 4, amplify=False)
    np.testing.assert_allclose(a, 0.0)


def test_singleton_group_baseline_zero_then_amplified():
    a = ca.compute_advantages([0.4], ["solo"], amplify=True, alpha=3.0)
    np.testing.assert_allclose(a, [1.2])
    a = ca.compute_advantages([-0.1], ["solo"], amplify=True, alpha=3.0)
    np.testing.assert_allclose(a, [-0.1])


def test_fixed_items_do_not_enter_group_statistics():
    # the aux item (fixed 1.0) shares a group id but must not move the base items' baseline
    a = ca.compute_advantages([1.0, 0.0, 0.0], ["g", "g", "g"], amplify=False, fixed=[None, None, 1.0])
    np.testing.assert_allclose(a, [0.5, -0.5, 1.0])


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="group_ids"):
        ca.group_relative_advantages([1.0, 2.0], ["a"])
    with pytest.raises(ValueError, match="NaN"):
        ca.group_relative_advantages([float("nan")], ["a"])
    with pytest.raises(ValueError, match="pivot"):
        ca.pivotal_credit_mask(np.ones(3, bool), np.zeros(3, int), -1)


def test_pivotal_credit_mask():
    resp = np.array([0, 1, 1, 0, 1, 1, 0, 1], dtype=bool)
    turns = np.array([0, 0, 0, 1, 1, 1, 2, 2])
    np.testing.assert_array_equal(ca.pivotal_credit_mask(resp, turns, 0), resp)
    np.testing.assert_array_equal(ca.pivotal_credit_mask(resp, turns, 2), [0, 0, 0, 0, 0, 0, 0, 1])
    np.testing.assert_array_equal(ca.pivotal_credit_mask(resp, turns, 1), [0, 0, 0, 0, 1, 1, 0, 1])


def test_policy_gradient_loss_token_mean_value_and_gradient():
    logp = torch.tensor([-1.0, -2.0, -0.5, -3.0], requires_grad=True)
    adv = torch.tensor([1.0, 1.0, -0.5, 0.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    loss, stats = ca.policy_gradient_loss(logp, adv, mask)
    # -(1*-1 + 1*-2 + -0.5*-0.5)/3 = -(-1 -2 +0.25)/3 = 2.75/3
    assert float(loss) == pytest.approx(2.75 / 3)
    loss.backward()
    np.testing.assert_allclose(logp.grad.numpy(), [-1 / 3, -1 / 3, 0.5 / 3, 0.0])


def test_policy_gradient_loss_external_normalizer_matches_big_batch():
    torch.manual_seed(0)
    logp = torch.randn(10)
    adv = torch.randn(10)
    mask = (torch.rand(10) > 0.3).float()
    full, _ = ca.policy_gradient_loss(logp, adv, mask)
    n = float(mask.sum())
    parts = [ca.policy_gradient_loss(logp[s], adv[s], mask[s], normalizer=n)[0] for s in (slice(0, 4), slice(4, 10))]
    assert float(sum(parts)) == pytest.approx(float(full), rel=1e-6)


def test_weights_scale_tokens():
    logp = torch.tensor([-1.0, -1.0])
    loss, _ = ca.policy_gradient_loss(logp, torch.ones(2), torch.ones(2), weights=torch.tensor([1.0, 0.5]))
    assert float(loss) == pytest.approx((1.0 + 0.5) / 2)


def test_clipped_ratio_only_where_ratio_mask():
    logp = torch.tensor([0.0, 0.0])  # new policy prob 1
    old = torch.log(torch.tensor([0.5, 0.5]))  # ratio 2
    adv = torch.tensor([1.0, 1.0])
    mask = torch.ones(2)
    loss, stats = ca.policy_gradient_loss(
        logp, adv, mask, old_logprobs=old, ratio_mask=torch.tensor([1.0, 0.0]), clip_low=0.2, clip_high=0.2
    )
    # token 0: -min(2*1, 1.2*1) = -1.2 ; token 1 (retry data, no ratio): -1 * 0 = 0
    assert float(loss) == pytest.approx(-1.2 / 2)
    assert float(stats["clip_fraction"]) == pytest.approx(1.0)


def test_kl_estimators():
    p = torch.tensor([-1.0])
    q = torch.tensor([-2.0])
    assert float(ca.kl_penalty(p, q, "k1")) == pytest.approx(1.0)
    assert float(ca.kl_penalty(p, q, "k2")) == pytest.approx(0.5)
    assert float(ca.kl_penalty(p, q, "k3")) == pytest.approx(np.exp(-1.0) + 1.0 - 1.0)
    with pytest.raises(ValueError, match="k1"):
        ca.kl_penalty(p, q, "k9")


def test_kl_requires_reference():
    with pytest.raises(ValueError, match="reference"):
        ca.policy_gradient_loss(torch.zeros(1), torch.ones(1), torch.ones(1), kl_coef=0.1)


def test_paper_loss_aggregation_factors_by_hand():
    # N = 10 credited tokens; two RL items (2 and 4 tokens), two auxiliary items (3 and 1 tokens)
    f = ca.loss_aggregation_weights([2, 4, 3, 1], "paper", is_aux=[False, False, True, True])
    np.testing.assert_allclose(f, [10 / (2 * 2), 10 / (2 * 4), 10 / (2 * 3), 10 / (2 * 1)])
    # an item without credited tokens gets 0 and does not count in its term's mean
    f = ca.loss_aggregation_weights([2, 0, 4], "paper", is_aux=[False, False, True])
    np.testing.assert_allclose(f, [6 / (1 * 2), 0.0, 6 / (1 * 4)])
    with pytest.raises(ValueError, match="needs is_aux"):
        ca.loss_aggregation_weights([1, 2], "paper")


def test_the_paper_rl_term_averages_over_every_trajectory_of_the_group_by_hand():
    """Paper §4, Eq. (L_RL), Algorithm 1: -(1/|G|) sum_{tau in G} (1/|tau|) sum_t A log pi over the group G.
    A group of 4 trajectories, two with advantage 0 (left out of the batch: no gradient): |G| is still 4."""
    logp = torch.tensor([[-1.0, -3.0], [-2.0, -2.0]])  # the two kept RL items
    mask = torch.ones(2, 2)
    adv = torch.tensor([0.5, -1.0])[:, None].expand(2, 2)
    factors = ca.loss_aggregation_weights(mask.sum(1).numpy(), "paper", is_aux=[False, False], num_rl_trajectories=4)
    np.testing.assert_allclose(factors, [4 / (4 * 2), 4 / (4 * 2)])
    weights = torch.tensor(factors, dtype=torch.float32)[:, None].expand(2, 2)
    loss, _ = ca.policy_gradient_loss(logp, adv, mask, weights=weights, normalizer=float(mask.sum()))
    assert float(loss) == pytest.approx(-(0.5 * (-4 / 2) + (-1.0) * (-4 / 2) + 0 + 0) / 4)  # = -0.25
    # dividing by the kept items only (what this did before) doubles it
    kept_only = ca.loss_aggregation_weights(mask.sum(1).numpy(), "paper", is_aux=[False, False])
    np.testing.assert_allclose(kept_only, 2 * factors)
    with pytest.raises(ValueError, match="below the 2 RL items"):
        ca.loss_aggregation_weights([2, 2], "paper", is_aux=[False, False], num_rl_trajectories=1)


def test_paper_objective_is_rl_trajectory_mean_plus_sft_term_by_hand():
    """L = -(1/|G|) sum_tau (1/|tau|) sum_t A log pi  +  -(1/|D_aux|) sum_aux (1/|tau|) sum_t log pi."""
    logp = torch.tensor(
        [
            [-1.0, -3.0, 0.0, 0.0],  # RL, A = 0.5
            [-2.0, -2.0, -2.0, -2.0],  # RL, A = -1
            [-1.0, -1.0, -4.0, 0.0],  # auxiliary, A = 1
            [-6.0, 0.0, 0.0, 0.0],
        ]
    )  # auxiliary, A = 1
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.float32)
    adv = torch.tensor([0.5, -1.0, 1.0, 1.0])[:, None].expand(4, 4)
    factors = ca.loss_aggregation_weights(mask.sum(1).numpy(), "paper", is_aux=[False, False, True, True])
    weights = torch.tensor(factors, dtype=torch.float32)[:, None].expand(4, 4)
    loss, _ = ca.policy_gradient_loss(logp, adv, mask, weights=weights, normalizer=float(mask.sum()))
    l_rl = -(0.5 * (-1 - 3) / 2 + (-1.0) * (-8) / 4) / 2  # -0.5
    l_sft = -((-1 - 1 - 4) / 3 + (-6) / 1) / 2  # 4.0
    assert float(loss) == pytest.approx(l_rl + l_sft) == pytest.approx(3.5)
    # the same batch under the authors' token mean: every token once, RL and auxiliary alike
    tm, _ = ca.policy_gradient_loss(logp, adv, mask, normalizer=float(mask.sum()))
    assert float(tm) == pytest.approx(-(0.5 * -4 + -1.0 * -8 + -6 + -6) / 10)


def test_ratio_selection_by_hand():
    """Base tokens with behaviour log-probs take the ratio under use_importance_ratio (clip bounds) and, when
    from older weights, always (stale bounds); retries and tokens without behaviour log-probs never."""
    on = torch.tensor([True, True, True, False])
    has = torch.tensor([True, True, False, True])
    fresh = torch.zeros(4)
    assert ca.ratio_selection(on, has, fresh, use_importance_ratio=False, clip=(0.2, 0.3), stale_clip=(0.1, 0.15)) == (
        None,
        0.2,
        0.3,
    )
    mask, low, high = ca.ratio_selection(
        on, has, fresh, use_importance_ratio=True, clip=(0.2, 0.3), stale_clip=(0.1, 0.1)
    )
    assert mask.tolist() == [True, True, False, False] and (low, high) == (0.2, 0.3)
    lag = torch.tensor([1.0, 0.0, 2.0, 3.0])  # token 2 has no behaviour log-probs, token 3 is a retry's
    mask, low, high = ca.ratio_selection(
        on, has, lag, use_importance_ratio=False, clip=(0.2, 0.3), stale_clip=(0.1, 0.15)
    )
    assert mask.tolist() == [True, False, False, False]
    assert low.tolist() == pytest.approx([0.1, 0.2, 0.2, 0.2]) and high.tolist() == pytest.approx([0.15, 0.3, 0.3, 0.3])
    mask, low, _ = ca.ratio_selection(on, has, lag, use_importance_ratio=True, clip=(0.2, 0.3), stale_clip=(0.1, 0.15))
    assert mask.tolist() == [True, True, False, False] and low.tolist() == pytest.approx([0.1, 0.2, 0.2, 0.2])


def test_the_clipped_surrogate_takes_per_token_bounds():
    lp, old = torch.tensor([0.5, 0.5]), torch.tensor([0.0, 0.0])  # both ratios e^0.5
    adv, mask = torch.ones(2), torch.ones(2)
    bounds = torch.tensor([0.1, 0.3])
    loss, st = ca.policy_gradient_loss(
        lp, adv, mask, old_logprobs=old, ratio_mask=mask.bool(), clip_low=bounds, clip_high=bounds
    )
    assert float(loss) == pytest.approx((-1.1 - 1.3) / 2) and float(st["clip_fraction"]) == 1.0
