"""Per-step cost, R3L vs the GRPO baseline (issue 7, item 1; paper appendix D.2).

    python benchmarks/r3l_vs_grpo_cost.py                      # table from the learning-curve runs' logs
    python benchmarks/r3l_vs_grpo_cost.py --run --iterations 4 # fresh runs first (no evaluation), then the table

Both variants are ``R3LConfig`` on r3l/CoinCollector with the same model, seed (the same training
task seeds), group size and task budget per step; R3L = reflect + pivotal credit + positive
amplification, GRPO = all three off + std-normalised advantages. The per-iteration metrics come
from the algorithm itself (``env_runners/r3l/*``, ``r3l/trained_tokens_per_sample``,
``learners/default_policy/r3l/learner/*``, RLlib's timers), recorded by
``benchmarks/learning_curves.py`` in ``benchmarks/results/learning_curves/<variant>.jsonl``; the two
variants run concurrently, so they see the same machine load. Process CPU seconds per step (the
driver process holds both the env runner and the learner here) is given beside the wall seconds as
the load-robust measure. Output: a table with the R3L/GRPO ratios beside the paper's, and
``benchmarks/results/r3l_vs_grpo_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CURVES = ROOT / "benchmarks" / "results" / "learning_curves"
OUT = ROOT / "benchmarks" / "results"

# (label, key in the per-iteration record, paper's R3L/GRPO ratio on multi-step tasks (D.2) or None)
METRICS = [
    ("samples (base+retry) / step", "samples_per_step", None),
    ("rollout turns / sample", "env_runners/r3l/rollout_turns_per_sample", "0.66-0.72 (28-34 % fewer)"),
    ("generated tokens / sample", "env_runners/r3l/generated_tokens_per_sample", None),
    ("trained tokens / sample", "r3l/trained_tokens_per_sample", "0.51 (ALFWorld 1.5B), 0.38 (4B)"),
    ("rollout s / step (wall)", "env_runners/r3l/rollout_seconds", "0.67 (DAPO 4B, single-step)"),
    ("train s / step (wall, RLlib learner_update_timer)", "timers/learner_update_timer", "1.86 (DAPO 4B)"),
    ("iteration s (wall)", "wall_s", None),
    ("driver CPU s / step", "cpu_s", None),
    ("learner forward tokens / step (all positions)", "learners/default_policy/r3l/learner/forward_tokens", None),
    ("learner trained tok/s", "learners/default_policy/r3l/learner/trained_tokens_per_s", None),
    ("rollout generated tok/s", "env_runners/r3l/generated_tokens_per_s", None),
    ("base success rate (train tasks)", "env_runners/success_rate", None),
    ("cpu / wall", "cpu_over_wall", None),
    ("load average (1 min)", "loadavg_1m", None),
]


def load(variant: str):
    p = CURVES / f"{variant}.jsonl"
    if not p.exists():
        return None, []
    lines = [json.loads(l) for l in p.read_text().splitlines() if l.strip()]
    recs = [l for l in lines[1:] if l.get("iteration", 0) > 0]
    prev = 0.0
    for r in recs:  # samples generated in this step
        r["samples_per_step"] = r["samples_cumulative"] - prev
        prev = r["samples_cumulative"]
    return lines[0]["header"], recs


def summarise(recs, key):
    vals = [r[key] for r in recs if isinstance(r.get(key), (int, float))]
    if not vals:
        return None
    return {"mean": statistics.mean(vals), "median": statistics.median(vals), "n": len(vals)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="store_true", help="run fresh R3L and GRPO iterations first (learning_curves.py)")
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--a", default="r3l")
    ap.add_argument("--b", default="grpo")
    args, rest = ap.parse_known_args()
    if args.run:
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "learning_curves.py"), "--variants", f"{args.a},{args.b}",
                        "--iterations", str(args.iterations), "--eval-every", "1000000", *rest], check=True)
    ha, ra = load(args.a)
    hb, rb = load(args.b)
    if not ra or not rb:
        raise SystemExit(f"no iterations recorded yet under {CURVES} for {args.a} and {args.b}")
    n = min(len(ra), len(rb))  # the same number of steps for both (the same task seeds)
    ra, rb = ra[:n], rb[:n]
    print(f"{ha['num_locations']}-room coin collector, max_turns {ha['max_turns']}, group size {ha['group_size']}, "
          f"{ha['tasks_per_iteration']} tasks/step, seed {ha['seed']}, {n} steps each (mean over steps; median in the JSON)")
    print(f"| per step | {args.a} | {args.b} | {args.a}/{args.b} | paper R3L/GRPO (D.2) |")
    print("|---|---|---|---|---|")
    table = []
    for label, key, paper in METRICS:
        a, b = summarise(ra, key), summarise(rb, key)
        ratio = a["mean"] / b["mean"] if a and b and b["mean"] else None
        table.append({"metric": label, "key": key, args.a: a, args.b: b, "ratio_mean": ratio,
                      "ratio_median": (a["median"] / b["median"] if a and b and b["median"] else None), "paper": paper})
        fa = f"{a['mean']:.2f}" if a else "-"
        fb = f"{b['mean']:.2f}" if b else "-"
        fr = f"{ratio:.2f}" if ratio is not None else "-"
        print(f"| {label} | {fa} | {fb} | {fr} | {paper or ''} |")
    with open(OUT / "r3l_vs_grpo_cost.json", "w") as f:
        json.dump({"headers": {args.a: ha, args.b: hb}, "steps": n, "table": table}, f, indent=1)
    print(f"wrote {OUT / 'r3l_vs_grpo_cost.json'}")


if __name__ == "__main__":
    main()
