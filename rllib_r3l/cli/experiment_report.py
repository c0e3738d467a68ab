"""Experiment report (``rllib-r3l report``): final metrics per trial and learning curves.

Reads every Tune trial directory under ``EXPERIMENT_DIR`` (``result.json``, one JSON result per
line, preferred because Tune's ``progress.csv`` keeps only the columns of the first result; the
iterations it lacks, cut or deleted, from ``progress.csv``, with a warning), writes ``summary.csv`` (one row per
trial: the last value of each metric, and the
hyperparameters that differ between trials, e.g. a grid search's) and PNG learning curves
(matplotlib, Agg backend): reward, success rate, R3L retry metrics and tokens per sample against
the training iteration; and, for trials with a retry ledger, the reflect-then-retry chain as a funnel
(``retry_chain.csv``, ``retry_chain.png``: rllib_r3l.cli.ledger_report).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Optional, Tuple

from rllib_r3l.cli import driver_mark, ledger_report, pbt_lineage
from rllib_r3l.cli.report_warnings import error_text
from rllib_r3l.cli.result_rows import flat, read_rows
from rllib_r3l.errors import UsageError

SUMMARY_FILE = "summary.csv"

# short name -> flattened result key (Tune flattens nested results with "/").
METRICS: Dict[str, str] = {
    "reward": "env_runners/episode_return_mean",
    "success_rate": "env_runners/success_rate",
    "episode_turns": "env_runners/episode_len_mean",
    "eval_reward": "evaluation/env_runners/episode_return_mean",
    "eval_success_rate": "evaluation/env_runners/success_rate",
    "retry_trigger_rate": "env_runners/r3l/retry_trigger_rate",
    "retry_success_rate": "env_runners/r3l/retry_success_rate",
    "retry_improvement_rate": "env_runners/r3l/retry_improvement_rate",
    "reward_gain": "env_runners/r3l/reward_gain",
    "mean_pivot_turn": "env_runners/r3l/mean_pivot_turn",
    "reflection_valid_rate": "env_runners/r3l/reflection_valid_rate",
    "num_retries": "env_runners/r3l/num_retries",
    "trained_tokens_per_sample": "r3l/trained_tokens_per_sample",
    "generated_tokens_per_sample": "env_runners/r3l/generated_tokens_per_sample",
    "rollout_turns_per_sample": "env_runners/r3l/rollout_turns_per_sample",
    "loss": "learners/default_policy/total_loss",
    "grad_norm": "learners/default_policy/gradients_default_optimizer_global_norm",
    "time_this_iter_s": "time_this_iter_s",
    "time_total_s": "time_total_s",
}
# losses, summed over the iterations in the table (a run that lost every episode must show it)
FAULTS: Dict[str, str] = {
    "episodes_lost": "env_runners/r3l/faults/episodes_lost",
    "env_errors": "env_runners/r3l/faults/env_errors",
    "env_create_errors": "env_runners/r3l/faults/env_create_errors",
    "generation_errors": "env_runners/r3l/faults/generation_errors",
    "empty_batches": "r3l/batch/empty_batches",
}
# figure file -> (title, metrics on it)
PLOTS: Dict[str, Tuple[str, List[str]]] = {
    "reward.png": ("Mean episode return (base rollouts)", ["reward", "eval_reward"]),
    "success_rate.png": ("Success rate (base rollouts)", ["success_rate", "eval_success_rate"]),
    "retry_metrics.png": (
        "R3L retries",
        [
            "retry_trigger_rate",
            "retry_success_rate",
            "retry_improvement_rate",
            "reward_gain",
            "mean_pivot_turn",
            "reflection_valid_rate",
        ],
    ),
    "tokens_per_sample.png": (
        "Tokens per sample",
        ["trained_tokens_per_sample", "generated_tokens_per_sample", "rollout_turns_per_sample"],
    ),
}
# config keys never shown as "varied" (bookkeeping that differs per trial anyway).
_IGNORED_PARAMS = ("__trial_info__", "seed", "callbacks", "callbacks_class")


def find_trial_dirs(root: str) -> List[str]:
    """Directories (``root`` itself or below, up to 3 levels) holding a Tune result file, an
    ``error.txt`` (a trial that failed before its first result), Tune's ``params.json`` or a checkpoint."""
    root = os.path.abspath(os.path.expanduser(root))
    if not os.path.isdir(root):  # a file is not "no such directory"
        what = "a file, not a directory" if os.path.exists(root) else "no such directory"
        raise UsageError(f"{root}: {what} (pass a Tune experiment directory, e.g. ~/ray_results/NAME)")
    found = []
    base_depth = root.rstrip(os.sep).count(os.sep)
    for d, dirs, files in os.walk(root):
        if d.count(os.sep) - base_depth >= 3:
            dirs[:] = []
        checkpointed = any(x.startswith("checkpoint_") for x in dirs)  # a killed driver's trial: nothing else yet
        dirs[:] = [x for x in dirs if not x.startswith("checkpoint_") and x != "report"]
        # params.json: a trial whose row files are gone is still listed, with a warning
        if {"result.json", "progress.csv", "error.txt", "params.json"} & set(files) or checkpointed:
            found.append(d)
            dirs[:] = []
    if not found:
        raise UsageError(
            f"{root}: no Tune trials found (no result.json, progress.csv or error.txt up to 3 levels down)"
        )
    return sorted(found)


