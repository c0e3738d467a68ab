"""Exploration across the env runners: each runner's share of the iteration's task groups (paper Alg. 1,
the rollout phase, spread over RLlib's ``EnvRunnerGroup``).

``R3L._explore`` drives it: with no remote runner, the local one samples everything
(:func:`sample_local`); otherwise every healthy runner gets an explicit share of ``tasks_per_iteration``
and of the iteration's episode cap (``R3L.episode_cap``, an exact trajectory budget), and
:func:`sample_round` runs one round of ``sample`` calls. What happens when a runner fails in a round
(counting, restoring, re-sampling its share) is recovery, wrapped around these rounds by
``rllib_r3l.reliability.resilience.sample_with_recovery``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from rllib_r3l import ray_internals


def runner_shares(total: int, runner_ids: Sequence[int]) -> Dict[int, int]:
    """Split ``total`` task groups over ``runner_ids`` (the same split ``R3LEnvRunner.sample`` uses)."""
    ids = sorted(runner_ids)
    if not ids:
        return {}
    base, extra = divmod(int(total), len(ids))
    return {i: base + int(k < extra) for k, i in enumerate(ids) if base + int(k < extra) > 0}


def episode_shares(cap: Optional[int], groups: Dict[int, int]) -> Dict[int, Optional[int]]:
    """``cap`` episodes split over runners in proportion to their task groups (the remainder to the first
    ones); None for each when there is no cap."""
    if cap is None:
        return {i: None for i in groups}
    total = sum(groups.values()) or 1
    shares = {i: cap * n // total for i, n in groups.items()}
    for i in sorted(groups)[: cap - sum(shares.values())]:
        shares[i] += 1
    return shares


def runner_states(algo: Any) -> Dict[int, Dict[str, Any]]:
    """The last state each remote runner returned (its task-seed RNG, groups sampled), by runner id:
    what a restored runner gets back and what a checkpoint saves (``resilience.remote_runner_states``)."""
    cache = getattr(algo, "_r3l_runner_states", None)
    if cache is None:
        cache = algo._r3l_runner_states = {}
    return cache


def sample_fn(n: int, after: Dict[str, Any], max_episodes: Optional[int] = None):
    """Sample ``n`` groups, unless the runner cannot sample from the learner's weights: it has fewer
    groups behind it than the driver last saw (``after``: a fresh process Ray restarted unseen, with
    the initial weights and task RNG), or its engine was rebuilt with older weights than the last
    weight transfer's. Then it answers ``None`` and the reason (raising would make RLlib exit the actor
    and restart it again); the driver restores it like a failed runner."""
    k = int(after.get("num_groups_sampled", 0) or 0)

    def fn(r):
        if r.get_state()["num_groups_sampled"] < k:
            return None, "env_runners_restarted_unseen", r.worker_index, None
        if r.needs_weights():
            return None, "env_runners_behind_weights", r.worker_index, None
        return r.sample(num_groups=n, max_episodes=max_episodes), r.get_metrics(), r.worker_index, r.get_state()

    return fn


def sample_local(algo: Any) -> Tuple[List[Any], List[Any]]:
    """No remote runner: the local runner samples the whole iteration (within the episode cap)."""
    cap = getattr(algo, "episode_cap", None)
    out = algo.env_runner_group.foreach_env_runner(
        lambda r: (r.sample(max_episodes=cap), r.get_metrics()), local_env_runner=True
    )
    return [g for o in out for g in o[0]], [o[1] for o in out]


class Round:
    """What one round of ``sample`` calls returned: the groups and metrics of the runners that sampled
    (``done``), and the runners that answered they cannot sample (``out_of_service``: id -> reason)."""

    def __init__(self) -> None:
        self.groups: List[Any] = []
        self.metrics: List[Any] = []
        self.done: set = set()
        self.out_of_service: Dict[int, str] = {}


def sample_round(algo: Any, pending: Dict[int, int], cap: Optional[int]) -> Round:
    """One ``sample`` call on each runner of ``pending`` (runner id -> task groups), with its share of
    ``cap`` episodes. A runner that fails mid-call is simply absent from the round's ``done`` (with
    restarts on, RLlib drops its result); one that cannot sample from the learner's weights is marked
    unhealthy for RLlib to restore and listed in ``out_of_service``."""
    group, cache = algo.env_runner_group, runner_states(algo)
    ids = sorted(pending)
    caps = episode_shares(cap, pending)
    out = group.foreach_env_runner(
        [sample_fn(pending[i], cache.get(i, {}), caps.get(i)) for i in ids],
        remote_worker_ids=ids,
        local_env_runner=False,
    )
    got = Round()
    for sample, runner_metrics, idx, state in out:
        if sample is None:  # out of service until restored with the learner's weights (and its RNG)
            got.out_of_service[idx] = runner_metrics
            ray_internals.mark_unhealthy(group, idx)
            continue
        got.groups.extend(sample)
        got.metrics.append(runner_metrics)
        cache[idx] = state
        got.done.add(idx)
    return got
