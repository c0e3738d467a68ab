"""Bounded soak test: train R3L for N iterations on CPU while faults are injected; check that every
fault was survived and every loss was counted.

    python scripts/soak.py [--iterations 8] [--env r3l/CoinCollector] [--num-env-runners 1]
                           [--env-crash-prob 0.02] [--jvm-kill-prob 0.02] [--bad-obs-prob 0.01]
                           [--runner-kill-every 3] [--nan-every 2] [--engine-death-prob 0.005]

The tiny random model (``model="tiny"``, transformers backend) trains on TextWorldExpress coin
collector (every environment holds a JVM) with one remote env runner and
``fault_tolerance(restart_failed_env_runners=True)``. Injected (``rllib_r3l.reliability.faults.inject``):
environment crashes (``env.step`` raises), SIGKILLed JVMs mid-episode,
non-string observations, ``ray.kill`` of the remote env runner mid-sample (Ray restarts it),
the policy's generation engine dying (the runner rebuilds it), NaN losses and inf gradients in the
learner. It also reports the driver's RSS at iteration 10 and at the end (the slope per 100
iterations) and, after shutdown, the processes it left behind (JVMs, Ray daemons, engines: none).

Prints a table (fault, injected, survived, losses counted) and the accounting checks, and exits
non-zero when an iteration raised, a fault was not survived, or a loss was not counted:

* env faults: every injected one is a counted environment error (``env_errors``), each error a
  counted lost episode; the episodes the runners report lost equal those the driver counts;
* runner kills: each one is a counted runner failure, the runner is restored, and per iteration
  ``groups received = tasks_per_iteration - groups_lost_with_runner + groups_resampled``;
* NaN/inf: each injected update is a counted skipped update, and the weights stay finite;
* the learner stays in service (every iteration with a batch returns learner results).

Run on demand (minutes); ``tests/reliability/test_reliability.py`` runs a short version.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def flatten(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _num(x: Any) -> float:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return 0.0
    return 0.0 if math.isnan(x) else x


# metric (flattened result key) -> short name
METRICS = {
    "env_runners/r3l/faults/injected_env_raise": "inj_env_raise",
    "env_runners/r3l/faults/injected_env_kill_jvm": "inj_env_kill_jvm",
    "env_runners/r3l/faults/injected_env_bad_observation": "inj_env_bad_observation",
    "r3l/faults/injected_runner_kill": "inj_runner_kill",
    "learners/r3l/faults/injected_nan_loss": "inj_nan_loss",
    "learners/r3l/faults/injected_nan_grad": "inj_nan_grad",
    "env_runners/r3l/faults/injected_engine_death": "inj_engine_death",
    "env_runners/r3l/faults/engine_rebuilds": "engine_rebuilds",
    "env_runners/r3l/faults/engine_failures_after_rebuild": "engine_failures_after_rebuild",
    "env_runners/r3l/faults/env_errors": "env_errors",
    "env_runners/r3l/faults/env_create_errors": "env_create_errors",
    "env_runners/r3l/faults/env_close_errors": "env_close_errors",
    "env_runners/r3l/faults/generation_errors": "generation_errors",
    "env_runners/r3l/faults/episodes_lost": "runner_episodes_lost",
    "r3l/faults/episodes_lost": "driver_episodes_lost",
    "r3l/faults/partial_groups": "partial_groups",
    "r3l/faults/episodes_dropped_with_partial_group": "episodes_dropped_with_partial_group",
    "r3l/faults/env_runner_failures": "env_runner_failures",
    "r3l/faults/env_runners_restored": "env_runners_restored",
    "r3l/faults/env_runners_unavailable": "env_runners_unavailable",
    "r3l/faults/groups_lost_with_runner": "groups_lost_with_runner",
    "r3l/faults/groups_resampled": "groups_resampled",
    "env_runners/r3l/faults/groups_lost_with_exploration_error": "groups_lost_with_exploration_error",
    "env_runners/r3l/faults/exploration_errors": "exploration_errors",
    "learners/r3l/faults/nonfinite_updates_skipped": "nonfinite_updates_skipped",
    "r3l/batch/groups": "groups_received",
    "r3l/batch/empty_batches": "empty_batches",
}


def soak_config(args: argparse.Namespace, fault_overrides: Optional[Dict[str, Any]] = None):
    from rllib_r3l import R3LConfig

    iters = int(args.iterations)
    faults: Dict[str, Any] = {"seed": int(args.seed)}
    if args.env_crash_prob:
        faults["env_raise_prob"] = float(args.env_crash_prob)
    if args.jvm_kill_prob:
        faults["env_kill_jvm_prob"] = float(args.jvm_kill_prob)
    if args.bad_obs_prob:
        faults["env_bad_observation_prob"] = float(args.bad_obs_prob)
    if args.engine_death_prob:
        faults["engine_death_prob"] = float(args.engine_death_prob)
    if args.runner_kill_every and args.num_env_runners > 0:
        faults["kill_runner_at_iterations"] = list(range(2, iters + 1, int(args.runner_kill_every)))
    if args.nan_every:
        k = int(args.nan_every)
        faults["nan_loss_at_updates"] = list(range(1, 4 * iters, 2 * k))
        faults["nan_grad_at_updates"] = list(range(1 + k, 4 * iters, 2 * k))
    faults.update(fault_overrides or {})  # e.g. fixed schedules instead of probabilities (the CI test)
    env_config: Dict[str, Any] = {"max_turns": int(args.max_turns)}
    if args.env == "r3l/CoinCollector":
        env_config["num_locations"] = int(args.num_locations)
    elif args.env == "r3l/ToyCorridor":
        env_config = {"num_rooms": 3, "max_turns": int(args.max_turns)}
    from rllib_r3l.reliability.faults import inject

    return inject(
        R3LConfig()
        .environment(args.env, env_config=env_config)
        .training(
            model="tiny",
            backend="transformers",
            group_size=4,
            tasks_per_iteration=int(args.tasks),
            max_response_tokens=8,
            max_reflection_tokens=24,
            micro_batch_size=4,
            lr=1e-4,
            num_threads=1,
            sampling_seed=int(args.seed),
            runner_failure_retries=1,
            runner_restart_wait_s=float(args.restart_wait_s),
        )
        .env_runners(num_env_runners=int(args.num_env_runners), num_cpus_per_env_runner=0.5)
        .fault_tolerance(
            restart_failed_env_runners=True,
            delay_between_env_runner_restarts_s=1.0,
            env_runner_health_probe_timeout_s=30.0,
        )
        .debugging(seed=int(args.seed)),
        faults,
    )


def _learner_steps(algo) -> int:
    """Updates the learner(s) actually ran (applied or skipped as non-finite)."""
    lg = algo.learner_group
    fn = lambda l: int(l._updates) + int(l._skipped)  # noqa: E731
    if lg.is_local:
        return fn(lg._learner)
    vals = [r.get() for r in lg.foreach_learner(fn) if getattr(r, "ok", False)]
    return max(vals) if vals else -1


def _weights_finite(algo) -> bool:
    import torch

    module = algo.learner_group._learner.module["default_policy"]
    return all(bool(torch.isfinite(p).all()) for p in module.parameters())


def run_soak(
    args: argparse.Namespace, log=print, fault_overrides: Optional[Dict[str, Any]] = None
) -> Tuple[List[Tuple[str, int, int, str]], List[str], Dict[str, float]]:
    """Train ``args.iterations`` iterations with faults injected. Returns (table rows, failed checks,
    totals). A Ray session must be running."""
    cfg = soak_config(args, fault_overrides)
    tasks = int(args.tasks)
    totals: Counter = Counter()
    failures: List[str] = []
    completed = 0
    t0 = time.perf_counter()
    rss: Dict[int, Tuple[int, int]] = {}  # iteration -> driver (RSS, USS) bytes: a leak shows as a slope
    algo = cfg.build_algo()
    try:
        for it in range(1, int(args.iterations) + 1):
            t1 = time.perf_counter()
            updates_before, steps_before = algo._num_updates, _learner_steps(algo)
            try:
                result = algo.train()
            except Exception as e:  # not survived
                failures.append(f"iteration {it} raised {type(e).__name__}: {e}")
                log(traceback.format_exc())
                break
            completed += 1
            rss[it] = _rss()
            flat = flatten(result)
            row = {short: _num(flat.get(key)) for key, short in METRICS.items()}
            totals.update(row)
            learned = algo._num_updates > updates_before
            if learned and _learner_steps(algo) <= steps_before:
                failures.append(f"iteration {it}: the learner ran no update (out of service?)")
            expected = tasks - row["groups_lost_with_runner"] + row["groups_resampled"]
            if row["groups_received"] + row["groups_lost_with_exploration_error"] != expected:
                failures.append(
                    f"iteration {it}: {row['groups_received']:.0f} groups received, expected "
                    f"{tasks} - {row['groups_lost_with_runner']:.0f} lost with a runner + "
                    f"{row['groups_resampled']:.0f} re-sampled = {expected:.0f}"
                )
            if learned == bool(row["empty_batches"]):
                failures.append(f"iteration {it}: updated={learned} but empty_batches={row['empty_batches']:.0f}")
            injected = {k[4:]: int(v) for k, v in row.items() if k.startswith("inj_") and v}
            log(
                f"iteration {it}/{args.iterations}: {time.perf_counter() - t1:5.1f}s  groups "
                f"{row['groups_received']:.0f}  episodes lost {row['driver_episodes_lost']:.0f}  "
                f"updated {learned}  injected {injected or '-'}"
            )
        finite = _weights_finite(algo)
        healthy = algo.env_runner_group.num_healthy_remote_workers()
    finally:
        algo.stop()
    totals["seconds"] = time.perf_counter() - t0
    totals["iterations_completed"] = completed
    totals.update(rss_summary(rss))
    all_done = completed == int(args.iterations)
    if not finite:
        failures.append("the learner's weights are not finite")
    if int(args.num_env_runners) > 0 and healthy < int(args.num_env_runners):
        failures.append(f"only {healthy} of {args.num_env_runners} env runners healthy at the end")

    T = totals
    env_injected = T["inj_env_raise"] + T["inj_env_kill_jvm"] + T["inj_env_bad_observation"]
    if T["env_errors"] < env_injected:
        failures.append(f"{env_injected:.0f} env faults injected but only {T['env_errors']:.0f} counted as env errors")
    if T["runner_episodes_lost"] < T["env_errors"]:
        failures.append(
            f"{T['env_errors']:.0f} env errors but only {T['runner_episodes_lost']:.0f} lost episodes counted"
        )
    if T["runner_episodes_lost"] != T["driver_episodes_lost"]:
        failures.append(
            f"runners counted {T['runner_episodes_lost']:.0f} lost episodes, the driver "
            f"{T['driver_episodes_lost']:.0f}: losses went uncounted in transit"
        )
    if T["env_runner_failures"] < T["inj_runner_kill"]:
        failures.append(
            f"{T['inj_runner_kill']:.0f} runner kills injected, {T['env_runner_failures']:.0f} runner failures counted"
        )
    if T["env_runner_failures"] and T["env_runners_restored"] < T["env_runner_failures"]:
        failures.append(f"{T['env_runner_failures']:.0f} runner failures, {T['env_runners_restored']:.0f} restored")
    if T["engine_rebuilds"] + T["engine_failures_after_rebuild"] < T["inj_engine_death"]:
        failures.append(
            f"{T['inj_engine_death']:.0f} engine deaths injected, {T['engine_rebuilds']:.0f} rebuilds + "
            f"{T['engine_failures_after_rebuild']:.0f} failures after a rebuild counted"
        )
    nan_injected = T["inj_nan_loss"] + T["inj_nan_grad"]
    if T["nonfinite_updates_skipped"] != nan_injected:
        failures.append(f"{nan_injected:.0f} NaN/inf updates injected, {T['nonfinite_updates_skipped']:.0f} skipped")

    ok = all_done and not failures
    rows = [
        (
            "environment crash (env.step raises)",
            int(T["inj_env_raise"]),
            int(T["inj_env_raise"]) if ok else 0,
            f"env errors {T['env_errors']:.0f} (all env faults), episodes lost {T['runner_episodes_lost']:.0f}",
        ),
        (
            "JVM SIGKILLed mid-episode",
            int(T["inj_env_kill_jvm"]),
            int(T["inj_env_kill_jvm"]) if ok else 0,
            f"env replaced (new JVM); env close errors {T['env_close_errors']:.0f}, create errors "
            f"{T['env_create_errors']:.0f}",
        ),
        (
            "non-string observation",
            int(T["inj_env_bad_observation"]),
            int(T["inj_env_bad_observation"]) if ok else 0,
            "counted as env errors",
        ),
        (
            "env runner ray.kill mid-sample",
            int(T["inj_runner_kill"]),
            int(min(T["inj_runner_kill"], T["env_runners_restored"])) if ok else 0,
            f"runner failures {T['env_runner_failures']:.0f}, groups lost {T['groups_lost_with_runner']:.0f}, "
            f"re-sampled {T['groups_resampled']:.0f}",
        ),
        (
            "NaN loss",
            int(T["inj_nan_loss"]),
            int(T["inj_nan_loss"]) if ok else 0,
            f"updates skipped {T['nonfinite_updates_skipped']:.0f} (NaN + inf)",
        ),
        ("inf gradient", int(T["inj_nan_grad"]), int(T["inj_nan_grad"]) if ok else 0, "weights finite: " + str(finite)),
        (
            "generation engine dies",
            int(T["inj_engine_death"]),
            int(T["inj_engine_death"]) if ok else 0,
            f"rebuilds {T['engine_rebuilds']:.0f}, failed again after a rebuild "
            f"{T['engine_failures_after_rebuild']:.0f}, "
            f"generation errors {T['generation_errors']:.0f}",
        ),
    ]
    return rows, failures, dict(totals)


def _rss() -> Tuple[int, int]:
    """The driver's resident memory and its unique part (USS: without the shared pages, such as the Ray
    object store's, which RSS counts once the driver has touched them)."""
    import psutil

    info = psutil.Process().memory_full_info()
    return int(info.rss), int(info.uss)


