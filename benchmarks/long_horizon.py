"""Does R3L overtake GRPO after a warm-up? A long-horizon probe (issue 39, item 5).

    .venv/bin/python benchmarks/long_horizon.py                       # grpo_paper and r3l_paper, seed 0, 40 iterations
    .venv/bin/python benchmarks/long_horizon.py --seeds 0,1 --parallel 2
    .venv/bin/python benchmarks/long_horizon.py --iterations 60      # extends finished runs from their checkpoints
    .venv/bin/python benchmarks/long_horizon.py --report-only         # table and plot from what is there

The paper reports a cold start for small models: R3L trails GRPO early and overtakes it only after a
warm-up (~120 steps at 1.5B), on tasks where base success stays low. The learning-curve sweep
(``learning_curves.py``) stops every run at a budget of 64 trajectories, a handful of updates on a
task GRPO learns in four; it cannot see a warm-up. This probe trains the paper's GRPO
(``grpo_paper``) and R3L in the paper's mode (``r3l_paper``) for a fixed number of iterations on a
harder task, and measures held-out success along the way.

**Setting.** ``learning_curves.DEFAULT_SETTING`` (model, backend, numerics, group, tasks, lr) on coin
collector with 8 rooms and 25 turns (``num_locations``, ``max_turns``; TWX allows up to 11 rooms),
where the untrained policy rarely finds the coin. The variants are ``learning_curves.VARIANTS``, each
on top of ``R3LConfig()``'s defaults, and ``setting.json`` records and checks them as that sweep does.

**Stopping rule: iterations, not trajectories.** A GRPO iteration spends group x tasks trajectories,
an R3L one half that in base rollouts plus its retries; every record keeps the cumulative
trajectories, so the budgets stay visible and the plot shows success against both. ``--iterations``
is a target, not part of the setting: a finished run keeps its checkpoint, and a larger target
extends it.

**Held-out curve.** ``eval_episodes`` games of the test fold (``learning_curves.evaluate_heldout``,
``EVAL_BATCH`` at a time) every ``eval_every`` iterations and at a run's last, written into that
iteration's record; iteration 0 is the untrained model, evaluated once per seed (``base/seed<k>``)
and shared by both variants.

**Resumable** as ``learning_curves.py`` is, with its functions: ``<out>/<variant>/seed<k>/`` holds
``curve.jsonl`` (a header, then a record per iteration) and ``checkpoint/`` (git-ignored; saved,
recorded, then swapped in after every iteration); a killed run resumes from its checkpoint, and an
evaluation that was due at the checkpointed iteration but not recorded is run first. ``running.pid``
keeps a second sweep off a run; a changed setting is refused. The script writes files and never
commits them. The report (``--report-only``, and after every sweep) is pure: ``summary.md`` and
``long_horizon.png`` in the folder, tested on hand-made curves in ``benchmarks/tests/test_long_horizon.py``.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402
from benchmarks import learning_curves as lc  # noqa: E402
from benchmarks.learning_curves_report import (
    BASE,
    ORDER,
    folder_variants,
    pairs_for,
    ratio_text,  # noqa: E402
    read_curve,
    read_setting,
    run_dir,
)

OUT = harness.RESULTS / "long_horizon"
VARIANTS = ("grpo_paper", "r3l_paper")  # the default pair (learning_curves_report.PAIRS)
ITERATIONS, EVAL_EVERY, EVAL_EPISODES = 40, 5, 32
# Held-out games run 16 at a time: 32 untrained 25-turn games at once outgrew the CPU engine's 1 GiB
# KV cache (over 450 s, killed), two rounds of 16 took 147 s (2026-12-05, Xeon, 2 cores).
EVAL_BATCH = 16
EVAL_KEYS = (
    "eval_successes",
    "eval_episodes",
    "eval_lost",
    "eval_return_mean",
    "eval_temperature",
    "eval_seconds",
    "eval_cpu_s",
    "eval_games",  # every held-out game (learning_curves.evaluate_heldout)
)


def setting_for(eval_every: int = EVAL_EVERY, eval_episodes: int = EVAL_EPISODES) -> Dict[str, Any]:
    """``learning_curves.DEFAULT_SETTING`` on 8-room, 25-turn coin collector, with the evaluation
    schedule instead of a trajectory budget."""
    base = {k: v for k, v in lc.DEFAULT_SETTING.items() if k not in ("budget", "max_iterations")}
    return dict(
        base,
        env_config={**lc.DEFAULT_SETTING["env_config"], "num_locations": 8, "max_turns": 25},
        eval_every=eval_every,
        eval_episodes=eval_episodes,
        eval_batch=EVAL_BATCH,
    )


# ---------------------------------------------------------------------------------------------------
# which runs (pure)
def target_of(variant: str, iterations: int) -> int:
    return 0 if variant == BASE else iterations


def is_done(d: Path, iterations: int) -> bool:
    """The run in ``d`` reached ``iterations`` (the untrained ``base``: 0) and its last record holds
    its held-out evaluation."""
    _, recs = read_curve(d)
    return bool(recs) and recs[-1]["iteration"] >= target_of(d.parent.name, iterations) and "eval_successes" in recs[-1]


def next_runs(out: Path, variants: Sequence[str], seeds: Sequence[int], iterations: int) -> List[Tuple[str, int]]:
    """The runs not done: those already started first (they resume), then seed by seed the shared
    iteration 0 (``base``) and the variants."""
    runs = [
        (v, s) for s in seeds for v in dict.fromkeys([BASE, *variants]) if not is_done(run_dir(out, v, s), iterations)
    ]
    return sorted(runs, key=lambda r: not (run_dir(out, *r) / "curve.jsonl").exists())


def line_of(variant: str, seed: int, rec: Dict[str, Any], iterations: int) -> str:
    """One console line for an iteration's record: trajectories, training success, held-out."""
    held = f"held-out {rec['eval_successes']}/{rec['eval_episodes']}" if "eval_successes" in rec else ""
    if rec["iteration"] == 0:
        return f"{variant}/seed{seed} iteration 0 (untrained): {held}"
    return (
        f"{variant}/seed{seed} iteration {rec['iteration']}/{iterations}: {rec['samples_cumulative']:.0f} "
        f"trajectories, success {lc._fmt(rec.get('success_rate'))}, {rec.get('wall_s', 0):.0f} s {held}"
    ).rstrip()


