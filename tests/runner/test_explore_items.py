"""What exploration builds, item by item (rllib_r3l.runner.explore), with scripted episodes and hand-made
trajectories: the reflection item's every field (policy reflector, and a separate reflector whose
report is re-encoded for the policy), one reflection item per reflection however many retries
beat the base, auxiliary items over the context limit, retries that are lost or generated nothing
after the pivot, and metrics that reset. The rules for when items are added: test_aux_rules.py.

ToyCorridor(4 rooms), seed 11: start in room 2, coin in room 4; the scripted policy goes left
unguided and right with the guidance, so every base fails and every retry from turn 1 succeeds.
"""

from __future__ import annotations

import types

import environments
from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.runner.explore import Explorer, GroupResult
from rllib_r3l.runner.reflection import reflect as reflect_lib
from rllib_r3l.runner.reflection.reflect import ParseStatus
from rllib_r3l.runner.rollout import EpisodeRunner, RolloutOptions
from rllib_r3l.trajectory import Kind, Segment, Status, Trajectory
from tests.scripted import ScriptedBackend, explore_options, walk_policy

SEED = 11
TEMPLATE = "A custom review.\nRULES {rules}\nTASK {task}\nSTEPS\n{trajectory}\nReward {reward}; answer in JSON."


Recording = ScriptedBackend  # it records the temperature of each call


class Failing(ScriptedBackend):
    def generate(self, requests, *, temperature, top_p=1.0, seed=None, on_done=None):
        if any(r.json_schema is not None for r in requests):
            raise RuntimeError("engine died")
        return super().generate(requests, temperature=temperature, top_p=top_p, seed=seed, on_done=on_done)


def make(tokenizer, *, separate_reflector=False, backend_cls=ScriptedBackend, outcome="failure", **options):
    chat = ChatFormat(tokenizer)
    backend = backend_cls(tokenizer, policy=walk_policy("left", "right"), pivot=1, outcome=outcome)
    ro = RolloutOptions(max_turns=6, max_response_tokens=16, max_context_tokens=4096, temperature=1.0)
    runner = EpisodeRunner(backend, chat, lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}), ro)
    opts = explore_options(**{"group_size": 4, **options})
    if separate_reflector:  # another model's chat format (same tokenizer here: what matters is the object)
        return Explorer(runner, chat, opts, reflector=backend, reflector_chat=ChatFormat(tokenizer)), chat
    return Explorer(runner, chat, opts), chat


def kinds(group, kind):
    return [t for t in group.trajectories if t.kind == kind]


def test_reflection_item_is_the_reflection_prompt_and_the_policys_report(tiny_tokenizer):
    ex, chat = make(tiny_tokenizer, aux_weight=0.3, reflection_template=TEMPLATE)
    [group] = ex.explore([SEED], ["g0"])
    bases, refl = kinds(group, Kind.BASE), kinds(group, Kind.REFLECTION_SFT)
    assert len(bases) == len(refl) == 2
    for b, r in zip(bases, refl):
        _parsed, prompt_ids, out = b.info["reflection"]
        assert prompt_ids == chat.prompt(reflect_lib.build_reflection_messages(b, template=TEMPLATE))
        assert "A custom review." in tiny_tokenizer.decode(prompt_ids)
        prompt, response = r.segments
        assert (prompt.role, prompt.turn, prompt.token_ids) == ("prompt", 0, prompt_ids)
        # the report as the policy generated it: its own tokens and sampler log-probs
        assert (response.role, response.turn, response.token_ids) == ("response", 0, out.token_ids)
        assert response.logprobs == out.logprobs == [-0.5] * len(out.token_ids)
        assert r.group_id == f"g0/reflection/{id(b)}" and r.kind is Kind.REFLECTION_SFT
        assert (r.reward, r.success, r.num_turns, r.fixed_advantage, r.weight) == (1.0, True, 1, 1.0, 0.3)
        assert r.seed == b.seed == SEED and r.task == b.task != ""
    for s in kinds(group, Kind.RETRY_SFT):
        assert s.group_id.startswith("g0/retry_sft/")