def rss_summary(rss: Dict[int, Tuple[int, int]]) -> Dict[str, float]:
    """Driver RSS and USS at iteration 10 (after warm-up; the first iteration if fewer) and at the end,
    and the growth between them per 100 iterations (MB)."""
    if not rss:
        return {}
    its = sorted(rss)
    first = 10 if 10 in rss and its[-1] > 10 else its[0]
    last = its[-1]
    out: Dict[str, float] = {"rss_first_iteration": first}
    for i, name in enumerate(("rss", "uss")):
        out[f"{name}_first_mb"] = rss[first][i] / 2**20
        out[f"{name}_end_mb"] = rss[last][i] / 2**20
        if last > first:
            out[f"{name}_slope_mb_per_100"] = (rss[last][i] - rss[first][i]) / 2**20 / (last - first) * 100
    return out


def leftover_processes(before: set, session: str) -> Dict[str, List[str]]:
    """Processes of this soak still alive after shutdown: Ray's daemons and workers of its session
    (their command lines name the session), and JVMs or engine processes started since the soak began
    (run the soak alone: another program's JVMs would count too)."""
    import psutil

    out: Dict[str, List[str]] = {"ray": [], "jvm": [], "engine": []}
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            text = " ".join([proc.info["name"] or ""] + list(proc.info["cmdline"] or []))
        except psutil.Error:
            continue
        if proc.info["pid"] == os.getpid():
            continue
        if session and session in text:
            out["ray"].append(f"{proc.info['pid']} {text[:80]}")
        elif (
            proc.info["pid"] not in before
            and "java" in (proc.info["name"] or "")
            and any(j in text for j in ("textworld", "scienceworld", "py4j"))
        ):
            out["jvm"].append(f"{proc.info['pid']} {text[:80]}")
        elif proc.info["pid"] not in before and ("EngineCore" in text or "vllm.entrypoints" in text):
            out["engine"].append(f"{proc.info['pid']} {text[:80]}")
    return out