def load_trial(trial_dir: str):
    """``(progress DataFrame with the METRICS short names + training_iteration, params dict)``; what was
    damaged in the row files is in ``df.attrs["row_notes"]`` and the last row in ``df.attrs["last"]``."""
    import pandas as pd

    live = driver_mark.driver_alive(os.path.dirname(trial_dir)) is True
    rows, notes = read_rows(trial_dir, live=live)
    raw = pd.DataFrame(rows)
    df = pd.DataFrame()
    if "training_iteration" in raw:
        df["training_iteration"] = pd.to_numeric(raw["training_iteration"], errors="coerce")
    for short, key in {**METRICS, **FAULTS}.items():
        if key in raw:
            df[short] = pd.to_numeric(raw[key], errors="coerce")
    df.attrs["row_notes"], df.attrs["last"] = notes, (rows[-1] if rows else {})
    params = {}
    pj = os.path.join(trial_dir, "params.json")
    if os.path.isfile(pj):
        try:
            with open(pj) as f:
                params = json.load(f)
        except ValueError:
            params = {}
    return df, params


def _scalar_params(params: Dict[str, Any]) -> Dict[str, Any]:
    """Dotted keys to scalar leaves; an ignored key at any depth is left out with what is under it."""
    return {
        k: v
        for k, v in flat(params, ".").items()
        if not set(k.split(".")) & set(_IGNORED_PARAMS) and (v is None or isinstance(v, (str, int, float, bool)))
    }


def _tune_statuses(folder: str) -> Dict[str, str]:
    """Trial directory name -> status, from the newest ``experiment_state-*.json`` Tune keeps in the
    experiment folder (``{}`` when there is none or it cannot be read: Tune's own format)."""
    try:
        states = sorted(f for f in os.listdir(folder) if f.startswith("experiment_state-") and f.endswith(".json"))
        if not states:
            return {}
        with open(os.path.join(folder, states[-1])) as f:
            data = json.load(f)
        out = {}
        for entry in data.get("trial_data", []):
            trial = json.loads(entry[0])
            out[os.path.basename(str(trial["relative_logdir"]))] = str(trial["status"])
        return out
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return {}