def test_a_separate_reflectors_report_is_re_encoded_for_the_policy(tiny_tokenizer):
    ex, chat = make(tiny_tokenizer, separate_reflector=True, reflection_template=TEMPLATE)
    [group] = ex.explore([SEED], ["g0"])
    bases, refl = kinds(group, Kind.BASE), kinds(group, Kind.REFLECTION_SFT)
    assert len(bases) == len(refl) == 2
    for b, r in zip(bases, refl):
        _parsed, _prompt_ids, out = b.info["reflection"]
        prompt, response = r.segments
        # the policy's own rendering of the reflection prompt (with the configured template), and the
        # report's text in the policy's tokens, closed like a turn; no log-probs (another model's)
        assert prompt.token_ids == chat.prompt(reflect_lib.build_reflection_messages(b, template=TEMPLATE))
        assert response.token_ids == chat.encode(out.text) + [chat.eot_token_id]
        assert response.logprobs is None and (prompt.turn, response.turn) == (0, 0)


class SpelledApart(ScriptedBackend):
    """Reports spelled one character a token, as vLLM's JSON grammar may spell them."""

    def _result(self, text):
        res = super()._result(text)
        if text.startswith("{"):
            ids = [t for ch in text for t in self.tok.encode(ch, add_special_tokens=False)] + [self.tok.eos_token_id]
            res = type(res)(token_ids=ids, logprobs=[-0.5] * len(ids), text=text, finish_reason="stop")
        return res


def test_a_report_in_other_tokens_is_trained_in_the_policys_own_tokens(tiny_tokenizer):
    ex, chat = make(tiny_tokenizer, backend_cls=SpelledApart)
    [group] = ex.explore([SEED], ["g0"])
    bases, refl = kinds(group, Kind.BASE), kinds(group, Kind.REFLECTION_SFT)
    assert len(refl) == 2
    for b, r in zip(bases, refl):
        _parsed, prompt_ids, out = b.info["reflection"]
        assert out.token_ids[:-1] != chat.encode(out.text)  # the sample was spelled apart
        prompt, response = r.segments
        assert prompt.token_ids == prompt_ids  # the context the policy reflected in, unchanged
        assert response.token_ids == chat.encode(out.text) + [chat.eot_token_id]
        assert response.logprobs is None
    assert ex.counters["reflection_items_retokenized"] == 2


def test_one_reflection_item_per_reflection_however_many_retries_beat_the_base(tiny_tokenizer):
    ex, _ = make(tiny_tokenizer, group_size=6, retries_per_failure=2)
    [group] = ex.explore([SEED], ["g0"])
    assert len(kinds(group, Kind.BASE)) == 2 and len(kinds(group, Kind.RETRY)) == 4
    assert all(r.success for r in kinds(group, Kind.RETRY))
    assert len(kinds(group, Kind.RETRY_SFT)) == 4  # one guided item per beating retry
    assert len(kinds(group, Kind.REFLECTION_SFT)) == 2  # but one reflection item per base
    assert all(b.info["reflection_item_added"] is True for b in kinds(group, Kind.BASE))


def test_auxiliary_items_over_the_context_limit_are_dropped_and_counted(tiny_tokenizer):
    ex, _ = make(tiny_tokenizer)
    [group] = ex.explore([SEED], ["g0"])
    aux = kinds(group, Kind.REFLECTION_SFT) + kinds(group, Kind.RETRY_SFT)
    assert len(aux) == 4 and not [k for k in ex.counters if k.endswith("_items_too_long")]
    longest = max(t.num_tokens for t in aux)
    ex, _ = make(tiny_tokenizer, max_context_tokens=longest)  # at the limit: kept
    [group] = ex.explore([SEED], ["g0"])
    assert len(kinds(group, Kind.REFLECTION_SFT) + kinds(group, Kind.RETRY_SFT)) == 4
    limit = longest - 1
    over = {k: sum(t.kind == k and t.num_tokens > limit for t in aux) for k in (Kind.REFLECTION_SFT, Kind.RETRY_SFT)}
    ex, _ = make(tiny_tokenizer, max_context_tokens=limit)
    [group] = ex.explore([SEED], ["g0"])
    for k, n in over.items():
        assert ex.counters[f"{k.value}_items_too_long"] == n
        assert len(kinds(group, k)) == 2 - n
    assert sum(over.values()) >= 1
    assert len(kinds(group, Kind.BASE)) == len(kinds(group, Kind.RETRY)) == 2  # only auxiliary items are dropped