def progress_lines(
    out: Path, runs: Sequence[Tuple[str, int]], seen: Dict[Tuple[str, int], int], every: int, iterations: int
) -> List[str]:
    """Lines for the records of ``runs`` past ``seen`` (updated) that are complete: evaluated, or not
    due for an evaluation."""
    lines = []
    for v, s in runs:
        _, recs = read_curve(run_dir(out, v, s))
        for r in recs:
            i = r["iteration"]
            if i <= seen.get((v, s), -1):
                continue
            if "eval_successes" not in r and (i % every == 0 or i == target_of(v, iterations)):
                break  # its evaluation is still running
            seen[(v, s)] = i
            lines.append(line_of(v, s, r, iterations))
    return lines


# ---------------------------------------------------------------------------------------------------
# one run (a child process)
def run_one(out: Path, setting: Dict[str, Any], variant: str, seed: int, iterations: int) -> List[dict]:
    """Train ``variant`` at ``seed`` to ``iterations`` (``base``: evaluate the untrained model),
    resuming from its checkpoint; held-out every ``eval_every`` iterations and at the last; returns
    the curve's records. ``running.pid`` holds the run while it runs."""
    d = run_dir(out, variant, seed)
    if is_done(d, iterations):
        return read_curve(d)[1]
    target = target_of(variant, iterations)
    with lc.holding(d), lc.opened_run(d, out, setting, variant, seed) as (algo, header, recs):
        if variant == BASE:
            recs.append({"iteration": 0, "samples_cumulative": 0.0})
            _evaluate(d, algo, header, recs, setting, variant, seed)
            return recs
        if recs and "eval_successes" not in recs[-1] and recs[-1]["iteration"] % setting["eval_every"] == 0:
            _evaluate(d, algo, header, recs, setting, variant, seed)  # due at the checkpoint, cut before recorded
        while algo.iteration < target:
            rec = lc.train_iteration(d, algo, header, recs)
            n = rec["samples_cumulative"] - (recs[-2]["samples_cumulative"] if len(recs) > 1 else 0.0)
            print(
                lc.iteration_line(
                    variant, seed, rec, f"(of {target}) trajectories {rec['samples_cumulative']:.0f} (+{n:.0f})"
                ),
                flush=True,
            )
            if algo.iteration % setting["eval_every"] == 0:
                _evaluate(d, algo, header, recs, setting, variant, seed)
        if recs and "eval_successes" not in recs[-1]:
            _evaluate(d, algo, header, recs, setting, variant, seed)  # a run's last iteration
        return recs


