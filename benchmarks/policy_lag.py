"""Exploring while the learner trains (issue 47, item 6b): ``max_policy_lag`` 0 vs 1 in the main job's setting
with one remote env runner beside the learner, each on one thread (one core each on 2 cores).

    .venv/bin/python benchmarks/policy_lag.py --lags 0,1,2 --seeds 0,1,2 --iterations 4   # resumable

Per iteration (raw, one JSON line each in OUT/lag{k}_seed{s}.jsonl; seed 0 of an older run: OUT/lag{k}.jsonl):
wall seconds, the driver's wait for samples (the learner's idle time), the runner's sampling seconds, the
learner's update seconds, the policy lag, the trajectories started, when each phase ran. The summary
(OUT/summary.md) compares the lags on the iterations after the first (engine start and the first request,
which has nothing to overlap with), seed by seed, against the ideal overlap ``(E + L) / max(E, L)`` from the
same seed's lag-0 phase times, and shows where the overlap goes (a per-phase timeline,
benchmarks/phase_timeline.py). A timing, not a learning comparison."""

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
PHASES = ("base", "retry", "reflect")  # the runner's engine phases (prompt_tokens_computed_<phase>)
ENGINE_TIMERS = ("generate_base", "generate_retry", "reflect", "score_behaviour")  # r3l/timers/<name>_s


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lags", default="0,1", help="max_policy_lag values to run, comma-separated")
    ap.add_argument("--iterations", type=int, default=4, help="iterations per lag (the first is not compared)")
    ap.add_argument("--seeds", default="0", help="the runs' seeds (debugging(seed=...)), comma-separated")
    ap.add_argument("--step-delay", type=float, default=0.0, help="env_config.step_delay_s (tool latency stand-in)")
    ap.add_argument("--rollout-loop", default="waves", help="rollout_loop: waves or episodes")
    ap.add_argument("--out", default=str(OUT), help="results folder (one JSON-lines file per lag)")
    ap.add_argument("--report-only", action="store_true", help="write the summary from what is there")
    return ap.parse_args()


def _config(lag: int, seed: int, delay: float = 0.0, loop: str = "waves"):
    from rllib_r3l import R3LConfig
    from rllib_r3l.cli.main import MAIN_JOB_SETTINGS

    cfg = R3LConfig().training(**MAIN_JOB_SETTINGS, max_policy_lag=lag, num_threads=1, rollout_loop=loop)
    if delay:
        cfg = cfg.environment(env_config={**(cfg.env_config or {}), "step_delay_s": delay})
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
        # the work of each side, for rates that compare like with like (the arms' batches differ): the learner's
        # forward tokens; the runner's engine tokens (computed prompt + generated) and engine seconds
        "learner_forward_tokens": number(learner_metric(r, "forward_tokens")),
        "runner_engine_tokens": number(get_metric(r, "env_runners/r3l/generated_tokens"))
        + sum(number(get_metric(r, f"env_runners/r3l/prompt_tokens_computed_{p}")) for p in PHASES),
        "runner_engine_s": sum(number(get_metric(r, f"env_runners/r3l/timers/{t}_s")) for t in ENGINE_TIMERS),
        # where the runner's request went (r3l/timers: engine per phase, environment, behaviour scoring)
        "runner_timers": {k: number(v) for k, v in (get_metric(r, "env_runners/r3l/timers") or {}).items()},
        # when each phase ran (seconds since the run's first phase): benchmarks/phase_timeline.py
        "timeline": {k: number(v) for k, v in (get_metric(r, "r3l/timeline") or {}).items()},
    }


def _path(out: Path, lag: int, seed: int) -> Path:
    return out / f"lag{lag}_seed{seed}.jsonl"