def test_metrics_are_popped_once(tiny_tokenizer):
    ex, _ = make(tiny_tokenizer)
    ex.explore([SEED], ["g0"])
    first = ex.pop_metrics()
    assert first["retry_success_rate"] == 1.0 and first["reflection_total"] == 2
    assert ex.pop_metrics() == {}  # samples and reflection counts start again


# ---------------------------------------------------------------------- retries by hand
def _traj(parts, *, reward, kind=Kind.BASE, pivot=None, status=Status.OK):
    segs = [
        Segment(role, [10 + i], turn=turn, logprobs=[-1.0] if role == "response" else None)
        for i, (role, turn) in enumerate(parts)
    ]
    return Trajectory(
        segments=segs,
        reward=reward,
        group_id="g",
        kind=kind,
        pivot=pivot,
        status=status,
        num_turns=1 + max(t for _, t in parts),
    )


BASE = [("prompt", 0), ("response", 0), ("prompt", 1), ("response", 1), ("prompt", 2), ("response", 2)]


def test_a_lost_retry_joins_the_lost_episodes(tiny_tokenizer):
    ex, _ = make(tiny_tokenizer)
    base, group = _traj(BASE, reward=0.0), GroupResult("g")
    retry = _traj(BASE[:3], reward=0.0, kind=Kind.RETRY, pivot=1, status=Status.ENV_ERROR)
    ex._add_retry(base, retry, group)
    assert group.lost == [retry] and group.trajectories == [] and base.credit_from_turn == 0
    assert ex.samples == {}


def test_a_retry_with_nothing_generated_after_its_pivot_is_counted_not_trained(tiny_tokenizer):
    ex, _ = make(tiny_tokenizer, aux_items=())  # no auxiliary items: the base has no reflection here
    base, group = _traj(BASE, reward=0.25), GroupResult("g")
    for n in (1, 2):
        # the context overflowed at the pivot's prompt: no response from turn 2 on
        empty = _traj(BASE[:5], reward=0.0, kind=Kind.RETRY, pivot=2, status=Status.CONTEXT_OVERFLOW)
        ex._add_retry(base, empty, group)
        assert ex.counters["retries_empty"] == n
    assert group.trajectories == [] and group.lost == [] and base.credit_from_turn == 0 and ex.samples == {}
    # a response at the pivot's own turn is a corrected suffix: trained, with pivotal credit
    retry = _traj(BASE[:4], reward=1.0, kind=Kind.RETRY, pivot=1, status=Status.TRUNCATED)
    ex._add_retry(base, retry, group)
    assert ex.counters["retries_empty"] == 2
    [item] = [t for t in group.trajectories if t.kind is Kind.RETRY]
    assert item.credit_from_turn == 1 and base.credit_from_turn == 1
    assert ex.samples == {
        "retry_success_rate": [1.0],
        "retry_improvement_rate": [1.0],
        "reward_gain": [0.75],
        "mean_pivot_turn": [1.0],
    }


def test_a_shallower_pivot_moves_the_bases_credit_a_deeper_one_does_not(tiny_tokenizer):
    ex, _ = make(tiny_tokenizer, aux_items=())
    base, group = _traj(BASE, reward=0.0), GroupResult("g")
    base.credit_from_turn = 1  # an earlier retry restarted at turn 1
    ex._add_retry(base, _traj(BASE, reward=0.0, kind=Kind.RETRY, pivot=2), group)
    assert base.credit_from_turn == 1 and group.trajectories[-1].credit_from_turn == 2
    base.credit_from_turn = 2
    ex._add_retry(base, _traj(BASE, reward=0.0, kind=Kind.RETRY, pivot=1), group)
    assert base.credit_from_turn == 1
    ex._add_retry(base, _traj(BASE, reward=0.0, kind=Kind.RETRY, pivot=0), group)  # no shared prefix
    assert base.credit_from_turn == 1 and group.trajectories[-1].credit_from_turn == 0


# ----------------------------------------------------------------------------- reflect()
def _episode(actions, *, reward):
    segs = [Segment("prompt", [10], 0)] + [Segment("response", [11 + k], k) for k in range(len(actions))]
    return Trajectory(
        segments=segs,
        reward=reward,
        group_id="g",
        success=reward == 1.0,
        num_turns=len(actions),
        actions=list(actions),
        observations=[f"room {k}" for k in range(len(actions) + 1)],
        task="Find the coin.",
        seed=5,
    )