def _evaluate(
    d: Path, algo, header: Dict[str, Any], recs: List[dict], setting: Dict[str, Any], variant: str, seed: int
) -> None:
    """The held-out evaluation of the last record's policy, written into that record."""
    rec = recs[-1]
    rec.update(lc.evaluate_heldout(algo, setting["eval_episodes"], setting.get("eval_batch")))
    lc._write_curve(d, header, recs)
    print(
        f"[{variant} seed {seed}] iteration {rec['iteration']}: held-out {rec['eval_successes']}/"
        f"{rec['eval_episodes']} ({rec['eval_seconds']:.0f} s, cpu {rec['eval_cpu_s']:.0f})",
        flush=True,
    )


# ---------------------------------------------------------------------------------------------------
def sweep(
    out: Path, setting: Dict[str, Any], variants: Sequence[str], seeds: Sequence[int], parallel: int, iterations: int
) -> None:
    """Run what is left (``next_runs``), ``parallel`` children at a time (``learning_curves.run_children``),
    a console line per iteration as its record is complete."""
    todo = next_runs(out, variants, seeds, iterations)
    print(f"{len(todo)} run(s) to do in {out}: {', '.join(f'{v}/seed{s}' for v, s in todo)}", flush=True)
    seen: Dict[Tuple[str, int], int] = {}
    progress_lines(out, todo, seen, setting["eval_every"], iterations)  # what is on file already

    def poll() -> None:
        for line in progress_lines(out, todo, seen, setting["eval_every"], iterations):
            print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)

    def finished(v: str, s: int, took: Optional[float]) -> None:
        poll()
        print(f"{time.strftime('%H:%M:%S')} {v}/seed{s} done" + (f" in {took:.1f} min" if took else ""), flush=True)

    lc.run_children(
        out,
        todo,
        parallel,
        setting["num_threads"],
        finished,
        script=__file__,
        child_args=("--iterations", str(iterations)),
        done=lambda d: is_done(d, iterations),
        poll=poll,
    )


# ---------------------------------------------------------------------------------------------------
# the report (pure: reads the run folders, writes summary.md and long_horizon.png)
def curve_points(out: Path, variant: str, seed: int) -> List[Dict[str, Any]]:
    """A run's held-out points (iteration, cumulative trajectories, k of n, success), iteration 0
    from the seed's untrained model (``base``)."""
    recs = [r for r in read_curve(run_dir(out, BASE, seed))[1] if r["iteration"] == 0] if variant != BASE else []
    recs += read_curve(run_dir(out, variant, seed))[1]
    return [
        {
            "iteration": r["iteration"],
            "samples": float(r.get("samples_cumulative") or 0.0),
            "k": int(r["eval_successes"]),
            "n": int(r["eval_episodes"]),
            "success": r["eval_successes"] / max(r["eval_episodes"], 1),
        }
        for r in recs
        if "eval_successes" in r
    ]


def run_summary(out: Path, variant: str, seed: int) -> Optional[Dict[str, Any]]:
    """A run's iterations, trajectories, updates, CPU seconds (training; held-out apart), reflection
    tokens and held-out points; None before it recorded anything."""
    _, recs = read_curve(run_dir(out, variant, seed))
    if not recs:
        return None
    trained = [r for r in recs if r["iteration"] > 0]
    its = trained[-1]["iteration"] if trained else 0
    samples = trained[-1]["samples_cumulative"] if trained else 0.0
    return {
        "variant": variant,
        "seed": seed,
        "iterations": its,
        "samples": samples,
        "samples_per_iteration": samples / its if its else math.nan,
        "updates": sum(1 for r in trained if (r.get("trained_tokens") or 0) > 0),
        "cpu_s": sum(r.get("cpu_s") or 0.0 for r in trained),
        "eval_cpu_s": sum(r.get("eval_cpu_s") or 0.0 for r in recs),
        "reflection_tokens": sum(r.get("reflection_generated_tokens") or 0.0 for r in trained),
        "points": curve_points(out, variant, seed),
    }


