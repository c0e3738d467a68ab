"""More hand values for the core math and batch helpers: defaults, dtypes, error messages and the
edges that mutation testing (docs/mutation.md) showed no test pinned."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rllib_r3l import core_algos as ca
from rllib_r3l.batch import build_train_batch, kind_counts, loss_share_by_kind, select_trainable
from rllib_r3l.trajectory import Kind
from tests.scripted import make_trajectory


def test_compute_advantages_defaults_are_r3l_amplification_with_alpha_3():
    # group mean 0.24: success -> 1.0, partial 0.26 above the mean -> x3, the rest unchanged
    adv = ca.compute_advantages([1.0, 0.5, 0.0, 0.0, -0.3], ["g"] * 5)
    np.testing.assert_allclose(adv, [1.0, 0.78, -0.24, -0.24, -0.54], rtol=1e-9)
    plain = ca.compute_advantages([1.0, 0.5, 0.0, 0.0, -0.3], ["g"] * 5, amplify=False)
    np.testing.assert_allclose(plain, [0.76, 0.26, -0.24, -0.24, -0.54], rtol=1e-9)


def test_group_relative_advantages_edges():
    # integer rewards still give float advantages
    np.testing.assert_allclose(ca.group_relative_advantages([1, 0, 0, 0], ["g"] * 4), [0.75, -0.25, -0.25, -0.25])
    # a singleton group first does not end the loop over groups
    np.testing.assert_allclose(ca.group_relative_advantages([0.4, 1.0, 0.0], ["s", "g", "g"]), [0.4, 0.5, -0.5])
    # std normalisation: the default eps is tiny; a given eps is added to the std
    r = [1.0, 0.0, 0.0, 0.0]  # std 0.5
    np.testing.assert_allclose(
        ca.group_relative_advantages(r, ["g"] * 4, std_normalize=True),
        np.array([0.75, -0.25, -0.25, -0.25]) / (0.5 + 1e-6),
        rtol=1e-9,
    )
    np.testing.assert_allclose(
        ca.group_relative_advantages(r, ["g"] * 4, std_normalize=True, eps=0.5), [0.75, -0.25, -0.25, -0.25], rtol=1e-9
    )
    with pytest.raises(ValueError, match=r"^rewards must be 1-D, got shape \(1, 2\)$"):
        ca.group_relative_advantages([[1.0, 0.0]], ["g"])
    with pytest.raises(ValueError, match=r"^rewards contain NaN or inf; fix the environment's reward$"):
        ca.group_relative_advantages([float("inf"), 0.0], ["g", "g"])


def test_positive_amplification_defaults_dtypes_and_errors():
    # defaults: alpha 3, success at reward 1.0
    np.testing.assert_allclose(ca.positive_amplification([0.5, 0.2, -0.3], [1.0, 0.7, 0.2]), [1.0, 0.6, -0.3])
    out = ca.positive_amplification([1, 0, -1], [0.5, 0.2, 0.0], alpha=2.5)  # integer advantages
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, [2.5, 0.0, -1.0])
    with pytest.raises(ValueError, match=r"advantages \(2,\) and rewards \(1,\) differ in shape"):
        ca.positive_amplification([0.1, 0.2], [1.0])


def test_compute_advantages_passes_every_option_on():
    r, g = [1.0, 0.5, 0.0, 0.0], ["g"] * 4  # mean 0.375, std 0.4787
    sd = float(np.std(r, ddof=1))
    std = ca.compute_advantages(r, g, std_normalize=True, amplify=False)
    np.testing.assert_allclose(std, (np.array(r) - 0.375) / (sd + 1e-6), rtol=1e-9)
    np.testing.assert_allclose(ca.compute_advantages(r, g, alpha=2.0), [1.0, 0.25, -0.375, -0.375])
    # success_reward 0.5: the 0.5 is a success too
    np.testing.assert_allclose(ca.compute_advantages(r, g, success_reward=0.5), [1.0, 1.0, -0.375, -0.375])


def test_compute_advantages_rejects_a_fixed_list_of_the_wrong_length():
    with pytest.raises(ValueError, match="fixed has 1 entries but rewards has 2"):
        ca.compute_advantages([1.0, 0.0], ["g", "g"], fixed=[None])


def test_pivotal_credit_mask_is_boolean_for_integer_masks():
    out = ca.pivotal_credit_mask(np.array([0, 2, 1, 1]), np.array([0, 0, 1, 1]), 1)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, [False, False, True, True])
    with pytest.raises(ValueError, match=r"response_mask \(3,\) and turn_ids \(2,\) differ"):
        ca.pivotal_credit_mask(np.ones(3, bool), np.zeros(2, int), 0)


def test_kl_estimators_away_from_one_and_k3_by_default():
    p, q = torch.tensor([-1.0, 0.5]), torch.tensor([-3.0, 0.0])  # d = 2, 0.5
    torch.testing.assert_close(ca.kl_penalty(p, q, "k1"), torch.tensor([2.0, 0.5]))
    torch.testing.assert_close(ca.kl_penalty(p, q, "k2"), torch.tensor([2.0, 0.125]))
    k3 = torch.exp(torch.tensor([-2.0, -0.5])) + torch.tensor([2.0, 0.5]) - 1.0
    torch.testing.assert_close(ca.kl_penalty(p, q, "k3"), k3)
    torch.testing.assert_close(ca.kl_penalty(p, q), k3)


def test_kind_counts_names_every_kind():
    trajs = [
        make_trajectory([("prompt", 1, 0), ("response", 1, 0)], reward=0.0, group_id="g", kind=k)
        for k in (Kind.BASE, Kind.BASE, Kind.RETRY, Kind.RETRY_SFT)
    ]
    assert kind_counts(trajs) == {"base": 2, "retry": 1, "reflection_sft": 0, "retry_sft": 1}
    assert kind_counts([]) == {"base": 0, "retry": 0, "reflection_sft": 0, "retry_sft": 0}


def test_loss_share_by_kind_hand_values():
    # group g: success (3 tokens) and failure (2 tokens), mean 0.5 -> amplified +1.0 and -0.5:
    # base mass 1.0*3 + 0.5*2 = 4; a reflection item (fixed +1.0, weight 0.5, 4 tokens): 2; total 6
    win = make_trajectory([("prompt", 2, 0), ("response", 3, 0)], reward=1.0, group_id="g")
    win.success = True
    lose = make_trajectory([("prompt", 2, 0), ("response", 2, 0)], reward=0.0, group_id="g")
    refl = make_trajectory(
        [("prompt", 5, 0), ("response", 4, 0)],
        reward=1.0,
        group_id="g/reflection",
        kind=Kind.REFLECTION_SFT,
        weight=0.5,
        fixed_advantage=1.0,
    )
    batch, _ = _build([win, lose, refl])
    share = loss_share_by_kind(batch)
    assert share["base"]["credited_tokens"] == 5 and share["reflection_sft"]["credited_tokens"] == 4
    assert share["base"]["loss_share"] == pytest.approx(4 / 6)
    assert share["reflection_sft"]["loss_share"] == pytest.approx(2 / 6)
    assert share["retry"] == {"credited_tokens": 0.0, "loss_share": 0.0}
    assert sum(v["loss_share"] for v in share.values()) == pytest.approx(1.0)


def test_loss_aggregation_weights_hand_values():
    # N = 1 + 3 + 0 + 4 = 8 credited tokens over B = 3 items: factors N / (B n_i)
    np.testing.assert_allclose(ca.loss_aggregation_weights([1, 3, 0, 4], "sequence_mean"), [8 / 3, 8 / 9, 0.0, 8 / 12])
    np.testing.assert_allclose(ca.loss_aggregation_weights([1, 3, 0, 4]), [1.0, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(ca.loss_aggregation_weights([0, 0], "sequence_mean"), [0.0, 0.0])
    with pytest.raises(ValueError, match="loss_aggregation='seq'.*token_mean"):
        ca.loss_aggregation_weights([1], "seq")


def test_sequence_mean_loss_is_the_mean_of_item_token_means():
    # item 1: tokens log-probs (-1, -3), A = +1 -> token mean 2.0; item 2: (-2,), A = -0.5 -> -1.0
    # sequence mean: (2.0 - 1.0) / 2 = 0.5 (the token mean would be (1 + 3 - 1) / 3 = 1.0)
    logp = torch.tensor([-1.0, -3.0, -2.0])
    adv = torch.tensor([1.0, 1.0, -0.5])
    factors = ca.loss_aggregation_weights([2, 1], "sequence_mean")
    w = torch.tensor([factors[0], factors[0], factors[1]], dtype=torch.float32)
    loss, _ = ca.policy_gradient_loss(logp, adv, torch.ones(3), weights=w)
    assert float(loss) == pytest.approx(0.5)
    plain, _ = ca.policy_gradient_loss(logp, adv, torch.ones(3))
    assert float(plain) == pytest.approx(1.0)


def test_build_train_batch_folds_sequence_mean_into_the_kept_items_weights():
    win = make_trajectory([("prompt", 2, 0), ("response", 3, 0)], reward=1.0, group_id="g")
    lose = make_trajectory([("prompt", 2, 0), ("response", 1, 0)], reward=0.0, group_id="g")
    flat = make_trajectory([("prompt", 2, 0), ("response", 5, 0)], reward=0.0, group_id="h")  # A = 0: left out
    batch, _ = _build([win, lose, flat], loss_aggregation="sequence_mean")
    assert batch["num_loss_tokens"].tolist() == [3, 1]
    np.testing.assert_allclose(batch["weights"], [4 / 6, 4 / 2])  # N = 4, B = 2
    plain, _ = _build([win, lose, flat])
    np.testing.assert_allclose(plain["weights"], [1.0, 1.0])


def _build(trajs, **kw):
    opts = dict(
        pad_token_id=0,
        std_normalize=False,
        positive_amplification=True,
        alpha=3.0,
        success_reward=1.0,
        pivotal_credit=True,
        max_length=64,
    )
    opts.update(kw)
    return build_train_batch(trajs, **opts)


def test_a_row_with_a_single_credited_token_is_kept_and_an_empty_one_left_out():
    one = make_trajectory([("prompt", 2, 0), ("response", 1, 0)], reward=1.0, group_id="g")
    none = make_trajectory([("prompt", 2, 0), ("response", 1, 0)], reward=0.0, group_id="g", credit_from_turn=1)
    batch, adv = _build([one, none])
    np.testing.assert_allclose(adv, [1.0, -0.5])
    assert batch["num_loss_tokens"].tolist() == [1.0]
    assert batch["advantages"].tolist() == [1.0]
    assert batch["input_ids"].shape == (1, 3)  # every column kept: the longest row is the kept one


def test_zero_advantage_rows_leave_by_default_and_nothing_else_does():
    a = make_trajectory([("prompt", 2, 0), ("response", 2, 0)], reward=0.5, group_id="g")
    b = make_trajectory([("prompt", 2, 0), ("response", 2, 0)], reward=0.5, group_id="g")
    c = make_trajectory([("prompt", 2, 0), ("response", 2, 0)], reward=1.0, group_id="h")  # singleton: A = r
    d = make_trajectory([("prompt", 2, 0), ("response", 2, 0)], reward=0.0, group_id="h2")  # singleton: A = 0
    batch, _ = _build([a, b, c, d])  # a, b: equal rewards, advantage 0
    assert batch["advantages"].tolist() == [1.0]
    assert len(batch["input_ids"]) == len(batch["loss_mask"]) == len(batch["weights"]) == 1


def test_select_trainable_counts_and_drops_partial_groups():
    from rllib_r3l.runner.explore import GroupResult

    t = [make_trajectory([("prompt", 1, 0), ("response", 1, 0)], reward=0.0, group_id=g) for g in "abbcc"]
    p1 = GroupResult("a", trajectories=t[:1], lost=[t[0], t[0]], complete=False)
    whole = GroupResult("b", trajectories=t[1:3])
    p2 = GroupResult("c", trajectories=t[3:], lost=[t[3]], complete=False)
    out, counts = select_trainable([p1, whole, p2])
    assert out == t[1:3]
    assert dict(counts) == {
        "groups": 3,
        "episodes_lost": 3,
        "partial_groups": 2,
        "episodes_dropped_with_partial_group": 3,
    }
    out, counts = select_trainable([p1, whole, p2], drop_partial_groups=False)
    assert out == t
    assert dict(counts) == {"groups": 3, "episodes_lost": 3, "partial_groups": 2}


def test_fixed_advantages_override_and_stay_out_of_group_statistics():
    base = [make_trajectory([("prompt", 2, 0), ("response", 2, 0)], reward=r, group_id="g") for r in (0.5, 0.0)]
    # an auxiliary item that shares the group id and would score 0.5 x 3 on its own: fixed 1.0
    aux = make_trajectory(
        [("prompt", 2, 0), ("response", 2, 0)],
        reward=0.5,
        group_id="g",
        kind=Kind.REFLECTION_SFT,
        fixed_advantage=1.0,
        weight=0.25,
    )
    batch, adv = _build(base + [aux])
    np.testing.assert_allclose(adv, [0.75, -0.25, 1.0])  # base mean 0.25 (the aux item not in it)
    assert batch["weights"].tolist() == [1.0, 1.0, 0.25]


def _pg(logp, adv, **kw):
    t = torch.tensor
    loss, stats = ca.policy_gradient_loss(t(logp), t(adv), torch.ones(len(logp)), **kw)
    return float(loss), stats


def test_clipped_surrogate_default_bounds_and_both_sides():
    # new prob 1 vs old 0.5 / 2.0: ratios 2 and 0.5; defaults clip to [0.8, 1.2]
    old = torch.log(torch.tensor([0.5, 2.0]))
    on = torch.ones(2)
    # A = 2 (ratio 2): -min(4, 2.4) = -2.4 ; A = -0.5 (ratio 0.5): -min(-0.25, -0.4) = 0.4
    loss, stats = _pg([0.0, 0.0], [2.0, -0.5], old_logprobs=old, ratio_mask=on)
    assert loss == pytest.approx((-2.4 + 0.4) / 2)
    assert float(stats["clip_fraction"]) == 1.0 and float(stats["mean_ratio"]) == pytest.approx(1.25)
    # explicit, asymmetric bounds: [0.9, 1.5]
    loss, _ = _pg([0.0, 0.0], [2.0, -0.5], old_logprobs=old, ratio_mask=on, clip_low=0.1, clip_high=0.5)
    assert loss == pytest.approx((-3.0 + 0.45) / 2)


def test_log_ratio_is_clamped_to_plus_minus_20():
    # log ratios of +30 and -30 count as +-20: -min(e^20 A, 1.2 A) with A < 0, -min(e^-20 A, 0.8 A) with A > 0
    loss, _ = _pg([0.0], [-1.0], old_logprobs=torch.tensor([-30.0]), ratio_mask=torch.ones(1))
    assert loss == pytest.approx(np.exp(20.0), rel=1e-5)
    loss, _ = _pg([-30.0], [1.0], old_logprobs=torch.tensor([0.0]), ratio_mask=torch.ones(1))
    assert loss == pytest.approx(-np.exp(-20.0), rel=1e-5)


def test_old_logprobs_without_ratio_mask_is_the_plain_objective():
    loss, stats = _pg([-1.0, -2.0], [1.0, -1.0], old_logprobs=torch.tensor([-5.0, -5.0]))
    assert loss == pytest.approx((1.0 - 2.0) / 2) and "mean_ratio" not in stats


def test_kl_term_defaults_to_k3_and_a_single_token_is_its_own_mean():
    d = torch.tensor([0.5])  # log p - log q
    loss, stats = ca.policy_gradient_loss(
        torch.tensor([-1.0]), torch.zeros(1), torch.ones(1), ref_logprobs=torch.tensor([-1.5]), kl_coef=0.1
    )
    k3 = float(torch.exp(-d) + d - 1.0)
    assert float(loss) == pytest.approx(0.1 * k3) and float(stats["kl"]) == pytest.approx(k3)
    # one credited token: the token mean divides by 1
    loss, _ = ca.policy_gradient_loss(torch.tensor([-2.0, -7.0]), torch.tensor([1.5, 9.0]), torch.tensor([1.0, 0.0]))
    assert float(loss) == pytest.approx(3.0)


def test_boolean_masks_and_integer_advantages():
    loss, stats = ca.policy_gradient_loss(
        torch.tensor([-1.0, -2.0, -4.0]), torch.tensor([2, -1, 3]), torch.tensor([True, True, False])
    )
    assert loss.dtype == torch.float32 and float(loss) == pytest.approx((2.0 - 2.0) / 2)
    assert float(stats["pg_loss"]) == pytest.approx(0.0)


def test_one_trajectory_per_micro_batch():
    from rllib_r3l.batch import plan_micro_batches

    assert plan_micro_batches([3, 9, 5], max_sequences=1) == [[1], [2], [0]]


def test_policy_gradient_loss_every_term_and_statistic_by_hand():
    """Ratio on some tokens, KL on others, weights, a masked token: the loss and every statistic."""
    t = torch.tensor
    logp = t([-1.0, -2.0, -0.5, -3.0])
    old = t([-1.5, -2.0, -0.5, -3.0])  # ratios e^0.5, 1, 1, 1
    adv = t([1.0, -1.0, 2.0, 5.0])
    mask = t([1.0, 1.0, 1.0, 0.0])  # token 3 carries no credit
    ratio_mask = t([1.0, 0.0, 1.0, 1.0])  # token 1: no ratio (retry data)
    kl_mask = t([1.0, 0.0, 1.0, 1.0])
    ref = t([-1.0, -1.0, -1.0, -1.0])
    weights = t([1.0, 2.0, 0.5, 1.0])
    loss, stats = ca.policy_gradient_loss(
        logp,
        adv,
        mask,
        weights=weights,
        old_logprobs=old,
        ratio_mask=ratio_mask,
        ref_logprobs=ref,
        kl_mask=kl_mask,
        kl_coef=0.1,
    )
    r0 = np.exp(0.5)
    # policy term: token 0 clipped -min(r0 * 1, 1.2 * 1) = -1.2; token 1 plain -(-1)(-2) = -2; token 2 ratio 1: -2
    pg = [-1.2, -2.0, -2.0]
    k3 = [0.0, np.e - 2.0, np.exp(-0.5) - 0.5]  # d = 0, -1, 0.5 (kl_mask drops token 1)
    kl_terms = [0.1 * k3[0], 0.0, 0.1 * k3[2]]
    expected = sum(w * (p + k) for w, p, k in zip([1.0, 2.0, 0.5], pg, kl_terms)) / 3
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(stats["pg_loss"]) == pytest.approx(sum(pg) / 3, rel=1e-6)
    assert float(stats["kl"]) == pytest.approx((k3[0] + k3[2]) / 3, rel=1e-5)
    assert float(stats["clip_fraction"]) == pytest.approx(0.5)  # token 0 of the two ratio tokens
    assert float(stats["mean_ratio"]) == pytest.approx((r0 + 1.0) / 2, rel=1e-6)
    loss_k1, _ = ca.policy_gradient_loss(
        logp,
        adv,
        mask,
        weights=weights,
        old_logprobs=old,
        ratio_mask=ratio_mask,
        ref_logprobs=ref,
        kl_mask=kl_mask,
        kl_coef=0.1,
        kl_kind="k1",
    )
    k1_terms = [0.0, 0.0, 0.1 * 0.5]
    assert float(loss_k1) == pytest.approx(
        sum(w * (p + k) for w, p, k in zip([1.0, 2.0, 0.5], pg, k1_terms)) / 3, rel=1e-6
    )
    with pytest.raises(ValueError, match=r"^kl_coef > 0 needs ref_logprobs \(a frozen reference model\)$"):
        ca.policy_gradient_loss(logp, adv, mask, kl_coef=0.1)


def test_build_train_batch_passes_success_reward_on():
    trajs = [make_trajectory([("prompt", 2, 0), ("response", 2, 0)], reward=r, group_id="g") for r in (0.5, 0.0)]
    _, adv = _build(trajs, success_reward=0.5)
    np.testing.assert_allclose(adv, [1.0, -0.25])  # 0.5 is a success: exactly 1.0