def test_reflection_requests_and_their_accounting(tiny_tokenizer):
    ex, chat = make(
        tiny_tokenizer,
        backend_cls=Recording,
        outcome="success",
        reflection_max_chars=40,
        max_reflection_tokens=77,
        temperature=0.7,
    )
    failed, won = _episode([], reward=0.0), _episode(["a", "b", "c"], reward=1.0)
    results = ex.reflect([failed, won])
    backend = ex.reflector
    [reqs] = backend.calls
    assert (
        [r.prompt_token_ids for r in reqs]
        == [p for _parsed, p, _o in results]
        == [chat.prompt(reflect_lib.build_reflection_messages(t)) for t in (failed, won)]
    )
    assert [r.max_tokens for r in reqs] == [77, 77] and backend.temperatures == [0.7]
    # the schema bounds the pivot by the episode's steps (at least one) and, for a failure, forbids "success"
    assert reqs[0].json_schema == reflect_lib.report_json_schema(1, failed=True, max_chars=40)
    assert reqs[1].json_schema == reflect_lib.report_json_schema(3, failed=False, max_chars=40)
    # a "success" verdict on a failed episode is counted and not trusted; on a won one it is PERFECT
    assert [r[0].status for r in results] == [ParseStatus.BAD_OUTCOME, ParseStatus.PERFECT]
    assert results[0][0].error == "outcome 'success' contradicts the environment's reward"
    assert ex.reflection_stats.counts[ParseStatus.BAD_OUTCOME] == 1 and ex.reflection_stats.total == 2
    prompt_tokens = sum(len(r.prompt_token_ids) for r in reqs)
    generated = sum(len(o.token_ids) for _p, _i, o in results)
    ex.reflect([failed, won])  # the counters add up
    c = ex.counters
    assert c["prompt_tokens"] == c["prompt_tokens_reflect"] == 2 * prompt_tokens
    assert c["progress_reflections"] == 4 and c["progress_tokens"] == 2 * generated
    assert c["reflection_contradicts_reward"] == 2 and c["prompt_tokens_cached_reflect"] == 0


def test_unstructured_reflection_has_no_schema(tiny_tokenizer):
    ex, _ = make(tiny_tokenizer, reflection_structured=False)
    ex.reflect([_episode(["a"], reward=0.0)])
    [[req]] = ex.reflector.calls
    assert req.json_schema is None and req.max_tokens == 512


def test_a_failed_reflection_call_is_counted_and_reflects_nothing(tiny_tokenizer):
    ex, chat = make(tiny_tokenizer, backend_cls=Failing)
    eps = [_episode(["a"], reward=0.0), _episode(["a", "b"], reward=0.0)]
    for n in (2, 4):
        results = ex.reflect(eps)
        assert results == [(None, chat.prompt(reflect_lib.build_reflection_messages(t)), None) for t in eps]
        assert ex.counters["reflection_generation_errors"] == n
    assert ex.reflection_stats.total == 0 and ex.counters["progress_reflections"] == 0


def test_success_takes_the_environments_verdict_or_the_configured_reward(tiny_tokenizer):
    ex, _ = make(tiny_tokenizer, success_reward=2.0)
    assert ex.is_success(Trajectory([], 0.0, "g", success=True))  # won, whatever the reward
    assert ex.is_success(Trajectory([], 2.0, "g")) and not ex.is_success(Trajectory([], 1.0, "g"))


def test_reflection_time_and_group_bookkeeping(tiny_tokenizer, monkeypatch):
    import rllib_r3l.runner.explore as explore_mod

    clock = iter(range(100))
    monkeypatch.setattr(explore_mod, "time", types.SimpleNamespace(perf_counter=lambda: float(next(clock))))
    ex, _ = make(tiny_tokenizer, group_size=2)  # one base rollout: a rate over 1 is still logged
    assert ex.reflect_seconds == 0.0  # nothing reflected yet
    [group] = ex.explore([SEED], ["g0"])
    assert group.group_id == "g0" and group.complete is True
    assert ex.reflect_seconds == 1.0  # the reflection phase, one tick of the fake clock
    assert ex.pop_metrics()["retry_trigger_rate"] == 1.0
    ex.explore([SEED], ["g1"])
    assert ex.reflect_seconds == 1.0  # per explore() call, not accumulated