def summaries(out: Path, variants: Sequence[str], seeds: Sequence[int]) -> List[Dict[str, Any]]:
    return [r for v in variants for s in seeds if (r := run_summary(out, v, s)) is not None]


def held_out_table(rows: Sequence[Dict[str, Any]]) -> str:
    """Per run: held-out k/n at every evaluated iteration (columns: all runs' eval points), trajectories,
    updates, CPU seconds, reflection tokens."""
    its = sorted({p["iteration"] for r in rows for p in r["points"]})
    body = []
    for r in rows:
        at = {p["iteration"]: f"{p['k']}/{p['n']}" for p in r["points"]}
        body.append(
            [
                r["variant"],
                r["seed"],
                r["iterations"],
                *[at.get(i, "-") for i in its],
                f"{r['samples']:.0f}",
                "-" if math.isnan(r["samples_per_iteration"]) else f"{r['samples_per_iteration']:.1f}",
                r["updates"],
                f"{r['cpu_s']:.0f}",
                f"{r['eval_cpu_s']:.0f}",
                f"{r['reflection_tokens']:.0f}",
            ]
        )
    return harness.markdown_table(
        [
            "variant",
            "seed",
            "iterations",
            *[f"held-out @{i}" for i in its],
            "trajectories",
            "per iteration",
            "updates",
            "CPU s (training)",
            "CPU s (held-out)",
            "reflection tokens",
        ],
        body,
    )


