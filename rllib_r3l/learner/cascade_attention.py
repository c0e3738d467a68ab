"""Cascade attention for shared-prefix training: a continuation attends to its prefix's KV cache
without a mask.

A node of the prefix trie (``rl_module.shared_prefix_hidden``) runs on its parent's KV cache: its
queries see every cached key (the prefix) and, causally, its own keys. Transformers expresses that
with an explicit ``[B, 1, L, P + L]`` mask, and CPU SDPA then attends to all ``P + L`` keys for
every query: the masked half of the square part is computed and thrown away. At the lengths of a
long episode (a 2,900-token continuation on an 800-token prefix) that made a continuation on a cache
cost more than the whole sequence unshared, so prefix sharing lost time where it saved the most
tokens (docs/benchmarks.md, 'What do prefix sharing and cascade attention save?').

Here the two parts run as two unmasked flash calls: the queries against the prefix (full, no mask)
and against their own keys (``is_causal``, square, so the kernel skips the upper triangle). The
outputs merge by their log-sum-exps. The backward runs each part's flash backward with the *merged*
output and log-sum-exp, which gives exactly that part's share of the gradient (the softmax
normaliser is the merged one), so the result equals the masked call up to float rounding.

Only for the calls ``shared_prefix_hidden`` makes (right-padded rows, causal, one prefix length for
the batch); everything else keeps transformers' SDPA path. ``use_cascade(decoder)`` switches a
decoder's attention to this function for the duration of a ``with`` block.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Tuple

import torch

NAME = "r3l_cascade"

# Below this many keys (prefix + own) a call keeps transformers' masked SDPA: two kernel calls and a
# merge cost more than the masked half they save on short rows; the break-even is measured with
# benchmarks/cascade_attention.py (docs/benchmarks.md, 'What do prefix sharing and cascade attention save?').
CASCADE_MIN_KEYS = 768

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class CascadeAttention(torch.autograd.Function):
    """``softmax(q [k_prefix; k_own]^T * scale, causal on the own part) [v_prefix; v_own]``.

    Shapes ``[B, H, L, D]`` (queries), ``[B, Hkv, L, D]`` (own keys and values) and
    ``[B, Hkv, P, D]`` (prefix keys and values), ``H`` a multiple of ``Hkv``. CPU only: the flash
    kernels are the CPU ones. ``P == 0`` is plain causal attention.
    """

    @staticmethod
    def forward(ctx, q, k_prefix, v_prefix, k_own, v_own, scale: float):
        q, k_own, v_own = q.contiguous(), k_own.contiguous(), v_own.contiguous()
        o_own, lse_own = _flash(q, k_own, v_own, 0.0, True, attn_mask=None, scale=scale)
        has_prefix = k_prefix.shape[2] > 0
        if has_prefix:
            k_prefix, v_prefix = k_prefix.contiguous(), v_prefix.contiguous()
            o_pre, lse_pre = _flash(q, k_prefix, v_prefix, 0.0, False, attn_mask=None, scale=scale)
            lse = torch.logaddexp(lse_own, lse_pre)
            out = (
                o_own.float() * torch.exp(lse_own - lse).unsqueeze(-1)
                + o_pre.float() * torch.exp(lse_pre - lse).unsqueeze(-1)
            ).to(q.dtype)
        else:
            out, lse = o_own, lse_own
        ctx.scale, ctx.has_prefix = scale, has_prefix
        ctx.save_for_backward(q, k_prefix, v_prefix, k_own, v_own, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k_prefix, v_prefix, k_own, v_own, out, lse = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        dq, dk_own, dv_own = _flash_backward(
            grad_out, q, k_own, v_own, out, lse, 0.0, True, attn_mask=None, scale=ctx.scale
        )
        dk_pre = dv_pre = None
        if ctx.has_prefix:
            dq_pre, dk_pre, dv_pre = _flash_backward(
                grad_out, q, k_prefix, v_prefix, out, lse, 0.0, False, attn_mask=None, scale=ctx.scale
            )
            dq = dq + dq_pre
        return dq, dk_pre, dv_pre, dk_own, dv_own, None


def cascade_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Queries ``[B, H, L, D]`` on keys/values ``[B, H, P + L, D]`` whose first ``P`` positions are
    the prefix: every query sees the whole prefix and, causally, the last ``L`` keys."""
    L, K = q.shape[2], k.shape[2]
    if K < L:
        raise ValueError(f"cascade attention needs at least as many keys as queries, got {K} < {L}")
    P = K - L
    return CascadeAttention.apply(q, k[:, :, :P], v[:, :, :P], k[:, :, P:], v[:, :, P:], float(scale))


def _attention_forward(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    **kwargs,
) -> Tuple[torch.Tensor, None]:
    """Transformers' attention-function signature (``AttentionInterface``)."""
    if attention_mask is not None:
        raise RuntimeError("cascade attention runs without a mask (right-padded rows on a shared prefix only)")
    if dropout:
        raise RuntimeError("cascade attention has no dropout")
    if query.device.type != "cpu":
        raise RuntimeError("cascade attention uses the CPU flash kernels")
    L, K = query.shape[2], key.shape[2]
    if K < CASCADE_MIN_KEYS:
        # short: one masked SDPA call costs less than two flash calls and the merge
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        # no cache (a root node): no mask, so SDPA keeps its causal flash kernel, as before the switch
        mask = None if K == L else torch.ones(L, K, dtype=torch.bool, device=query.device).tril(K - L)[None, None]
        return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling, **kwargs)
    # what SDPA does under autocast (it is on autocast's lower-precision list): one dtype for all
    # three (rotary embeddings leave queries and keys in fp32 beside bf16 values)
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else query.dtype
    query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    # grouped-query attention (fewer key/value heads) runs as it is: the CPU flash kernels take it,
    # forward and backward (tests/learner/test_cascade_attention.py)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = cascade_attention(query, key, value, scale)
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args, **kwargs) -> None:
    """The mask function of the cascade path: the structure is known, nothing is materialised."""
    return None


def register() -> None:
    """Make ``NAME`` a transformers attention implementation (idempotent)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register(NAME, _attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, _no_mask)


def supported(decoder: torch.nn.Module, device: torch.device) -> bool:
    """Whether ``use_cascade`` applies: a CPU decoder whose attention is transformers' SDPA."""
    return device.type == "cpu" and getattr(getattr(decoder, "config", None), "_attn_implementation", None) == "sdpa"


@contextlib.contextmanager
def use_cascade(decoder: torch.nn.Module) -> Iterator[None]:
    """Inside the block, ``decoder``'s attention layers run ``cascade_attention`` (restored after;
    the backward of what ran inside does not depend on the switch)."""
    register()
    config = decoder.config
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before
