"""The learner's loss on a real batch, against hand-computed values (paper §4 "Objective").

The batch is ``tests/scripted.py: HANDMADE`` through ``build_train_batch``: a base whose turn-0
response is pivot-masked, a base ending on an unanswered observation, a pivot-masked retry, two
auxiliary items with ``aux_weight`` 0.5 and a success, with mixed-sign advantages. The reference
is an independent full forward of the same weights: ``-A * log pi`` of the hand-counted credited
tokens, summed and divided by their number (token mean), weighted for the loss.
"""

from __future__ import annotations

import pytest
import torch

from rllib_r3l.batch import build_train_batch
from tests.learner.helpers import MID, make_learner
from tests.scripted import HANDMADE, HANDMADE_ADVANTAGES, HANDMADE_KEPT, handmade_trajectories

POSITIONS = {name: pos for name, _parts, _opts, pos in HANDMADE}
WEIGHTS = {"A": 1.0, "B": 1.0, "R": 1.0, "X": 0.5, "Y": 0.5, "V1": 1.0}
ON_POLICY = {"A": True, "B": True, "R": False, "X": False, "Y": False, "V1": True}


@pytest.fixture(scope="module")
def learner(tiny_model_dir):
    return make_learner()


def tensor_batch(**overrides):
    batch, _ = build_train_batch(
        handmade_trajectories(**overrides),
        pad_token_id=0,
        std_normalize=False,
        positive_amplification=True,
        alpha=3.0,
        success_reward=1.0,
        pivotal_credit=True,
        max_length=64,
    )
    return {k: torch.as_tensor(v) for k, v in batch.items()}


def lm_of(learner):
    return learner.module[MID].lm


def reference(lm, batch, names=HANDMADE_KEPT, advantages=None, weights=None):
    """(pg_loss, weighted loss) by hand: -A log pi over the hand-counted positions, token mean."""
    advantages = advantages or HANDMADE_ADVANTAGES
    weights = weights or WEIGHTS
    n = sum(len(POSITIONS[k]) for k in names)
    pg = wl = torch.zeros(())
    for i, k in enumerate(names):
        length = int(batch["attention_mask"][i].sum())
        ids = batch["input_ids"][i : i + 1, :length]
        logp = torch.log_softmax(lm(input_ids=ids).logits[0].float(), -1)
        lp = torch.stack([logp[p - 1, ids[0, p]] for p in POSITIONS[k]])
        term = -advantages[k] * lp.sum()
        pg = pg + term
        wl = wl + weights[k] * term
    return pg / n, wl / n


def update(learner, batch, *, restore=True):
    """One real learner update; returns (loss, pg_loss metric, gradient by parameter name). With
    ``restore`` the weights are put back afterwards, so several calls see the same weights."""
    named = dict(lm_of(learner).named_parameters())
    snapshot = {k: v.detach().clone() for k, v in named.items()}
    _, losses, _ = learner._update({MID: {k: v.clone() for k, v in batch.items()}})
    grads = {k: p.grad.detach().clone() for k, p in named.items() if p.grad is not None}
    pg = learner.metrics.peek(("r3l", "learner", "pg_loss"))
    if restore:
        with torch.no_grad():
            for k, p in named.items():
                p.copy_(snapshot[k])
    return float(losses[MID]), float(pg), grads


def flat(grads):
    return torch.cat([g.flatten() for _, g in sorted(grads.items())])


def assert_same_gradient(got, want, rel=1e-4):
    """Equal up to float rounding: the difference is tiny next to the gradient's own norm."""
    err = float(torch.linalg.vector_norm(got - want))
    assert err <= rel * float(torch.linalg.vector_norm(want)), (err, float(torch.linalg.vector_norm(want)))


def set_old_logprobs(batch, rows, value):
    """The log-probs the importance ratio divides by (the behaviour model's, where the batch has
    them; else the sampler's), set to ``value`` on ``rows`` and marked as known."""
    for key in ("sampler_logprobs", "behaviour_logprobs"):
        if key in batch:
            batch[key][rows] = value
    for key in ("has_sampler_logprobs", "has_behaviour_logprobs"):
        if key in batch:
            batch[key][rows] = 1.0


def test_loss_and_gradient_equal_the_hand_computed_token_mean(learner):
    batch = tensor_batch()
    lm = lm_of(learner)
    for p in lm.parameters():
        p.grad = None
    ref_pg, ref_loss = reference(lm, batch)
    ref_loss.backward()
    ref_pg, ref_loss = float(ref_pg.detach()), float(ref_loss.detach())
    ref_grads = {k: p.grad.detach().clone() for k, p in lm.named_parameters() if p.grad is not None}
    for p in lm.parameters():
        p.grad = None
    loss, pg, grads = update(learner, batch)
    # the weights (aux items 0.5) make the loss differ from the unweighted pg_loss
    assert abs(ref_loss - ref_pg) > 1e-3
    assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
    assert pg == pytest.approx(ref_pg, rel=1e-5, abs=1e-6)
    assert grads.keys() == ref_grads.keys()
    assert_same_gradient(flat(grads), flat(ref_grads))


