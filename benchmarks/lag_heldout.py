"""Does exploring while the learner trains cost held-out success? ``max_policy_lag`` 1 against 0 after the
same trajectories (issue 47, item 6b: "held-out success after equal trajectories within the paired interval
of lag 0").

    .venv/bin/python benchmarks/lag_heldout.py --seeds 0,1,2          # the sweep; resumable
    .venv/bin/python benchmarks/lag_heldout.py --report-only          # tables from what is there

``benchmarks/learning_curves.py``'s harness (resumable runs, an exact trajectory budget, setting.json,
held-out games of the test fold kept game by game), on evidence v5's task and budget (``V5_SETTING``: coin
collector, 8 rooms, 15 turns, 64 trajectories, 32 held-out games), with ONE remote env runner beside the
learner in both arms, since a lag needs a runner of its own; so the arms differ in the lag only:

* ``lag0``: R3L today (``R3LConfig()`` with ``MAIN_JOB_SETTINGS``): explore, then train;
* ``lag1``: the same with ``max_policy_lag=1``: the runner samples the next groups while the learner
  trains on the last ones; base items from the older weights train with the clipped importance ratio.

The runner draws the same task seeds in both arms (its task RNG is seeded by the run's seed), and the
held-out games run through the runner's own ``evaluate_episodes`` (``learning_curves.evaluate_on_runners``)
with the same sampling seeds. Each run's curve keeps its wall seconds and largest policy lag per iteration:
the report adds seconds per iteration and the lags seen. The sweep never commits its results.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402
from benchmarks import learning_curves as lc  # noqa: E402
from benchmarks.evidence_v5 import V5_SETTING  # noqa: E402
from benchmarks.learning_curves_report import BASE, read_curve, read_setting, report, run_dir  # noqa: E402

OUT = harness.RESULTS / "policy_lag_heldout"
SETTING: Dict[str, Any] = {
    **V5_SETTING,
    "env_config": {**V5_SETTING["env_config"], "eval_split": "test"},  # the runners' held-out fold
    "num_env_runners": 1,
}
VARIANTS: Dict[str, Dict[str, Any]] = {
    "lag0": dict(lc.VARIANTS["r3l"]),
    "lag1": {**lc.VARIANTS["r3l"], "max_policy_lag": 1},
}
PRIORITY: Dict[str, int] = {BASE: 0, "lag0": 0, "lag1": 0}
PAIRS: Dict[str, str] = {"lag1": "lag0"}


def install() -> None:
    """This script's variants and run order in ``learning_curves`` (this process only)."""
    lc.VARIANTS.clear()
    lc.VARIANTS.update(VARIANTS)
    lc.PRIORITY.clear()
    lc.PRIORITY.update(PRIORITY)


def timing_lines(out: Path, variants: Sequence[str], seeds: Sequence[int]) -> List[str]:
    """Per variant: wall seconds per iteration after the first, the training seconds the whole budget took
    per seed (every iteration: equal trajectories, so this is the arms' speed) and the largest policy lags
    seen; the budget's seconds of each variant against its reference, seed by seed."""
    head = "| variant | runs | s/iter (after the first) | s to spend the budget, per seed | lags seen |"
    lines, totals = ["", head, "|---|---|---|---|---|"], {}
    for v in variants:
        walls, lags, per_seed = [], set(), {}
        for s in seeds:
            _header, recs = read_curve(run_dir(out, v, s))
            if not recs:
                continue
            per_seed[s] = sum(float(r["wall_s"]) for r in recs)
            walls += [float(r["wall_s"]) for r in recs[1:]]
            lags |= {int(r["policy_lag_max"]) for r in recs if isinstance(r.get("policy_lag_max"), (int, float))}
        if per_seed:
            totals[v] = per_seed
            mean = sum(walls) / len(walls) if walls else float("nan")
            each = ", ".join(f"{per_seed[s]:.0f}" for s in sorted(per_seed))
            lines.append(f"| {v} | {len(per_seed)} | {mean:.1f} | {each} | {sorted(lags) or [0]} |")
    for v, ref in PAIRS.items():
        if v in totals and ref in totals:
            ratio = harness.paired_ratio(totals[ref], totals[v])  # > 1: v spent the budget faster
            lines += ["", f"{v} spends the budget {harness.fmt_interval(ratio, 2)}x as fast as {ref} (paired by seed)"]
    return lines


def full_report(out: Path, variants: Sequence[str], seeds: Sequence[int]) -> str:
    held_out = report(out, variants, seeds, PAIRS).rstrip("\n")
    text = held_out + "\n" + "\n".join(timing_lines(out, variants, seeds)) + "\n"
    (out / "summary.md").write_text(text)
    return text


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default=None, help=f"comma list of {list(VARIANTS)} (default: all)")
    ap.add_argument("--seeds", default="0,1,2", help="the runs' seeds, comma-separated (paired across variants)")
    ap.add_argument("--out", default=str(OUT), help="results folder (one folder per variant and seed)")
    ap.add_argument("--parallel", type=int, default=1, help="runs at a time (each is two processes)")
    ap.add_argument("--report-only", action="store_true", help="write the tables from what is there")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    install()
    out = Path(args.out).resolve()
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    if args.child:
        v, s = args.child.split(":")
        lc.run_one(out, read_setting(out)["common"], v, int(s))
        return
    variants = [v for v in (args.variants or "").split(",") if v] or list(VARIANTS)
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"--variants: unknown {bad}; choose from {list(VARIANTS)}")
    if args.report_only:
        print(full_report(out, variants, seeds))
        return
    setting = dict(SETTING)
    lc.check_setting(out, setting, lc.variant_diffs(setting, [BASE, *variants]))
    lc.sweep(out, setting, variants, seeds, args.parallel, __file__, lambda: full_report(out, variants, seeds))
    print(full_report(out, variants, seeds))


if __name__ == "__main__":
    main()
