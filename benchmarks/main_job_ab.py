"""The main job under several settings, runs alternating: what a newcomer would see with each.

    python benchmarks/main_job_ab.py --variant both='aux_items=[reflection_sft, retry_sft]' \\
        --variant retry_sft='aux_items=[retry_sft]' --pairs 4          # resumable
    python benchmarks/main_job_ab.py --preset reflect_on --pairs 3       # a named comparison
    python benchmarks/main_job_ab.py --out FOLDER --table-only           # the table of what is saved

Each run is ``python -m rllib_r3l.cli.main --out OUT/<variant>_<k> --set <overrides>`` (the main job:
3 iterations, unseeded), one after the other with the variants alternating, so every variant sees
the same machine (``benchmarks/harness.py``: a run whose ``summary.json`` exists is kept; its
checkpoint is deleted). ``--preset`` names a comparison the docs report (``PRESETS``).

The table, per variant: iterations with an update, base successes and retries that succeeded, each
as a count pooled over the runs with its Wilson interval (a description, not evidence for a
difference: a run's episodes share one policy), split into the first iteration (the untrained
policy) and the later ones (after one or two updates); extra rounds of tasks (dynamic sampling) and
trained tokens per run; seconds after set-up; each run's base success in iterations 2-3; and,
against the first variant, the paired difference of that success, run k against run k (the
alternating runs beside each other), with its 95 % t interval over the pairs. Not a test: a
benchmark (docs/benchmarks.md quotes it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402

OUT = harness.RESULTS / "main_job_ab"
parse_variant = harness.parse_variant  # the --variant syntax

# The comparisons docs/benchmarks.md reports, each named by the setting it decides. Variants spell
# their values out, so a preset still compares the same two things after a default changes.
PRESETS: Dict[str, Dict[str, List[str]]] = {
    # actions in the tokenizer's own tokens, or any spelling vLLM's character grammar admits
    "choice_tokenization": {v: [f"backend_options={{choice_tokenization: {v}}}"] for v in ("canonical", "any")},
    # reflect on every base episode (the authors' code) or on the failed ones (the paper's text)
    "reflect_on": {"all": ["reflect_on=all"], "failures": ["reflect_on=failures"]},
    # resample tasks while no task of an iteration has a learning signal (the main job: 2 rounds)
    "dynamic_sampling": {"ds0": ["dynamic_sampling_rounds=0"], "ds2": ["dynamic_sampling_rounds=2"]},
    # the paper's two auxiliary items, or the guided-retry item alone
    "aux_items": {"both": ["aux_items=[reflection_sft, retry_sft]"], "retry_sft": ["aux_items=[retry_sft]"]},
    # episodes in lock-step waves, or each episode its own loop (issue 47 item 1: the default stays waves)
    "rollout_loop": {v: [f"rollout_loop={v}"] for v in ("waves", "episodes")},
}


def iteration_counts(it: Dict[str, Any], base_per_iteration: int) -> Dict[str, float]:
    r = it.get("r3l", {})
    retries = float(r.get("num_retries", 0.0) or 0.0)
    ok = retries * float(r.get("retry_success_rate", 0.0) or 0.0) if retries else 0.0
    trained = float(it.get("credit", {}).get("trained_tokens", 0.0) or 0.0)
    base = it.get("episodes")  # the iteration's base episodes; older summaries: the planned number
    base = int(base) if isinstance(base, (int, float)) and base == base else base_per_iteration
    rounds = float(it.get("dynamic_sampling", {}).get("extra_rounds", 0.0) or 0.0)
    return {
        "update": trained > 0,
        "trained": trained,
        "base": base,
        "extra_rounds": rounds,
        "base_ok": round(float(it["success_rate"]) * base),
        "retries": retries,
        "retry_ok": round(ok),
    }


def summarize(out: Path, variants: Sequence[str], base_per_iteration: int = 8) -> List[Dict[str, Any]]:
    """Per variant with finished runs: the runs' seconds, their iterations' counts (first, later)
    and each run's base success in the later iterations (``later_success``: run number -> rate)."""
    rows = []
    for variant in variants:
        runs = sorted(
            (int(p.name[len(variant) + 1 :]), p)
            for p in out.glob(f"{variant}_*")
            if p.name[len(variant) + 1 :].isdigit() and (p / "summary.json").exists()
        )
        if not runs:
            continue
        agg = {"variant": variant, "runs": len(runs), "seconds": [], "first": [], "later": [], "later_success": {}}
        for k, p in runs:
            s = json.loads((p / "summary.json").read_text())
            agg["seconds"].append(float(s["seconds_total"]))
            base = int(s.get("base_episodes_per_iteration") or base_per_iteration)  # older summaries: 8
            counts = [iteration_counts(it, base) for it in s["per_iteration"]]
            agg["first"] += counts[:1]
            agg["later"] += counts[1:]
            n_later = sum(c["base"] for c in counts[1:])
            agg["later_success"][k] = sum(c["base_ok"] for c in counts[1:]) / n_later if n_later else float("nan")
        rows.append(agg)
    return rows


