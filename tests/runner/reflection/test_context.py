"""Reflection as a continuation of the episode's own context (issue 12): exact tokens, the same
parsing, and a reflection item that shares the episode's prefix."""

from __future__ import annotations

import pytest

import environments
from rllib_r3l import R3LConfig
from rllib_r3l.learner.prefix_tree import trie_tokens
from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.runner.explore import Explorer
from rllib_r3l.runner.reflection.context import transcript_prompt
from rllib_r3l.runner.reflection.reflect import report_json_schema
from rllib_r3l.runner.rollout import EpisodeRunner, RolloutOptions
from rllib_r3l.trajectory import Kind
from tests.scripted import ScriptedBackend, explore_options

SEED = 11


def _explorer(tokenizer, **kw):
    chat = ChatFormat(tokenizer)
    opts = RolloutOptions(max_turns=6, max_response_tokens=16, max_context_tokens=4096, temperature=1.0)
    runner = EpisodeRunner(
        ScriptedBackend(tokenizer, pivot=1), chat, lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}), opts
    )
    return Explorer(runner, chat, explore_options(group_size=4, **kw)), chat


def test_transcript_prompt_continues_the_episode(tiny_tokenizer):
    ex, chat = _explorer(tiny_tokenizer, reflect=False)
    [group] = ex.explore([SEED], ["g"])
    base = group.trajectories[0]
    ids = transcript_prompt(chat, base)
    assert ids[: base.num_tokens] == base.token_ids  # the episode's tokens, untouched
    tail = tiny_tokenizer.decode(ids[base.num_tokens :])
    k = len(base.actions)
    assert f"numbered 0 to {k - 1}" in tail and "Final reward: 0.0 (the task was not completed)" in tail
    assert base.observations[k].strip() in tail  # the last observation, which the policy never saw
    assert tail.rstrip().endswith("assistant")  # the assistant's turn is open


def test_transcript_reflection_drives_retries_and_its_item_shares_the_episode(tiny_tokenizer):
    ex, _ = _explorer(tiny_tokenizer, reflection_context="transcript")
    [group] = ex.explore([SEED], ["g"])
    kinds = [t.kind for t in group.trajectories]
    assert kinds.count(Kind.RETRY) == 2 and kinds.count(Kind.REFLECTION_SFT) == 2
    bases = [t for t in group.trajectories if t.kind == Kind.BASE]
    items = [t for t in group.trajectories if t.kind == Kind.REFLECTION_SFT]
    for base, item in zip(bases, items):
        assert item.token_ids[: base.num_tokens] == base.token_ids
        # in the learner the episode's tokens are computed once for both
        assert trie_tokens([base.token_ids, item.token_ids]) == item.num_tokens
    assert ex.counters["reflection_transcript_fallbacks"] == 0


def test_bounded_report_schema_and_config_checks():
    s = report_json_schema(5, failed=True, max_chars=80)
    assert s["properties"]["summary"]["maxLength"] == 80 and s["properties"]["suggestion"]["maxLength"] == 80
    assert "maxLength" not in report_json_schema(5)["properties"]["summary"]
    with pytest.raises(ValueError, match="reflection_context"):
        R3LConfig().training(reflection_context="transcript", reflector="other").validate_r3l()
    with pytest.raises(ValueError, match="reflection_context: must be one of"):
        R3LConfig().training(reflection_context="notes").validate_r3l()
    with pytest.raises(ValueError, match="reflection_max_chars"):
        R3LConfig().training(reflection_max_chars=0).validate_r3l()


def test_auto_reflection_context_follows_who_reflects():
    """The default continues the policy's own transcript (cache-served); a separate reflector has not
    seen that context, so it gets the re-rendered log."""
    assert R3LConfig().reflection_context == "auto"
    assert R3LConfig().resolved_reflection_context() == "transcript"
    other = R3LConfig().training(reflector="other")
    other.validate_r3l()  # "auto" with a separate reflector is valid (unlike an explicit "transcript")
    assert other.resolved_reflection_context() == "log"
    assert R3LConfig().training(reflection_context="log").resolved_reflection_context() == "log"
