"""``max_policy_lag`` (issue 47, item 2; rllib_r3l/runner/lagged.py): remote runners sample the next task
groups while the learner trains, through RLlib's asynchronous runner requests; the lag never exceeds its
bound, nothing is trained twice or lost uncounted, and a checkpoint taken with a request queued resumes
with those tasks sampled again, once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_r3l import R3LConfig
from rllib_r3l.runner.explore import GroupResult
from rllib_r3l.runner.lagged import LaggedSampler, tag_version
from rllib_r3l.trajectory import Trajectory


def _n(v) -> float:
    """A metric's value, 0 where it is missing or NaN (RLlib reports NaN where nothing was logged)."""
    return 0 if v is None or v != v else v


def _remote(cfg):
    return cfg.env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)


@pytest.mark.parametrize(
    "cfg, names",
    [
        (lambda: R3LConfig().training(max_policy_lag=1), "num_env_runners=1"),
        (lambda: _remote(R3LConfig().training(max_policy_lag=2)), "max_requests_in_flight_per_env_runner=2"),
        (lambda: _remote(R3LConfig().training(max_policy_lag=1, weight_sync_interval=2)), "weight_sync_interval=2"),
        (lambda: _remote(R3LConfig().training(max_policy_lag=1, colocate_engine_sleep=True)), "colocate_engine_sleep"),
        (lambda: _remote(R3LConfig().training(max_policy_lag=-1)), "max_policy_lag"),
    ],
)
def test_a_lag_the_setting_cannot_honour_is_refused_naming_the_fix(cfg, names):
    with pytest.raises(ValueError, match="max_policy_lag") as e:
        cfg().validate()
    assert names in str(e.value)


def test_a_lag_within_the_in_flight_limit_validates():
    cfg = _remote(R3LConfig().training(max_policy_lag=2)).env_runners(max_requests_in_flight_per_env_runner=2)
    cfg.validate()
    assert cfg.max_policy_lag == 2


def _group(gid, version):
    g = GroupResult(group_id=gid, trajectories=[Trajectory(segments=[], reward=0.0, group_id=gid)])
    tag_version(g, version)
    return g


def test_groups_older_than_the_bound_are_dropped_and_counted_with_the_lag_logged():
    """At update 5 with a bound of 1: a group from update 4 trains (lag 1), one from update 3 (lag 2) is
    dropped, never trained, and counted."""
    algo = SimpleNamespace(metrics=MetricsLogger(), learner_updates=5)
    keep = LaggedSampler._drop_stale(algo, [_group("a", 4), _group("b", 3), _group("c", 5)], depth=1)
    assert [g.group_id for g in keep] == ["a", "c"]
    assert all(t.policy_version == g.policy_version for g in keep for t in g.trajectories)
    r3l = algo.metrics.reduce()["r3l"]
    assert r3l["stale_groups_dropped"].peek() == 1
    assert r3l["policy_lag_max"].peek() == 2 and r3l["policy_lag_mean"].peek() == pytest.approx(1.0)


