"""Bounded-lag exploration (``max_policy_lag`` k >= 1; docs/scaling.md "Exploring while the learner trains").

With k = 0, ``R3L.training_step`` explores, then trains: one side always idles. With k >= 1 each remote env
runner keeps k ``sample`` requests queued through RLlib's asynchronous runner requests
(``EnvRunnerGroup.foreach_env_runner_async`` / ``fetch_ready_async_reqs``, as APPO does; no thread of ours in
the driver): an iteration takes the oldest request's task groups of every runner and sends the next
requests *before* the learner trains, so the runners sample while it does.

Versions. A request is tagged with the learner-update count whose weights its runner holds when the request
runs: ``R3L.engine_weights_version`` when it is sent, because the weight sync before it is queued on the same actor
and a Ray actor runs one caller's calls in order. Its groups (and each trajectory: ``policy_version``)
train at update ``R3L.learner_updates``; their policy lag is the difference. At steady state the lag is k: a
request waits k iterations. A group older than k (a runner restored with older weights) is dropped and
counted (``r3l/stale_groups_dropped``), never trained on.

Budget. With ``R3L.episode_cap`` (an exact trajectory budget), a request may start at most the episodes
the cap leaves after what this iteration's results used and what the requests still queued may use,
so queued work never overdraws the budget.

Faults. A runner that dies with requests queued loses only their groups, counted under
``r3l/faults/groups_lost_with_runner``; RLlib restores it at the next iteration (``restore_env_runners``)
and it gets new requests. A checkpoint holds the runners' task RNGs from *before* their queued requests
(``queued_runner_ids``: ``resilience`` reads those from its cache), so a resumed run samples those tasks
again, once; a restore in the same process first discards what is queued (``discard``; ``R3L.set_state``
counts it under ``r3l/inflight_groups_discarded``).
"""

from __future__ import annotations

import collections
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any, Deque, Dict, List, Optional, Tuple

from rllib_r3l import ray_internals, timeline
from rllib_r3l.reliability import faults
from rllib_r3l.runner import dispatch

logger = logging.getLogger(__name__)

TAG = "r3l_sample"  # RLlib counts requests in flight per tag: ours never block its weight syncs ("set_state")


@dataclass
class Request:
    """One queued ``sample`` request: its number, the weights version it samples under, its share."""

    seq: int
    version: int
    groups: int
    cap: Optional[int]


