"""Cascade attention (rllib_r3l.learner.cascade_attention): the masked attention of a continuation on its
prefix's cache, as two unmasked flash calls merged by log-sum-exp, forward and backward."""

import pytest
import torch
import torch.nn.functional as F

from rllib_r3l.learner.cascade_attention import NAME, cascade_attention, use_cascade


def _masked(q, k, v, scale):
    """The reference: every query sees the prefix and, causally, the last L keys (bottom-right)."""
    L, K = q.shape[2], k.shape[2]
    mask = torch.ones(L, K, dtype=torch.bool).tril(diagonal=K - L)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _run(fn, B, H, P, L, D=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=g).to(dtype).requires_grad_() for n in (L, P + L, P + L))
    grad_out = torch.randn(B, H, L, D, generator=g).to(dtype)
    out = fn(q, k, v, D**-0.5)
    out.backward(grad_out)
    return [t.detach().float() for t in (out, q.grad, k.grad, v.grad)]


def _rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 4, 1, 1), (3, 2, 40, 9), (1, 2, 0, 12)])
def test_equals_the_masked_call_forward_and_backward(shape):
    got = _run(cascade_attention, *shape)
    want = _run(_masked, *shape)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert _rel(a, b) <= 1e-5, (name, shape, _rel(a, b))


def test_the_prefix_carries_its_share_of_the_gradient():
    """A hand-sized case: one query on a one-key prefix and itself, equal scores, so the softmax
    is 1/2 each: out = (v_prefix + v_own) / 2 and each value's gradient is half the output's."""
    q = torch.zeros(1, 1, 1, 2, requires_grad=True)
    k = torch.zeros(1, 1, 2, 2, requires_grad=True)
    v = torch.tensor([[[[2.0, 0.0], [0.0, 4.0]]]], requires_grad=True)
    out = cascade_attention(q, k, v, 1.0)
    assert torch.allclose(out, torch.tensor([[[[1.0, 2.0]]]]))
    out.sum().backward()
    assert torch.allclose(v.grad, torch.full((1, 1, 2, 2), 0.5))
    # d out / d score_j = p_j (v_j - out); the scores' gradient (q . k) reaches q through k = 0: zero
    assert torch.allclose(q.grad, torch.zeros_like(q))


def test_more_queries_than_keys_is_refused():
    q = torch.zeros(1, 1, 3, 2)
    with pytest.raises(ValueError, match="at least as many keys"):
        cascade_attention(q, torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), 1.0)


@pytest.mark.parametrize("min_keys", [0, None])
def test_decoder_switch_is_restored_and_matches_sdpa_on_a_cache(tiny_model_dir, monkeypatch, min_keys):
    """Through the tiny model (grouped-query heads, rotary, autocast): a continuation on a cache
    gives the hidden states of transformers' own masked path, and the switch is undone after.
    ``min_keys=0``: every call takes the cascade; the default threshold sends these 30 keys to
    the masked SDPA call (short calls cost less that way)."""
    if min_keys is not None:
        monkeypatch.setattr("rllib_r3l.learner.cascade_attention.CASCADE_MIN_KEYS", min_keys)
    from rllib_r3l.learner.forward import _cache
    from rllib_r3l.models import load_causal_lm

    lm = load_causal_lm(tiny_model_dir, dtype=torch.float32)
    dec = lm.get_decoder()
    assert dec.config._attn_implementation == "sdpa"
    ids = torch.randint(5, 200, (1, 30), generator=torch.Generator().manual_seed(1))

    def continuation(cascade: bool):
        out = dec(input_ids=ids[:, :12], use_cache=True)
        kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        if cascade:
            with use_cascade(dec):
                assert dec.config._attn_implementation == NAME
                return dec(input_ids=ids[:, 12:], past_key_values=_cache(kv), use_cache=True).last_hidden_state
        return dec(input_ids=ids[:, 12:], past_key_values=_cache(kv), use_cache=True).last_hidden_state

    assert _rel(continuation(True), continuation(False)) <= 1e-5
    assert dec.config._attn_implementation == "sdpa"
    with torch.autocast("cpu", dtype=torch.bfloat16):  # mixed dtypes after rotary: cast like SDPA does
        assert _rel(continuation(True).float(), continuation(False).float()) <= 2e-2
