"""Credit at the batch level: what ``build_train_batch`` hands the learner, row by row.

The learner reads ``loss_mask``, ``num_loss_tokens``, ``advantages``, ``weights`` and ``on_policy``
of the padded batch, not each trajectory's own arrays; these tests pin those rows to hand-counted
positions (``tests/scripted.py: HANDMADE``) and hand-computed advantages.
"""

from __future__ import annotations

import numpy as np
import pytest

from rllib_r3l.batch import build_train_batch
from tests.scripted import HANDMADE, HANDMADE_ADVANTAGES, HANDMADE_KEPT, handmade_trajectories

PAD = 0
POSITIONS = {name: pos for name, _parts, _opts, pos in HANDMADE}
LENGTHS = {name: sum(n for _r, n, _t in parts) for name, parts, _opts, _pos in HANDMADE}


def build(trajs, **kw):
    opts = dict(
        pad_token_id=PAD,
        std_normalize=False,
        positive_amplification=True,
        alpha=3.0,
        success_reward=1.0,
        pivotal_credit=True,
        max_length=64,
    )
    opts.update(kw)
    return build_train_batch(trajs, **opts)


def rows_as_positions(batch):
    return [np.flatnonzero(row).tolist() for row in batch["loss_mask"]]


def test_batch_rows_carry_pivotal_credit_weights_and_on_policy():
    trajs = handmade_trajectories()
    batch, adv = build(trajs)
    # advantages of every trajectory (before rows are left out), by hand
    np.testing.assert_allclose(adv, [HANDMADE_ADVANTAGES[t.task] for t in trajs], rtol=1e-6)
    kept = HANDMADE_KEPT
    assert len(batch["input_ids"]) == len(kept)
    # loss_mask: exactly the credited response positions; prompts, observations, the pivot-masked
    # prefix and the padding are 0
    assert rows_as_positions(batch) == [POSITIONS[k] for k in kept]
    assert batch["loss_mask"].dtype == np.float32 and set(np.unique(batch["loss_mask"])) <= {0.0, 1.0}
    np.testing.assert_array_equal(batch["num_loss_tokens"], [len(POSITIONS[k]) for k in kept])
    np.testing.assert_allclose(batch["advantages"], [HANDMADE_ADVANTAGES[k] for k in kept], rtol=1e-6)
    np.testing.assert_array_equal(batch["weights"], [1.0, 1.0, 1.0, 0.5, 0.5, 1.0])
    # only base rollouts are on-policy (importance ratio / KL may apply); retries and aux items never
    np.testing.assert_array_equal(batch["on_policy"], [1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    # right padding: real tokens, then pad ids with attention 0
    T = max(LENGTHS[k] for k in kept)
    assert batch["input_ids"].shape == (len(kept), T)
    by_name = {t.task: t for t in trajs}
    for i, k in enumerate(kept):
        n = LENGTHS[k]
        assert batch["input_ids"][i, :n].tolist() == by_name[k].token_ids
        assert (batch["input_ids"][i, n:] == PAD).all()
        assert batch["attention_mask"][i].tolist() == [1] * n + [0] * (T - n)
        assert (batch["sampler_logprobs"][i][batch["loss_mask"][i] > 0] == -1.0).all()


def test_pivotal_credit_off_credits_every_response_token():
    trajs = handmade_trajectories()
    batch, _ = build(trajs, pivotal_credit=False)
    # V2 now has credited tokens and stays; Z1/Z2 (advantage 0) still leave
    kept = ["A", "B", "R", "X", "Y", "V1", "V2"]
    full = {"A": [3, 4, 7, 8, 9], "R": [3, 4, 7, 8, 10, 11], "Y": [2, 6, 7], "V2": [2, 3, 5]}
    assert rows_as_positions(batch) == [full.get(k, POSITIONS[k]) for k in kept]
    np.testing.assert_array_equal(batch["num_loss_tokens"], [len(full.get(k, POSITIONS[k])) for k in kept])
    np.testing.assert_array_equal(batch["on_policy"], [1, 1, 0, 0, 0, 1, 0])


def test_zero_advantage_rows_stay_when_asked_and_rows_without_credit_always_leave():
    trajs = handmade_trajectories()
    batch, _ = build(trajs, skip_zero_advantage=False)
    kept = ["A", "B", "R", "X", "Y", "Z1", "Z2", "V1"]
    assert rows_as_positions(batch) == [POSITIONS[k] for k in kept]
    np.testing.assert_allclose(batch["advantages"], [HANDMADE_ADVANTAGES[k] for k in kept], rtol=1e-6)


def test_amplification_and_std_switches_reach_the_batch():
    trajs = handmade_trajectories()
    plain, _ = build(trajs, positive_amplification=False, skip_zero_advantage=False)
    # group g without amplification: r - mean; v: 0.5, -0.5 (V2 left out: no credited token)
    g_mean = 1.7 / 3
    np.testing.assert_allclose(
        plain["advantages"], [0.0 - g_mean, 0.7 - g_mean, 1.0 - g_mean, 1.0, 1.0, 0.0, 0.0, 0.5], rtol=1e-6
    )
    std, _ = build(trajs, positive_amplification=False, std_normalize=True, skip_zero_advantage=False)
    sd = float(np.std([0.0, 0.7, 1.0], ddof=1))
    np.testing.assert_allclose(std["advantages"][:3], [(r - g_mean) / (sd + 1e-6) for r in (0.0, 0.7, 1.0)], rtol=1e-5)
    amp5, _ = build(trajs, alpha=5.0)
    assert amp5["advantages"][1] == pytest.approx((0.7 - g_mean) * 5.0)


def test_trajectory_longer_than_max_length_is_an_error():
    with pytest.raises(ValueError, match="max_context_tokens"):
        build(handmade_trajectories(), max_length=11)


def test_scripted_exploration_batch_rows(tiny_tokenizer):
    """Reflect-then-retry for real (scripted choices): every row of the learner batch is credited
    from the pivot on, only base rows are on-policy, auxiliary rows carry ``aux_weight``."""
    from rllib_r3l.batch import select_trainable
    from rllib_r3l.trajectory import Kind
    from tests.scripted import SEED, make_explorer

    ex, _ = make_explorer(tiny_tokenizer, pivot=1, aux_weight=0.25)
    trajs, _ = select_trainable(ex.explore([SEED], ["g0"]))
    batch, adv = build(trajs, skip_zero_advantage=False, max_length=4096)
    assert len(batch["input_ids"]) == len(trajs)
    kinds = [t.kind for t in trajs]
    assert sorted(k.value for k in set(kinds)) == ["base", "reflection_sft", "retry", "retry_sft"]
    for i, t in enumerate(trajs):
        ids = t.token_ids
        row = batch["loss_mask"][i]
        # credited tokens = response tokens of turns >= credit_from_turn, counted from the segments
        expected = []
        pos = 0
        for s in t.segments:
            if s.role == "response" and s.turn >= t.credit_from_turn:
                expected.extend(range(pos, pos + len(s.token_ids)))
            pos += len(s.token_ids)
        assert np.flatnonzero(row).tolist() == expected, t.kind
        assert batch["input_ids"][i, : len(ids)].tolist() == ids
        assert batch["num_loss_tokens"][i] == len(expected)
        assert batch["on_policy"][i] == float(t.kind is Kind.BASE)
        aux = t.kind in (Kind.REFLECTION_SFT, Kind.RETRY_SFT)
        assert batch["weights"][i] == (0.25 if aux else 1.0)
        if t.kind in (Kind.BASE, Kind.RETRY, Kind.RETRY_SFT):
            assert t.credit_from_turn == 1 and expected  # the pivot masks turn 0 on every side
    assert adv[kinds.index(Kind.BASE)] == pytest.approx(-0.5)


def test_paper_loss_aggregation_puts_auxiliary_items_in_their_own_term():
    # kept rows A, B, R, V1 (RL: 3, 3, 4, 2 credited tokens) and X, Y (auxiliary: 3, 2; weight 0.5): N = 17.
    # The paper's L_RL averages over every RL trajectory of the groups: A, B, R, Z1, Z2, V1, V2 (7), the
    # zero-advantage Z1, Z2 and the uncredited V2 left out of the batch included
    batch, _ = build(handmade_trajectories(), loss_aggregation="paper")
    rl, aux = 17 / 7, 17 / 2
    want = [rl / 3, rl / 3, rl / 4, 0.5 * aux / 3, 0.5 * aux / 2, rl / 2]  # HANDMADE_KEPT order
    np.testing.assert_allclose(batch["weights"], want, rtol=1e-6)
    tm, _ = build(handmade_trajectories(), loss_aggregation="token_mean")
    np.testing.assert_allclose(tm["weights"], [1, 1, 1, 0.5, 0.5, 1])


def test_mark_policy_lag_counts_updates_since_each_items_weights():
    from rllib_r3l.batch import mark_policy_lag

    batch = {"policy_version": np.asarray([3, 5, -1, 4])}  # -1: not recorded (counted as fresh)
    assert mark_policy_lag(batch, 5) == 2
    assert batch["policy_lag"].tolist() == [2.0, 0.0, 0.0, 1.0] and batch["policy_lag"].dtype == np.float32
