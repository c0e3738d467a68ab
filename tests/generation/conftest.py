"""``tiny_vllm_engine``: one vLLM engine over the tiny model per test module (a small KV cache, seed 0)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_vllm_engine(tiny_model_dir):
    from rllib_r3l.generation import make_backend

    backend = make_backend("vllm", tiny_model_dir, kv_cache_gib=0.25, max_model_len=2048, seed=0)
    yield backend
    backend.close()
