"""The learner's forward and micro-batching as pure functions (torch and transformers only, no Ray).

``R3LCausalLMModule`` (``rl_module``, an RLlib module) and ``R3LTorchLearner`` (``torch_learner``)
call these; so does ``benchmarks/gpu_kit.py`` on a GPU machine without Ray. Exact shared-prefix
training (``shared_prefix_hidden``) runs each shared prefix once and its continuations on its KV cache.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Optional, Tuple

import torch

from rllib_r3l.learner.cascade_attention import supported as cascade_supported
from rllib_r3l.learner.cascade_attention import use_cascade

__all__ = [
    "token_logprobs",
    "shared_prefix_hidden",
    "right_padded",
    "prefix_sharing_unsupported",
    "split_micro_batches",
]


def token_logprobs(lm: torch.nn.Module, batch: Dict[str, Any], share_prefixes: bool = False) -> Dict[str, torch.Tensor]:
    """Log-probs of ``input_ids[:, t]`` for every ``t`` with ``loss_mask[:, t] > 0`` (flattened).

    Returns ``logprobs`` [M] and ``selection`` [B, T-1] (bool; position ``t-1`` predicts ``t``).
    A right-padded batch (what ``trajectory.collate`` makes) runs without an attention mask:
    under causal attention no real token sees the padding after it, so the result is exact,
    and the mask-free path keeps SDPA on its memory-efficient kernel (with a padding mask, CPU
    SDPA falls back to materialising [B, heads, T, T] attention per layer).
    """
    input_ids = batch["input_ids"]
    attention = batch["attention_mask"]
    sel = batch["loss_mask"][:, 1:] > 0
    if share_prefixes and right_padded(attention):
        hidden = shared_prefix_hidden(lm.get_decoder(), input_ids, attention.sum(dim=1).tolist())
    else:
        if right_padded(attention):
            attention = None
        hidden = lm.get_decoder()(input_ids=input_ids, attention_mask=attention).last_hidden_state
    h = hidden[:, :-1][sel]
    head = lm.get_output_embeddings()
    logits = head(h).float()
    targets = input_ids[:, 1:][sel]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return {"logprobs": logp, "selection": sel}


def prefix_sharing_unsupported(hf_config: Any, gradient_checkpointing: bool) -> Optional[str]:
    """Why exact shared-prefix training cannot run with this model, or None."""
    if gradient_checkpointing:
        return "gradient checkpointing recomputes without a KV cache"
    layer_types = getattr(hf_config, "layer_types", None) or []
    if any("sliding" in str(t) for t in layer_types) or getattr(hf_config, "use_sliding_window", False):
        return "the model has sliding-window attention layers (a cache would drop their window's edge)"
    return None


def shared_prefix_hidden(decoder: torch.nn.Module, input_ids: torch.Tensor, lengths: List[int]) -> torch.Tensor:
    """The decoder's last hidden states of a right-padded batch, each shared prefix computed once.

    The rows' token trie (``prefix_tree.build_prefix_tree``) runs from its roots down. A node
    continues from its parent's KV cache (with gradient), so every row's hidden states, and the
    gradient through them, equal those of running the row on its own. The leaves under one parent
    (a group's items after their shared task prompt, a retry and its base after the pivot) run in
    right-padded batches of similar lengths on the parent's cache, expanded
    (``prefix_tree.leaf_batches``): on CPU that costs about what its tokens cost unshared, where
    one call per node did not (docs/benchmarks.md, 'What do prefix sharing and cascade attention save?'). Nodes with
    children run one by one,
    since their caches must end where their children start. Padding positions of the result are
    zero. On CPU a node attends to its parent's cache through ``cascade_attention`` (no mask, the
    causal triangle skipped), else through transformers' masked SDPA.
    """
    from rllib_r3l.learner.prefix_tree import build_prefix_tree, children_of

    seqs = [input_ids[i, :n].tolist() for i, n in enumerate(lengths)]
    nodes, paths = build_prefix_tree(seqs)
    schedule = children_of(nodes)
    hidden: Dict[int, torch.Tensor] = {}

    def run(parent: int, kv: Optional[list]) -> None:
        batches, inner = schedule.get(parent, ([], []))
        for leaves in batches:
            width = max(nodes[j].length for j in leaves)
            ids = input_ids.new_zeros((len(leaves), width))
            for b, j in enumerate(leaves):
                n = nodes[j]
                ids[b, : n.length] = input_ids[n.row, n.start : n.end]
            cache = (
                _cache([(k.expand(len(leaves), -1, -1, -1), v.expand(len(leaves), -1, -1, -1)) for k, v in kv])
                if kv
                else None
            )
            out = decoder(input_ids=ids, past_key_values=cache, use_cache=cache is not None)
            for b, j in enumerate(leaves):
                hidden[j] = out.last_hidden_state[b, : nodes[j].length]
        for j in inner:
            n = nodes[j]
            out = decoder(
                input_ids=input_ids[n.row, n.start : n.end][None],
                past_key_values=_cache(kv) if kv else None,
                use_cache=True,
            )
            hidden[j] = out.last_hidden_state[0]
            run(j, [(layer.keys, layer.values) for layer in out.past_key_values.layers])

    # on CPU a continuation attends to its cache through two unmasked flash calls (cascade_attention):
    # transformers' masked call computed the whole [L, P + L] score matrix, which made long
    # continuations on a cache cost more than running their rows unshared
    with use_cascade(decoder) if cascade_supported(decoder, input_ids.device) else contextlib.nullcontext():
        run(-1, None)
    B, T = input_ids.shape
    empty = input_ids.new_zeros((0, hidden[0].shape[-1]) if hidden else (0, 1), dtype=torch.float32)
    rows = [torch.cat([hidden[j] for j in path]) if path else empty for path in paths]
    pad = [torch.nn.functional.pad(r, (0, 0, 0, T - r.shape[0])) for r in rows]
    return torch.stack(pad)


def _cache(kv: list):
    """A transformers ``DynamicCache`` holding ``[(keys, values)]`` per layer (continued, never
    written in place: ``update`` concatenates into new tensors, so siblings can share a parent's)."""
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=kv)