def format_table(rows, failures, totals, args) -> str:
    lines = [
        f"soak: {totals.get('iterations_completed', 0):.0f}/{args.iterations} iterations, {args.env}, "
        f"{args.num_env_runners} remote env runner(s), {totals.get('seconds', 0):.0f} s",
        "",
        "| fault | injected | survived | losses counted |",
        "|---|---:|---:|---|",
    ]
    lines += [f"| {name} | {inj} | {surv} | {note} |" for name, inj, surv, note in rows]
    lines += [
        "",
        f"episodes lost: runners counted {totals.get('runner_episodes_lost', 0):.0f}, driver counted "
        f"{totals.get('driver_episodes_lost', 0):.0f}; partial groups dropped {totals.get('partial_groups', 0):.0f} "
        f"({totals.get('episodes_dropped_with_partial_group', 0):.0f} surviving episodes not trained on); "
        f"empty batches {totals.get('empty_batches', 0):.0f}; groups received {totals.get('groups_received', 0):.0f}",
        _memory_line(totals),
        "result: " + ("OK: every fault survived, every loss counted" if not failures else "FAILED"),
    ]
    lines += [f"  - {f}" for f in failures]
    return "\n".join(lines)


def _memory_line(totals) -> str:
    if "rss_end_mb" not in totals:
        return "driver RSS: not measured"
    line = (
        f"driver RSS (USS): {totals['rss_first_mb']:.0f} ({totals['uss_first_mb']:.0f}) MB at iteration "
        f"{totals['rss_first_iteration']:.0f}, {totals['rss_end_mb']:.0f} ({totals['uss_end_mb']:.0f}) MB at the end"
    )
    if "rss_slope_mb_per_100" in totals:
        line += (
            f" ({totals['rss_slope_mb_per_100']:+.0f} ({totals['uss_slope_mb_per_100']:+.0f}) MB per 100 iterations)"
        )
    if "leftover_processes" in totals:
        line += f"; processes left after shutdown: {totals['leftover_processes']:.0f}"
    return line


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--env", default="r3l/CoinCollector")
    p.add_argument("--num-locations", type=int, default=3)
    p.add_argument("--max-turns", type=int, default=6)
    p.add_argument("--tasks", type=int, default=2, help="tasks_per_iteration")
    p.add_argument("--num-env-runners", type=int, default=1)
    p.add_argument("--env-crash-prob", type=float, default=0.02)
    p.add_argument("--jvm-kill-prob", type=float, default=0.02)
    p.add_argument("--bad-obs-prob", type=float, default=0.01)
    p.add_argument(
        "--runner-kill-every", type=int, default=3, help="kill the runner in iterations 2, 2+k, ... (0: never)"
    )
    p.add_argument(
        "--nan-every", type=int, default=2, help="NaN loss / inf grad alternately every k updates (0: never)"
    )
    p.add_argument(
        "--engine-death-prob",
        type=float,
        default=0.005,
        help="probability per generate call that the policy's engine dies (the runner rebuilds it)",
    )
    p.add_argument("--restart-wait-s", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import psutil
    import ray

    import rllib_r3l  # noqa: F401  (registers R3L)

    before = {p.pid for p in psutil.process_iter()}
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    session = os.path.basename(ray._private.worker._global_node.get_session_dir_path())
    try:
        rows, failures, totals = run_soak(args)
    finally:
        ray.shutdown()
    time.sleep(5.0)  # Ray's daemons exit asynchronously after shutdown
    left = leftover_processes(before, session)
    totals["leftover_processes"] = sum(len(v) for v in left.values())
    for kind, procs in left.items():
        if procs:
            failures.append(f"{len(procs)} {kind} process(es) left after shutdown: " + "; ".join(procs[:3]))
    print(format_table(rows, failures, totals, args))
    return 1 if failures or totals.get("iterations_completed", 0) != args.iterations else 0


if __name__ == "__main__":
    sys.exit(main())
