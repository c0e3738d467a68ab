"""The policy as an RLlib ``TorchRLModule``: a Hugging Face causal LM.

The train forward returns the log-probs of the tokens that carry credit only: the LM head (a
49k-vocabulary matmul for SmolLM2, about half of a CPU step over all positions) is applied at those
positions alone. State goes in and out as torch tensors so bf16 weights survive (RLlib's default
converts to numpy, which has no bf16).
"""

from __future__ import annotations

from typing import Any, Dict

import torch
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule

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
        adapted decoder layers only (``rllib_r3l.weight_sync.lora_engine_state``)."""
        from rllib_r3l.weight_sync import lora_engine_state, to_cpu_state

        if inference_only and getattr(self, "lora", None):
            return {"lm." + k: v for k, v in lora_engine_state(self.lm).items()}
        return to_cpu_state(self.state_dict())

    def set_state(self, state: Dict[str, Any]) -> None:
        state = {k: (v if isinstance(v, torch.Tensor) else torch.as_tensor(v)) for k, v in state.items()}
        self.load_state_dict(state, strict=False)

    def hf_state_dict(self) -> Dict[str, torch.Tensor]:
        """Parameters under Hugging Face names (for engines and export)."""
        return {_strip("lm.", k): v.detach() for k, v in self.state_dict().items()}


def right_padded(attention_mask: torch.Tensor) -> bool:
    """True when every row is ones then zeros (real tokens first, padding after)."""
    m = attention_mask.to(torch.int64)
    return bool((m[:, 1:] <= m[:, :-1]).all()) and bool((m[:, 0] == 1).all())


def hf_named_tensors(module_state: Dict[str, Any]):
    """Map a module state (``lm.``-prefixed) to Hugging Face parameter names."""
    return [(_strip("lm.", k), v if isinstance(v, torch.Tensor) else torch.as_tensor(v)) for k, v in module_state.items()]