def right_padded(attention_mask: torch.Tensor) -> bool:
    """True when every row is ones then zeros (real tokens first, padding after)."""
    m = attention_mask.to(torch.int64)
    return bool((m[:, 1:] <= m[:, :-1]).all()) and bool((m[:, 0] == 1).all())


def split_micro_batches(
    b: Dict[str, Any], share_prefixes: bool, max_sequences: int, max_tokens: Optional[int]
) -> List[Tuple[List[int], Dict[str, Any]]]:
    """The batch cut into micro-batches, right padding trimmed: ``(rows, tensors)`` of each, at most
    ``max_sequences`` trajectories and ``max_tokens`` tokens. Padded tokens, longest first
    (``batch.plan_micro_batches``); with shared-prefix training, the tokens of the micro-batch's
    prefix trie, rows in token order so that shared prefixes meet (``prefix_tree``)."""
    from rllib_r3l.batch import plan_micro_batches
    from rllib_r3l.learner.prefix_tree import plan_shared_micro_batches

    B = int(b["input_ids"].shape[0])
    lengths = b["attention_mask"].sum(dim=1).tolist()
    if share_prefixes:
        seqs = [b["input_ids"][i, :n].tolist() for i, n in enumerate(lengths)]
        plan = plan_shared_micro_batches(seqs, max_sequences=int(max_sequences), max_tokens=max_tokens)
    else:
        plan = plan_micro_batches(lengths, max_sequences=int(max_sequences), max_tokens=max_tokens)
    out = []
    for idx in plan:
        rows = torch.as_tensor(idx, dtype=torch.long, device=b["input_ids"].device)
        T = int(max(lengths[i] for i in idx))
        sub = {k: v[rows] for k, v in b.items() if isinstance(v, torch.Tensor) and v.shape[:1] == (B,)}
        out.append((list(idx), {k: (v[:, :T] if v.dim() == 2 else v) for k, v in sub.items()}))
    return out