def test_failed_reflection_calls_leave_every_base_unreflected(tiny_tokenizer):
    ex, chat = make(tiny_tokenizer, backend_cls=Failing)
    [group] = ex.explore([SEED], ["g0"])
    bases = kinds(group, Kind.BASE)
    assert len(bases) == 2 and [t.kind for t in group.trajectories] == [Kind.BASE, Kind.BASE]
    for b in bases:
        assert b.info["reflection"] == (None, chat.prompt(reflect_lib.build_reflection_messages(b)), None)


def test_transcript_reflection_falls_back_to_the_log_and_counts_it(tiny_tokenizer, monkeypatch):
    from rllib_r3l.runner.reflection import context as reflection_context

    monkeypatch.setattr(reflection_context, "transcript_prompt", lambda chat, t: None)  # e.g. no room left
    ex, chat = make(tiny_tokenizer, reflection_context="transcript")
    eps = [_episode(["a"], reward=0.0), _episode(["a", "b"], reward=0.0)]
    for n in (2, 4):
        results = ex.reflect(eps)
        assert [p for _r, p, _o in results] == [chat.prompt(reflect_lib.build_reflection_messages(t)) for t in eps]
        assert ex.counters["reflection_transcript_fallbacks"] == n


def test_reflect_on_failures_passes_over_successes_and_counts_them(tiny_tokenizer):
    """reflect_on="failures" (paper §3): a won base episode gets no reflection request and no retry,
    counted as reflections_skipped_successes; "all" (authors' code) reflects on every base."""
    seeds = list(range(6))
    runs = {}
    for mode in ("all", "failures"):
        ex, _chat = make(tiny_tokenizer, backend_cls=Recording, outcome="success_but_inefficient", reflect_on=mode)
        groups = ex.explore(seeds, [f"g{s}" for s in seeds])
        reflected = [r for call in ex.reflector.calls for r in call if r.json_schema is not None]
        runs[mode] = (ex, groups, reflected)
    ex, groups, reflected = runs["all"]
    bases = [b for g in groups for b in kinds(g, Kind.BASE)]
    won = [b for b in bases if b.success]
    assert 0 < len(won) < len(bases)  # the seeds give both outcomes, so the test can tell the modes apart
    assert len(reflected) == len(bases) and ex.counters["reflections_skipped_successes"] == 0
    assert all("reflection" in b.info for b in bases)
    ex, groups, reflected = runs["failures"]
    bases_f = [b for g in groups for b in kinds(g, Kind.BASE)]
    # the same seeds and the same scripted policy: the same base episodes
    assert [(b.seed, b.actions, b.success) for b in bases_f] == [(b.seed, b.actions, b.success) for b in bases]
    assert len(reflected) == len(bases) - len(won)
    assert ex.counters["reflections_skipped_successes"] == len(won)
    for g in groups:
        for b in kinds(g, Kind.BASE):
            assert ("reflection" in b.info) == (not b.success)
    # every reflected episode is retried here (a valid report, pivot 1): a won one only under "all"
    n_retries = {m: sum(len(kinds(g, Kind.RETRY)) for g in runs[m][1]) for m in runs}
    assert n_retries == {"all": len(bases), "failures": len(bases) - len(won)}
    assert ex.reflection_stats.total == len(bases) - len(won)


class ReportsOneByOne(ScriptedBackend):
    """Tells ``on_done`` per finished report, and records the live count the explorer shows at each."""

    def generate(self, requests, *, temperature, top_p=1.0, seed=None, on_done=None):
        outs = super().generate(requests, temperature=temperature, top_p=top_p, seed=seed)
        if on_done is not None and any(r.json_schema is not None for r in requests):
            for _ in outs:
                on_done(1)
                self.seen.append(self.explorer.counters["progress_reflections"])
        return outs


def test_the_live_reflection_count_grows_per_finished_report_not_per_batch(tiny_tokenizer):
    ex, _ = make(tiny_tokenizer, backend_cls=ReportsOneByOne)
    backend = ex.reflector
    backend.seen, backend.explorer = [], ex
    [group] = ex.explore([SEED], ["g0"])
    reflected = len(kinds(group, Kind.BASE))
    assert backend.seen == list(range(1, reflected + 1))  # while the batch was still generating
    assert ex.counters["progress_reflections"] == reflected  # and not counted twice at its end
    plain, _ = make(tiny_tokenizer)  # a backend that never tells: counted once the batch returns
    plain.explore([SEED], ["g0"])
    assert plain.counters["progress_reflections"] == reflected
