"""The auxiliary-item rules (paper §4 "Data construction"; authors' code), with scripted episodes.

- a successful retry that beats its base (higher reward, or equal reward in fewer turns) adds the
  reflection item and the guided retry item, both positive (advantage 1.0, weight ``aux_weight``);
- a retry that succeeds without beating its base adds nothing;
- a success the reflector recognises (outcome ``success``) adds its reflection item only;
- ``aux_items=()`` adds nothing; ``aux_items`` chooses the kinds.

ToyCorridor(4 rooms) seeds: 11 starts in room 2 with the coin in room 4; 2 starts in room 3 with
the coin in room 1.
"""

from __future__ import annotations

import pytest

import environments
from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.runner.explore import Explorer
from rllib_r3l.runner.rollout import EpisodeRunner, RolloutOptions
from rllib_r3l.trajectory import Kind
from tests.scripted import GUIDE_MARK, ScriptedBackend, explore_options, walk_policy

COIN_RIGHT = 11
COIN_LEFT = 2
AUX = (Kind.REFLECTION_SFT, Kind.RETRY_SFT)


def explore(tokenizer, seed, *, unguided, guided, outcome, pivot, **options):
    chat = ChatFormat(tokenizer)
    backend = ScriptedBackend(tokenizer, policy=walk_policy(unguided, guided), pivot=pivot, outcome=outcome)
    opts = RolloutOptions(max_turns=6, max_response_tokens=16, max_context_tokens=4096, temperature=1.0)
    runner = EpisodeRunner(backend, chat, lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}), opts)
    ex = Explorer(runner, chat, explore_options(group_size=4, **options))
    [group] = ex.explore([seed], ["g0"])
    return group.trajectories, ex


def by_kind(trajs, kind):
    return [t for t in trajs if t.kind == kind]


def test_retry_that_beats_a_failed_base_adds_both_items(tiny_tokenizer):
    trajs, _ = explore(
        tiny_tokenizer, COIN_RIGHT, unguided="left", guided="right", outcome="failure", pivot=1, aux_weight=0.3
    )
    bases, retries = by_kind(trajs, Kind.BASE), by_kind(trajs, Kind.RETRY)
    assert [b.reward for b in bases] == [0.0, 0.0] and [r.reward for r in retries] == [1.0, 1.0]
    refl, sft = by_kind(trajs, Kind.REFLECTION_SFT), by_kind(trajs, Kind.RETRY_SFT)
    assert len(refl) == 2 and len(sft) == 2  # one of each per beating retry
    for t in refl + sft:
        assert t.fixed_advantage == 1.0 and t.weight == pytest.approx(0.3)
        assert t.group_id != "g0"  # alone in its own group: no baseline shared with the samples
    assert len({t.group_id for t in refl + sft}) == 4
    for t in sft:  # the guided retry: the guidance stays in its context, credit from the pivot
        assert GUIDE_MARK in tiny_tokenizer.decode(t.token_ids) and t.credit_from_turn == 1
    for t in refl:  # the reflection item: reflection prompt -> the report
        assert t.segments[-1].role == "response" and '"outcome": "failure"' in tiny_tokenizer.decode(
            t.segments[-1].token_ids
        )


def test_retry_that_equals_its_base_in_fewer_turns_beats_it(tiny_tokenizer):
    # the base detours (right to room 4, then left to room 1: 5 turns); the guided retry from turn 0
    # goes left at once (3 turns): same reward, fewer turns
    trajs, _ = explore(
        tiny_tokenizer, COIN_LEFT, unguided="detour", guided="left", outcome="success_but_inefficient", pivot=0
    )
    bases, retries = by_kind(trajs, Kind.BASE), by_kind(trajs, Kind.RETRY)
    assert [(b.reward, b.num_turns) for b in bases] == [(1.0, 5)] * 2
    assert [(r.reward, r.num_turns) for r in retries] == [(1.0, 3)] * 2
    assert len(by_kind(trajs, Kind.REFLECTION_SFT)) == 2 and len(by_kind(trajs, Kind.RETRY_SFT)) == 2


