"""The policy as an RLlib ``TorchRLModule``: a Hugging Face causal LM.

The train forward returns the log-probs of the tokens that carry credit only: the LM head (a
49k-vocabulary matmul for SmolLM2, about half of a CPU step over all positions) is applied at those
positions alone. State goes in and out as torch tensors so bf16 weights survive (RLlib's default
converts to numpy, which has no bf16).
"""

from __future__ import annotations

import logging
from typing import Any, Dict

import torch
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule

# the forward is pure (no Ray: benchmarks/gpu_kit.py runs it too); its names stay importable from here
from rllib_r3l.learner.forward import prefix_sharing_unsupported, right_padded, shared_prefix_hidden, token_logprobs  # noqa: F401 - importable from here

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _strip(prefix: str, name: str) -> str:
    return name[len(prefix) :] if name.startswith(prefix) else name


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
            self.lm = get_peft_model(
                self.lm,
                LoraConfig(
                    r=r,
                    lora_alpha=self.lora.get("alpha", 2 * r),
                    target_modules=self.lora.get("target_modules", "all-linear"),
                    lora_dropout=float(self.lora.get("dropout", 0.0)),
                    bias="none",
                ),
            )

    # -- forward -------------------------------------------------------------------------------------
    def _forward(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        return self.token_logprobs(batch)

    def _forward_train(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        return self.token_logprobs(batch)

    def token_logprobs(self, batch: Dict[str, Any]) -> Dict[str, torch.Tensor]:
        """``rllib_r3l.learner.forward.token_logprobs`` of this module's model (shared prefixes per
        ``share_prefixes``, which the learner sets)."""
        return token_logprobs(self.lm, batch, share_prefixes=bool(getattr(self, "share_prefixes", False)))

    # -- state ---------------------------------------------------------------------------------------
    def get_state(self, components=None, *, not_components=None, inference_only: bool = False, **kwargs):
        """Full state (CPU tensors: a GPU learner's state crosses the object store). With
        ``inference_only`` (the weight sync into the engines) and LoRA: the merged weights of the
        adapted decoder layers only (``rllib_r3l.learner.engine_state.lora_engine_state``)."""
        from rllib_r3l.learner.engine_state import lora_engine_state, to_cpu_state

        if inference_only and getattr(self, "lora", None):
            return {"lm." + k: v for k, v in lora_engine_state(self.lm).items()}
        return to_cpu_state(self.state_dict())

    def set_state(self, state: Dict[str, Any]) -> None:
        """Load a (possibly partial: an inference-only or LoRA) state; a state that holds none of the model's
        weights is an error (a damaged checkpoint's ``{}`` loaded "fine" and left the base model's weights)."""
        state = {k: (v if isinstance(v, torch.Tensor) else torch.as_tensor(v)) for k, v in state.items()}
        result = self.load_state_dict(state, strict=False)
        own = self.state_dict()
        if own and len(result.missing_keys) == len(own):
            shown = ", ".join(sorted(state)[:3]) or "nothing"
            raise ValueError(
                f"the module state to restore holds none of the model's {len(own)} weights (it holds "
                f"{len(state)} entries: {shown}); a damaged or foreign checkpoint: restore from another one"
            )

    def hf_state_dict(self) -> Dict[str, torch.Tensor]:
        """Parameters under Hugging Face names (for engines and export)."""
        return {_strip("lm.", k): v.detach() for k, v in self.state_dict().items()}


def hf_named_tensors(module_state: Dict[str, Any]):
    """Map a module state (``lm.``-prefixed) to Hugging Face parameter names."""
    return [
        (_strip("lm.", k), v if isinstance(v, torch.Tensor) else torch.as_tensor(v)) for k, v in module_state.items()
    ]
