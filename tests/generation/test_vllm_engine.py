"""The vLLM engine's arguments (rllib_r3l.generation.vllm_engine.engine_args): CPU defaults, GPU pass-through.

Pure configuration: no engine starts here. The GPU branch is checked as arguments only (no GPU here)."""

import pytest

from rllib_r3l.generation.vllm_choice import PROCESSOR_FQCN
from rllib_r3l.generation.vllm_engine import CPU_BLOCK_SIZE, CPU_MIN_BATCHED_TOKENS, engine_args


def test_cpu_defaults_eager_small_blocks_fixed_cache_no_chunked_prefill():
    a = engine_args("m", on_cpu=True, dtype="float32", max_model_len=2048)
    assert a["enforce_eager"] is True and a["block_size"] == CPU_BLOCK_SIZE
    assert a["kv_cache_memory_bytes"] == 1 << 30 and a["max_model_len"] == 2048
    assert a["enable_chunked_prefill"] is False and a["max_num_batched_tokens"] == max(2048, CPU_MIN_BATCHED_TOKENS)
    assert a["logits_processors"] == [PROCESSOR_FQCN] and a["logprobs_mode"] == "processed_logprobs"
    assert "enable_prefix_caching" not in a and "enable_sleep_mode" not in a


def test_gpu_arguments_pass_through_with_prefix_caching_on_fake_gpu_branch():
    a = engine_args(
        "m",
        on_cpu=False,
        gpu_memory_utilization=0.5,
        tensor_parallel_size=2,
        enable_sleep_mode=True,
        choice_tokenization="any",
        engine_kwargs={"max_num_seqs": 7},
    )
    assert a["dtype"] == "auto" and a["gpu_memory_utilization"] == 0.5 and a["enable_sleep_mode"] is True
    assert a["enable_prefix_caching"] is True and a["distributed_executor_backend"] == "mp"
    assert "logits_processors" not in a and a["max_num_seqs"] == 7 and "block_size" not in a


@pytest.mark.parametrize("extra", [{"block_size": 16}, {"enable_chunked_prefill": True}])
def test_engine_kwargs_override_the_cpu_defaults(extra):
    a = engine_args("m", on_cpu=True, dtype="float32", max_model_len=1024, engine_kwargs=extra)
    for k, v in extra.items():
        assert a[k] == v
