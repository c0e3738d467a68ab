"""Surviving env-runner failures and checkpointing the runners' state RLlib leaves out.

* ``sample_with_recovery``: recovery wrapped around exploration (``runner/dispatch.py`` samples each
  healthy runner's share). A runner that dies mid-sample (with
  ``fault_tolerance(restart_failed_env_runners=True)`` RLlib drops its result) is counted under
  ``r3l/faults/env_runner_failures`` and its share under ``r3l/faults/groups_lost_with_runner``;
  then, up to ``runner_failure_retries`` times, the runner is restored (RLlib restarts the actor;
  ``restore_env_runners`` gives it the learner's weights and its last task-seed RNG state) and the
  lost share is sampled again (``r3l/faults/groups_resampled``). Invariant per iteration:
  ``groups received = tasks_per_iteration - groups_lost_with_runner + groups_resampled``.
  A runner Ray restarted before the driver saw it fail (a sample call queued for the new process)
  refuses to sample with its initial weights (``env_runners_restarted_unseen``), and so does a runner
  whose engine was rebuilt after a weight transfer (``env_runners_behind_weights``): counted, restored
  and re-sampled the same way.
* ``restore_env_runners``: replaces RLlib's default, which copies the *local* runner's state into a
  restarted runner (the local runner of a multi-runner group has no model loaded and a different
  task RNG) and no weights: the restarted runner would sample with the initial weights.
* ``get_extra_state``/``set_extra_state``: what RLlib's checkpoint leaves out. RLlib saves the local
  env runner only; the remote runners' task-seed RNG states go under ``state["r3l_state"]`` (the
  update counter and the replay buffer are saved by the Algorithm under ``state["r3l_scaling"]``).
* ``learner_lost_is_clear``: a remote learner lost mid-update ends the run with one line.

Reproducible sampling (``sampling_seed``) lives in ``generation/seeded.py``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from rllib_r3l import ray_internals
from rllib_r3l.reliability import faults
from rllib_r3l.runner import dispatch

logger = logging.getLogger(__name__)

STATE_KEY = "r3l_state"


# ------------------------------------------------------------------------------------------------------
# recovery around exploration
def sample_with_recovery(algo: Any, sample_round: Callable[..., Any]) -> Tuple[List[Any], List[Any]]:
    """Recovery wrapped around exploration: ``sample_round(algo, pending, cap)`` (``runner/dispatch.py``)
    samples each healthy runner's share; a runner that failed or could not sample is counted, restored
    and its share sampled again, up to ``runner_failure_retries`` times."""
    group = algo.env_runner_group
    cap = getattr(algo, "episode_cap", None)  # an exact trajectory budget for this iteration (R3L.episode_cap)
    c, m = algo.config, algo.metrics
    healthy = list(group.healthy_worker_ids())
    if not healthy:  # every runner is restarting: wait (bounded) rather than run an empty iteration
        healthy = wait_for_runners(algo, group, ray_internals.actor_ids(group))
    if len(healthy) < group.num_remote_workers():
        m.log_value(
            ("r3l", "faults", "env_runners_unavailable"), group.num_remote_workers() - len(healthy), reduce="sum"
        )
    pending = dispatch.runner_shares(c.tasks_per_iteration, healthy)
    if not pending:
        m.log_value(("r3l", "faults", "groups_lost_with_runner"), int(c.tasks_per_iteration), reduce="sum")
    groups: List[Any] = []
    metrics: List[Any] = []
    attempt = 0
    while pending:
        killer = faults.maybe_kill_runner(algo, sorted(pending)) if attempt == 0 else None
        try:
            got = sample_round(algo, pending, cap)
        finally:
            if killer is not None and killer.finish():
                m.log_value(("r3l", "faults", "injected_runner_kill"), 1, reduce="sum")
        for reason in got.out_of_service.values():
            m.log_value(("r3l", "faults", reason), 1, reduce="sum")
        groups.extend(got.groups)
        metrics.extend(got.metrics)
        failed = {i: n for i, n in pending.items() if i not in got.done}
        if not failed:
            break
        lost = sum(failed.values())
        logger.warning("env runner(s) %s failed mid-sample: %d task group(s) lost", sorted(failed), lost)
        m.log_value(("r3l", "faults", "env_runner_failures"), len(failed), reduce="sum")
        m.log_value(("r3l", "faults", "groups_lost_with_runner"), lost, reduce="sum")
        if attempt >= int(c.runner_failure_retries):
            break
        attempt += 1
        healthy = wait_for_runners(algo, group, list(failed))
        if not healthy:
            break
        again: Counter = Counter()
        for i, n in failed.items():
            if i in healthy:  # restored with its pre-sample RNG state: it redraws the same tasks
                again[i] += n
            else:
                again.update(dispatch.runner_shares(n, healthy))
        pending = {i: n for i, n in again.items() if n > 0}
        m.log_value(("r3l", "faults", "groups_resampled"), sum(pending.values()), reduce="sum")
    return groups, metrics


def wait_for_runners(algo: Any, group: Any, ids: List[int]) -> List[int]:
    """Restore restarted runners until all of ``ids`` are healthy or ``runner_restart_wait_s`` passed;
    returns the healthy runner ids. (Ray restarts a dead runner actor; until its constructor has run,
    pings fail.)"""
    deadline = time.monotonic() + float(getattr(algo.config, "runner_restart_wait_s", 0.0) or 0.0)
    while True:
        algo.restore_env_runners(group)
        healthy = list(group.healthy_worker_ids())
        if all(i in healthy for i in ids) or time.monotonic() >= deadline:
            return healthy
        time.sleep(0.5)


def restore_env_runners(algo: Any, group: Any) -> List[int]:
    """Bring restarted env runners back into service with the learner's weights and their own state."""
    if group is None or group.num_remote_workers() <= 0:
        return []
    restored = group.probe_unhealthy_env_runners()
    if not restored:
        return []
    import ray
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE

    ray_internals.algorithm_counters(algo)["total_num_restored_workers"] += len(restored)
    algo.metrics.log_value(("r3l", "faults", "env_runners_restored"), len(restored), reduce="sum")
    weights = algo.learner_group.get_state(
        components=COMPONENT_LEARNER + "/" + COMPONENT_RL_MODULE, inference_only=True
    )[COMPONENT_LEARNER]
    ref = ray.put(weights)
    cache = dispatch.runner_states(algo) if group is algo.env_runner_group else {}
    funcs = []
    for idx in restored:
        own = {k: v for k, v in cache.get(idx, {}).items() if k != "weights_seq_no"}

        def _sync(r, _own=own, _ref=ref):
            r.set_state({**_own, **ray.get(_ref)})

        funcs.append(_sync)
    group.foreach_env_runner(
        funcs,
        remote_worker_ids=list(restored),
        local_env_runner=False,
        timeout_seconds=algo.config.env_runner_restore_timeout_s,
    )
    logger.warning("env runner(s) %s restored (weights and task RNG state re-sent)", restored)
    return list(restored)


