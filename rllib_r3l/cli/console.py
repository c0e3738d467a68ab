"""The training console shared by ``python -m rllib_r3l.cli.main`` and ``rllib-r3l train``.

Quiet by default: a header (model, environment, backend, CPU, precision), a live progress line
while the runners explore, one line per iteration (success, retry success, update and its tokens,
where the time went), and at the end a summary table and a PNG of the run. Engine and library
output (vLLM, Ray, transformers, warnings, progress bars, anything written to stdout/stderr, C
libraries included) goes to a log file under the results folder; ``--verbose`` leaves it on the
console instead.

The formatting functions are pure (dicts in, text out); ``rllib_r3l.cli.run_info`` reads the machine and
the config, :func:`routed_output` (``rllib_r3l.cli.output_routing``, re-exported here) redirects the process's
output, :mod:`rllib_r3l.cli.live_progress` draws the live line from what the runners publish
(``rllib_r3l.runner.progress``).
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

from rllib_r3l.cli import retry_chain

# re-exported: callers use console.routed_output, console.Console
from rllib_r3l.cli.output_routing import Console, routed_output  # noqa: F401
from rllib_r3l.cli.result_rows import finite, get_metric, number
from rllib_r3l.runner import progress

PLOT_FILE = "run.png"


# ==================================================================================================
# Reading results
# ==================================================================================================
def learner_metric(result: Mapping[str, Any], key: str) -> float:
    """``learners/r3l/learner/<key>`` (where R3L's learner logs), else under a module; NaN if none
    (no update this iteration)."""
    v = get_metric(result, f"learners/r3l/learner/{key}")
    if finite(v):
        return float(v)
    learners = result.get("learners")
    if isinstance(learners, Mapping):
        for mod in learners.values():
            v = get_metric(mod, f"r3l/learner/{key}")
            if finite(v):
                return float(v)
    for k, v in result.items():  # flattened
        if k.startswith("learners/") and k.endswith(f"/r3l/learner/{key}") and finite(v):
            return float(v)
    return math.nan


def iteration_row(iteration: int, result: Mapping[str, Any]) -> Dict[str, Any]:
    """One iteration's console numbers from an RLlib/Tune result.

    Times (seconds): ``rollout`` = the runners' sampling time without reflection
    (``env_runners/r3l/rollout_seconds`` - ``env_runners/r3l/timers/reflect_s``), ``reflect``,
    ``learn`` (the learner's ``update_seconds``), ``start`` (the engine start, first iteration),
    ``sync`` (the weight sync into the engines, ``r3l/timers/weight_sync_s``: RLlib's own
    ``timers/`` are moving averages, not this iteration's) and ``other`` = the rest of the
    iteration: the credit assignment and RLlib's bookkeeping.
    """
    total = number(result.get("time_this_iter_s"), math.nan)
    sampling = number(get_metric(result, "env_runners/r3l/rollout_seconds"))
    reflect = number(get_metric(result, "env_runners/r3l/timers/reflect_s"))
    start = number(get_metric(result, "env_runners/r3l/timers/engine_start_s"))
    learn = learner_metric(result, "update_seconds")
    updated = finite(learn)
    learn = learn if updated else 0.0
    sync = number(get_metric(result, "r3l/timers/weight_sync_s"))
    rest = total - sampling - learn - start - sync if finite(total) else math.nan
    episodes = number(get_metric(result, "env_runners/num_episodes"))
    success = get_metric(result, "env_runners/success_rate")
    retries = number(get_metric(result, "env_runners/r3l/num_retries"))
    retry_rate = get_metric(result, "env_runners/r3l/retry_success_rate")
    trained = learner_metric(result, "trained_tokens") if updated else 0.0
    return {
        "iteration": int(iteration),
        "episodes": int(episodes),
        "extra_rounds": int(number(get_metric(result, "env_runners/r3l/dynamic_sampling/extra_rounds"))),
        "success_rate": number(success, math.nan),
        "retries": int(retries),
        "retry_success_rate": number(retry_rate, math.nan) if retries else math.nan,
        "reflections": int(number(get_metric(result, "env_runners/r3l/reflection_total"))),
        # the reflect-then-retry chain (reports valid, cut, asking for a retry): where it broke, if it did
        "reflection": retry_chain.reflection_counts(result),
        "updated": updated,
        "trained_tokens": int(number(trained)),
        "generated_tokens": int(number(get_metric(result, "env_runners/r3l/generated_tokens"))),
        # evaluation_interval: R3L.evaluate()'s held-out episodes of this iteration (absent: NaN)
        "eval_success_rate": number(get_metric(result, "evaluation/env_runners/success_rate"), math.nan),
        "eval_episodes": int(number(get_metric(result, "evaluation/env_runners/num_episodes"))),
        "eval_lost": int(number(get_metric(result, "evaluation/env_runners/lost_episodes"))),
        # max_policy_lag: the lag trained on and how long the learner waited for samples (absent: NaN)
        "policy_lag": number(get_metric(result, "r3l/policy_lag_max"), math.nan),
        "waited": number(get_metric(result, "r3l/async/wait_for_samples_s"), math.nan),
        "time": {
            "rollout": max(sampling - reflect, 0.0),
            "reflect": reflect,
            "learn": learn,
            "start": start,
            "sync": sync,
            "other": max(rest, 0.0) if finite(rest) else math.nan,
            "total": total,
        },
    }


# ==================================================================================================
# Formatting (pure)
# ==================================================================================================
def fmt_int(n: float) -> str:
    """1234 -> '1,234'; 12345 -> '12.3k'; 1234567 -> '1.23M'."""
    n = int(n)
    if abs(n) >= 1_000_000:
        return f"{n / 1e6:.2f}M"
    if abs(n) >= 10_000:
        return f"{n / 1e3:.1f}k"
    return f"{n:,}"


def fmt_clock(seconds: float) -> str:
    """75.4 -> '1:15'; 3725 -> '1:02:05'."""
    s = int(max(seconds, 0))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def fmt_rate(x: float) -> str:
    return f"{x:.3f}" if finite(x) else "  -  "


def header_lines(info: Mapping[str, Any]) -> List[str]:
    """The header: what runs, on what, with which precision, and where its logs go."""
    title = info.get("title", "R3L")
    lines = [f"{title}"]
    rows = [
        ("model", info.get("model", "?")),
        ("environment", info.get("env", "?") + (f" {info['env_config']}" if info.get("env_config") else "")),
        ("backend", f"{info.get('backend', '?')} (engine dtype {info.get('engine_dtype', '?')})"),
        (
            "CPU",
            f"{info.get('cpu', '?')}, {info.get('cores', '?')} cores, "
            f"{'native bf16' if info.get('native_bf16') else 'no native bf16'}",
        ),
        ("precision", f"learner {info.get('learner_precision', '?')}"),
    ]
    if info.get("tasks"):
        base, retries = info.get("base_per_task"), info.get("max_retries_per_task")
        what = f"{info['tasks']} tasks, each {base} base episodes"
        if info.get("reflect"):
            on = " on the failed ones" if info.get("reflect_on") == "failures" else ""
            what += f" + reflections{on} + up to {retries} retries"
        else:
            what += " (no reflection)"
        rows.append(("per iteration", what))
        if info.get("dynamic_sampling_rounds"):
            n = int(info["dynamic_sampling_rounds"])
            rows.append(
                (
                    "resampling",
                    f"up to {n} more round{'s' if n > 1 else ''} of {info['tasks']} new tasks "
                    f"while no task has a learning signal (dynamic_sampling_rounds={n})",
                )
            )
    if info.get("log"):
        rows.append(("logs", f"{info['log']}" + ("" if info.get("verbose") else "  (--verbose: on the console)")))
    width = max(len(k) for k, _ in rows)
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    return lines


def progress_line(
    counts: Mapping[str, int], elapsed: float, expected_episodes: Optional[int] = None, phase: str = "exploring"
) -> str:
    """The live line: ``exploring  episodes 3/8 | turns 41 | reflections 2 | retries 1 | tokens 1,234 | 0:41``
    (phases: starting, exploring, reflecting, retrying, learning)."""
    eps = int(counts.get(progress.EPISODES, 0))
    eps_text = f"{eps}/{expected_episodes}" if expected_episodes else f"{eps}"
    return (
        f"  {phase:<10} episodes {eps_text} | turns {fmt_int(counts.get(progress.TURNS, 0))}"
        f" | reflections {fmt_int(counts.get(progress.REFLECTIONS, 0))}"
        f" | retries {fmt_int(counts.get(progress.RETRIES, 0))}"
        f" | tokens {fmt_int(counts.get(progress.TOKENS, 0))} | {fmt_clock(elapsed)}"
    )


TIME_LABELS = {
    "start": "start",
    "rollout": "rollout",
    "reflect": "reflect",
    "learn": "learn",
    "sync": "sync",
    "other": "other",
    "total": "total",
}


def time_split(t: Mapping[str, float]) -> str:
    """``rollout 52 + reflect 20 + learn 28 + sync 1 + other 2 s`` (and the engine start where there was one)."""
    parts = [("start", t.get("start", 0.0))] if number(t.get("start")) >= 0.5 else []
    parts += [(k, t.get(k, math.nan)) for k in ("rollout", "reflect", "learn", "sync", "other")]
    return " + ".join(f"{TIME_LABELS[k]} {number(v):.0f}" for k, v in parts) + " s"


def iteration_line(row: Mapping[str, Any], iterations: Optional[int] = None) -> str:
    """``iter 1/3 | success 0.125 (1/8) | retries 6, 1 succeeded | update yes, 408 tok | 103 s: rollout ...``."""
    it = f"{row['iteration']}/{iterations}" if iterations else f"{row['iteration']}"
    sr, n = row.get("success_rate", math.nan), row.get("episodes", 0)
    extra = int(row.get("extra_rounds", 0) or 0)
    more = f", +{extra} round{'s' if extra > 1 else ''} of tasks" if extra else ""  # dynamic sampling
    success = f"success {fmt_rate(sr)}" + (f" ({round(sr * n)}/{n}{more})" if finite(sr) and n else "")
    if row.get("retries"):
        rr = row.get("retry_success_rate", math.nan)
        retries = f"retries {row['retries']}, {round(rr * row['retries']) if finite(rr) else 0} succeeded"
    else:  # with reflection on: why no retry ran (no failure, reports cut or invalid, ...)
        retries = "retries 0" + retry_chain.iteration_note(row.get("reflection"))
    update = f"update yes, {fmt_int(row.get('trained_tokens', 0))} tok" if row.get("updated") else "update no"
    esr, en = row.get("eval_success_rate", math.nan), row.get("eval_episodes", 0)
    lost = int(row.get("eval_lost", 0) or 0)  # lost episodes count as failures: say how many
    held_out = (
        f" | held-out {fmt_rate(esr)} ({round(esr * en)}/{en}{f', {lost} lost' if lost else ''})"
        if finite(esr) and en
        else ""
    )
    lag = row.get("policy_lag", math.nan)  # the runners sampled while the learner trained: the times overlap
    lagged = f" | lag {lag:.0f}, learner waited {number(row.get('waited')):.0f} s" if finite(lag) else ""
    t = row.get("time", {})
    return (
        f"iter {it} | {success} | {retries} | {update}{held_out}{lagged} | {number(t.get('total')):.0f} s: "
        f"{time_split(t)}"
    )


SUMMARY_COLUMNS = (
    "iter",
    "success",
    "retries",
    "retry ok",
    "update",
    "trained tok",
    "gen tok",
    "start s",
    "rollout s",
    "reflect s",
    "learn s",
    "sync s",
    "other s",
    "total s",
)
TIME_KEYS = ("start", "rollout", "reflect", "learn", "sync", "other", "total")


def summary_table(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    """The end-of-run table: one row per iteration and an ``all`` row (means of rates, sums of the rest);
    then, where reflection was on and no retry ever ran, a ``note:`` line with the likely cause."""

    def cells(r: Mapping[str, Any], label: str) -> List[str]:
        t = r.get("time", {})
        rr = r.get("retry_success_rate", math.nan)
        ok = f"{round(rr * r['retries'])}" if r.get("retries") and finite(rr) else "0"
        upd = r["updated"] if isinstance(r.get("updated"), str) else ("yes" if r.get("updated") else "no")
        return [
            label,
            fmt_rate(r.get("success_rate", math.nan)),
            str(r.get("retries", 0)),
            ok,
            upd,
            fmt_int(r.get("trained_tokens", 0)),
            fmt_int(r.get("generated_tokens", 0)),
            *(f"{number(t.get(k)):.0f}" for k in TIME_KEYS),
        ]

    body = [cells(r, str(r["iteration"])) for r in rows]
    if len(rows) > 1:
        srs = [r["success_rate"] for r in rows if finite(r.get("success_rate"))]
        n_ret = sum(r.get("retries", 0) for r in rows)
        n_ok = sum(
            round(r["retry_success_rate"] * r["retries"])
            for r in rows
            if r.get("retries") and finite(r.get("retry_success_rate"))
        )
        total = {
            "success_rate": sum(srs) / len(srs) if srs else math.nan,
            "retries": n_ret,
            "retry_success_rate": n_ok / n_ret if n_ret else math.nan,
            "updated": f"{sum(bool(r.get('updated')) for r in rows)}/{len(rows)}",
            "trained_tokens": sum(r.get("trained_tokens", 0) for r in rows),
            "generated_tokens": sum(r.get("generated_tokens", 0) for r in rows),
            "time": {k: sum(number(r.get("time", {}).get(k)) for r in rows) for k in TIME_KEYS},
        }
        body.append(cells(total, "all"))
    keep = [
        i
        for i, c in enumerate(SUMMARY_COLUMNS)  # the engine-start column only where an engine started
        if c != "start s" or any(number(r.get("time", {}).get("start")) >= 0.5 for r in rows)
    ]
    header = [SUMMARY_COLUMNS[i] for i in keep]
    body = [[b[i] for i in keep] for b in body]
    widths = [max([len(c), *(len(b[j]) for b in body)]) for j, c in enumerate(header)]  # body may be empty

    def line(cs: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) for c, w in zip(cs, widths))

    note = retry_chain.run_note(rows)  # a run with reflection on that never retried: say so, and why
    return [
        line(header),
        line(["-" * w for w in widths]),
        *(line(b) for b in body),
        *([f"note: {note}"] if note else []),
    ]


def plot_run(rows: Sequence[Mapping[str, Any]], path: str, title: str = "R3L run") -> Optional[str]:
    """A PNG of the run: base and retry success per iteration, and where each iteration's time went."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        return None
    its = [r["iteration"] for r in rows]
    fig, (ax1, ax3, ax2) = plt.subplots(1, 3, figsize=(13, 3.8))
    ax1.plot(its, [r.get("success_rate", math.nan) for r in rows], "o-", label="base success")
    ax1.plot(its, [r.get("retry_success_rate", math.nan) for r in rows], "s--", label="retry success")
    ax1.set_ylim(-0.02, 1.02)
    ax1.set_xlabel("iteration")
    ax1.set_title("success rate")
    ax1.legend(loc="upper right", fontsize=8)
    ax3.bar(its, [r.get("trained_tokens", 0) for r in rows], color="tab:green")
    for r in rows:
        if not r.get("updated"):
            ax3.annotate("no update", (r["iteration"], 0), ha="center", va="bottom", fontsize=8, color="gray")
    ax3.set_xlabel("iteration")
    ax3.set_title("trained tokens (the update)")
    bottom = [0.0] * len(rows)
    for key in ("start", "rollout", "reflect", "learn", "sync", "other"):
        vals = [number(r.get("time", {}).get(key)) for r in rows]
        if any(vals):
            ax2.bar(its, vals, bottom=bottom, label=TIME_LABELS[key])
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax2.set_xlabel("iteration")
    ax2.set_ylabel("seconds")
    ax2.set_title("time per iteration")
    ax2.legend(fontsize=8)
    for ax in (ax1, ax2, ax3):
        ax.set_xticks(its)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=100)
    except OSError:  # a full disk: no half-written PNG left behind; the caller says what happened
        with contextlib.suppress(OSError):
            os.remove(path)
        raise
    finally:
        plt.close(fig)
    return path
