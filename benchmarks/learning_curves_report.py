"""The report of ``benchmarks/learning_curves.py``: what a sweep folder's runs hold, as tables,
``summary.json``, ``runs.csv`` and ``learning_curves.png``.

Pure: it reads the run folders and writes files; no Ray, no model (``--report-only`` and the tests
run it alone).

The evidence is seed-level and paired: each variant against its reference (``PAIRS``: the same
seed's training tasks and sampling seeds on both sides), as the mean difference of held-out success
and as the ratio (the issue's goal is a multiple of GRPO's held-out success), each with a 95 % t
interval over seeds. The held-out games are the same at every seed, so successes pooled over seeds
are not independent trials: pooled k/n is shown as a description only, without an interval.
Reflection costs (tokens the reflector generated, seconds spent reflecting) sit in their own columns,
since a variant that wins by reflecting more has paid for it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from benchmarks import harness
from benchmarks.harness import mean_interval

BASE = "base"  # the untrained model, evaluated once per seed
ORDER = (BASE, "grpo", "grpo_paper", "grpo_ds", "r3l", "r3l_oracle", "r3l_paper")  # table order (others after, by name)
# variant -> its reference: the same dynamic sampling on both sides of a pair
PAIRS: Dict[str, str] = {"r3l": "grpo_ds", "r3l_oracle": "grpo_ds", "r3l_paper": "grpo_paper", "grpo_ds": "grpo_paper"}
LEGACY_REFERENCE = "grpo"  # a v3 folder: every variant against its one GRPO
GOAL_RATIO = 1.3  # issue 39: >= 1.3x GRPO's held-out success, the paired interval above 1.0
# the options the summary states per variant (the rest of each variant's differences are listed)
STATED = (
    "reflect",
    "reflect_on",
    "dynamic_sampling_rounds",
    "temperature",
    "evaluation_temperature",
    "reflection_temperature",
    "reflection_style",
    "aux_items",
    "loss_aggregation",
    "kl_coef",
    "use_importance_ratio",
)
POOLED_NOTE = (
    "Pooled k/n describes the counts only: the same held-out games repeat at every seed, so they are "
    "not independent trials; the evidence is the paired seed-level comparison below."
)


# ---------------------------------------------------------------------------------------------------
# curves
def interpolate_curve(xs: Sequence[float], ys: Sequence[float], grid: Sequence[float]) -> List[float]:
    """Piecewise-linear ``ys(xs)`` on ``grid``; NaN outside ``[xs[0], xs[-1]]`` (no extrapolation)."""
    out = []
    for g in grid:
        if not xs or g < xs[0] or g > xs[-1]:
            out.append(math.nan)
            continue
        for i in range(len(xs)):
            if xs[i] == g:
                out.append(float(ys[i]))
                break
            if i + 1 < len(xs) and xs[i] < g < xs[i + 1]:
                w = (g - xs[i]) / (xs[i + 1] - xs[i])
                out.append(float(ys[i]) * (1 - w) + float(ys[i + 1]) * w)
                break
    return out


# ---------------------------------------------------------------------------------------------------
# what a run recorded
def run_dir(out: Path, variant: str, seed: int) -> Path:
    return out / variant / f"seed{seed}"


def read_curve(d: Path) -> Tuple[Optional[dict], List[dict]]:
    p = d / "curve.jsonl"
    if not p.exists():
        return None, []
    lines = [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
    header = lines[0].get("header") if lines else None
    return header, [x for x in lines[1:] if "iteration" in x]


def folder_variants(out: Path) -> List[str]:
    """The variants that have a run folder in ``out``: ``ORDER`` first, then the others by name."""
    found = {p.parent.name for p in Path(out).glob("*/seed*") if p.is_dir()}
    return [v for v in ORDER if v in found] + sorted(found - set(ORDER))


def pairs_for(variants: Sequence[str], pairs: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """``pairs`` (default ``PAIRS``) among ``variants``; in a folder with a ``grpo`` (v3's), every other
    variant against it."""
    pairs = {v: ref for v, ref in (PAIRS if pairs is None else pairs).items() if v in variants and ref in variants}
    if LEGACY_REFERENCE in variants:
        pairs.update({v: LEGACY_REFERENCE for v in variants if v != LEGACY_REFERENCE and v not in pairs})
    return pairs


def run_numbers(out: Path, variant: str, seed: int) -> Optional[Dict[str, Any]]:
    """A finished run's numbers: held-out success (k/n), samples, iterations, updates, cost, reflection
    cost, pooled retry success and pivot accuracy; None until ``final.json`` exists."""
    d = run_dir(out, variant, seed)
    if not (d / "final.json").exists():
        return None
    final = json.loads((d / "final.json").read_text())
    _, recs = read_curve(d)
    trained = [r for r in recs if r["iteration"] > 0]

    def tot(key: str) -> float:
        return float(sum(r.get(key) or 0.0 for r in trained))

    def tot_logged(key: str) -> float:
        """Like ``tot``, NaN where no iteration recorded the key (a curve written before it existed)."""
        return tot(key) if any(key in r for r in trained) else math.nan

    def per_retry(key: str) -> float:
        """A per-retry rate pooled over iterations (weighted by retries); NaN where never logged."""
        pairs = [(r.get(key), r.get("num_retries") or 0.0) for r in trained]
        pairs = [(x, w) for x, w in pairs if x is not None and not math.isnan(x) and w > 0]
        return sum(x * w for x, w in pairs) / sum(w for _, w in pairs) if pairs else math.nan

    pivots = [(r.get("pivot_accuracy"), r.get("reflection_valid") or 0.0) for r in trained]
    pivots = [(p, w) for p, w in pivots if p is not None and not math.isnan(p) and w > 0]
    samples = trained[-1]["samples_cumulative"] if trained else 0.0
    return {
        "variant": variant,
        "seed": seed,
        "eval_success": final["eval_successes"] / max(final["eval_episodes"], 1),
        "eval_successes": int(final["eval_successes"]),
        "eval_episodes": int(final["eval_episodes"]),
        "iterations": len(trained),
        "samples": samples,
        "updates": sum(1 for r in trained if (r.get("trained_tokens") or 0) > 0),
        "train_success_last": trained[-1].get("success_rate") if trained else math.nan,
        "retry_success": per_retry("retry_success_rate"),
        "retry_changed_pivot_action": per_retry("retry_changed_pivot_action"),
        "retry_took_oracle_action": per_retry("retry_took_oracle_action"),
        "retries": tot("num_retries"),
        "pivot_accuracy": sum(p * w for p, w in pivots) / sum(w for _, w in pivots) if pivots else math.nan,
        "reflections_valid": tot("reflection_valid"),
        # reflection cost: what the reflector generated and the seconds it took (its prompts' prefill too)
        "reflection_tokens": tot_logged("reflection_generated_tokens"),
        "reflection_seconds": tot_logged("reflect_s"),
        "reflection_prompt_tokens": tot_logged("prompt_tokens_computed_reflect"),
        "reflections_truncated": tot_logged("reflections_truncated"),
        "dynamic_extra_rounds": tot_logged("dynamic_extra_rounds"),
        "cpu_s": tot("cpu_s"),
        "wall_s": tot("wall_s"),
        "cpu_s_per_iteration": tot("cpu_s") / len(trained) if trained else math.nan,
        "cpu_s_per_sample": tot("cpu_s") / samples if samples else math.nan,
        "generated_tokens": tot("generated_tokens"),
        "learner_forward_tokens": tot("forward_tokens"),
        "trained_tokens": tot("trained_tokens"),
    }


MEANS = (
    "samples",
    "iterations",
    "updates",
    "retry_success",
    "retry_changed_pivot_action",
    "retry_took_oracle_action",
    "pivot_accuracy",
    "cpu_s_per_iteration",
    "cpu_s_per_sample",
    "generated_tokens",
    "learner_forward_tokens",
    "trained_tokens",
    "reflection_tokens",
    "reflection_seconds",
    "reflection_prompt_tokens",
    "reflections_truncated",
    "dynamic_extra_rounds",
)


def goal_met(ratio: Dict[str, Any]) -> Optional[bool]:
    """The issue's goal on a ``paired_ratio``: geometric-mean ratio >= ``GOAL_RATIO`` and the interval's
    lower end above 1.0; None where the ratio is undefined (a zero, or one seed)."""
    if math.isnan(ratio["ratio"]) or math.isnan(ratio["lo"]):
        return None
    return ratio["ratio"] >= GOAL_RATIO and ratio["lo"] > 1.0


def summarize(
    out: Path, variants: Sequence[str], seeds: Sequence[int], pair_map: Optional[Dict[str, str]] = None
) -> Dict[str, Any]:
    """Per variant: held-out success over seeds (mean, sd, 95 % t interval; pooled k/n as a description),
    cost and reflection numbers; per pair (``pairs_for``): the paired difference and the paired ratio
    over the seeds both have."""
    per: Dict[str, Dict[int, Dict[str, Any]]] = {}
    for v in dict.fromkeys([BASE, *variants]):
        for s in seeds:
            n = run_numbers(out, v, s)
            if n is not None:
                per.setdefault(v, {})[s] = n
    table: Dict[str, Any] = {}
    for v, by_seed in per.items():
        rows = list(by_seed.values())
        k = sum(r["eval_successes"] for r in rows)
        n = sum(r["eval_episodes"] for r in rows)
        entry = {
            "seeds": sorted(by_seed),
            "eval_success": mean_interval([r["eval_success"] for r in rows]),
            "pooled": {"k": k, "n": n, "rate": k / n if n else math.nan},
        }
        entry.update({key: mean_interval([r[key] for r in rows]) for key in MEANS})
        entry["retries_total"] = sum(r["retries"] for r in rows)
        table[v] = entry
    pairs = []
    for v, ref in pairs_for(list(per), pair_map).items():
        a = {s: r["eval_success"] for s, r in per[v].items()}
        b = {s: r["eval_success"] for s, r in per[ref].items()}
        ratio = harness.paired_ratio(a, b)
        if not ratio["units"]:
            continue
        common = ratio["units"]
        pairs.append(
            {
                "variant": v,
                "reference": ref,
                "seeds": common,
                "diff": harness.paired_difference(a, b),
                "ratio": ratio,
                "goal_met": goal_met(ratio),
                "cpu_s_per_sample_ratio": mean_interval(
                    [
                        per[v][s]["cpu_s_per_sample"] / per[ref][s]["cpu_s_per_sample"]
                        for s in common
                        if per[ref][s]["cpu_s_per_sample"]
                    ]
                ),
            }
        )
    return {
        "variants": table,
        "pairs": pairs,
        "per_seed": {v: {str(s): r for s, r in d.items()} for v, d in per.items()},
    }


# ---------------------------------------------------------------------------------------------------
# the setting, as setting.json records it
def read_setting(out: Path) -> Dict[str, Any]:
    """``setting.json`` as ``{"common": ..., "variants": ...}`` (a v3 file, the common setting alone,
    gets ``variants`` {})."""
    p = Path(out) / "setting.json"
    s = json.loads(p.read_text()) if p.exists() else {}
    return s if "common" in s else {"common": s, "variants": {}}


def stated_options(diff: Dict[str, Any]) -> Dict[str, Any]:
    """``STATED``'s values of a variant: its recorded difference, else ``R3LConfig``'s default ("-"
    for an option this checkout does not know)."""
    from rllib_r3l.options import R3L_OPTIONS

    return {k: diff[k] if k in diff else R3L_OPTIONS[k][0] if k in R3L_OPTIONS else "-" for k in STATED}


def setting_lines(out: Path, variants: Sequence[str]) -> List[str]:
    s = read_setting(out)
    c = s["common"]
    if not c:
        return []
    lines = [
        f"Setting (setting.json): model {c.get('model') or 'the default'}, {c.get('env')} {c.get('env_config')}, "
        f"group {c.get('group_size')}, {c.get('tasks_per_iteration')} tasks an iteration, lr {c.get('lr')}, "
        f"a budget of {c.get('budget')} trajectories a run (base + retry), {c.get('eval_episodes')} held-out "
        f"games per seed; engine {c.get('engine_dtype')}, mixed_precision {c.get('mixed_precision')}, "
        f"choices {c.get('choice_tokenization')}, share_prefixes {c.get('share_prefixes')}, "
        f"{c.get('num_threads')} thread(s).",
        "",
    ]
    recorded = [v for v in dict.fromkeys([BASE, *variants]) if v in s["variants"]]
    if not recorded:
        return lines + [
            "(This folder's setting.json records no per-variant options: each curve header has the "
            "variant's switches.)",
            "",
        ]
    rows = [
        [v, *[json.dumps(x) if not isinstance(x, str) else x for x in stated_options(s["variants"][v]).values()]]
        for v in recorded
    ]
    lines += [
        harness.markdown_table(["variant", *STATED], rows),
        "",
        "Every option that differs from `R3LConfig()` (setting.json):",
        "",
    ]
    lines += [
        f"- {v}: " + ", ".join(f"`{k}={json.dumps(x)}`" for k, x in sorted(s["variants"][v].items())) for v in recorded
    ]
    return lines + [""]


# ---------------------------------------------------------------------------------------------------
# the report
def _ci(e: Dict[str, float], digits: int = 3) -> str:
    if not e or e.get("n", 0) == 0 or math.isnan(e["mean"]):
        return "-"
    if e["n"] == 1:
        return f"{e['mean']:.{digits}f} (1 seed)"
    return f"{e['mean']:.{digits}f} ± {e['std']:.{digits}f} [{e['lo']:.{digits}f}, {e['hi']:.{digits}f}]"


def _each(per: Dict[str, Dict[str, Any]], key: str, digits: int = 0) -> str:
    """A run field per seed, ``"14, 20, 25"`` (``-`` where unknown)."""
    xs = [r[key] for _, r in sorted(per.items(), key=lambda kv: int(kv[0]))]
    return (
        ", ".join("-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}" for x in xs)
        or "-"
    )


def ratio_text(r: Dict[str, Any]) -> Tuple[str, str, str]:
    """(per-seed ratios, mean ratio, geometric mean [95 % t on the log ratio]) of a ``paired_ratio``."""
    each = ", ".join("-" if math.isnan(x) else f"{x:.2f}" for x in r["ratios"].values())
    if r["zero"]:
        side = {"a": "the variant", "b": "the reference", "both": "both"}
        why = "; ".join(f"seed {k}: 0 successes ({side[w]})" for k, w in r["zero"].items())
        return each, "n/a", f"n/a ({why})"
    if r["n"] == 1:
        return each, f"{r['mean']:.2f}", f"{r['ratio']:.2f} (1 seed)"
    return each, f"{r['mean']:.2f}", f"{r['ratio']:.2f} [{r['lo']:.2f}, {r['hi']:.2f}]"


def report(out: Path, variants: Sequence[str], seeds: Sequence[int], pair_map: Optional[Dict[str, str]] = None) -> str:
    """The Markdown summary (also ``summary.md``), ``summary.json``, ``runs.csv`` and the PNG; ``pair_map``:
    variant -> reference (default ``PAIRS``). Runs that kept a retry ledger add the chain's funnel and the
    retry against its fresh control (``chain_lines``)."""
    s = summarize(out, variants, seeds, pair_map)
    chain = chain_summary(out, variants, seeds)
    rows = []
    for v in dict.fromkeys([BASE, *variants]):
        e = s["variants"].get(v)
        if e is None:
            continue
        per, p = s["per_seed"][v], e["pooled"]
        games = sorted({r["eval_episodes"] for r in per.values()})
        rows.append(
            [
                v,
                len(e["seeds"]),
                f"{_each(per, 'eval_successes')} of {'/'.join(map(str, games))}",
                _ci(e["eval_success"]),
                f"{p['k']}/{p['n']}",
                _ci(e["samples"], 0),
                _ci(e["iterations"], 1),
                _ci(e["updates"], 1),
                _each(per, "reflection_tokens"),
                _each(per, "reflection_seconds"),
                _each(per, "reflection_prompt_tokens"),
                _ci(e["retry_success"], 2),
                _ci(e["pivot_accuracy"], 2),
                _ci(e["cpu_s_per_sample"], 1),
            ]
        )
    held = harness.markdown_table(
        [
            "variant",
            "seeds",
            "held-out successes per seed",
            "held-out success: mean ± sd [95 % t]",
            "pooled k/n (description)",
            "samples",
            "iterations",
            "updates",
            "reflection tokens generated per seed",
            "reflection s per seed",
            "reflection prompt tokens computed per seed",
            "retry success",
            "pivot acc.",
            "CPU s / sample",
        ],
        rows,
    )
    prow = []
    for p in s["pairs"]:
        d, r = p["diff"], p["ratio"]
        each, mean, geo = ratio_text(r)
        ours, theirs = s["per_seed"][p["variant"]], s["per_seed"][p["reference"]]
        diffs = ", ".join(f"{ours[str(k)]['eval_success'] - theirs[str(k)]['eval_success']:+.3f}" for k in p["seeds"])
        ci = _ci(d) + (f" ({d['n'] - 1} df)" if d.get("n", 0) > 1 else "")
        goal = {True: "yes", False: "no", None: "n/a"}[p["goal_met"]]
        prow.append([p["variant"], p["reference"], ", ".join(map(str, p["seeds"])), diffs, ci, each, mean, geo, goal])
    paired = harness.markdown_table(
        [
            "variant",
            "against",
            "seeds",
            "differences per seed",
            "difference: mean ± sd [95 % t]",
            "ratios per seed",
            "mean ratio",
            "geometric mean ratio [95 % t on the log ratio]",
            f">= {GOAL_RATIO}x with the interval above 1",
        ],
        prow,
    )
    text = "\n".join(
        [
            *setting_lines(out, variants),
            held,
            "",
            POOLED_NOTE,
            "",
            "Paired, seed-level (each variant against its reference at the same seeds):",
            "",
            paired,
            *chain_lines(chain),
        ]
    )
    if chain:  # a folder without ledgers (v4) keeps its summary.json as it was
        s["chain"] = chain
    (out / "summary.md").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps(s, indent=1, default=float))
    _write_csv(out, s)
    _plot(out, variants, seeds, s)
    return text


# ---------------------------------------------------------------------------------------------------
# the retry chain, from each finished run's ledger (retries.jsonl)
def ledger_rows(out: Path, variant: str, seed: int) -> Optional[List[Dict[str, Any]]]:
    """A finished run's retry ledger (``rllib_r3l.retry_ledger``); None for an unfinished run or one
    without a ledger (v4's runs, GRPO's)."""
    from rllib_r3l import retry_ledger

    d = run_dir(out, variant, seed)
    p = d / retry_ledger.LEDGER_FILE
    if not (d / "final.json").exists() or not p.exists():
        return None
    return retry_ledger.read(str(p))


def chain_numbers(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """``retry_ledger.funnel`` and ``control_comparison`` of ``rows`` (rows of several runs: their
    ``group_id`` prefixed with the run, so that tasks of different runs stay apart)."""
    from rllib_r3l import retry_ledger

    return {**retry_ledger.funnel(rows), "control": retry_ledger.control_comparison(rows)}


def chain_summary(out: Path, variants: Sequence[str], seeds: Sequence[int]) -> Dict[str, Any]:
    """Per variant with a ledger: each run's chain numbers (by seed) and all its runs' together."""
    res: Dict[str, Any] = {}
    for v in dict.fromkeys(variants):
        runs = {s: rows for s in seeds if (rows := ledger_rows(out, v, s)) is not None}
        if not runs:
            continue
        pooled = [dict(r, group_id=f"seed{s}/{r.get('group_id')}") for s, rows in runs.items() for r in rows]
        res[v] = {"per_seed": {str(s): chain_numbers(rows) for s, rows in runs.items()}, "all": chain_numbers(pooled)}
    return res


def _frac(k: int, n: int) -> str:
    return f"{k}/{n}" if n else "-"


def chain_row(label: List[str], c: Dict[str, Any]) -> List[str]:
    ctl = c["control"]
    if ctl["pairs"]:
        diff = f"{ctl['difference']:+.2f}" + (
            "" if ctl["difference_low"] is None else f" [{ctl['difference_low']:+.2f}, {ctl['difference_high']:+.2f}]"
        )
        versus = f"{ctl['retry_successes']}/{ctl['pairs']} vs {ctl['control_successes']}/{ctl['pairs']}"
        ratio = "-" if ctl["ratio"] is None else f"{ctl['ratio']:.2f}"
    else:
        diff = versus = ratio = "-"
    pivots = f"{c['pivot_in_time']}/{c['pivot_scored']} ({c['pivot_exact']} exact)" if c["pivot_scored"] else "-"
    return [
        *label,
        c["reflections"],
        c["valid"],
        pivots,
        c["retried"],
        _frac(c["action_changed"], c["action_compared"]),
        _frac(c["retry_success"], c["retried"]),
        versus,
        diff,
        ratio,
    ]


def chain_lines(ch: Dict[str, Any]) -> List[str]:
    """``chain_summary``'s funnel and retry-vs-control table, one row per run and one per variant (all its
    runs); nothing where no finished run kept a ledger (a v4 folder)."""
    if not ch:
        return []
    rows = []
    for v, e in ch.items():
        rows += [chain_row([v, s], c) for s, c in sorted(e["per_seed"].items(), key=lambda kv: int(kv[0]))]
        if len(e["per_seed"]) > 1:
            rows.append(chain_row([f"**{v}**", "all"], e["all"]))
    return [
        "",
        "The retry chain per run (its retries.jsonl): reflections -> valid reports -> pivot at or before the "
        "oracle's first mistake (of the valid reports the oracle scored) -> retries started -> action at the pivot "
        "changed -> retry success; and the retry against a fresh unguided episode of the same task "
        "(`retry_control`, never trained on), paired over retry/control pairs (difference with its 95 % t "
        "interval; ratio = retry successes / control successes):",
        "",
        harness.markdown_table(
            [
                "variant",
                "seed",
                "reflections",
                "valid",
                "pivot in time",
                "retries",
                "action changed",
                "retry success",
                "retry vs control successes",
                "difference [95 % t]",
                "ratio",
            ],
            rows,
        ),
    ]


def _write_csv(out: Path, s: Dict[str, Any]) -> None:
    import csv

    rows = [r for d in s["per_seed"].values() for r in d.values()]
    if not rows:
        return
    with open(out / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _plot(out: Path, variants: Sequence[str], seeds: Sequence[int], s: Dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    names_all = list(dict.fromkeys([*ORDER, *variants]))
    color = {v: f"C{i % 10}" for i, v in enumerate(names_all)}  # one colour per variant, both panels
    for v in variants:
        curves = []
        for seed in seeds:
            _, recs = read_curve(run_dir(out, v, seed))
            tr = [r for r in recs if r["iteration"] > 0 and r.get("success_rate") is not None]
            if tr:
                curves.append(([r["samples_cumulative"] for r in tr], [r["success_rate"] for r in tr]))
        if not curves:
            continue
        grid = np.linspace(min(c[0][0] for c in curves), max(c[0][-1] for c in curves), 24)
        ys = np.array([interpolate_curve(x, y, grid) for x, y in curves], dtype=float)
        with np.errstate(all="ignore"):
            m, sd = np.nanmean(ys, axis=0), np.nanstd(ys, axis=0)
        axes[0].plot(grid, m, label=f"{v} ({len(curves)} seeds)", color=color[v])
        axes[0].fill_between(grid, m - sd, m + sd, alpha=0.2, color=color[v])
    names = [v for v in dict.fromkeys([BASE, *variants]) if v in s["variants"]]
    for i, v in enumerate(names):
        e = s["variants"][v]["eval_success"]
        err = None if math.isnan(e["lo"]) else [[e["mean"] - e["lo"]], [e["hi"] - e["mean"]]]
        axes[1].errorbar([i], [e["mean"]], yerr=err, fmt="o", capsize=4, color=color[v])
        for r in s["per_seed"][v].values():
            axes[1].plot([i + 0.12], [r["eval_success"]], ".", color="gray")
    axes[1].set_xticks(range(len(names)), names, rotation=30, ha="right")
    axes[0].set_title("base-rollout success on training tasks (mean ± sd over seeds)")
    axes[0].set_xlabel("trajectories generated (base + retry)")
    axes[1].set_title("final held-out success (mean, 95 % t interval; dots: seeds)")
    for ax in axes:
        ax.set_ylabel("success rate")
        ax.set_ylim(-0.02, 1.0)
    if axes[0].lines:
        axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "learning_curves.png", dpi=110)
    plt.close(fig)
