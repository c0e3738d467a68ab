"""Exploring while the learner trains (issue 47, item 6b): ``max_policy_lag`` 0 vs 1 in the main job's setting
with one remote env runner beside the learner, each on one thread (one core each on 2 cores).

    .venv/bin/python benchmarks/policy_lag.py --lags 0,1 --iterations 4          # resumable: done lags are kept

Per iteration (raw, one JSON line each in OUT/lag{k}.jsonl): wall seconds, the driver's wait for samples
(the learner's idle time), the runner's sampling seconds, the learner's update seconds, the policy lag, the
trajectories started. The summary (OUT/summary.md) compares the lags on the iterations after the first
(engine start and the first request, which has nothing to overlap with) and the ideal overlap
``(E + L) / max(E, L)`` from lag 0's own phase times. One seed: a timing, not a learning comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OUT = ROOT / "benchmarks" / "results" / "policy_lag"


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lags", default="0,1", help="max_policy_lag values to run, comma-separated")
    ap.add_argument("--iterations", type=int, default=4, help="iterations per lag (the first is not compared)")
    ap.add_argument("--seed", type=int, default=0, help="the run's seed (debugging(seed=...))")
    ap.add_argument("--out", default=str(OUT), help="results folder (one JSON-lines file per lag)")
    ap.add_argument("--report-only", action="store_true", help="write the summary from what is there")
    return ap.parse_args()


def _config(lag: int, seed: int):
    from rllib_r3l import R3LConfig
    from rllib_r3l.cli.main import MAIN_JOB_SETTINGS

    cfg = R3LConfig().training(**MAIN_JOB_SETTINGS, max_policy_lag=lag, num_threads=1)
    cfg = cfg.env_runners(
        num_env_runners=1, num_cpus_per_env_runner=1, max_requests_in_flight_per_env_runner=max(1, lag)
    )
    return cfg.debugging(seed=seed)


def _float(v) -> float:
    """A metric as a float (RLlib's reduced values may be numpy scalars); NaN where there is none."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _row(i: int, r: dict) -> dict:
    from rllib_r3l.cli.console import learner_metric
    from rllib_r3l.cli.result_rows import get_metric, number

    learn = learner_metric(r, "update_seconds")
    return {
        "iteration": i,
        "wall_s": number(r.get("time_this_iter_s")),
        "wait_for_samples_s": number(get_metric(r, "r3l/async/wait_for_samples_s")),
        "sampling_timer_s": number(get_metric(r, "timers/env_runner_sampling_timer")),
        "runner_sampling_s": number(get_metric(r, "env_runners/r3l/rollout_seconds")),
        "learn_s": number(learn) if learn == learn else 0.0,  # NaN: no update this iteration
        "sync_s": number(get_metric(r, "r3l/timers/weight_sync_s")),
        "policy_lag_max": _float(get_metric(r, "r3l/policy_lag_max")),
        "episodes_started": number(get_metric(r, "env_runners/r3l/episodes_started")),
        "success_rate": number(get_metric(r, "env_runners/success_rate"), float("nan")),
    }


def run(lag: int, iterations: int, seed: int, out: Path) -> None:
    import ray

    path = out / f"lag{lag}.jsonl"
    if path.exists() and len(path.read_text().splitlines()) >= iterations:
        print(f"lag {lag}: done ({path})", flush=True)
        return
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    algo = _config(lag, seed).build_algo()
    rows = []
    try:
        for i in range(1, iterations + 1):
            t0 = time.perf_counter()
            r = algo.train()
            row = _row(i, r)
            row["train_call_s"] = round(time.perf_counter() - t0, 2)
            rows.append(row)
            print(f"lag {lag} it {i}: {json.dumps(row)}", flush=True)
    finally:
        algo.stop()
        ray.shutdown()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # whole runs only: a cut run starts again


def _lag(row: dict) -> int:
    v = row.get("policy_lag_max")
    return int(v) if isinstance(v, (int, float)) and v == v else 0  # None/NaN: lag 0 logs none


def _mean(rows: list, key: str) -> float:
    return sum(float(r[key] or 0) for r in rows) / max(len(rows), 1)


def report(out: Path) -> str:
    from benchmarks.harness import machine

    runs = {
        int(p.stem[3:]): [json.loads(x) for x in p.read_text().splitlines()] for p in sorted(out.glob("lag*.jsonl"))
    }
    lines = [
        f"# max_policy_lag timing ({machine()})",
        "",
        "| lag | s/iter | learner waits | runner samples | learns | sync | lag max |",
        "|---|---|---|---|---|---|---|",
    ]
    later = {lag: rows[1:] or rows for lag, rows in runs.items()}  # the first iteration has nothing to overlap
    for lag, rows in sorted(later.items()):
        cells = [f"{_mean(rows, k):.1f}" for k in ("train_call_s", "wait_for_samples_s", "runner_sampling_s")]
        cells += [f"{_mean(rows, k):.1f}" for k in ("learn_s", "sync_s")]
        lag_max = max(_lag(r) for r in rows)
        lines.append(f"| {lag} | {' | '.join(cells)} | {lag_max} |")
    if 0 in later and 1 in later:
        e = _mean(later[0], "runner_sampling_s")
        l_ = _mean(later[0], "learn_s") + _mean(later[0], "sync_s")
        speedup = _mean(later[0], "train_call_s") / _mean(later[1], "train_call_s")
        ideal = (e + l_) / max(e, l_) if max(e, l_) else float("nan")
        share = (speedup - 1) / (ideal - 1) * 100 if ideal > 1 else float("nan")
        lines += [
            "",
            f"lag 1 vs 0: {speedup:.2f}x the iterations per second; the ideal (E + L) / max(E, L) from lag 0's "
            f"phases: {ideal:.2f}x (E {e:.1f} s, L {l_:.1f} s); {share:.0f} % of the ideal gain reached",
        ]
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


def main() -> None:
    a = _parse()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if not a.report_only:
        for lag in [int(x) for x in a.lags.split(",")]:
            run(lag, a.iterations, a.seed, out)
    print(report(out))


if __name__ == "__main__":
    main()