def test_flipped_advantage_sign_flips_the_gradient(learner):
    batch = tensor_batch()
    _, _, g = update(learner, batch)
    batch["advantages"] = -batch["advantages"]
    _, _, g_neg = update(learner, batch)
    assert_same_gradient(flat(g_neg), -flat(g))


def test_tokens_no_credited_token_sees_leave_the_gradient_unchanged(learner):
    """Prompt/observation tokens after the last credited token and padding are not scored: changing
    them (and the sampler log-probs, without importance ratio) changes nothing. Changing a credited
    token does."""
    batch = tensor_batch()
    _, _, g = update(learner, batch)
    changed = {k: v.clone() for k, v in batch.items()}
    for i, k in enumerate(HANDMADE_KEPT):
        last = max(POSITIONS[k])
        changed["input_ids"][i, last + 1 :] = 7  # trailing observation (row B) and padding
    assert not torch.equal(changed["input_ids"], batch["input_ids"])
    changed["sampler_logprobs"] = torch.full_like(batch["sampler_logprobs"], -3.0)
    _, _, g_same = update(learner, changed)
    assert_same_gradient(flat(g_same), flat(g), rel=1e-5)
    credited = {k: v.clone() for k, v in batch.items()}
    credited["input_ids"][1, POSITIONS["B"][-1]] = 7
    _, _, g_other = update(learner, credited)
    assert (flat(g_other) - flat(g)).abs().max() > 1e-6


@pytest.mark.slow
def test_scaling_an_items_weight_scales_its_gradient_contribution(learner):
    """Loss linear in each item's weight: g(w=3) - g(w=1) = 2 (g(w=1) - g(w=0)) for the aux item X."""
    row = HANDMADE_KEPT.index("X")
    grads = {}
    for w in (0.0, 1.0, 3.0):
        batch = tensor_batch()
        batch["weights"][row] = w
        grads[w] = flat(update(learner, batch)[2])
    contribution = grads[1.0] - grads[0.0]
    assert contribution.abs().max() > 1e-6
    assert_same_gradient(grads[3.0] - grads[1.0], 2 * contribution, rel=1e-3)
    # and aux_weight reaches the batch: the default HANDMADE aux items carry 0.5
    assert tensor_batch()["weights"][row] == 0.5


@pytest.mark.slow
def test_importance_ratio_applies_to_base_rows_only(tiny_model_dir):
    """With use_importance_ratio, the sampler log-probs of retry and auxiliary rows do not matter
    (no ratio for off-policy data, paper §4); those of base rows do."""
    lr = make_learner(use_importance_ratio=True)
    batch = tensor_batch()
    everything = list(range(len(HANDMADE_KEPT)))
    set_old_logprobs(batch, everything, -1.0)  # far above the tiny model's (~ -10.8): ratios ~ 0
    _, _, g = update(lr, batch)
    off = [i for i, k in enumerate(HANDMADE_KEPT) if not ON_POLICY[k]]
    on = [i for i, k in enumerate(HANDMADE_KEPT) if ON_POLICY[k]]
    changed = {k: v.clone() for k, v in batch.items()}
    set_old_logprobs(changed, off, -11.0)
    _, _, g_off = update(lr, changed)
    assert_same_gradient(flat(g_off), flat(g), rel=1e-5)
    changed = {k: v.clone() for k, v in batch.items()}
    set_old_logprobs(changed, on, -11.0)  # near the tiny model's log-probs: ratios near 1
    _, _, g_on = update(lr, changed)
    assert (flat(g_on) - flat(g)).abs().max() > 1e-6


@pytest.mark.slow
def test_grad_clip_bounds_the_gradient_the_optimizer_applies(tiny_model_dir):
    def step_norms(learner):
        norms = []
        for opt in learner._optimizer_parameters:
            orig = opt.step

            def step(*a, _orig=orig, _opt=opt, **kw):
                gs = [p.grad for group in _opt.param_groups for p in group["params"] if p.grad is not None]
                norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in gs]))))
                return _orig(*a, **kw)

            opt.step = step
        return norms

    batch = tensor_batch()
    free = make_learner(grad_clip=None)
    free_norms = step_norms(free)
    update(free, batch)
    clipped = make_learner(grad_clip=1e-3)
    clipped_norms = step_norms(clipped)
    named = dict(lm_of(clipped).named_parameters())
    before = {k: v.detach().clone() for k, v in named.items()}
    update(clipped, batch, restore=False)
    assert free_norms and clipped_norms
    assert free_norms[0] > 1e-2  # the raw gradient is far above the clip
    assert clipped_norms[0] <= 1e-3 * (1 + 1e-4)
    assert clipped_norms[0] == pytest.approx(1e-3, rel=1e-3)  # clipped to the bound, not zeroed
    # the clipped step was still applied
    assert any(not torch.equal(before[k], p.detach()) for k, p in named.items())
