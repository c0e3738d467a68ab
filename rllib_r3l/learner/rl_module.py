"""The policy as an RLlib ``TorchRLModule``: a Hugging Face causal LM.

The train forward returns the log-probs of the tokens that carry credit only: the LM head (a
49k-vocabulary matmul for SmolLM2, about half of a CPU step over all positions) is applied at those
positions alone. State goes in and out as torch tensors so bf16 weights survive (RLlib's default
converts to numpy, which has no bf16).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Dict, List, Optional

import torch
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule

from rllib_r3l.learner.cascade_attention import supported as cascade_supported
from rllib_r3l.learner.cascade_attention import use_cascade

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _strip(prefix: str, name: str) -> str:
    return name[len(prefix):] if name.startswith(prefix) else name


class R3LCausalLMModule(TorchRLModule):
    """Wraps ``AutoModelForCausalLM`` (loaded through ``rllib_r3l.models.resolve_model``)."""

    framework = "torch"

    def setup(self) -> None:
        from transformers import AutoModelForCausalLM

        from rllib_r3l.models import resolve_model

        cfg = dict(self.model_config or {})
        if "model_id" not in cfg:
            raise ValueError("R3LCausalLMModule needs model_config['model_id'] (set training(model=...))")
        dtype = _DTYPES[cfg.get("model_dtype", "float32")]
        self.model_path = resolve_model(cfg["model_id"])
        self.lm = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype)
        self.lm.config.use_cache = False
        if cfg.get("gradient_checkpointing"):
            self.lm.gradient_checkpointing_enable()
        self.share_prefixes = bool(cfg.get("share_prefixes", False))
        reason = prefix_sharing_unsupported(self.lm.config, bool(cfg.get("gradient_checkpointing")))
        if self.share_prefixes and reason:
            logger.warning("share_prefixes off: %s; every sequence runs on its own", reason)
            self.share_prefixes = False
        self.lora = dict(cfg["lora"]) if cfg.get("lora") else None
        if self.lora:  # LoRA adapters via peft; only they train (engines get merged weights)
            from peft import LoraConfig, get_peft_model

            if cfg.get("gradient_checkpointing"):
                self.lm.enable_input_require_grads()
            r = int(self.lora.get("r", 16))
            self.lm = get_peft_model(self.lm, LoraConfig(
                r=r, lora_alpha=self.lora.get("alpha", 2 * r),
                target_modules=self.lora.get("target_modules", "all-linear"),
                lora_dropout=float(self.lora.get("dropout", 0.0)), bias="none"))

    # -- forward -------------------------------------------------------------------------------------
    def _forward(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        return self.token_logprobs(batch)

    def _forward_train(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        return self.token_logprobs(batch)

    def token_logprobs(self, batch: Dict[str, Any]) -> Dict[str, torch.Tensor]:
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
        if getattr(self, "share_prefixes", False) and right_padded(attention):
            hidden = shared_prefix_hidden(self.lm.get_decoder(), input_ids, attention.sum(dim=1).tolist())
        else:
            if right_padded(attention):
                attention = None
            hidden = self.lm.get_decoder()(input_ids=input_ids, attention_mask=attention).last_hidden_state
        h = hidden[:, :-1][sel]
        head = self.lm.get_output_embeddings()
        logits = head(h).float()
        targets = input_ids[:, 1:][sel]
        logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return {"logprobs": logp, "selection": sel}

    # -- state ---------------------------------------------------------------------------------------
    def get_state(self, components=None, *, not_components=None, inference_only: bool = False, **kwargs):
        """Full state (CPU tensors: a GPU learner's state crosses the object store). With
        ``inference_only`` (the weight sync into the engines) and LoRA: the merged weights of the
        adapted decoder layers only (``rllib_r3l.learner.weight_sync.lora_engine_state``)."""
        from rllib_r3l.learner.weight_sync import lora_engine_state, to_cpu_state

        if inference_only and getattr(self, "lora", None):
            return {"lm." + k: v for k, v in lora_engine_state(self.lm).items()}
        return to_cpu_state(self.state_dict())

    def set_state(self, state: Dict[str, Any]) -> None:
        state = {k: (v if isinstance(v, torch.Tensor) else torch.as_tensor(v)) for k, v in state.items()}
        self.load_state_dict(state, strict=False)

    def hf_state_dict(self) -> Dict[str, torch.Tensor]:
        """Parameters under Hugging Face names (for engines and export)."""
        return {_strip("lm.", k): v.detach() for k, v in self.state_dict().items()}


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
    one call per node did not (docs/benchmarks.md, 'What do prefix sharing and cascade attention save?'). Nodes with children run one by one,
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
                ids[b, :n.length] = input_ids[n.row, n.start:n.end]
            cache = _cache([(k.expand(len(leaves), -1, -1, -1), v.expand(len(leaves), -1, -1, -1)) for k, v in kv]) if kv else None
            out = decoder(input_ids=ids, past_key_values=cache, use_cache=cache is not None)
            for b, j in enumerate(leaves):
                hidden[j] = out.last_hidden_state[b, :nodes[j].length]
        for j in inner:
            n = nodes[j]
            out = decoder(input_ids=input_ids[n.row, n.start:n.end][None], past_key_values=_cache(kv) if kv else None,
                          use_cache=True)
            hidden[j] = out.last_hidden_state[0]
            run(j, [(layer.keys, layer.values) for layer in out.past_key_values.layers])

    # on CPU a continuation attends to its cache through two unmasked flash calls (cascade_attention):
    # transformers' masked call computed the whole [L, P + L] score matrix, which made long
    # continuations on a cache cost more than running their rows unshared
    with (use_cascade(decoder) if cascade_supported(decoder, input_ids.device) else contextlib.nullcontext()):
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


def hf_named_tensors(module_state: Dict[str, Any]):
    """Map a module state (``lm.``-prefixed) to Hugging Face parameter names."""
    return [(_strip("lm.", k), v if isinstance(v, torch.Tensor) else torch.as_tensor(v)) for k, v in module_state.items()]
