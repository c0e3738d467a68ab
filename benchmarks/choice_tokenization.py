"""The main job with vLLM's choice grammar vs the tokenizer's own tokens (``choice_tokenization``).

    python benchmarks/choice_tokenization.py --pairs 4              # main jobs, alternating; resumable
    python benchmarks/choice_tokenization.py --table-only           # the table of what is saved

Each run is ``python -m rllib_r3l.main --out RESULTS/<variant>_<k>`` (the embedded default, 3
iterations, unseeded) with ``--set backend_options={choice_tokenization: <variant>}``, run one after
the other, variants alternating, so both see the same machine. A run whose ``summary.json`` exists
is kept; its checkpoint is deleted. The table sums over runs: iterations with an update, base successes (8 base episodes an
iteration) and retries that succeeded, each with a 95 % Wilson interval, split into the first
iteration (the untrained policy) and the later ones (after one or two updates), and the seconds
after set-up. Not a test: a benchmark (docs/benchmarks.md section 0 quotes it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
OUT = ROOT / "benchmarks" / "results" / "choice_tokenization"
VARIANTS = ("canonical", "any")

from benchmarks.default_setting import wilson  # noqa: E402  (95 % Wilson interval)


def run_one(out: Path, variant: str, verbose: bool) -> int:
    env = dict(os.environ, RAY_AUTH_MODE="disabled", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    cmd = [sys.executable, "-m", "rllib_r3l.main", "--out", str(out),
           "--set", f"backend_options={{choice_tokenization: {variant}}}"]
    with open(str(out) + ".console", "w") as f:
        return subprocess.call(cmd, cwd=ROOT, env=env, stdout=None if verbose else f, stderr=subprocess.STDOUT)


def iteration_counts(it: Dict[str, Any], base_per_iteration: int) -> Dict[str, float]:
    r = it.get("r3l", {})
    retries = float(r.get("num_retries", 0.0) or 0.0)
    ok = retries * float(r.get("retry_success_rate", 0.0) or 0.0) if retries else 0.0
    return {"update": float(it.get("credit", {}).get("trained_tokens", 0.0) or 0.0) > 0,
            "base_ok": round(float(it["success_rate"]) * base_per_iteration), "retries": retries,
            "retry_ok": round(ok)}


def summarize(out: Path, base_per_iteration: int = 8) -> List[Dict[str, Any]]:
    rows = []
    for variant in VARIANTS:
        runs = sorted(p for p in out.glob(f"{variant}_*") if (p / "summary.json").exists())
        if not runs:
            continue
        agg = {"variant": variant, "runs": len(runs), "seconds": [], "first": [], "later": []}
        for p in runs:
            s = json.loads((p / "summary.json").read_text())
            agg["seconds"].append(float(s["seconds_total"]))
            counts = [iteration_counts(it, base_per_iteration) for it in s["per_iteration"]]
            agg["first"] += counts[:1]
            agg["later"] += counts[1:]
        rows.append(agg)
    return rows


def table(rows: List[Dict[str, Any]], base_per_iteration: int = 8) -> str:
    f = lambda k, n: f"{k}/{n} ({wilson(k, n)[0]:.2f}-{wilson(k, n)[1]:.2f})"  # noqa: E731
    head = ("choices", "runs", "iterations with an update", "base ok, iteration 1", "base ok, iterations 2-3",
            "retries ok, iteration 1", "retries ok, iterations 2-3", "s after set-up")
    out = [head, tuple("---" for _ in head)]
    for r in rows:
        its = r["first"] + r["later"]
        n1, n2 = len(r["first"]), len(r["later"])
        out.append((r["variant"], str(r["runs"]), f(sum(c["update"] for c in its), len(its)),
                    f(sum(c["base_ok"] for c in r["first"]), n1 * base_per_iteration),
                    f(sum(c["base_ok"] for c in r["later"]), n2 * base_per_iteration),
                    f(int(sum(c["retry_ok"] for c in r["first"])), int(sum(c["retries"] for c in r["first"]))),
                    f(int(sum(c["retry_ok"] for c in r["later"])), int(sum(c["retries"] for c in r["later"]))),
                    " / ".join(f"{s:.0f}" for s in r["seconds"])))
    return "\n".join("| " + " | ".join(row) + " |" for row in out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3, help="main jobs per variant")
    ap.add_argument("--out", default=str(OUT / time.strftime("%Y-%m-%d")))
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        for k in range(1, args.pairs + 1):
            for variant in VARIANTS:
                d = out / f"{variant}_{k}"
                if (d / "summary.json").exists():
                    continue
                print(f"{time.strftime('%H:%M:%S')} {d.name} (load {os.getloadavg()[0]:.1f}) ...", flush=True)
                rc = run_one(d, variant, args.verbose)
                shutil.rmtree(d / "checkpoint", ignore_errors=True)  # 1.7 GB; summary, console, log and plot stay
                if rc != 0:
                    print(f"{d.name}: exit {rc}; see {d}.console", flush=True)
                    return rc
    from rllib_r3l.run_info import cpu_model

    print(f"\n{cpu_model()}, {os.cpu_count()} CPUs; main job defaults, 3 iterations, unseeded; {out}")
    print(table(summarize(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
