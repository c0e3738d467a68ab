"""The main job under several settings, runs alternating: what a newcomer would see with each.

    python benchmarks/main_job_ab.py --variant both='aux_items=[reflection_sft, retry_sft]' \\
        --variant retry_sft='aux_items=[retry_sft]' --pairs 4          # resumable
    python benchmarks/main_job_ab.py --variant ... --table-only          # the table of what is saved

Each run is ``python -m rllib_r3l.cli.main --out RESULTS/<variant>_<k> --set <overrides>`` (the embedded
default, 3 iterations, unseeded), one after the other with the variants alternating, so every
variant sees the same machine. A run whose ``summary.json`` exists is kept; its checkpoint is
deleted (1.7 GB). The table sums over runs: iterations with an update, base successes and retries
that succeeded, each with a 95 % Wilson interval, split into the first iteration (the untrained
policy) and the later ones (after one or two updates), trained tokens and the seconds after set-up.
Not a test: a benchmark (docs/benchmarks.md section 0 quotes it; its arithmetic is tested in
``tests/test_main_job_ab.py``).
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
from typing import Any, Dict, List, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
OUT = ROOT / "benchmarks" / "results" / "main_job_ab"

from benchmarks.default_setting import wilson  # noqa: E402  (95 % Wilson interval)


def parse_variant(spec: str) -> Tuple[str, List[str]]:
    """``name=key=value key=value`` -> (name, ["key=value", ...]); ``name=`` is the plain default."""
    name, sep, rest = spec.partition("=")
    if not sep or not name or not name.replace("_", "").replace("-", "").isalnum():
        raise SystemExit(f"--variant expects NAME=OVERRIDES (NAME of letters, digits, '_' or '-'; "
                         f"OVERRIDES 'key=value key=value' or empty), got {spec!r}")
    sets, depth, cur = [], 0, ""
    for ch in rest.strip():  # split on spaces outside brackets: aux_items=[a, b] stays one override
        depth += ch in "[{" and 1 or ch in "]}" and -1 or 0
        if ch == " " and depth == 0:
            if cur:
                sets.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        sets.append(cur)
    bad = [s for s in sets if "=" not in s]
    if bad or depth != 0:
        raise SystemExit(f"--variant {name}: overrides must be key=value with balanced brackets, got {rest!r}")
    return name, sets


def run_one(out: Path, sets: Sequence[str], verbose: bool) -> int:
    env = dict(os.environ, RAY_AUTH_MODE="disabled", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    cmd = [sys.executable, "-m", "rllib_r3l.cli.main", "--out", str(out)] + (["--set", *sets] if sets else [])
    with open(str(out) + ".console", "w") as f:
        return subprocess.call(cmd, cwd=ROOT, env=env, stdout=None if verbose else f, stderr=subprocess.STDOUT)


def iteration_counts(it: Dict[str, Any], base_per_iteration: int) -> Dict[str, float]:
    r = it.get("r3l", {})
    retries = float(r.get("num_retries", 0.0) or 0.0)
    ok = retries * float(r.get("retry_success_rate", 0.0) or 0.0) if retries else 0.0
    trained = float(it.get("credit", {}).get("trained_tokens", 0.0) or 0.0)
    base = it.get("episodes")  # the iteration's base episodes; older summaries: the planned number
    base = int(base) if isinstance(base, (int, float)) and base == base else base_per_iteration
    rounds = float(it.get("dynamic_sampling", {}).get("extra_rounds", 0.0) or 0.0)
    return {"update": trained > 0, "trained": trained, "base": base, "extra_rounds": rounds,
            "base_ok": round(float(it["success_rate"]) * base), "retries": retries, "retry_ok": round(ok)}


def summarize(out: Path, variants: Sequence[str], base_per_iteration: int = 8) -> List[Dict[str, Any]]:
    rows = []
    for variant in variants:
        runs = sorted(p for p in out.glob(f"{variant}_*") if (p / "summary.json").exists()
                      and p.name[len(variant) + 1:].isdigit())
        if not runs:
            continue
        agg = {"variant": variant, "runs": len(runs), "seconds": [], "first": [], "later": []}
        for p in runs:
            s = json.loads((p / "summary.json").read_text())
            agg["seconds"].append(float(s["seconds_total"]))
            base = int(s.get("base_episodes_per_iteration") or base_per_iteration)  # older summaries: 8
            counts = [iteration_counts(it, base) for it in s["per_iteration"]]
            agg["first"] += counts[:1]
            agg["later"] += counts[1:]
        rows.append(agg)
    return rows


def table(rows: List[Dict[str, Any]], label: str = "variant") -> str:
    f = lambda k, n: f"{k}/{n} ({wilson(k, n)[0]:.2f}-{wilson(k, n)[1]:.2f})"  # noqa: E731
    head = (label, "runs", "iterations with an update", "base ok, iteration 1", "base ok, iterations 2-3",
            "retries ok, iteration 1", "retries ok, iterations 2-3", "extra rounds / run", "trained tok / run",
            "s after set-up")
    out = [head, tuple("---" for _ in head)]
    for r in rows:
        its = r["first"] + r["later"]
        out.append((r["variant"], str(r["runs"]), f(sum(c["update"] for c in its), len(its)),
                    f(sum(c["base_ok"] for c in r["first"]), sum(c["base"] for c in r["first"])),
                    f(sum(c["base_ok"] for c in r["later"]), sum(c["base"] for c in r["later"])),
                    f(int(sum(c["retry_ok"] for c in r["first"])), int(sum(c["retries"] for c in r["first"]))),
                    f(int(sum(c["retry_ok"] for c in r["later"])), int(sum(c["retries"] for c in r["later"]))),
                    f"{sum(c.get('extra_rounds', 0) for c in its) / r['runs']:.1f}",
                    f"{sum(c['trained'] for c in its) / r['runs']:.0f}",
                    " / ".join(f"{s:.0f}" for s in r["seconds"])))
    return "\n".join("| " + " | ".join(row) + " |" for row in out)


def sweep(out: Path, variants: Dict[str, List[str]], pairs: int, verbose: bool = False) -> int:
    """``pairs`` main jobs per variant, alternating; resumes what ``out`` already holds."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "variants.json").write_text(json.dumps(variants, indent=1))
    for k in range(1, pairs + 1):
        for variant, sets in variants.items():
            d = out / f"{variant}_{k}"
            if (d / "summary.json").exists():
                continue
            print(f"{time.strftime('%H:%M:%S')} {d.name} (load {os.getloadavg()[0]:.1f}) ...", flush=True)
            rc = run_one(d, sets, verbose)
            shutil.rmtree(d / "checkpoint", ignore_errors=True)  # 1.7 GB; summary, console, log and plot stay
            if rc != 0:
                print(f"{d.name}: exit {rc}; see {d}.console", flush=True)
                return rc
    return 0


