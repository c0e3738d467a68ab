"""Which coin-collector setting should the main job default to? (issue 16, item 2)

    python benchmarks/default_setting.py                                   # the default grid
    python benchmarks/default_setting.py --settings 3x10,4x15 --groups 4   # rooms x max_turns
    python benchmarks/default_setting.py --table-only                      # print what is saved

For each setting (``rooms x max_turns`` of ``r3l/CoinCollector``) it builds the R3L env runner
(the real model through the real loading code, the configured backend) *without* Ray or a
learner, explores ``--groups`` task groups exactly as one training iteration would (base
rollouts, reflections, retries from the pivot, seeded: the same task seeds for every setting)
and records what the newcomer would see before any update: base success, reflection validity,
retries and how many succeeded, how many groups would give an update (not all rewards equal), the
credited and forward tokens of the learner batch ``build_train_batch`` would make, and the time
spent. One JSON line per setting is appended to
``benchmarks/results/default_setting/<tag>.jsonl``; a setting already there is skipped, so the
sweep can be continued after an interruption.

The default should be failure-dominated (base success well below 1/2: the regime R3L targets)
while retries still succeed and every iteration has an update, at a cost that keeps the main
job short. Not a test: a benchmark that prints a table (docs/benchmarks.md quotes it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402

OUT = harness.RESULTS / "default_setting"
DEFAULT_GRID = "2x10,3x10,3x15,4x10,4x15"


def measure(rooms: int, turns: int, args) -> Dict[str, Any]:

    from rllib_r3l import R3LConfig
    from rllib_r3l.batch import build_train_batch, select_trainable
    from rllib_r3l.cli.run_info import cpu_model
    from rllib_r3l.runner.env_runner import R3LEnvRunner

    overrides = dict(json.loads(args.set)) if args.set else {}
    cfg = (
        R3LConfig()
        .environment(
            "r3l/CoinCollector",
            env_config={
                "num_locations": rooms,
                "max_turns": turns,
                **(json.loads(args.env_set) if args.env_set else {}),
            },
        )
        .training(group_size=args.group_size, tasks_per_iteration=args.groups, sampling_seed=args.seed, **overrides)
        .debugging(seed=args.seed)
    )
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    runner = R3LEnvRunner(config=cfg)
    runner.backend  # noqa: B018  (start the engine outside the timed exploration)
    t_start = time.perf_counter() - t0
    t1 = time.perf_counter()
    groups = runner.sample(num_groups=args.groups)
    t_explore = time.perf_counter() - t1
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    metrics = runner.get_metrics()
    r3l = metrics.get("r3l", {})

    base = [t for g in groups for t in g.trajectories if t.kind.value == "base"]
    retries = [t for g in groups for t in g.trajectories if t.kind.value == "retry"]
    trainable_groups = sum(
        1 for g in groups if len({round(t.reward, 6) for t in g.trajectories if t.kind.value in ("base", "retry")}) > 1
    )
    trajectories, _ = select_trainable(groups, drop_partial_groups=True)
    fwd = credited = 0
    if trajectories:
        batch, _ = build_train_batch(
            trajectories,
            pad_token_id=0,
            std_normalize=cfg.std_normalize,
            positive_amplification=cfg.positive_amplification,
            alpha=cfg.amplification_alpha,
            success_reward=cfg.success_reward,
            pivotal_credit=cfg.pivotal_credit,
            max_length=cfg.max_context_tokens,
        )
        if len(batch["input_ids"]):
            fwd = int(batch["attention_mask"].sum())
            credited = int((batch["loss_mask"] > 0).sum())
    k = sum(bool(t.success) for t in base)
    rk = sum(bool(t.success) for t in retries)
    rec = {
        "setting": f"{rooms}x{turns}",
        "rooms": rooms,
        "max_turns": turns,
        "groups": args.groups,
        "group_size": args.group_size,
        "seed": args.seed,
        "overrides": overrides,
        "env_overrides": json.loads(args.env_set) if args.env_set else {},
        "base_episodes": len(base),
        "base_successes": k,
        "base_success": k / max(len(base), 1),
        "base_success_ci95": harness.wilson(k, len(base)),
        "base_turns_mean": sum(t.num_turns for t in base) / max(len(base), 1),
        "retries": len(retries),
        "retry_successes": rk,
        "reflection_valid_rate": _num(r3l.get("reflection_valid_rate")),
        "pivot_accuracy": _num(r3l.get("pivot_accuracy")),
        "retry_changed_pivot_action": _num(r3l.get("retry_changed_pivot_action")),
        "retry_took_oracle_action": _num(r3l.get("retry_took_oracle_action")),
        "groups_with_update": trainable_groups,
        "items_trained": len(trajectories),
        "forward_tokens": fwd,
        "credited_tokens": credited,
        "prompt_tokens_computed_per_sample": _num(r3l.get("prompt_tokens_computed_per_sample")),
        "generated_tokens": _num(r3l.get("generated_tokens")),
        "engine_start_s": round(t_start, 1),
        "explore_s": round(t_explore, 1),
        "reflect_s": round(_num(r3l.get("timers", {}).get("reflect_s")), 1),
        "timers": {k: round(_num(v), 1) for k, v in r3l.get("timers", {}).items()},
        "cpu_s": round((cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime), 1),
        "load": os.getloadavg(),
        "cpu": cpu_model(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    runner.stop()
    return rec


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def table(records: List[Dict[str, Any]]) -> str:
    head = (
        "setting",
        "base ok",
        "95% CI",
        "turns",
        "valid",
        "pivot acc",
        "retries",
        "retry ok",
        "upd groups",
        "fwd tok",
        "credited",
        "fwd/cred",
        "explore s",
        "reflect s",
        "CPU s",
    )
    rows = []
    for r in records:
        lo, hi = r["base_success_ci95"]
        rows.append(
            (
                r["setting"],
                f"{r['base_successes']}/{r['base_episodes']}",
                f"{lo:.2f}-{hi:.2f}",
                f"{r['base_turns_mean']:.1f}",
                f"{r['reflection_valid_rate']:.2f}",
                f"{r['pivot_accuracy']:.2f}",
                str(r["retries"]),
                str(r["retry_successes"]),
                f"{r['groups_with_update']}/{r['groups']}",
                f"{r['forward_tokens']:,}",
                str(r["credited_tokens"]),
                f"{r['forward_tokens'] / max(r['credited_tokens'], 1):.1f}",
                f"{r['explore_s']:.0f}",
                f"{r['reflect_s']:.0f}",
                f"{r['cpu_s']:.0f}",
            )
        )
    return harness.markdown_table(head, rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", default=DEFAULT_GRID, help="comma-separated ROOMSxMAX_TURNS")
    ap.add_argument("--groups", type=int, default=4, help="task groups explored per setting")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--set",
        default="",
        help='extra R3LConfig training options as JSON, e.g. \'{"reflection_context": "transcript"}\'',
    )
    ap.add_argument(
        "--env-set", default="", help='extra coin-collector options as JSON, e.g. \'{"compact_observations": true}\''
    )
    ap.add_argument(
        "--tag", default="default", help="results file name (benchmarks/results/default_setting/<tag>.jsonl)"
    )
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="engine and library logs on the console")
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{args.tag}.jsonl"
    done = {r["setting"]: r for r in harness.read_jsonl(path)}
    if not args.table_only:
        from rllib_r3l.cli.console import routed_output

        with routed_output(str(OUT / f"{args.tag}.log"), verbose=args.verbose) as con:
            for s in args.settings.split(","):
                s = s.strip()
                if s in done:
                    con.line(f"{s}: already measured (skipped)")
                    continue
                rooms, turns = (int(x) for x in s.split("x"))
                con.line(f"{s}: exploring {args.groups} groups ...")
                rec = measure(rooms, turns, args)
                harness.append_jsonl(path, [rec])
                done[s] = rec
                con.line(table([rec]).splitlines()[-1])
    recs = (
        [done[s.strip()] for s in args.settings.split(",") if s.strip() in done]
        if not args.table_only
        else list(done.values())
    )
    if recs:
        print(
            f"\n{recs[0]['cpu']}, {os.cpu_count()} CPUs; {recs[0]['groups']} groups x {recs[0]['group_size']} per "
            f"setting, seed {recs[0]['seed']}"
        )
        print(table(recs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