# ------------------------------------------------------------------------------------------------------
# checkpoint state RLlib leaves out
def remote_runner_states(algo: Any) -> Dict[int, Dict[str, Any]]:
    """Task-seed RNG state of every remote env runner (live, else the last one seen)."""
    group = algo.env_runner_group
    cache = dispatch.runner_states(algo)
    if group is None or group.num_remote_workers() <= 0:
        return {}
    from rllib_r3l.runner.lagged import queued_runner_ids

    # a runner with sample requests queued (max_policy_lag) keeps the state from before them: a resumed run
    # samples those tasks again, once (runner/lagged.py)
    busy = set(queued_runner_ids(algo))
    ids = [i for i in group.healthy_worker_ids() if i not in busy]
    try:
        out = (
            group.foreach_env_runner(
                lambda r: (r.worker_index, r.get_state()),
                local_env_runner=False,
                remote_worker_ids=ids,
                timeout_seconds=algo.config.env_runner_health_probe_timeout_s,
            )
            if ids
            else []
        )
        cache.update({int(i): s for i, s in out})
    except Exception:  # a dying runner: keep its last known state
        logger.exception("could not read env runner states; using the last known ones")
    return {int(i): dict(s) for i, s in cache.items()}


def get_extra_state(algo: Any, components=None, not_components=None) -> Optional[Dict[str, Any]]:
    if not ray_internals.asked_for_component(algo, STATE_KEY, components, not_components):
        return None
    return {"env_runners": remote_runner_states(algo)}


def set_extra_state(algo: Any, state: Optional[Dict[str, Any]]) -> None:
    if not state:
        return
    runner_states = {int(i): s for i, s in (state.get("env_runners") or {}).items()}
    cache = dispatch.runner_states(algo)
    cache.clear()
    cache.update(runner_states)
    group = algo.env_runner_group
    if not runner_states or group is None or group.num_remote_workers() <= 0:
        return
    ids = [i for i in sorted(runner_states) if i in set(group.healthy_worker_ids())]
    if ids:
        group.foreach_env_runner(
            [(lambda r, _s=runner_states[i]: r.set_state(_s)) for i in ids],
            remote_worker_ids=ids,
            local_env_runner=False,
        )


@contextlib.contextmanager
def learner_lost_is_clear(algo: Any) -> Iterator[None]:
    """A remote learner that died during the update (its node lost, its process killed) ends the run
    with one line naming what happened and how to go on, instead of Ray's actor traceback: RLlib does
    not restart a learner with its optimizer state, and the last checkpoint holds it."""
    import ray

    from rllib_r3l.errors import LearnerLost

    try:
        yield
    except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
        n = algo.config.num_learners
        raise LearnerLost(
            f"the learner actor ({n} remote learner(s)) died during the update or weight sync of iteration "
            f"{algo.iteration + 1} ({type(e).__name__}: its node was lost or its process killed); "
            "resume from the last checkpoint (rllib-r3l train ... --resume, or "
            "R3L.from_checkpoint(path)) once the cluster can place the learner again"
        ) from e