class LaggedSampler:
    """Each remote runner's queue of ``sample`` requests (at most ``max_policy_lag`` deep)."""

    def __init__(self) -> None:
        self.queued: Dict[int, Deque[Request]] = collections.defaultdict(collections.deque)
        self._ready: Dict[Tuple[int, int], Any] = {}  # (runner, seq) -> result that came before its turn
        self._seq = itertools.count()
        self.last_window: Optional[Tuple[float, float]] = None  # when the requests taken last ran (runner clocks)

    # -- one iteration -----------------------------------------------------------------------------------
    def explore(self, algo: Any) -> Tuple[List[Any], List[Any]]:
        """This iteration's groups (the oldest request of every runner) and runner metrics; the next
        requests are queued before returning, so the runners sample while the learner trains."""
        m, depth = algo.metrics, int(algo.config.max_policy_lag)
        self._top_up(algo, depth, used=0)
        t0 = time.perf_counter()
        groups, metrics, used = self._take_oldest(algo)
        m.log_value(("r3l", "async", "wait_for_samples_s"), time.perf_counter() - t0, reduce="mean", window=1)
        if self.last_window is not None:
            timeline.log(algo, "sample", *self.last_window)
        groups = self._drop_stale(algo, groups, depth)
        self._top_up(algo, depth, used=used)
        m.log_value(("r3l", "async", "requests_in_flight"), self.num_queued(), reduce="mean", window=1)
        return groups, metrics

    def _top_up(self, algo: Any, depth: int, used: int) -> None:
        """Queue requests until every healthy runner has ``depth``, each with its share of the task groups
        and of what the episode cap leaves (``used``: episodes of this iteration's results)."""
        group, c = algo.env_runner_group, algo.config
        healthy = sorted(group.healthy_worker_ids())
        for i in list(self.queued):
            if i not in healthy and not self.queued[i]:
                del self.queued[i]
        cache = dispatch.runner_states(algo)
        while True:
            short = [i for i in healthy if len(self.queued[i]) < depth]
            if not short:
                return
            # each runner's share of an iteration among all healthy ones (a restored runner topping up alone
            # must not take the whole iteration's task groups)
            every = dispatch.runner_shares(c.tasks_per_iteration, healthy)
            shares = {i: every[i] for i in short if i in every}
            caps = dispatch.episode_shares(self._cap_left(algo, used), shares)
            sent = False
            for i, n in shares.items():
                req = Request(seq=next(self._seq), version=algo.engine_weights_version, groups=n, cap=caps.get(i))
                fn = dispatch.sample_fn(n, cache.get(i, {}), req.cap)
                made = group.foreach_env_runner_async(_numbered(req.seq, fn), tag=TAG, remote_worker_ids=[i])
                if made:
                    self.queued[i].append(req)
                    sent = True
            if not sent:  # RLlib's in-flight limit (validated >= max_policy_lag) or no runner took it
                return

    def _cap_left(self, algo: Any, used: int) -> Optional[int]:
        cap = getattr(algo, "episode_cap", None)
        if cap is None:
            return None
        reserved = sum(r.cap or 0 for q in self.queued.values() for r in q)
        return max(0, int(cap) - int(used) - reserved)

    def _take_oldest(self, algo: Any) -> Tuple[List[Any], List[Any], int]:
        """Wait for the oldest request of every runner; a runner that died loses its queue (counted)."""
        group, m = algo.env_runner_group, algo.metrics
        cache = dispatch.runner_states(algo)
        want = {i: q[0] for i, q in self.queued.items() if q}
        killer = faults.maybe_kill_runner(algo, sorted(want))
        try:
            while any((i, r.seq) not in self._ready for i, r in want.items()) and group.num_in_flight_async_reqs(TAG):
                for idx, result in group.fetch_ready_async_reqs(tags=TAG, timeout_seconds=1.0):
                    self._ready[(idx, result[0])] = result[1:]  # (episodes started, (start, end), answer)
        finally:
            if killer is not None and killer.finish():
                m.log_value(("r3l", "faults", "injected_runner_kill"), 1, reduce="sum")
        groups: List[Any] = []
        metrics: List[Any] = []
        used = 0
        windows: List[Tuple[float, float]] = []
        for i, req in sorted(want.items()):
            result = self._ready.pop((i, req.seq), None)
            if result is None:  # the runner died: RLlib dropped its requests and marked it unhealthy
                self._lose(algo, i)
                continue
            self.queued[i].popleft()
            started, window, (sample, runner_metrics, idx, state) = result
            windows.append(window)
            if sample is None:  # out of service until restored (dispatch.sample_fn): its queue is void
                m.log_value(("r3l", "faults", runner_metrics), 1, reduce="sum")
                ray_internals.mark_unhealthy(group, idx)
                self._lose(algo, i, counted_as=None)
                continue
            for g in sample:
                tag_version(g, req.version)
            groups.extend(sample)
            metrics.append(runner_metrics)
            cache[idx] = state
            used += started
        self.last_window = (min(w[0] for w in windows), max(w[1] for w in windows)) if windows else None
        return groups, metrics, used

    def _lose(self, algo: Any, i: int, counted_as: Optional[str] = "groups_lost_with_runner") -> None:
        """Forget runner ``i``'s queue; its task groups are counted as lost."""
        lost = sum(r.groups for r in self.queued.pop(i, ()))
        self._ready = {k: v for k, v in self._ready.items() if k[0] != i}
        m = algo.metrics
        if counted_as is not None:
            logger.warning("env runner %d failed with requests queued: %d task group(s) lost", i, lost)
            m.log_value(("r3l", "faults", "env_runner_failures"), 1, reduce="sum")
        m.log_value(("r3l", "faults", "groups_lost_with_runner"), lost, reduce="sum")

    @staticmethod
    def _drop_stale(algo: Any, groups: List[Any], depth: int) -> List[Any]:
        m, now = algo.metrics, algo.learner_updates
        lags = [now - g.policy_version for g in groups]
        keep = [g for g, lag in zip(groups, lags) if lag <= depth]
        m.log_value(("r3l", "stale_groups_dropped"), len(groups) - len(keep), reduce="sum")
        if lags:
            m.log_value(("r3l", "policy_lag_mean"), sum(lags) / len(lags), reduce="mean", window=1)
            m.log_value(("r3l", "policy_lag_max"), max(lags), reduce="max", window=1)
        return keep

    # -- checkpoints ---------------------------------------------------------------------------------------
    def num_queued(self) -> int:
        return sum(len(q) for q in self.queued.values())

    def queued_runner_ids(self) -> List[int]:
        """Runners with requests queued: a checkpoint takes their task RNG from before them."""
        return sorted(i for i, q in self.queued.items() if q)

    def discard(self, algo: Any) -> int:
        """Wait out every queued request and drop its groups (a restore replaces the state they came
        from); returns how many task groups were dropped (``r3l/inflight_groups_discarded``)."""
        group = algo.env_runner_group
        n = sum(r.groups for q in self.queued.values() for r in q)
        while group is not None and group.num_in_flight_async_reqs(TAG):
            group.fetch_ready_async_reqs(tags=TAG, timeout_seconds=1.0)
        self.queued.clear()
        self._ready.clear()
        return n


def tag_version(group_result: Any, version: int) -> None:
    """Record the weights version a group (and each of its trajectories) was generated under."""
    group_result.policy_version = int(version)
    for t in list(group_result.trajectories) + list(group_result.lost):
        t.policy_version = int(version)


def _numbered(seq: int, fn: Any) -> Any:
    """``fn`` (``dispatch.sample_fn``) as request ``seq``: its answer with the episodes it started (what
    ``R3L.episode_cap`` caps) and when it ran on the runner (``r3l/timeline/sample``)."""

    def call(r):
        before, start = r.counters["episodes_started"], time.time()
        out = fn(r)
        return seq, r.counters["episodes_started"] - before, (start, time.time()), out

    return call


def discard_queued(algo: Any) -> int:
    """Drop the requests queued on the runners (``LaggedSampler.discard``); the task groups dropped."""
    s = getattr(algo, "_r3l_lagged", None)
    return s.discard(algo) if s is not None and s.num_queued() else 0


def queued_runner_ids(algo: Any) -> List[int]:
    """Runners with sample requests queued (none without ``max_policy_lag``)."""
    s = getattr(algo, "_r3l_lagged", None)
    return s.queued_runner_ids() if s is not None else []


def sampler(algo: Any) -> LaggedSampler:
    """The algorithm's lagged sampler (made on first use)."""
    s = getattr(algo, "_r3l_lagged", None)
    if s is None:
        s = algo._r3l_lagged = LaggedSampler()
    return s
