"""``rollout_loop="episodes"`` (issue 47 item 1): every episode its own loop, environment steps in worker threads.

The exploration tests of the waves run again here with every ``EpisodeRunner.run`` going through the episode
loops (same trajectories, statuses, counters: the scripted policy decides the same whatever the batching);
then what only the loops do: environment steps of different episodes overlap, a free-text pivot turn is
resampled per episode, the per-step delay option, and failures inside the loop.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

import environments
from environments.latency import StepDelay
from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.runner.episode_loop import run_episodes
from rllib_r3l.runner.explore import Explorer
from rllib_r3l.runner.rollout import EpisodeRunner, EpisodeSpec, RolloutOptions
from rllib_r3l.trajectory import Kind, Status
from tests.runner.reflection.test_oracle import *  # noqa: F401,F403 - collected again under episode loops
from tests.runner.test_aux_rules import *  # noqa: F401,F403
from tests.runner.test_explore import *  # noqa: F401,F403
from tests.runner.test_explore_items import *  # noqa: F401,F403
from tests.runner.test_retry_levers import *  # noqa: F401,F403
from tests.scripted import ScriptedBackend, walk_policy
from tests.test_episode_budget import test_explore_starts_at_most_max_episodes_bases_first  # noqa: F401

SEED = 11  # ToyCorridor(4 rooms): start in room 2, coin in room 4


@pytest.fixture(autouse=True, params=["phases", "pipeline"])
def episode_loops(request, monkeypatch):
    """Every rollout of this module's tests (the imported ones too) runs as episode loops; with "pipeline",
    an Explorer also reflects and retries as each base ends (rllib_r3l.runner.pipeline), as
    ``rollout_loop="episodes"`` does."""
    monkeypatch.setattr(EpisodeRunner, "run", lambda self, specs: run_episodes(self, specs))
    if request.param == "pipeline":
        monkeypatch.setattr(
            Explorer, "pipelined", property(lambda self: self.opts.reflect and self.opts.pivot_selector != "hindsight")
        )
    return request.param


class Overlap:
    """Counts environment steps in progress at once, across instances (each step waits ``delay`` s)."""

    def __init__(self, delay: float) -> None:
        self.delay, self.now, self.most, self.lock = delay, 0, 0, threading.Lock()

    def factory(self):
        meter = self

        class Metered(environments.registry.resolve("r3l/ToyCorridor")):
            def step(self, action):
                with meter.lock:
                    meter.now += 1
                    meter.most = max(meter.most, meter.now)
                time.sleep(meter.delay)
                with meter.lock:
                    meter.now -= 1
                return super().step(action)

        return lambda: Metered(num_rooms=4)


def _runner(tokenizer, env_factory, loop="episodes", policy=None, **opts):
    backend = ScriptedBackend(tokenizer, **({"policy": policy} if policy else {}))
    ro = RolloutOptions(
        max_turns=4, max_response_tokens=16, max_context_tokens=4096, temperature=1.0, rollout_loop=loop, **opts
    )
    return EpisodeRunner(backend, ChatFormat(tokenizer), env_factory, ro, Counter())


def test_environment_steps_of_different_episodes_overlap(tokenizer, monkeypatch):
    monkeypatch.undo()  # this test calls each loop itself
    overlap = {}
    for loop in ("waves", "episodes"):
        meter = Overlap(delay=0.05)
        runner = _runner(tokenizer, meter.factory(), loop=loop, env_step_workers=8)
        trajs = runner.run([EpisodeSpec(seed=SEED, group_id=str(i)) for i in range(6)])
        assert all(t.num_turns == 4 and t.status == Status.TRUNCATED for t in trajs)
        overlap[loop] = meter.most
    assert overlap["waves"] == 1  # the waves step one environment after another
    assert overlap["episodes"] == 6  # every episode's step runs while the others' do


def test_the_pool_of_env_step_workers_bounds_the_overlap(tokenizer):
    meter = Overlap(delay=0.05)
    runner = _runner(tokenizer, meter.factory(), env_step_workers=2)
    run_episodes(runner, [EpisodeSpec(seed=SEED, group_id=str(i)) for i in range(6)])
    assert meter.most == 2


def test_episode_loops_give_the_waves_trajectories_and_counters(tokenizer, monkeypatch):
    monkeypatch.undo()
    out = {}
    for loop in ("waves", "episodes"):
        runner = _runner(
            tokenizer, lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}), loop=loop, policy=walk_policy()
        )
        trajs = runner.run([EpisodeSpec(seed=s, group_id=str(s)) for s in (11, 12, 13, 14)])
        counters = {k: v for k, v in runner.counters.items() if v and not k.startswith("seconds_")}
        out[loop] = ([(t.token_ids, t.reward, t.status, t.actions, t.observations) for t in trajs], counters)
    assert out["episodes"] == out["waves"]


def test_a_crashing_step_ends_only_its_episode_counted(tokenizer):
    class Crashes(environments.registry.resolve("r3l/ToyCorridor")):
        def step(self, action):
            if self._seed_used == 12:
                raise RuntimeError("simulator died")
            return super().step(action)

        def reset(self, *, seed=None, options=None):
            self._seed_used = seed
            return super().reset(seed=seed, options=options)

    runner = _runner(tokenizer, lambda: Crashes(num_rooms=4))
    a, b = run_episodes(runner, [EpisodeSpec(seed=11, group_id="a"), EpisodeSpec(seed=12, group_id="b")])
    assert b.status == Status.ENV_ERROR and "simulator died" in b.info["error"]
    assert a.status == Status.TRUNCATED and a.num_turns == 4
    assert runner.counters["env_errors"] == 1


def test_a_failing_engine_loses_the_episodes_in_flight_counted(tokenizer):
    made = []
    runner = _runner(tokenizer, lambda: made.append(environments.make("r3l/ToyCorridor", {"num_rooms": 4})) or made[-1])

    def broken(*a, **k):
        raise RuntimeError("engine died")

    runner.backend.generate = broken
    trajs = run_episodes(runner, [EpisodeSpec(seed=s, group_id=str(s)) for s in (11, 12)])
    assert [t.status for t in trajs] == [Status.GENERATION_ERROR] * 2
    assert runner.counters["generation_errors"] >= 1
    # every environment made went back to the pool (one or two: the second episode may open after the first
    # failed and reuse its instance)
    assert 1 <= len(made) <= 2 and sorted(map(id, runner.envs._free)) == sorted(map(id, made))


def test_step_delay_option_delays_steps_not_resets(monkeypatch):
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    env = StepDelay(environments.make("r3l/ToyCorridor", {"num_rooms": 4}), 0.5)
    obs, info = env.reset(seed=SEED)
    assert slept == [] and env.env_name == "ToyCorridorEnv" and env.max_turns == env.env.max_turns
    env.step(info["admissible_actions"][0])
    assert slept == [0.5]
    with pytest.raises(ValueError, match="step_delay_s must be a number >= 0"):
        StepDelay(env.env, -1)


def test_step_delay_option_is_checked_before_anything_starts():
    from rllib_r3l.preflight import check_env

    with pytest.raises(ValueError, match=r"step_delay_s.*>= 0.*fix env_config.step_delay_s"):
        check_env("r3l/ToyCorridor", {"step_delay_s": -0.5})
    with pytest.raises(ValueError, match="step_delay_s.*must be a number"):
        check_env("r3l/ToyCorridor", {"step_delay_s": "slow"})
    check_env("r3l/ToyCorridor", {"step_delay_s": 0.2})  # an env runner's key: accepted by every environment


def test_a_request_the_engine_refuses_fails_only_its_episode(tokenizer, monkeypatch):
    import rllib_r3l.runner.episode_loop as loop_lib
    from rllib_r3l.generation.stream import BatchedStream

    class Refusing(BatchedStream):
        def submit(self, key, request, **kw):
            if key == ("ep", 1):
                raise ValueError("GenerationRequest.choices is empty")
            super().submit(key, request, **kw)

    monkeypatch.setattr(loop_lib, "open_stream", Refusing)
    runner = _runner(tokenizer, lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}))
    a, b = run_episodes(runner, [EpisodeSpec(seed=11, group_id="a"), EpisodeSpec(seed=12, group_id="b")])
    assert b.status == Status.GENERATION_ERROR and a.status == Status.TRUNCATED
    assert runner.counters["generation_errors"] == 1 and len(runner.envs._free) == 2


class SlowTask(Overlap):
    """ToyCorridor whose steps on one task (``slow_seed``) take ``delay`` s; the others are immediate."""

    def __init__(self, delay: float, slow_seed: int) -> None:
        super().__init__(delay)
        self.slow_seed = slow_seed

    def factory(self):
        meter = self

        class Slow(environments.registry.resolve("r3l/ToyCorridor")):
            def reset(self, *, seed=None, options=None):
                self._slow = seed == meter.slow_seed
                return super().reset(seed=seed, options=options)

            def step(self, action):
                if self._slow:
                    time.sleep(meter.delay)
                return super().step(action)

        return lambda: Slow(num_rooms=4)


def _ends(ex, monkeypatch):
    """(kind, seed) of each episode in the order they end."""
    ends = []
    finish = EpisodeRunner._finish

    def recorded(self, lv, healthy=True):
        ends.append((lv.spec.kind, lv.spec.seed))
        finish(self, lv, healthy)

    monkeypatch.setattr(EpisodeRunner, "_finish", recorded)
    return ends


def test_a_fast_failure_is_reflected_and_retried_while_a_slow_base_runs(tokenizer, monkeypatch, episode_loops):
    from tests.scripted import make_explorer

    ex, _backend = make_explorer(tokenizer, pivot=1, group_size=2, reflect_on="failures")
    ex.episodes.env_factory = SlowTask(0.15, slow_seed=12).factory()
    ends = _ends(ex, monkeypatch)
    groups = ex.explore([11, 12], ["fast", "slow"])
    slow_base_end = ends.index((Kind.BASE, 12))
    fast_retry_end = ends.index((Kind.RETRY, 11))
    if episode_loops == "pipeline":  # no barrier: the fast task's whole chain ran inside the slow base
        assert fast_retry_end < slow_base_end
    else:  # phases: every retry after every base
        assert fast_retry_end > slow_base_end
    assert [sorted(t.kind.value for t in g.trajectories if t.kind in (Kind.BASE, Kind.RETRY)) for g in groups] == [
        ["base", "retry"]
    ] * 2


def test_the_budget_admits_retries_in_base_order_whatever_ends_first(tokenizer, monkeypatch, episode_loops):
    """Two bases, budget for one retry: the first base's retry runs even though the second base fails first."""
    from tests.scripted import make_explorer

    ex, _backend = make_explorer(tokenizer, pivot=1, group_size=2, reflect_on="failures")
    ex.episodes.env_factory = SlowTask(0.1, slow_seed=11).factory()
    ends = _ends(ex, monkeypatch)
    groups = ex.explore([11, 12], ["slow", "fast"], max_episodes=3)
    assert [
        (g.group_id, sorted(t.kind.value for t in g.trajectories if t.kind in (Kind.BASE, Kind.RETRY))) for g in groups
    ] == [("slow", ["base", "retry"]), ("fast", ["base"])]
    assert ends.index((Kind.BASE, 12)) < ends.index((Kind.BASE, 11))  # the second base did end first
    assert ex.counters["retries_cut_by_budget"] == 1 and ex.counters["episodes_started"] == 3
    assert [r["retry_status"] for g in groups for r in g.ledger] == ["ok", "cut"]


