"""The retry ledger's rows from a real exploration, and the levers at a retry's pivot (issue 46): pivot_backoff,
pivot_action="exclude_failed" (choices and free text), pivot_temperature and the fresh control (retry_control).

ToyCorridor(4 rooms), seed 11: start in room 2, coin in room 4; the oracle's first mistake of a walk that
starts "move left" is turn 0. The scripted reflector names pivot 1 (a turn late, as small policies do).
"""

from __future__ import annotations

from collections import Counter

import environments
from rllib_r3l.generation.base import GenerationResult
from rllib_r3l.runner import pivot_turn
from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.runner.explore import Explorer
from rllib_r3l.runner.rollout import EpisodeRunner, EpisodeSpec, RolloutOptions
from rllib_r3l.trajectory import Kind, Trajectory
from tests.scripted import GUIDE_MARK, ScriptedBackend, explore_options

SEED = 11


def stubborn(prompt_text, choices):
    """Always 'move left' (the failed move, guided or not) where it may; else the first choice it is given."""
    last_user = prompt_text.rsplit("user\n", 1)[-1]
    if "coin here" in last_user:
        return "take coin"
    if "move left" in last_user and (choices is None or "move left" in choices):
        return "move left"
    return choices[0] if choices else "take coin"


def explorer(tokenizer, policy=None, *, decoding="choice", rollout=None, **explore):
    backend = ScriptedBackend(tokenizer, pivot=1, **({"policy": policy} if policy else {}))
    ro = RolloutOptions(
        max_turns=6,
        max_response_tokens=16,
        max_context_tokens=4096,
        temperature=1.0,
        action_decoding=decoding,
        **(rollout or {}),
    )
    runner = EpisodeRunner(
        backend, ChatFormat(tokenizer), lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}), ro
    )
    return Explorer(
        runner, ChatFormat(tokenizer), explore_options(group_size=4, reflect_on="failures", **explore)
    ), backend


def test_every_reflection_writes_a_ledger_row_with_the_chain_s_links(tiny_tokenizer):
    ex, _ = explorer(tiny_tokenizer)
    [group] = ex.explore([SEED], ["g0"])
    bases = [t for t in group.trajectories if t.kind == Kind.BASE]
    assert len(group.ledger) == len(bases) == 2 and all(not b.success for b in bases)
    for r, b in zip(group.ledger, bases):
        assert (r["group_id"], r["task_seed"], r["attempt"], r["style"], r["status"], r["valid"]) == (
            "g0",
            SEED,
            0,
            "structured",
            "valid",
            True,
        )
        assert (r["reported_pivot"], r["pivot"], r["oracle_pivot"]) == (1, 1, 0)  # a turn late: replays the mistake
        assert r["base_action"] == b.actions[1] and r["retry_action"] == "move right" and r["action_changed"]
        assert (r["retry_status"], r["retry_success"], r["control_success"]) == ("ok", True, None)
        assert r["group_base_success"] == 0.0 and r["retry_tokens"] > 0 and r["reflection_tokens"] > 0
        assert r["base_turns"] == b.num_turns and r["retry_reward"] == 1.0
    from rllib_r3l import retry_ledger

    f = retry_ledger.funnel([dict(r, iteration=1) for r in group.ledger])
    assert (f["reflections"], f["valid"], f["pivot_scored"], f["pivot_in_time"], f["retry_success"]) == (2, 2, 2, 0, 2)


def test_pivot_backoff_starts_the_retry_earlier(tiny_tokenizer):
    ex, _ = explorer(tiny_tokenizer, pivot_backoff=1)
    [group] = ex.explore([SEED], ["g0"])
    retries = [t for t in group.trajectories if t.kind == Kind.RETRY]
    assert retries and all(t.pivot == 0 for t in retries)
    assert all((r["reported_pivot"], r["pivot"]) == (1, 0) for r in group.ledger)
    ex, _ = explorer(tiny_tokenizer, pivot_backoff=5)  # never before turn 0
    [group] = ex.explore([SEED], ["g0"])
    assert all(r["pivot"] == 0 for r in group.ledger)


def test_exclude_failed_never_repeats_the_failed_action_with_choices(tiny_tokenizer):
    base_ex, _ = explorer(tiny_tokenizer, stubborn)
    [before] = base_ex.explore([SEED], ["g0"])
    assert any(r["action_changed"] is False for r in before.ledger)  # the stubborn policy repeats itself
    ex, _ = explorer(tiny_tokenizer, stubborn, rollout={"pivot_action": "exclude_failed"}, pivot_backoff=1)
    [group] = ex.explore([SEED, SEED + 1, SEED + 2], ["g0", "g1", "g2"])[:1]
    rows = [r for r in group.ledger if r["retry_status"] == "ok"]
    assert rows and all(r["action_changed"] is True for r in rows), rows
    assert ex.counters["pivot_choices_excluded"] >= len(rows)