def run(lag: int, iterations: int, seed: int, out: Path, delay: float = 0.0, loop: str = "waves") -> None:
    import ray

    path = _path(out, lag, seed)
    if path.exists() and len(path.read_text().splitlines()) >= iterations:
        print(f"lag {lag} seed {seed}: done ({path})", flush=True)
        return
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    from benchmarks.harness import machine

    ran_on = machine()
    algo = _config(lag, seed, delay, loop).build_algo()
    rows = []
    try:
        for i in range(1, iterations + 1):
            t0 = time.perf_counter()
            r = algo.train()
            row = _row(i, r)
            row["train_call_s"] = round(time.perf_counter() - t0, 2)
            row["machine"] = ran_on
            rows.append(row)
            print(f"lag {lag} seed {seed} it {i}: {json.dumps(row)}", flush=True)
    finally:
        algo.stop()
        ray.shutdown()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # whole runs only: a cut run starts again


def _lag(row: dict) -> int:
    v = row.get("policy_lag_max")
    return int(v) if isinstance(v, (int, float)) and v == v else 0  # None/NaN: lag 0 logs none


def _mean(rows: list, key: str) -> float:
    return sum(float(r[key] or 0) for r in rows) / max(len(rows), 1)


def _runs(out: Path) -> dict:
    """(lag, seed) -> the iterations after the first (the first has nothing to overlap with)."""
    runs = {}
    for p in sorted(out.glob("lag*.jsonl")):
        lag, _, seed = p.stem[3:].partition("_seed")
        rows = [json.loads(x) for x in p.read_text().splitlines()]
        runs[(int(lag), int(seed or 0))] = rows[1:] or rows
    return runs


def _rate(rows: list) -> float:
    """Trajectories per second: the episodes the iterations started over their wall seconds (an iteration's
    count varies with dynamic sampling's extra rounds and retries, so iterations per second alone can mislead)."""
    return sum(float(r["episodes_started"] or 0) for r in rows) / max(sum(float(r["train_call_s"]) for r in rows), 1e-9)


