"""Learning at small scale: R3L vs GRPO (and ablations) success-rate curves on CPU (issue 7, item 4).

    python benchmarks/learning_curves.py --variants r3l,grpo --iterations 12       # launches both, concurrently
    python benchmarks/learning_curves.py --plot-only                                 # table + PNG from what is there

Every variant trains ``R3LConfig`` on the same environment, model, seed (same training task seeds),
group size, task budget and learning rate; only the R3L switches differ. Each variant runs in its own
process (its own Ray instance and in-process vLLM engine); all run *concurrently* so they see the
same machine load. After every iteration a JSON line is appended to
``benchmarks/results/learning_curves/<variant>.jsonl`` (per-step cost metrics, CPU time / wall, load
average), so partial results are usable if the run is cut short. Every ``--eval-every`` iterations
(and at iteration 0) the current policy plays ``--eval-episodes`` held-out games of the TWX *test*
fold (seeds 0..E-1, disjoint from the training fold) at the evaluation temperature, with the
runner's own engine (no reflection, no retry).

Not a test: a benchmark script. The sample budget is what the run prints, stated in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import numbers
import os
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
OUT = ROOT / "benchmarks" / "results" / "learning_curves"

# variant -> R3L switches (everything else identical)
VARIANTS = {
    "r3l": dict(reflect=True, pivotal_credit=True, positive_amplification=True, std_normalize=False),
    "grpo": dict(reflect=False, pivotal_credit=False, positive_amplification=False, std_normalize=True),
    "r3l_no_pivot": dict(reflect=True, pivotal_credit=False, positive_amplification=True, std_normalize=False),
    "r3l_no_amp": dict(reflect=True, pivotal_credit=True, positive_amplification=False, std_normalize=False),
    "reflect_only": dict(reflect=True, pivotal_credit=False, positive_amplification=False, std_normalize=True),
}


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(_flatten(v, key))
        elif isinstance(v, bool):
            continue
        elif isinstance(v, numbers.Real) or (hasattr(v, "item") and getattr(v, "ndim", None) == 0):
            out[key] = float(v)  # learner metrics arrive as numpy / 0-d torch scalars
    return out


KEEP = ("env_runners/r3l/", "env_runners/success_rate", "env_runners/episode_return_mean", "env_runners/episode_len_mean",
        "env_runners/num_episodes", "learners/default_policy/r3l/learner/", "r3l/", "timers/", "time_this_iter_s")


def evaluate_policy(algo, args) -> dict:
    """Held-out games (TWX test fold) with the local runner's engine at the evaluation temperature."""
    import environments
    from rllib_r3l.rollout import EpisodeRunner, EpisodeSpec, RolloutOptions

    runner = algo.env_runner  # local runner (num_env_runners=0): holds the synced engine
    c = algo.config
    env_config = dict(c.env_config, split="test")
    opts = RolloutOptions(max_turns=c.max_turns, max_response_tokens=c.max_response_tokens,
                          max_context_tokens=c.max_context_tokens, temperature=c.evaluation_temperature,
                          top_p=c.top_p, action_decoding=c.action_decoding, system_prompt=c.system_prompt)
    er = EpisodeRunner(runner.backend, runner._chat, lambda: environments.make(c.env, env_config), opts, Counter())
    t0 = time.perf_counter()
    try:
        trajs = er.run([EpisodeSpec(seed=s, group_id=f"eval-{s}") for s in range(args.eval_episodes)])
    finally:
        er.close()
    ok = [t for t in trajs if t is not None]
    return {"eval_success_rate": sum(bool(t.success) for t in ok) / max(len(ok), 1),
            "eval_return_mean": sum(float(t.reward) for t in ok) / max(len(ok), 1),
            "eval_episodes": len(ok), "eval_seconds": round(time.perf_counter() - t0, 1)}