def trial_status(
    trial_dir: str, iterations: int, empty_batches: Optional[int], last: Optional[Dict[str, Any]] = None
) -> str:
    """What ``rllib-r3l train`` would call the trial: Tune's status (``error.txt`` = ERROR), TERMINATED
    without ``done`` = INTERRUPTED (Ctrl-C), RUNNING from a driver that is gone (``driver_mark``) =
    INTERRUPTED, and a finished trial whose every batch was empty TRAINED ON NOTHING
    (rllib_r3l.cli.outcome). ``last``: the trial's last result (default: read from its row files)."""
    from rllib_r3l.cli.outcome import INTERRUPTED, TRAINED_ON_NOTHING

    if last is None:
        rows, _notes = read_rows(trial_dir)
        last = rows[-1] if rows else {}

    exp_dir = os.path.dirname(trial_dir)
    status = _tune_statuses(exp_dir).get(os.path.basename(trial_dir))
    finished = status == "TERMINATED" and last.get("done")
    if error_text(trial_dir) is not None and not finished:  # an error a later --resume went past is history
        status = "ERROR"
    elif status in ("RUNNING", "PENDING", "PAUSED") and driver_mark.driver_alive(exp_dir) is False:
        status = None  # Tune's last saved state, from a driver that was killed: interrupted unless it finished
    if status in (None, "TERMINATED"):  # Tune's word stands where no row is left to judge by
        status = "TERMINATED" if last.get("done") or (status == "TERMINATED" and not last) else INTERRUPTED
    if status == "TERMINATED" and iterations and empty_batches is not None and empty_batches >= iterations:
        status = TRAINED_ON_NOTHING
    return status


def summarize(trial_dirs: List[str], root: str):
    """One row per trial: identity, the varied hyperparameters, the last value of each metric."""
    import pandas as pd

    loaded = [(d, *load_trial(d)) for d in trial_dirs]
    spliced = pbt_lineage.splices(trial_dirs)
    flat = [_scalar_params(p) for _d, _df, p in loaded]
    keys = sorted({k for f in flat for k in f})
    varied = [k for k in keys if len({json.dumps(f.get(k), sort_keys=True, default=str) for f in flat}) > 1]
    rows = []
    for (d, df, _p), f in zip(loaded, flat):
        row: Dict[str, Any] = {
            "trial": trial_name(d, root),
            "model": f.get("model", f.get("model_id")),
            "env": f.get("env"),
        }
        for k in varied:
            if k not in ("model", "model_id", "env"):
                row[k] = f.get(k)
        row["iterations"] = int(df["training_iteration"].max()) if "training_iteration" in df and len(df) else 0
        if d in spliced:  # PBT: part of this curve is another trial's run (pbt_lineage)
            row["spliced_from"] = "; ".join(
                f"{trial_name(s.source, root)}@{s.iteration if s.iteration else '?'}" for s in spliced[d]
            )
        for short in METRICS:
            if short in df:
                s = df[short].dropna()
                row[short] = float(s.iloc[-1]) if len(s) else float("nan")
        if "reward" in df and df["reward"].notna().any():
            row["best_reward"] = float(df["reward"].max())
        for short in FAULTS:
            if short in df:
                row[short] = int(df[short].fillna(0).sum())
        row["status"] = trial_status(d, row["iterations"], row.get("empty_batches"), last=df.attrs.get("last"))
        rows.append(row)
    table = pd.DataFrame(rows)
    for k in varied:  # an option some trials lack is NaN there: its whole numbers stay whole (not 3.0)
        values = [r[k] for r in rows if r.get(k) is not None]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            table[k] = table[k].astype("Int64")
    identity = ["trial", "status", "model", "env"]  # a varied env is not a second "env" column
    order = (
        identity
        + [k for k in varied if k in table and k not in identity]
        + ["iterations", "spliced_from", "reward", "best_reward"]
    )
    order += list(FAULTS)
    order += [m for m in METRICS if m not in order]
    table = table[[c for c in order if c in table] + [c for c in table if c not in order]]
    table.attrs["trial_dirs"] = [d for d, _df, _p in loaded]  # row by row: where warnings() finds error.txt
    table.attrs["row_notes"] = {d: df.attrs.get("row_notes") for d, df, _p in loaded}
    table.attrs["splices"] = spliced
    table.attrs["root"] = root
    return table, loaded, varied


def trial_name(trial_dir: str, root: str) -> str:
    """The trial as the table names it: its folder relative to the report's root, without Tune's
    ``_<index>_<params>_<date>`` suffix (a folder outside the root, e.g. a PBT clone's: its own name)."""
    rel = os.path.relpath(trial_dir, root)
    rel = os.path.basename(trial_dir) if rel == "." or rel.startswith("..") else rel
    return re.sub(r"^(.*_\d{5})_\d+_.*$", r"\1", rel)