def test_exclude_failed_with_free_text_resamples_up_to_the_bound(tiny_tokenizer):
    calls = Counter()

    def repeats_twice(prompt_text, choices):
        """The failed episode took 'take coin' at turn 1 (room 1 has no left): its retry's pivot turn (the
        first answer after the guidance) repeats that twice, then moves right."""
        if GUIDE_MARK in prompt_text and prompt_text.rsplit(GUIDE_MARK, 1)[-1].count("assistant") == 1:
            calls["pivot"] += 1
            return "take coin" if calls["pivot"] % 3 else "move right"
        return stubborn(prompt_text, choices)

    ex, _ = explorer(
        tiny_tokenizer,
        repeats_twice,
        decoding="free_text",
        rollout={"pivot_action": "exclude_failed", "pivot_resamples": 4},
    )
    [group] = ex.explore([SEED], ["g0"])
    rows = [r for r in group.ledger if r["retry_status"] == "ok"]
    assert [r["base_action"] for r in rows] == ["take coin", "take coin"]
    # both pivot turns repeat twice (one batched resample each round), then both move right
    assert ex.counters["pivot_resamples"] == 4 and calls["pivot"] == 6
    assert ex.counters["pivot_repeats_kept"] == 0 and all(r["action_changed"] for r in rows)
    ex, _ = explorer(
        tiny_tokenizer, stubborn, decoding="free_text", rollout={"pivot_action": "exclude_failed", "pivot_resamples": 2}
    )
    [group] = ex.explore([SEED], ["g0"])
    kept = [r for r in group.ledger if r["retry_status"] == "ok" and r["action_changed"] is False]
    assert ex.counters["pivot_repeats_kept"] == len(kept) > 0  # bounded, then kept and counted
    assert ex.counters["pivot_resamples"] == 2 * len(kept)


def test_the_pivot_turn_samples_at_its_own_temperature(tiny_tokenizer):
    ex, backend = explorer(tiny_tokenizer, rollout={"pivot_temperature": 1.7})
    ex.explore([SEED], ["g0"])
    hot = [calls for calls, t in zip(backend.calls, backend.temperatures) if t == 1.7]
    assert hot and all(len(c) == 1 or len(c) == 2 for c in hot)  # only the retries' pivot turns
    assert sum(len(c) for c in hot) == 2 and set(backend.temperatures) == {1.0, 1.7}


def test_the_control_is_a_fresh_unguided_episode_never_trained_on(tiny_tokenizer):
    ex, _ = explorer(tiny_tokenizer, retry_control=True)
    [group] = ex.explore([SEED], ["g0"])
    assert not any("control" in t.group_id for t in group.trajectories + group.lost)
    assert len([t for t in group.trajectories if t.kind == Kind.BASE]) == 2  # the control is no base episode
    assert all(r["control_success"] is False for r in group.ledger)  # unguided, it walks left as the base did
    assert ex.counters["control_episodes"] == 2 and ex.pop_metrics()["control_success_rate"] == 0.0


def test_pivot_turn_pure_parts():
    base = Trajectory(segments=[], reward=0.0, group_id="g", actions=["move left", "Take coin."])
    spec = EpisodeSpec(seed=1, group_id="g", kind=Kind.RETRY, base=base, pivot=1)
    assert pivot_turn.failed_action(spec, 1, "exclude_failed") == "Take coin."
    assert pivot_turn.failed_action(spec, 0, "exclude_failed") is None  # not the pivot turn
    assert pivot_turn.failed_action(spec, 1, "any") is None
    counters = Counter()
    assert pivot_turn.exclude(["move right", "take coin"], "Take coin.", counters) == ["move right"]
    assert pivot_turn.exclude(["take coin"], "take coin", counters) == ["take coin"]  # nothing else left
    assert counters == {"pivot_choices_excluded": 1, "pivot_exclusion_impossible": 1}
    assert pivot_turn.temperature(spec, 1, 1.0, 1.5) == 1.5 and pivot_turn.temperature(spec, 2, 1.0, 1.5) == 1.0
    assert pivot_turn.temperature(EpisodeSpec(seed=1, group_id="g"), 0, 1.0, 1.5) == 1.0

    texts = iter(["take coin", "x", "take coin", "take coin", "take coin"])

    def fake(requests, temperature):
        return [GenerationResult([1], [0.0], next(texts), "stop") for _ in requests]

    c2 = Counter()
    out = pivot_turn.generate(fake, ["a", "b"], [1.0, 1.0], ["take coin", None], 2, c2)
    assert [o.text for o in out] == ["take coin", "x"] and c2 == {"pivot_resamples": 2, "pivot_repeats_kept": 1}


def test_the_oracle_reflector_s_rows_carry_its_pivot(tiny_tokenizer):
    """reflector="oracle" (DIAGNOSTIC): its reports are the oracle's, so their pivots are scored and in time."""
    from rllib_r3l import retry_ledger

    ex, _ = explorer(tiny_tokenizer, reflector="oracle")
    [group] = ex.explore([SEED], ["g0"])
    assert group.ledger and all(r["oracle_pivot"] == 0 == r["reported_pivot"] for r in group.ledger)
    f = retry_ledger.funnel([dict(r, iteration=1) for r in group.ledger])
    assert f["pivot_scored"] == f["pivot_in_time"] == f["pivot_exact"] == len(group.ledger)
