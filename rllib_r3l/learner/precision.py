"""Numeric precision of the learner: bf16 autocast where the hardware computes bf16 natively.

The learner keeps fp32 master weights and optimizer state (``model_dtype`` float32) and runs its
forward/backward under ``torch.autocast(bfloat16)`` when ``mixed_precision`` asks for it: on a CPU
with native bf16 (AMX, AVX512-bf16) about half the fp32 time (benchmarks/learner_throughput.py;
docs/benchmarks.md, 'How fast is the learner?').

Bounded oneDNN kernel caches (``bound_kernel_caches``): under bf16 on such a CPU, every matmul runs
through oneDNN (``torch.mm`` -> ``ideep::matmul_forward`` -> a JIT-compiled ``brg_matmul``
primitive, its kernels in 256 KiB code buffers). Each new (M, N, K) compiles a primitive, and two
caches keep up to 1,024 of them by default: oneDNN's primitive cache
(``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) and ideep's (``LRU_CACHE_CAPACITY``). R3L's shapes change with
every batch (sequence lengths; with shared prefixes, the length of every prefix-trie node), so each
update adds ~150 primitives that are rarely met again, and the driver, where the local learner
lives, grew ~17 MB an iteration with the tiny model (docs/reliability.md, "Driver memory"). The
reuse that pays is within one decoder call (every layer repeats its shapes): an update of
SmolLM2-135M with shared prefixes creates as many primitives (~170) with a cache of 64 as with
1,024. oneDNN reads its variable once per process (at its first primitive) and ideep once per
thread, so this runs before the process's first bf16 matmul: in ``R3L.setup`` (the driver, before
its runner and learner build) and ``R3LTorchLearner.build`` (every learner process).
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Dict

import torch

KERNEL_CACHE_CAPACITY = 64
KERNEL_CACHE_ENV_VARS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_kernel_caches(capacity: int = KERNEL_CACHE_CAPACITY) -> Dict[str, str]:
    """Both oneDNN kernel caches bounded at ``capacity`` primitives where the environment leaves them
    unset (a user's own setting wins); returns the values in effect."""
    for name in KERNEL_CACHE_ENV_VARS:
        os.environ.setdefault(name, str(int(capacity)))
    return {name: os.environ[name] for name in KERNEL_CACHE_ENV_VARS}


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
