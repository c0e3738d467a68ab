"""Learner mechanics: micro-batch planning, mask-free right-padded forward, accumulation, precision."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.learner.helpers import uneven_batch
from tests.scripted_rllib import build_learner, grads_after_update


# -- plan_micro_batches (pure) -------------------------------------------------------------------------
def test_plan_micro_batches_hand_values():
    from rllib_r3l.batch import plan_micro_batches

    lengths = [5, 12, 7, 12, 3]
    # longest first; 2 per micro-batch; 24 padded tokens allow two 12s
    assert plan_micro_batches(lengths, max_sequences=2, max_tokens=24) == [[1, 3], [2, 0], [4]]
    # 20 padded tokens: the two 12s part; 7 and 5 share (2 x 7 = 14)
    assert plan_micro_batches(lengths, max_sequences=2, max_tokens=20) == [[1], [3], [2, 0], [4]]
    assert plan_micro_batches(lengths, max_sequences=3, max_tokens=None) == [[1, 3, 2], [0, 4]]
    # a trajectory longer than the budget still trains, alone
    assert plan_micro_batches([50, 4], max_sequences=4, max_tokens=10) == [[0], [1]]
    assert plan_micro_batches([], max_sequences=2) == []
    with pytest.raises(ValueError, match="max_sequences"):
        plan_micro_batches([1], max_sequences=0)


def test_plan_micro_batches_covers_every_index_once_within_budget():
    from rllib_r3l.batch import plan_micro_batches

    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = rng.integers(1, 100, size=rng.integers(1, 30)).tolist()
        plan = plan_micro_batches(lengths, max_sequences=4, max_tokens=150)
        assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
        for mb in plan:
            assert len(mb) <= 4
            assert len(mb) == 1 or len(mb) * max(lengths[i] for i in mb) <= 150


# -- mask-free forward of right-padded batches ---------------------------------------------------------
def test_right_padded_detection():
    from rllib_r3l.learner.rl_module import right_padded

    assert right_padded(torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]]))
    assert not right_padded(torch.tensor([[1, 1, 1], [0, 1, 1]]))  # left padding
    assert not right_padded(torch.tensor([[1, 0, 1]]))  # a hole
    assert not right_padded(torch.tensor([[0, 0, 0]]))


def test_right_padded_batch_logprobs_equal_unpadded_per_sequence(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rllib_r3l.learner.rl_module import R3LCausalLMModule

    lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    shim = type("Shim", (), {"lm": lm})()
    g = torch.Generator().manual_seed(0)
    lens = [11, 7, 4]
    T = max(lens)
    ids = torch.zeros(3, T, dtype=torch.long)
    att = torch.zeros(3, T, dtype=torch.long)
    loss = torch.zeros(3, T)
    for i, n in enumerate(lens):
        ids[i, :n] = torch.randint(1, lm.config.vocab_size, (n,), generator=g)
        att[i, :n] = 1
        loss[i, 1:n] = 1.0
    with torch.no_grad():
        batched = R3LCausalLMModule.token_logprobs(shim, {"input_ids": ids, "attention_mask": att, "loss_mask": loss})
        singles = [
            R3LCausalLMModule.token_logprobs(
                shim,
                {
                    "input_ids": ids[i : i + 1, :n],
                    "attention_mask": att[i : i + 1, :n],
                    "loss_mask": loss[i : i + 1, :n],
                },
            )["logprobs"]
            for i, n in enumerate(lens)
        ]
    assert batched["logprobs"].shape[0] == sum(n - 1 for n in lens)
    torch.testing.assert_close(batched["logprobs"], torch.cat(singles), atol=1e-5, rtol=1e-5)


# -- accumulation and precision through the real learner -------------------------------------------------
@pytest.mark.slow
def test_micro_batching_leaves_the_gradient_unchanged(tiny_model_dir):
    one = build_learner(micro_batch_size=5, micro_batch_tokens=None, mixed_precision="none")
    batch = uneven_batch(one.module["default_policy"].lm.config.vocab_size)
    plan_one = [mb["input_ids"].shape for mb in one.micro_batches(batch)]
    g_one = grads_after_update(one, batch)
    many = build_learner(micro_batch_size=4, micro_batch_tokens=40, mixed_precision="none")
    plan_many = [tuple(mb["input_ids"].shape) for mb in many.micro_batches(batch)]
    g_many = grads_after_update(many, batch)
    assert plan_one == [(5, 30)]
    # 40 padded tokens: 30 and 23 alone (2 x 30, 2 x 23 > 40), 17 + 12 (2 x 17 = 34), 9 alone (3 x 17 > 40)
    assert plan_many == [(1, 30), (1, 23), (2, 17), (1, 9)]
    assert g_one.abs().sum() > 0
    torch.testing.assert_close(g_many, g_one, atol=1e-6, rtol=1e-4)


@pytest.mark.slow
def test_bf16_autocast_gradient_tracks_fp32(tiny_model_dir):
    fp32 = build_learner(micro_batch_size=5, mixed_precision="none")
    batch = uneven_batch(fp32.module["default_policy"].lm.config.vocab_size)
    g32 = grads_after_update(fp32, batch)
    bf16 = build_learner(micro_batch_size=5, mixed_precision="bfloat16")
    assert isinstance(bf16.autocast(), torch.autocast)
    g16 = grads_after_update(bf16, batch)
    # master weights stay fp32; the bf16 gradient points the same way
    assert all(p.dtype == torch.float32 for p in bf16._params.values())
    cos = torch.nn.functional.cosine_similarity(g16, g32, dim=0)
    assert cos > 0.99, float(cos)
    assert not torch.equal(g16, g32)  # autocast really ran in bf16


def test_mixed_precision_resolution_and_validation():
    from rllib_r3l import R3LConfig
    from rllib_r3l.learner.precision import native_bf16, uses_autocast

    assert uses_autocast("none", "cpu") is False
    assert uses_autocast("bfloat16", "cpu") is True
    assert uses_autocast("auto", "cpu") is native_bf16("cpu")
    with pytest.raises(ValueError, match="mixed_precision"):
        R3LConfig().training(mixed_precision="fp16").validate_r3l()
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        R3LConfig().training(micro_batch_tokens=0).validate_r3l()
    R3LConfig().training(micro_batch_tokens=None).validate_r3l()