def notes(table) -> List[str]:
    """One line per trial whose curve is spliced from a PBT clone: whose run it continues, from which
    iteration (the table's last values and the plotted curve are then partly the other trial's)."""
    root = table.attrs.get("root", "")
    out = []
    for trial_dir, spl in sorted((table.attrs.get("splices") or {}).items()):
        for s in spl:
            out.append(
                f"note: {trial_name(trial_dir, root)}'s curve is spliced from a PBT clone: "
                f"{s.describe(lambda d: trial_name(d, root) if os.path.isabs(d) else d)}"
            )
    return out


def _label(d: str, params: Dict[str, Any], varied: List[str], root: str) -> str:
    flat = _scalar_params(params)
    parts = [f"{k.split('.')[-1]}={flat.get(k)}" for k in varied if k in flat]
    return ", ".join(parts) if parts else os.path.basename(d) or os.path.relpath(d, root)


def plot(loaded, varied: List[str], out_dir: str, root: str, splices=None) -> List[str]:
    """The PNG learning curves; a dotted line where a PBT clone's run takes over a curve (``splices``)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    written = []
    for fname, (title, metrics) in PLOTS.items():
        present = [m for m in metrics if any(m in df and df[m].notna().any() for _d, df, _p in loaded)]
        if not present:
            continue
        n = len(present)
        cols = min(n, 3)
        nrows = (n + cols - 1) // cols
        fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), squeeze=False)
        legend: Dict[str, Any] = {}
        for ax, metric in zip(axes.flat, present):
            for i, (d, df, params) in enumerate(loaded):
                if metric not in df or "training_iteration" not in df:
                    continue
                sub = df[["training_iteration", metric]].dropna()
                if len(sub):
                    label = _label(d, params, varied, root)
                    (line,) = ax.plot(
                        sub["training_iteration"],
                        sub[metric],
                        color=f"C{i % 10}",
                        marker="o" if len(sub) < 20 else None,
                        markersize=3,
                        label=label,
                    )
                    legend.setdefault(label, line)
                    for s in (splices or {}).get(d, []):
                        if s.iteration is not None:
                            ax.axvline(s.iteration - 0.5, color=f"C{i % 10}", linestyle=":", linewidth=1)
            ax.set_title(metric)
            ax.set_xlabel("training iteration")
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        labels, handles = list(legend), list(legend.values())
        bottom = 0.0
        if 1 < len(labels) <= 20:  # one legend for all panels, below them
            legend_rows = (len(labels) + 2) // 3
            fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3), fontsize=8)
            bottom = min(0.4, (0.15 + 0.25 * legend_rows) / (3.6 * nrows))
        fig.suptitle(title)
        fig.tight_layout(rect=(0, bottom, 1, 0.95))
        path = os.path.join(out_dir, fname)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def make_report(experiment_dir: str, out: Optional[str] = None):
    """Write ``summary.csv`` and the PNGs; returns ``(table, png paths, out dir)``."""
    root = os.path.abspath(os.path.expanduser(experiment_dir))
    trials = find_trial_dirs(root)
    table, loaded, varied = summarize(trials, root)
    out_dir = os.path.abspath(os.path.expanduser(out)) if out else os.path.join(root, "report")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"--out {out_dir}: exists and is not a folder; give a folder for summary.csv and the PNGs")
    from rllib_r3l.cli.storage import check_storage

    # a read-only experiment folder (shared results) needs its own --out; said before any file is half-written
    check_storage(out_dir, None, "--out" if out else "--out (default EXPERIMENT_DIR/report)")
    os.makedirs(out_dir, exist_ok=True)
    table.to_csv(os.path.join(out_dir, SUMMARY_FILE), index=False)
    pngs = plot(loaded, varied, out_dir, root, table.attrs.get("splices"))
    last = {d: int(n) for d, n in zip(table.attrs["trial_dirs"], table["iterations"])}  # trials' last results
    chain = ledger_report.chain_table(
        trials,
        [trial_name(d, root) for d in trials],  # the retry ledgers' funnels
        [last.get(d, 0) for d in trials],
    )
    table.attrs["chain"] = chain
    if chain is not None:
        chain.to_csv(os.path.join(out_dir, ledger_report.CHAIN_FILE), index=False)
        pngs.append(ledger_report.plot_chain(chain, out_dir))
    return table, pngs, out_dir