def report(out: Path) -> str:
    from benchmarks.harness import fmt_interval, machine, mean_interval, paired_ratio

    runs = _runs(out)
    lags = sorted({k for k, _ in runs})
    ran_on = sorted({r["machine"] for rs in runs.values() for r in rs if r.get("machine")})
    lines = [
        f"# max_policy_lag timing ({'; '.join(ran_on) or machine() + ', where this report ran: the rows name none'})",
        "",
        "Means over seeds of the iterations after the first; idle = the learner's wait for samples (or the runner's "
        "sampling time beside the iteration) / the iteration; lags seen = each later iteration's largest policy lag.",
        "",
        "| lag | seeds | s/iter | trajectories/s | learner waits | learner idle | runner idle | runner samples "
        "| learns | sync | lags seen |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lag in lags:
        rows = [r for (k, _s), rs in runs.items() if k == lag for r in rs]
        seeds = sorted(s for k, s in runs if k == lag)
        wall = max(_mean(rows, "train_call_s"), 1e-9)
        # lag 0 waits for the whole sample (no async metric); a lag waits for the oldest request
        waits = _mean(rows, "wait_for_samples_s" if lag else "runner_sampling_s")
        runner_idle = max(0.0, 1 - _mean(rows, "runner_sampling_s") / wall)
        cells = [f"{wall:.1f}", f"{_rate(rows):.2f}", f"{waits:.1f}", f"{waits / wall:.2f}", f"{runner_idle:.2f}"]
        cells += [f"{_mean(rows, k):.1f}" for k in ("runner_sampling_s", "learn_s", "sync_s")]
        seen = sorted({_lag(r) for r in rows})
        lines.append(f"| {lag} | {','.join(map(str, seeds))} | {' | '.join(cells)} | {seen} |")
    for lag in lags:
        if lag == 0:
            continue
        speed, share, rate = {}, {}, {}
        for (k, seed), rows in runs.items():
            base = runs.get((0, seed))
            if k != lag or not base:
                continue
            e = _mean(base, "runner_sampling_s")
            l_ = _mean(base, "learn_s") + _mean(base, "sync_s")
            speed[seed] = _mean(base, "train_call_s") / _mean(rows, "train_call_s")
            rate[seed] = _rate(rows) / _rate(base)
            ideal = (e + l_) / max(e, l_) if max(e, l_) else float("nan")
            share[seed] = (speed[seed] - 1) / (ideal - 1) if ideal > 1 else float("nan")
        if speed:
            ones = {s: 1.0 for s in speed}
            lines += [
                "",
                f"lag {lag} vs 0 (paired by seed): {fmt_interval(paired_ratio(speed, ones), 2)}x the iterations per "
                f"second; share of the ideal gain (E + L) / max(E, L) reached: "
                f"{fmt_interval(mean_interval(list(share.values())), 2)}; trajectories per second (episodes "
                f"started / wall): {fmt_interval(paired_ratio(rate, ones), 2)}x",
            ]
    lines += _where_the_overlap_goes(runs, lags)
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


def _where_the_overlap_goes(runs: dict, lags: list) -> list:
    """Per seed, the lagged period against the ideal, split (phase_timeline.split_loss), and each lag's
    timeline for its first seed; nothing for rows without a timeline (runs before it was logged)."""
    from benchmarks.phase_timeline import gantt, split_loss, work_rates

    keys = ["E0", "L0", "ideal", "period", "loss", "E1", "contention", "runner_gap", "runner_slack", "L1"]
    keys += ["learner_contention", "learner_gap"]
    lines = []
    for lag in [k for k in lags if k]:
        split = {
            seed: split_loss(runs[(0, seed)], rows)
            for (k, seed), rows in sorted(runs.items())
            if k == lag and (0, seed) in runs and all(r.get("timeline") for r in rows + runs[(0, seed)])
        }
        if not split:
            continue
        lines += [
            "",
            f"Where lag {lag}'s overlap goes (seconds, iterations after the first): period (update to update) = "
            "ideal max(E0, L0) + contention (E1 - E0: the runner's request beside the learner against E0 alone; "
            "it includes the lag's own work, the behaviour scoring) "
            "+ runner_gap (its wait between requests) - runner_slack (ideal - E0).",
            "",
            "| seed | " + " | ".join(keys) + " |",
            "|---" * (len(keys) + 1) + "|",
        ]
        lines += [f"| {seed} | " + " | ".join(f"{v[k]:.1f}" for k in keys) + " |" for seed, v in split.items()]
        rated = {s: (work_rates(runs[(0, s)]), work_rates(runs[(lag, s)])) for s in split}
        rated = {s: v for s, v in rated.items() if v[0]["learner_tokens_per_s"] == v[0]["learner_tokens_per_s"]}
        if rated:
            lines += [
                "",
                f"Each side's rate of work beside the other (lag {lag} / lag 0; tokens per second: the learner's "
                "forward tokens over its update seconds, the engine's computed + generated tokens over its seconds):",
                "",
                "| seed | learner, lag 0 | learner, lag k | ratio | engine, lag 0 | engine, lag k | ratio |",
                "|---|---|---|---|---|---|---|",
            ]
            for s, (r0, rk) in rated.items():
                cells = []
                for key in ("learner_tokens_per_s", "engine_tokens_per_s"):
                    cells += [f"{r0[key]:.0f}", f"{rk[key]:.0f}", f"{rk[key] / r0[key]:.2f}"]
                lines.append(f"| {s} | " + " | ".join(cells) + " |")
        first = min(split)
        for k in (0, lag):
            tail = "; the request queued in the last iteration is not drawn" if k else ""
            lines += ["", f"lag {k}, seed {first} (S sampling, U update, w weight sync, . idle{tail}):", "", "```"]
            lines += gantt(runs[(k, first)]) + ["```"]
    return lines


def main() -> None:
    a = _parse()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if not a.report_only:
        for seed in [int(x) for x in a.seeds.split(",")]:
            for lag in [int(x) for x in a.lags.split(",")]:
                run(lag, a.iterations, seed, out, a.step_delay, a.rollout_loop)
    print(report(out))


if __name__ == "__main__":
    main()
