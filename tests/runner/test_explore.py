"""Reflect-then-retry end to end with a scripted policy/reflector (paper §4), real everything else."""

import pytest

import environments
from rllib_r3l.batch import build_train_batch, select_trainable
from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.runner.explore import Explorer
from rllib_r3l.runner.rollout import EpisodeRunner, EpisodeSpec, RolloutOptions
from rllib_r3l.trajectory import Kind, Status
from tests.scripted import GUIDE_MARK, SEED, ScriptedBackend, explore_options, make_explorer


def unguided_rendering(tokenizer, traj):
    """What the chat template renders for the trajectory's messages, with no guidance anywhere."""
    msgs = [{"role": "system", "content": traj.info["system_text"]}]
    from rllib_r3l.runner.rollout import format_observation

    env = environments.make("r3l/ToyCorridor", {"num_rooms": 4})
    obs, info = env.reset(seed=traj.seed)
    for a in traj.actions:
        msgs.append({"role": "user", "content": format_observation(obs, info["admissible_actions"])})
        msgs.append({"role": "assistant", "content": a})
        obs, _, term, _, info = env.step(a)
    text = tokenizer.apply_chat_template(msgs, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    last_eos = max(i for i, t in enumerate(ids) if t == tokenizer.eos_token_id)
    return ids[: last_eos + 1]  # the template's text after the final stop token is not generated


def test_retry_from_pivot_succeeds_and_items_are_exact(tokenizer):
    ex, backend = make_explorer(tokenizer, pivot=1)
    [group] = ex.explore([SEED], ["g0"])
    kinds = [t.kind for t in group.trajectories]
    assert kinds.count(Kind.BASE) == 2 and kinds.count(Kind.RETRY) == 2
    assert kinds.count(Kind.REFLECTION_SFT) == 2 and kinds.count(Kind.RETRY_SFT) == 2
    bases = [t for t in group.trajectories if t.kind == Kind.BASE]
    retries = [t for t in group.trajectories if t.kind == Kind.RETRY]
    for b in bases:
        assert b.reward == 0.0 and not b.success and b.actions[0] == "move left"
        assert b.credit_from_turn == 1  # pivotal credit on the base side too
    for r in retries:
        assert r.success and r.reward == 1.0 and r.pivot == 1
        assert r.actions[0] == "move left"  # replayed prefix
        assert r.actions[1:] == ["move right", "move right", "move right", "take coin"]
        # the prefix tokens are reused verbatim from the base
        assert r.segments[0].token_ids == bases[0].segments[0].token_ids
        # no guidance in the training input, and token-exact with the unguided rendering
        text = tokenizer.decode(r.token_ids)
        assert GUIDE_MARK not in text
        assert r.token_ids == unguided_rendering(tokenizer, r)
    # but the model did see the guidance while retrying
    retry_prompts = [
        tokenizer.decode(q.prompt_token_ids) for call in backend.calls for q in call if q.json_schema is None
    ]
    assert any(GUIDE_MARK in p for p in retry_prompts)
    sft = [t for t in group.trajectories if t.kind == Kind.RETRY_SFT]
    assert all(GUIDE_MARK in tokenizer.decode(t.token_ids) for t in sft)
    m = ex.pop_metrics()
    assert m["retry_success_rate"] == 1.0 and m["retry_improvement_rate"] == 1.0
    assert m["reward_gain"] == 1.0 and m["mean_pivot_turn"] == 1.0 and m["retry_trigger_rate"] == 1.0
    assert m["reflection_valid_rate"] == 1.0


def test_learner_batch_has_expected_advantages_and_masks(tokenizer):
    ex, _ = make_explorer(tokenizer, pivot=1)
    groups = ex.explore([SEED], ["g0"])
    trajs, counts = select_trainable(groups)
    assert counts["episodes_lost"] == 0
    batch, adv = build_train_batch(
        trajs,
        pad_token_id=0,
        std_normalize=False,
        positive_amplification=True,
        alpha=3.0,
        success_reward=1.0,
        pivotal_credit=True,
        max_length=4096,
        skip_zero_advantage=False,
    )
    expected = {Kind.BASE: -0.5, Kind.RETRY: 1.0, Kind.REFLECTION_SFT: 1.0, Kind.RETRY_SFT: 1.0}
    for t, a in zip(trajs, adv):
        assert a == pytest.approx(expected[t.kind]), t.kind
    # masks: only responses of turns >= pivot carry credit in base and retry
    for t in trajs:
        arr = t.to_arrays()
        if t.kind in (Kind.BASE, Kind.RETRY):
            resp_turns = set(arr["turn_ids"][arr["loss_mask"]].tolist())
            assert resp_turns and min(resp_turns) == 1
            assert arr["loss_mask"].sum() == sum(
                len(s.token_ids) for s in t.segments if s.role == "response" and s.turn >= 1
            )


def test_pivot_zero_means_no_masking(tokenizer):
    ex, _ = make_explorer(tokenizer, pivot=0)
    [group] = ex.explore([SEED], ["g0"])
    for t in group.trajectories:
        assert t.credit_from_turn == 0
    retries = [t for t in group.trajectories if t.kind == Kind.RETRY]
    assert retries and all(r.success for r in retries)


def test_pivotal_credit_switch_off(tokenizer):
    ex, _ = make_explorer(tokenizer, pivot=1, pivotal_credit=False)
    [group] = ex.explore([SEED], ["g0"])
    assert all(t.credit_from_turn == 0 for t in group.trajectories)


def test_reflect_off_runs_full_group_of_base_rollouts(tokenizer):
    ex, backend = make_explorer(tokenizer, reflect=False, group_size=4)
    [group] = ex.explore([SEED], ["g0"])
    assert [t.kind for t in group.trajectories] == [Kind.BASE] * 4
    assert all(q.json_schema is None for call in backend.calls for q in call)


def test_replay_restores_recorded_observation(tokenizer):
    ex, _ = make_explorer(tokenizer)
    [base] = ex.episodes.run([EpisodeSpec(seed=SEED, group_id="g")])
    env = environments.make("r3l/ToyCorridor", {"num_rooms": 4})
    for k in range(base.num_turns):
        obs, _ = env.restore(base.seed, base.actions[:k])
        assert obs == base.observations[k]


def test_replay_mismatch_is_counted_and_retry_skipped(tokenizer):
    ex, _ = make_explorer(tokenizer)
    [base] = ex.episodes.run([EpisodeSpec(seed=SEED, group_id="g")])
    base.observations[1] = "something else"
    out = ex.episodes.run([EpisodeSpec(seed=SEED, group_id="g", kind=Kind.RETRY, base=base, pivot=2, guidance="x")])
    assert out == [None]
    assert ex.counters["replay_mismatch"] == 1


class _Exploding:
    rules = ""
    max_turns = 5

    def __init__(self):
        self.n = 0

    def reset(self, seed=None):
        return "start", {"task": "t", "admissible_actions": ["a", "b"]}

    def step(self, action):
        raise RuntimeError("JVM died")

    def close(self):
        pass


def test_environment_exception_is_counted_not_raised(tokenizer):
    chat = ChatFormat(tokenizer)
    backend = ScriptedBackend(tokenizer, policy=lambda text, choices: "a")
    runner = EpisodeRunner(backend, chat, _Exploding, RolloutOptions(None, 8, 1024, 1.0))
    ex = Explorer(runner, chat, explore_options(group_size=4))
    [group] = ex.explore([1], ["g"])
    assert len(group.lost) == 2 and not group.complete
    assert all(t.status == Status.ENV_ERROR for t in group.lost)
    assert runner.counters["env_errors"] == 2
    trajs, counts = select_trainable([group])
    assert trajs == [] and counts["partial_groups"] == 1 and counts["episodes_lost"] == 2


def test_context_overflow_ends_episode_within_budget(tokenizer):
    chat = ChatFormat(tokenizer)
    backend = ScriptedBackend(tokenizer)
    opts = RolloutOptions(max_turns=6, max_response_tokens=16, max_context_tokens=160, temperature=1.0)
    runner = EpisodeRunner(backend, chat, lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}), opts)
    [t] = runner.run([EpisodeSpec(seed=SEED, group_id="g")])
    assert t.status == Status.CONTEXT_OVERFLOW and runner.counters["context_overflow"] == 1
    assert 0 < t.num_turns < 6 and t.segments[-1].role == "response"
    assert t.num_tokens <= 160


