"""Numeric precision of the learner: bf16 autocast where the hardware computes bf16 natively.

The learner keeps fp32 master weights and optimizer state (``model_dtype`` float32) and runs its
forward/backward under ``torch.autocast(bfloat16)`` when ``mixed_precision`` asks for it: on a CPU
with native bf16 (AMX, AVX512-bf16) about half the fp32 time (benchmarks/learner_throughput.py;
docs/benchmarks.md, 'How fast is the learner?').
"""

from __future__ import annotations

import contextlib
import functools

import torch


@functools.lru_cache(maxsize=None)  # asked once per micro-batch with mixed_precision="auto"
def native_bf16(device_type: str = "cpu") -> bool:
    """Whether ``device_type`` computes bf16 natively (CUDA with bf16; CPUs with AMX or AVX512-bf16)."""
    if device_type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    try:
        return bool(torch.cpu._is_avx512_bf16_supported()) or bool(torch.cpu._is_amx_tile_supported())
    except Exception:  # pragma: no cover - private torch helpers
        return False


def uses_autocast(mode: str, device_type: str) -> bool:
    """Resolve ``mixed_precision`` ("auto" | "bfloat16" | "none") for ``device_type``."""
    if mode == "none":
        return False
    if mode == "bfloat16":
        return True
    if mode == "auto":
        return native_bf16(device_type)
    raise ValueError(f"R3LConfig.mixed_precision: must be 'auto', 'bfloat16' or 'none', got {mode!r}")


def autocast(mode: str, device_type: str):
    """Context manager: bf16 autocast on ``device_type`` if ``mode`` resolves to it, else a no-op."""
    if uses_autocast(mode, device_type):
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