@pytest.mark.integration
@pytest.mark.slow
def test_lag_one_samples_while_training_trains_each_group_once_and_resumes_queued_tasks_once(ray_session, tmp_path):
    from tests.scripted_rllib import tiny_config

    def build():
        return _remote(tiny_config(max_policy_lag=1, sampling_seed=3, num_threads=1)).build_algo()

    def spy(algo, seen):
        explore = algo._explore

        def recorded():
            groups, metrics = explore()
            seen.append([(g.group_id, g.policy_version) for g in groups])
            return groups, metrics

        algo._explore = recorded

    algo, seen = build(), []
    spy(algo, seen)
    try:
        results = [algo.train() for _ in range(2)]
        ckpt = algo.save_to_path(str(tmp_path / "ckpt"))  # a request is queued: its tasks belong to after this
        results.append(algo.train())
        # the first iteration waits for its own request (lag 0); then each trains on the request sent
        # before the previous update (lag 1), with the next request already queued
        assert [r["r3l"]["policy_lag_max"] for r in results] == [0, 1, 1]
        assert [[v for _, v in it] for it in seen] == [[0, 0], [0, 0], [1, 1]]
        assert all(r["r3l"]["async"]["requests_in_flight"] == 1 for r in results)
        assert all(r["r3l"].get("stale_groups_dropped", 0) == 0 for r in results)
        # every item of the lagged iterations is one update old: the learner takes the clipped ratio on its
        # base items (stale_clip_ratio_*), with the behaviour log-probs the runner scored
        batches = [r["r3l"]["batch"] for r in results]
        assert batches[0].get("stale_items", 0) == 0 and batches[1]["items"] > 0
        assert [b.get("stale_items", 0) for b in batches[1:]] == [b.get("items", 0) for b in batches[1:]]
        learner = results[1]["learners"]["r3l"]["learner"]
        assert "clip_fraction" in learner and not learner.get("stale_tokens_without_behaviour_logprobs")
        ids = [gid for it in seen for gid, _ in it]
        assert len(ids) == len(set(ids)) == 6  # nothing trained twice, nothing lost
        # the timeline (one host: the runner's clock is the driver's): the first iteration waits for its own
        # request; the second trains on a request that ran while the first update did, and the first
        # iteration's weight sync waited for that request (queued behind it on the actor: scaling.md)
        tl = [r["r3l"]["timeline"] for r in results]
        assert all(t[f"{p}_start"] <= t[f"{p}_end"] for t in tl for p in ("explore", "sample", "update", "sync"))
        assert all(t["explore_end"] <= t["update_start"] <= t["update_end"] <= t["sync_start"] for t in tl)
        assert tl[0]["explore_start"] <= tl[0]["sample_start"] <= tl[0]["sample_end"] <= tl[0]["explore_end"]
        assert tl[1]["sample_start"] < tl[0]["update_end"] and tl[1]["sample_end"] <= tl[0]["sync_end"]
        queued_after_save = seen[2]
        # restored: the queued request is discarded, counted, and its tasks sampled again (the checkpoint holds
        # the runner's task RNG from before it: a new process resuming gets the same state)
        algo.restore_from_path(ckpt)
        again = algo.train()
        assert again["r3l"]["inflight_groups_discarded"] == 2
        assert [gid for gid, _ in seen[3]] == [gid for gid, _ in queued_after_save]
    finally:
        algo.stop()


@pytest.mark.integration
@pytest.mark.slow
def test_a_runner_killed_with_a_request_queued_loses_only_its_groups_counted_and_comes_back(ray_session):
    """Item 5 of issue 47: the runner dies while its next request runs (killed right after the request is
    queued): the next iteration counts the failure and the request's task groups as lost, trains on nothing
    rather than on anything stale, and once RLlib restored the runner (weights and task RNG re-sent) it
    samples again."""
    import ray

    from rllib_r3l.runner import lagged
    from tests.scripted_rllib import tiny_config

    algo = (
        _remote(tiny_config(max_policy_lag=1, sampling_seed=3, num_threads=1))
        .fault_tolerance(restart_failed_env_runners=True)
        .build_algo()
    )
    try:
        sampler = lagged.sampler(algo)
        top_up, calls = sampler._top_up, []
        [rid] = algo.env_runner_group.healthy_worker_ids()

        def top_up_then_kill(a, depth, used):
            top_up(a, depth, used)
            calls.append(1)
            if len(calls) == 2:  # iteration 1's second call: its next request was just queued
                ray.kill(algo.env_runner_group._worker_manager._actors[rid], no_restart=False)

        sampler._top_up = top_up_then_kill
        first, second = algo.train(), algo.train()
        tasks = algo.config.tasks_per_iteration
        f = second["r3l"]["faults"]
        assert f["env_runner_failures"] == 1 and f["groups_lost_with_runner"] == tasks
        assert not _n(second["env_runners"].get("num_groups")) and second["r3l"]["batch"]["empty_batches"] == 1
        later = []
        while len(later) < 6 and not _n(later[-1]["env_runners"].get("num_groups") if later else 0):
            later.append(algo.train())  # RLlib restores the runner once Ray restarted it, then it samples again
        # the restore is counted in the iteration that made it (the one that saw the failure, or a later one)
        assert sum(_n(r["r3l"]["faults"].get("env_runners_restored")) for r in [second, *later]) == 1
        assert _n(later[-1]["env_runners"].get("num_groups")) == tasks == first["env_runners"]["num_groups"]
        assert all(not _n(r["r3l"].get("stale_groups_dropped")) for r in later)
    finally:
        algo.stop()