def paired_at_last_common(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per pair (``pairs_for``: R3L against its GRPO) over the seeds both ran: the last trained
    iteration every one of those runs evaluated, and the paired difference and ratio there."""
    by = {(r["variant"], r["seed"]): {p["iteration"]: p["success"] for p in r["points"]} for r in rows}
    out = []
    for v, ref in pairs_for(sorted({r["variant"] for r in rows})).items():
        seeds = sorted(s for (x, s) in by if x == v and (ref, s) in by)
        evaluated = [{i for i in by[(x, s)] if i > 0} for s in seeds for x in (v, ref)]
        common = set.intersection(*evaluated) if evaluated else set()
        if not common:
            continue
        at = max(common)
        a, b = {s: by[(v, s)][at] for s in seeds}, {s: by[(ref, s)][at] for s in seeds}
        out.append(
            {
                "variant": v,
                "reference": ref,
                "iteration": at,
                "seeds": seeds,
                "a": a,
                "b": b,
                "diff": harness.paired_difference(a, b),
                "ratio": harness.paired_ratio(a, b),
            }
        )
    return out


def paired_table(pairs: Sequence[Dict[str, Any]]) -> str:
    body = []
    for p in pairs:
        each, _, geo = ratio_text(p["ratio"])
        body.append(
            [
                p["variant"],
                p["reference"],
                p["iteration"],
                ", ".join(map(str, p["seeds"])),
                ", ".join(f"{p['a'][s] - p['b'][s]:+.3f}" for s in p["seeds"]),
                harness.fmt_interval(p["diff"], 3, signed=True),
                each,
                geo,
            ]
        )
    return harness.markdown_table(
        [
            "variant",
            "against",
            "at iteration",
            "seeds",
            "differences per seed",
            "difference: mean [95 % t]",
            "ratios per seed",
            "geometric mean ratio [95 % t on the log ratio]",
        ],
        body,
    )


def plot(out: Path, rows: Sequence[Dict[str, Any]]) -> Path:
    """``long_horizon.png``: held-out success against iteration and against cumulative trajectories,
    a line per run (colour: variant, line style: seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    names = list(dict.fromkeys([*ORDER, *sorted({r["variant"] for r in rows})]))
    styles = ("-", "--", ":", "-.")
    for r in rows:
        pts = r["points"]
        if not pts:
            continue
        kw = dict(
            color=f"C{names.index(r['variant']) % 10}",
            linestyle=styles[r["seed"] % len(styles)],
            marker="o",
            markersize=3,
            label=f"{r['variant']} seed {r['seed']}",
        )
        axes[0].plot([p["iteration"] for p in pts], [p["success"] for p in pts], **kw)
        axes[1].plot([p["samples"] for p in pts], [p["success"] for p in pts], **kw)
    axes[0].set_xlabel("training iteration")
    axes[1].set_xlabel("trajectories generated (base + retry, cumulative)")
    axes[0].set_ylabel("held-out success")
    for ax in axes:
        ax.set_ylim(-0.02, 1.0)
        ax.grid(alpha=0.3)
    if axes[0].lines:
        axes[0].legend(fontsize=8)
    fig.suptitle("held-out success (test fold, no reflection); iteration 0: the untrained model")
    fig.tight_layout()
    path = Path(out) / "long_horizon.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(out: Path, variants: Sequence[str], seeds: Sequence[int]) -> str:
    """The Markdown summary (also ``summary.md``) and ``long_horizon.png`` of what ``out`` holds."""
    c = read_setting(out)["common"]
    rows = summaries(out, variants, seeds)
    pairs = paired_at_last_common(rows)
    lines = [
        f"Setting (setting.json, with each variant's options): model {c.get('model') or 'the default'}, "
        f"{c.get('env')} {c.get('env_config')}, group {c.get('group_size')}, {c.get('tasks_per_iteration')} "
        f"tasks an iteration, lr {c.get('lr')}; held-out: {c.get('eval_episodes')} test-fold games every "
        f"{c.get('eval_every')} iterations and at a run's last (iteration 0: the untrained model, per seed).",
        "",
        held_out_table(rows),
        "",
    ]
    if any(len(p["seeds"]) >= 2 for p in pairs):
        lines += ["Paired, seed-level, at the last iteration every run of the pair evaluated:", "", paired_table(pairs)]
    else:
        lines += ["(Paired seed-level differences need two seeds of both variants of a pair.)"]
    text = "\n".join(lines)
    (Path(out) / "summary.md").write_text(text + "\n")
    plot(out, rows)
    return text


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--variants",
        default=None,
        help=f"comma list of {list(lc.VARIANTS)} (default {','.join(VARIANTS)}; report: those in --out)",
    )
    ap.add_argument("--seeds", default="0", help="comma list of seeds (training tasks and sampling seeds)")
    ap.add_argument("--iterations", type=int, default=ITERATIONS, help="iterations per run; a larger one extends")
    ap.add_argument("--eval-every", type=int, default=EVAL_EVERY, help="held-out evaluation every N iterations")
    ap.add_argument("--eval-episodes", type=int, default=EVAL_EPISODES, help="held-out games of the test fold")
    ap.add_argument("--parallel", type=int, default=1, help="runs at a time (one thread each; up to ~9 GB each)")
    ap.add_argument("--out", default=str(OUT), help="the results folder (resumed when it exists)")
    ap.add_argument("--report-only", action="store_true", help="write summary.md and long_horizon.png, train nothing")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    variants = [v for v in (args.variants or "").split(",") if v]
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    if args.child:
        v, s = args.child.split(":")
        run_one(out, read_setting(out)["common"], v, int(s), args.iterations)
        return
    if args.report_only:
        if not (out / "setting.json").exists():
            raise SystemExit(f"--report-only: {out} holds no probe (no setting.json); pass --out <its folder>")
        print(report(out, variants or [v for v in folder_variants(out) if v != BASE], seeds))
        return
    variants = variants or list(VARIANTS)
    bad = [v for v in variants if v not in lc.VARIANTS]
    if bad:
        raise SystemExit(f"--variants: unknown {bad}; choose from {list(lc.VARIANTS)}")
    setting = setting_for(args.eval_every, args.eval_episodes)
    warnings.filterwarnings("ignore", module="gymnasium")  # quiet: the env checks of validating each variant
    logging.getLogger("ray.rllib").setLevel(logging.ERROR)
    lc.check_setting(out, setting, lc.variant_diffs(setting, [BASE, *variants]))
    sweep(out, setting, variants, seeds, args.parallel, args.iterations)
    print(report(out, variants, seeds))


if __name__ == "__main__":
    main()
