"""``rllib-r3l report``'s retry chain: each trial's retry ledger (``retries.jsonl``, rllib_r3l.retry_ledger) as a
funnel, reflections -> valid -> pivot at or before the first mistake -> retried -> action changed at the
pivot -> success, and, where the run had ``retry_control``, retry success against a fresh sample of the same
task. Written as ``retry_chain.csv`` and ``retry_chain.png`` beside the report's summary.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from rllib_r3l import retry_ledger

CHAIN_FILE = "retry_chain.csv"
CHAIN_PLOT = "retry_chain.png"
# the funnel's links as plotted: (label, count key, of what)
LINKS = (
    ("reflections", "reflections", None),
    ("valid report", "valid", "reflections"),
    ("pivot in time", "pivot_in_time", "pivot_scored"),
    ("retried", "retried", "reflections"),
    ("action changed", "action_changed", "action_compared"),
    ("retry success", "retry_success", "retried"),
)


def chain_row(trial: str, rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One trial's funnel counts and control comparison, flat (a CSV row)."""
    out: Dict[str, Any] = {"trial": trial, **retry_ledger.funnel(rows)}
    c = retry_ledger.control_comparison(rows)
    if c["pairs"]:
        out.update(
            control_pairs=c["pairs"],
            control_tasks=c["tasks"],
            retry_vs_control=c["difference"],
            retry_vs_control_low=c["difference_low"],
            retry_vs_control_high=c["difference_high"],
            control_successes=c["control_successes"],
        )
    return out


def chain_table(trial_dirs: List[str], names: List[str], last_iterations: Optional[List[int]] = None):
    """A DataFrame with a row per trial that has a ledger (None when none has). ``last_iterations``: each trial's
    last result; ledger rows past it (an iteration cut short, Ctrl-C before its result) are left out, as its
    result is, and counted in ``rows_after_last_result``."""
    import pandas as pd

    rows = []
    for i, (d, name) in enumerate(zip(trial_dirs, names)):
        ledger = retry_ledger.read(os.path.join(d, retry_ledger.LEDGER_FILE))
        last = last_iterations[i] if last_iterations is not None else None
        kept = [r for r in ledger if last is None or int(r.get("iteration", 0)) <= last]
        if kept:
            rows.append({**chain_row(name, kept), "rows_after_last_result": len(ledger) - len(kept)})
    return pd.DataFrame(rows) if rows else None


def chain_lines(table) -> List[str]:
    """The funnel per trial, as console lines."""
    if table is None:
        return []
    out = []
    for _i, r in table.iterrows():
        # every count the funnel's links name: their count keys and what each is a share of
        f = {k: int(r[k]) for _label, *keys in LINKS for k in keys if k}
        pivots = f"{f['pivot_in_time']}/{f['pivot_scored']} in time" if f["pivot_scored"] else "pivots unscored"
        line = (
            f"retry chain {r['trial']}: {f['reflections']} reflections -> {f['valid']} valid -> {pivots} -> "
            f"{f['retried']} retried -> {f['action_changed']}/{f['action_compared']} changed the action -> "
            f"{f['retry_success']} succeeded"
        )
        if "control_pairs" in r and r["control_pairs"] == r["control_pairs"]:  # not NaN: the run had a control
            lo, hi = r.get("retry_vs_control_low"), r.get("retry_vs_control_high")
            interval = "" if lo is None or lo != lo else f" [{lo:+.2f}, {hi:+.2f}]"
            line += (
                f"; vs a fresh sample of the same task: {r['retry_vs_control']:+.2f}{interval} "
                f"over {int(r['control_pairs'])} retry/control pairs ({int(r['control_tasks'])} task"
                f"{'s' if int(r['control_tasks']) != 1 else ''})"
            )
        if r.get("rows_after_last_result"):
            line += f" ({int(r['rows_after_last_result'])} row(s) of an iteration cut short before its result left out)"
        out.append(line)
    return out


def plot_chain(table, out_dir: str) -> Optional[str]:
    """Each trial's funnel as bars (the share of the link before it on top of each bar); None: no ledger."""
    if table is None:
        return None
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(LINKS)), 3.8))
    width = 0.8 / len(table)
    for i, (_j, r) in enumerate(table.iterrows()):
        xs = [k + i * width for k in range(len(LINKS))]
        counts = [float(r[key]) for _label, key, _of in LINKS]
        bars = ax.bar(xs, counts, width=width, label=str(r["trial"]), color=f"C{i % 10}")
        for bar, (_label, key, of) in zip(bars, LINKS):
            if of and float(r[of]) > 0:
                ax.annotate(
                    f"{float(r[key]) / float(r[of]):.0%}",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(LINKS))], [label for label, _k, _o in LINKS], fontsize=8)
    ax.set_ylabel("count")
    ax.set_title("Retry chain (share of the link it follows from)")
    if len(table) > 1:
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out_dir, CHAIN_PLOT)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


__all__ = ["CHAIN_FILE", "CHAIN_PLOT", "chain_lines", "chain_row", "chain_table", "plot_chain"]