_phases_reflection_timer = test_reflection_time_and_group_bookkeeping  # noqa: F405 - imported above


def test_reflection_time_and_group_bookkeeping(tiny_tokenizer, monkeypatch, episode_loops):  # noqa: F811
    if episode_loops == "pipeline":
        pytest.skip("the phases' reflection timer; the pipeline's: test_pipeline_splits_engine_time_among_phases")
    _phases_reflection_timer(tiny_tokenizer, monkeypatch)


def test_pipeline_splits_engine_time_among_phases(tokenizer, monkeypatch, episode_loops):
    """Each engine step's seconds go to the phases in flight, by their requests: they add up to the steps'."""
    import types

    import rllib_r3l.runner.episode_loop as loop_lib
    from rllib_r3l.generation.stream import BatchedStream
    from tests.scripted import make_explorer

    if episode_loops != "pipeline":
        pytest.skip("the pipeline's timers")
    clock = iter(range(10_000))
    monkeypatch.setattr(loop_lib, "time", types.SimpleNamespace(perf_counter=lambda: float(next(clock))))
    steps = []
    step = BatchedStream.step
    monkeypatch.setattr(BatchedStream, "step", lambda self: steps.append(self.in_flight) or step(self))
    ex, _backend = make_explorer(tokenizer, pivot=1, group_size=4, reflect_on="failures")
    ex.explore([11, 12], ["a", "b"])
    c = ex.counters
    assert ex.reflect_seconds > 0 and c["seconds_generate_base"] > 0 and c["seconds_generate_retry"] > 0
    total = ex.reflect_seconds + c["seconds_generate_base"] + c["seconds_generate_retry"]
    assert total == pytest.approx(len(steps))  # one tick of the fake clock per engine step


_phases_live_count = test_the_live_reflection_count_grows_per_finished_report_not_per_batch  # noqa: F405


def test_the_live_reflection_count_grows_per_finished_report_not_per_batch(  # noqa: F811
    tiny_tokenizer, episode_loops
):
    if episode_loops == "pipeline":
        pytest.skip("a batched reflection call's on_done; the pipeline counts each report as its request ends")
    _phases_live_count(tiny_tokenizer)