def table(rows: List[Dict[str, Any]], label: str = "variant") -> str:
    f = lambda k, n: f"{k}/{n} ({harness.wilson(k, n)[0]:.2f}-{harness.wilson(k, n)[1]:.2f})"  # noqa: E731
    ref = rows[0] if rows else None
    head = (
        label,
        "runs",
        "iterations with an update",
        "base ok, iteration 1",
        "base ok, iterations 2-3",
        "retries ok, iteration 1",
        "retries ok, iterations 2-3",
        "extra rounds / run",
        "trained tok / run",
        "s after set-up",
        "base success 2-3, per run",
        f"vs {ref['variant'] if ref else '-'}: paired diff 2-3 [95 % t]",
    )
    out = []
    for r in rows:
        its = r["first"] + r["later"]
        per_run = r.get("later_success", {})
        vs = (
            "-"
            if r is ref
            else harness.fmt_interval(harness.paired_difference(per_run, ref.get("later_success", {})), signed=True)
        )
        out.append(
            (
                r["variant"],
                str(r["runs"]),
                f(sum(c["update"] for c in its), len(its)),
                f(sum(c["base_ok"] for c in r["first"]), sum(c["base"] for c in r["first"])),
                f(sum(c["base_ok"] for c in r["later"]), sum(c["base"] for c in r["later"])),
                f(int(sum(c["retry_ok"] for c in r["first"])), int(sum(c["retries"] for c in r["first"]))),
                f(int(sum(c["retry_ok"] for c in r["later"])), int(sum(c["retries"] for c in r["later"]))),
                f"{sum(c.get('extra_rounds', 0) for c in its) / r['runs']:.1f}",
                f"{sum(c['trained'] for c in its) / r['runs']:.0f}",
                " / ".join(f"{s:.0f}" for s in r["seconds"]),
                ", ".join(f"{x:.2f}" for _, x in sorted(per_run.items())) or "-",
                vs,
            )
        )
    return harness.markdown_table(head, out)


def sweep(out: Path, variants: Dict[str, List[str]], pairs: int, verbose: bool = False) -> int:
    """``pairs`` main jobs per variant, alternating; resumes what ``out`` already holds."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "variants.json").write_text(json.dumps(variants, indent=1))
    return harness.sweep(
        harness.alternating(variants, pairs, out), verbose=verbose, log=lambda line: print(line, flush=True)
    )


def main(
    argv: Optional[List[str]] = None,
    results: Path = OUT,
    label: str = "variant",
    description: str = __doc__,
    preset_in_folder: bool = True,
) -> int:
    """The command line; ``--out`` defaults to ``results/<date>``, plus ``-<preset>`` with a preset
    when ``preset_in_folder``."""
    ap = argparse.ArgumentParser(description=description.split("\n\n")[0])
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME='key=value ...'",
        help="a setting to run (repeat; at least one); NAME= alone is the plain default",
    )
    ap.add_argument("--preset", choices=sorted(PRESETS), help="a named comparison instead of --variant")
    ap.add_argument("--pairs", type=int, default=3, help="main jobs per variant")
    ap.add_argument("--out", default=None, help=f"results folder (default {results}/<date>[-<preset>])")
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.preset and args.variant:
        raise SystemExit("--preset and --variant: name the settings one way")
    suffix = f"-{args.preset}" if args.preset and preset_in_folder else ""
    out = Path(args.out or results / (time.strftime("%Y-%m-%d") + suffix))
    variants = dict(PRESETS[args.preset]) if args.preset else dict(parse_variant(v) for v in args.variant)
    if not variants and (out / "variants.json").exists():
        variants = json.loads((out / "variants.json").read_text())
    if not variants:
        raise SystemExit(
            "--variant: name at least one setting (e.g. --variant default=), or --preset, or point "
            "--out at a folder that holds variants.json"
        )
    if not args.table_only and (rc := sweep(out, variants, args.pairs, args.verbose)) != 0:
        return rc
    print(f"\n{harness.machine()}; main job, 3 iterations, unseeded; {out}")
    for name, sets in variants.items():
        print(f"  {name}: {' '.join(sets) or '(the default)'}")
    print(table(summarize(out, list(variants)), label=label))
    return 0


if __name__ == "__main__":
    sys.exit(main())