def main(argv=None, preset: Dict[str, List[str]] | None = None, results: Path = OUT, label: str = "variant",
         description: str = __doc__) -> int:
    """The command line; ``preset`` fixes the variants (``benchmarks/choice_tokenization.py``)."""
    ap = argparse.ArgumentParser(description=description.split("\n\n")[0])
    if preset is None:
        ap.add_argument("--variant", action="append", default=[], metavar="NAME='key=value ...'",
                        help="a setting to run (repeat; at least one); NAME= alone is the plain default")
    ap.add_argument("--pairs", type=int, default=3, help="main jobs per variant")
    ap.add_argument("--out", default=str(results / time.strftime("%Y-%m-%d")))
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    variants = dict(preset) if preset is not None else dict(parse_variant(v) for v in args.variant)
    if not variants and (out / "variants.json").exists():
        variants = json.loads((out / "variants.json").read_text())
    if not variants:
        raise SystemExit("--variant: name at least one setting (e.g. --variant default=), or point --out at a "
                         "folder that holds variants.json")
    if not args.table_only and (rc := sweep(out, variants, args.pairs, args.verbose)) != 0:
        return rc
    from rllib_r3l.cli.run_info import cpu_model

    print(f"\n{cpu_model()}, {os.cpu_count()} CPUs; main job, 3 iterations, unseeded; {out}")
    for name, sets in variants.items():
        print(f"  {name}: {' '.join(sets) or '(the default)'}")
    print(table(summarize(out, list(variants)), label=label))
    return 0


if __name__ == "__main__":
    sys.exit(main())
