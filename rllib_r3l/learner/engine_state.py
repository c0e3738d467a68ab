"""What the engines are sent on the object-store path (the fallback of :mod:`rllib_r3l.learner.weight_sync`).

**Object store** (the fallback, chosen once with one log line saying why)::

    learner rank 0: module.get_state(inference_only=True)   -> CPU tensors, HF names under "lm."
    driver:         ray.put(state) once                      -> one object in the object store
    every runner:   R3LEnvRunner.set_state -> backend.update_weights(named tensors)
    vLLM:           buckets of whole decoder layers (``weight_buckets``), one ``collective_rpc``
                    per bucket -> every tensor-parallel worker reloads in place; prefix cache reset

Nothing restarts; a bucket is ``weight_bucket_bytes`` (backend option, default 1 GiB) of whole
decoder layers, so the number of RPCs is ``ceil(model bytes / bucket)``, not one per parameter. The
bucketing itself lives in :func:`rllib_r3l.generation.vllm_weights.weight_buckets` (re-exported here).

**LoRA** (``lora`` option): the learner trains adapters; the engines receive the *merged* weights
``W + scale * B @ A`` of every decoder layer that holds an adapter (vLLM reloads a decoder layer as a
whole, so its other tensors go along); embeddings, final norm and untouched layers are not sent.
vLLM's native LoRA path (``enable_lora`` + a ``LoRARequest`` per call, adapter-only transfer) is not
used: it needs the adapter written as files and slows every forward pass.

These helpers are framework-light (torch only) so that tests and benchmarks can use them without Ray.
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

import torch

from rllib_r3l.generation.vllm_weights import group_key, weight_buckets

__all__ = ["weight_buckets", "layer_key", "to_cpu_state", "state_nbytes", "lora_engine_state", "num_buckets"]

_PEFT_PREFIX = "base_model.model."


def layer_key(name: str) -> str:
    """The unit vLLM reloads together: ``model.layers.<i>`` for a decoder-layer tensor, else the
    tensor's parent module."""
    return group_key(name)


def to_cpu_state(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Detached CPU tensors (what crosses the object store; a no-op copy-free pass on CPU)."""
    return {k: v.detach().to("cpu") if v.device.type != "cpu" else v.detach() for k, v in state.items()}


def state_nbytes(named_tensors: Iterable[Tuple[str, torch.Tensor]]) -> int:
    return int(sum(t.numel() * t.element_size() for _, t in named_tensors))


def _hf_name(peft_name: str) -> str:
    name = peft_name[len(_PEFT_PREFIX) :] if peft_name.startswith(_PEFT_PREFIX) else peft_name
    return name.replace(".base_layer.", ".")


@torch.no_grad()
def lora_engine_state(lm: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """HF-named merged weights of the decoder layers that hold a LoRA adapter (a peft model).

    Every tensor of an adapted layer is included (vLLM reloads whole layers); adapter tensors
    themselves (``lora_A``/``lora_B``) are not. Returns CPU tensors in the base weights' dtype.
    """
    from peft.tuners.lora import LoraLayer

    merged: Dict[str, torch.Tensor] = {}
    for mname, mod in lm.named_modules():
        if isinstance(mod, LoraLayer) and hasattr(mod, "base_layer") and hasattr(mod.base_layer, "weight"):
            base = mod.base_layer.weight
            w = base.detach().clone()
            for adapter in mod.active_adapters:
                if adapter in getattr(mod, "lora_A", {}):
                    w += mod.get_delta_weight(adapter).to(w.dtype)
            merged[_hf_name(mname + ".base_layer.weight")] = w
    if not merged:
        return {}
    layers = {layer_key(n) for n in merged}
    out: Dict[str, torch.Tensor] = {}
    for pname, t in lm.state_dict().items():
        if ".lora_" in pname:
            continue
        hf = _hf_name(pname)
        if layer_key(hf) not in layers:
            continue
        out[hf] = merged.get(hf, t.detach())
    return to_cpu_state(out)


def num_buckets(named_tensors: Iterable[Tuple[str, torch.Tensor]], bucket_bytes: Optional[int]) -> int:
    """How many ``collective_rpc`` calls a vLLM update of these tensors makes."""
    return len(weight_buckets(named_tensors, bucket_bytes))