def test_retry_that_succeeds_without_beating_its_base_adds_nothing(tiny_tokenizer):
    # the base already succeeds in 3 turns; the reflector calls it inefficient; the retry from turn 1
    # takes the same path: equal reward, equal turns
    trajs, ex = explore(
        tiny_tokenizer, COIN_LEFT, unguided="left", guided="left", outcome="success_but_inefficient", pivot=1
    )
    bases, retries = by_kind(trajs, Kind.BASE), by_kind(trajs, Kind.RETRY)
    assert [(b.reward, b.num_turns) for b in bases] == [(1.0, 3)] * 2
    assert [(r.reward, r.num_turns, r.success) for r in retries] == [(1.0, 3, True)] * 2
    assert not [t for t in trajs if t.kind in AUX]
    m = ex.pop_metrics()
    assert m["retry_success_rate"] == 1.0 and m["retry_improvement_rate"] == 0.0


def test_retry_that_fails_adds_nothing(tiny_tokenizer):
    trajs, _ = explore(tiny_tokenizer, COIN_RIGHT, unguided="left", guided="left", outcome="failure", pivot=1)
    assert len(by_kind(trajs, Kind.RETRY)) == 2 and all(r.reward == 0.0 for r in by_kind(trajs, Kind.RETRY))
    assert not [t for t in trajs if t.kind in AUX]


def test_recognised_success_adds_its_reflection_item_only(tiny_tokenizer):
    trajs, ex = explore(
        tiny_tokenizer, COIN_LEFT, unguided="left", guided="left", outcome="success", pivot=1, aux_weight=0.7
    )
    bases = by_kind(trajs, Kind.BASE)
    assert len(bases) == 2 and all(b.success for b in bases)
    assert not by_kind(trajs, Kind.RETRY) and not by_kind(trajs, Kind.RETRY_SFT)
    refl = by_kind(trajs, Kind.REFLECTION_SFT)
    assert len(refl) == 2
    for t in refl:
        assert t.fixed_advantage == 1.0 and t.weight == pytest.approx(0.7) and t.success
        assert t.group_id != "g0" and t.reward == 1.0
        assert '"outcome": "success"' in tiny_tokenizer.decode(t.segments[-1].token_ids)
    assert len({t.group_id for t in refl}) == 2
    assert ex.pop_metrics()["retry_trigger_rate"] == 0.0


@pytest.mark.parametrize("case", ["beats", "recognised_success"])
def test_no_aux_items_adds_nothing(tiny_tokenizer, case):
    if case == "beats":
        trajs, _ = explore(
            tiny_tokenizer, COIN_RIGHT, unguided="left", guided="right", outcome="failure", pivot=1, aux_items=()
        )
        assert len(by_kind(trajs, Kind.RETRY)) == 2 and all(r.success for r in by_kind(trajs, Kind.RETRY))
    else:
        trajs, _ = explore(
            tiny_tokenizer, COIN_LEFT, unguided="left", guided="left", outcome="success", pivot=1, aux_items=()
        )
    assert not [t for t in trajs if t.kind in AUX]


@pytest.mark.parametrize("items", [("retry_sft",), ("reflection_sft",), ()])
def test_aux_items_chooses_which_auxiliary_items_join(tiny_tokenizer, items):
    # a beating retry would add one item of each kind per retry; a recognised success its reflection
    beat, _ = explore(
        tiny_tokenizer, COIN_RIGHT, unguided="left", guided="right", outcome="failure", pivot=1, aux_items=items
    )
    won, _ = explore(
        tiny_tokenizer, COIN_LEFT, unguided="left", guided="left", outcome="success", pivot=1, aux_items=items
    )
    assert len(by_kind(beat, Kind.RETRY)) == 2 and all(r.success for r in by_kind(beat, Kind.RETRY))
    assert len(by_kind(beat, Kind.RETRY_SFT)) == (2 if "retry_sft" in items else 0)
    assert len(by_kind(beat, Kind.REFLECTION_SFT)) == (2 if "reflection_sft" in items else 0)
    assert len(by_kind(won, Kind.REFLECTION_SFT)) == (2 if "reflection_sft" in items else 0)
    assert not by_kind(won, Kind.RETRY_SFT)