def run_variant(args) -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import ray

    import rllib_r3l  # noqa: F401
    from rllib_r3l import R3LConfig

    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{args.variant}.jsonl"
    cfg = (R3LConfig()
           .environment("r3l/CoinCollector", env_config={"num_locations": args.num_locations, "max_turns": args.max_turns})
           .training(group_size=args.group_size, tasks_per_iteration=args.tasks, lr=args.lr,
                     micro_batch_size=args.micro_batch_size, micro_batch_tokens=args.micro_batch_tokens, backend="vllm",
                     **VARIANTS[args.variant])
           .debugging(seed=args.seed))
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    t_build = time.perf_counter()
    algo = cfg.build_algo()
    header = {"variant": args.variant, "switches": VARIANTS[args.variant], "num_locations": args.num_locations,
              "max_turns": args.max_turns, "group_size": args.group_size, "tasks_per_iteration": args.tasks,
              "lr": args.lr, "seed": args.seed, "eval_episodes": args.eval_episodes,
              "eval_temperature": cfg.evaluation_temperature, "build_seconds": round(time.perf_counter() - t_build, 1),
              "cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    with open(path, "w") as f:
        f.write(json.dumps({"header": header}) + "\n")
    samples = 0
    for it in range(0, args.iterations + 1):
        rec = {"iteration": it}
        if it > 0:
            w0, c0 = time.perf_counter(), time.process_time()
            res = algo.train()
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            flat = _flatten(res)
            rec.update({k: v for k, v in flat.items() if k.startswith(KEEP)})
            er_samples = flat.get("env_runners/r3l/num_retries", 0.0) + flat.get("env_runners/num_episodes", 0.0)
            samples += er_samples
            rec.update({"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "cpu_over_wall": round(cpu / wall, 3)})
        rec["samples_cumulative"] = samples  # base + retry trajectories generated so far
        rec["loadavg_1m"] = os.getloadavg()[0]
        if args.eval_episodes > 0 and (it % args.eval_every == 0 or it == args.iterations):
            rec.update(evaluate_policy(algo, args))
        rec["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"[{args.variant}] iter {it}: train success {rec.get('env_runners/success_rate', float('nan')):.3f} "
              f"eval {rec.get('eval_success_rate', float('nan')):.3f} wall {rec.get('wall_s', 0)} s "
              f"cpu/wall {rec.get('cpu_over_wall', float('nan'))} load {rec['loadavg_1m']:.1f}", flush=True)
    algo.stop()
    ray.shutdown()


def load(variant):
    p = OUT / f"{variant}.jsonl"
    if not p.exists():
        return None, []
    lines = [json.loads(l) for l in p.read_text().splitlines() if l.strip()]
    return lines[0].get("header"), [l for l in lines[1:] if "iteration" in l]


def plot_and_table(variants) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    rows = []
    for v in variants:
        header, recs = load(v)
        if not recs:
            continue
        tr = [r for r in recs if r["iteration"] > 0 and "env_runners/success_rate" in r]
        ev = [r for r in recs if "eval_success_rate" in r]
        if tr:
            axes[0].plot([r["samples_cumulative"] for r in tr], [r["env_runners/success_rate"] for r in tr], "o-", label=v)
        if ev:
            axes[1].plot([r["samples_cumulative"] for r in ev], [r["eval_success_rate"] for r in ev], "o-", label=v)
        for r in recs:
            rows.append({"variant": v, "iteration": r["iteration"], "samples": r["samples_cumulative"],
                         "train_success": r.get("env_runners/success_rate"), "eval_success": r.get("eval_success_rate"),
                         "wall_s": r.get("wall_s"), "cpu_over_wall": r.get("cpu_over_wall"), "load": r["loadavg_1m"]})
    axes[0].set_title("base-rollout success (training tasks)")
    axes[1].set_title("held-out success (TWX test fold, T=0.4)")
    for ax in axes:
        ax.set_xlabel("trajectories generated (base + retry)")
        ax.set_ylabel("success rate")
        ax.set_ylim(-0.02, 1.0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "learning_curves.png", dpi=110)
    import csv

    if rows:
        with open(OUT / "learning_curves.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    print("| variant | iter | samples | train success | eval success | wall s | cpu/wall | load |")
    print("|---|---|---|---|---|---|---|---|")
    fmt = lambda x: "" if x is None else (f"{x:.3f}" if isinstance(x, float) else str(x))  # noqa: E731
    for r in rows:
        print("| " + " | ".join(fmt(r[k]) for k in r) + " |")
    print(f"\nwrote {OUT / 'learning_curves.png'} and {OUT / 'learning_curves.csv'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="r3l,grpo", help=f"comma list of {list(VARIANTS)}")
    ap.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--num-locations", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=10)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=2, help="task groups per iteration")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--micro-batch-tokens", type=int, default=2048,
                    help="learner token budget per forward/backward (bounds memory: variants run concurrently)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--eval-episodes", type=int, default=24)
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if args.variant:
        run_variant(args)
        return
    if not args.plot_only:
        OUT.mkdir(parents=True, exist_ok=True)
        procs = []
        for v in variants:
            cmd = [sys.executable, __file__, "--variant", v, "--iterations", str(args.iterations),
                   "--num-locations", str(args.num_locations), "--max-turns", str(args.max_turns),
                   "--group-size", str(args.group_size), "--tasks", str(args.tasks), "--lr", str(args.lr),
                   "--micro-batch-size", str(args.micro_batch_size),
                   "--micro-batch-tokens", str(args.micro_batch_tokens), "--seed", str(args.seed),
                   "--eval-every", str(args.eval_every), "--eval-episodes", str(args.eval_episodes)]
            log = open(OUT / f"{v}.log", "w")
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT)))
        for p in procs:
            p.wait()
    plot_and_table(variants)


if __name__ == "__main__":
    main()