def test_success_verdict_on_a_failed_episode_is_counted_not_trusted(tokenizer):
    chat = ChatFormat(tokenizer)
    backend = ScriptedBackend(tokenizer, outcome="success")
    opts = RolloutOptions(max_turns=6, max_response_tokens=16, max_context_tokens=4096, temperature=1.0)
    runner = EpisodeRunner(backend, chat, lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}), opts)
    ex = Explorer(runner, chat, explore_options(group_size=4))
    [group] = ex.explore([SEED], ["g0"])
    assert [t.kind for t in group.trajectories] == [Kind.BASE, Kind.BASE]  # no retry, no aux item
    assert runner.counters["reflection_contradicts_reward"] == 2
    m = ex.pop_metrics()
    assert m["reflection_valid_rate"] == 0.0 and m["retry_trigger_rate"] == 0.0


def test_failed_episode_schema_forbids_success():
    from rllib_r3l.runner.reflection import reflect

    schema = reflect.report_json_schema(5, failed=True)
    assert schema["properties"]["outcome"]["enum"] == ["failure"]
    assert schema["properties"]["retry_from_step"]["maximum"] == 4


def test_rollout_phase_timers_account_for_engine_env_and_replay(tokenizer):
    """r3l/timers (issue 12): the engine's time per phase, environment steps and a retry's replay are
    each timed where they happen. Delays planted in the backend and the environment give lower bounds
    that only the right timer can meet."""
    import time as _time

    class SlowEnv:
        def __init__(self):
            self.env = environments.make("r3l/ToyCorridor", {"num_rooms": 4})
            self.rules, self.max_turns = self.env.rules, self.env.max_turns

        def reset(self, seed=None):
            _time.sleep(0.03)
            return self.env.reset(seed=seed)

        def step(self, action):
            _time.sleep(0.01)
            return self.env.step(action)

        def close(self):
            self.env.close()

    class SlowBackend(ScriptedBackend):
        def generate(self, requests, **kw):
            _time.sleep(0.05)
            return super().generate(requests, **kw)

    chat = ChatFormat(tokenizer)
    backend = SlowBackend(tokenizer, pivot=1)
    opts = RolloutOptions(max_turns=6, max_response_tokens=16, max_context_tokens=4096, temperature=1.0)
    runner = EpisodeRunner(backend, chat, SlowEnv, opts)
    ex = Explorer(runner, chat, explore_options(group_size=4))
    [group] = ex.explore([SEED], ["g0"])
    bases = [t for t in group.trajectories if t.kind == Kind.BASE]
    retries = [t for t in group.trajectories if t.kind == Kind.RETRY]
    assert len(retries) == 2 and all(r.pivot == 1 for r in retries)
    c = runner.counters
    live_steps = sum(len(b.actions) for b in bases) + sum(len(r.actions) - r.pivot for r in retries)
    assert c["seconds_env_step"] >= 0.01 * live_steps
    assert c["seconds_env_reset"] >= 0.03 * len(bases)
    assert c["seconds_replay"] >= (0.03 + 0.01) * len(retries)  # a reset and one replayed step each
    base_waves = max(len(b.actions) for b in bases)  # one generate call per turn wave
    retry_waves = max(len(r.actions) - r.pivot for r in retries)
    assert c["seconds_generate_base"] >= 0.05 * base_waves
    assert c["seconds_generate_retry"] >= 0.05 * retry_waves
