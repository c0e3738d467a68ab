"""Zero-shot: which real model should be the CPU default? (issue 11, item 4)

    python benchmarks/model_compare.py                          # default vs Gemma 3 270M, 4 groups each
    python benchmarks/model_compare.py --groups 6               # continue to 6 groups (what exists is kept)
    python benchmarks/model_compare.py --table-only             # print what is saved

For each model it builds the R3L env runner (the real model through the real loading code, the
configured backend, R3LConfig's default environment and options: choice decoding, schema-held
reflection) *without* Ray or a learner and explores task groups exactly as a training iteration
would (base rollouts, the policy's own reflections, retries from the pivot), before any update.
Every model sees the same task seeds and the same sampling seeds.

Recorded per group (one JSON line each in ``benchmarks/results/model_compare/<tag>.jsonl``): base
successes, each reflection's parse status, reported pivot and the environment's oracle pivot
(``env.oracle``; scored with ``rllib_r3l.runner.reflection.pivot_metrics``), retries and their successes, the time and
the CPU time, and the load average (``os.getloadavg``). Groups are explored ``--chunk`` at a time,
models interleaved chunk by chunk, each chunk in a fresh subprocess (one engine in memory at a time;
an interrupted sweep continues where it stopped, and a sweep cut short still has both models on the
same tasks). The runner's task-seed generator is advanced past the chunks already measured, so chunk
``r`` gets the same task seeds whether it runs first or after a resume.

The table: base success k/n with a 95 % Wilson interval, reflection valid rate (k/n, Wilson),
pivot accuracy (|reported - oracle| <= 1, over the valid reports with a pivot whose episode has an
oracle pivot), retries and how many succeeded, seconds per group. Not a test: a benchmark
(docs/benchmarks.md quotes it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402
from benchmarks.harness import wilson  # noqa: E402  (95 % Wilson interval)

OUT = harness.RESULTS / "model_compare"
DEFAULT_MODELS = "HuggingFaceTB/SmolLM2-135M-Instruct,google/gemma-3-270m"


def _config(model: str, args):
    from rllib_r3l import R3LConfig

    overrides = dict(json.loads(args.set)) if args.set else {}
    return (
        R3LConfig()
        .training(
            model_id=model,
            group_size=args.group_size,
            tasks_per_iteration=args.chunk,
            sampling_seed=args.seed,
            **overrides,
        )
        .debugging(seed=args.seed)
    )


def run_chunk(model: str, chunk_index: int, args) -> List[Dict[str, Any]]:
    """Explore chunk ``chunk_index`` (``args.chunk`` groups) with ``model``; one record per group."""
    import environments
    from rllib_r3l.cli.run_info import cpu_model
    from rllib_r3l.runner.env_runner import R3LEnvRunner
    from rllib_r3l.runner.reflection.pivot_metrics import pivot_quality
    from rllib_r3l.runner.sample_metrics import generated_anew

    cfg = _config(model, args)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    runner = R3LEnvRunner(config=cfg)
    runner.backend  # noqa: B018  (start the engine outside the timed exploration)
    start_s = time.perf_counter() - t0
    for _ in range(chunk_index):  # the task seeds of the chunks before this one (as sample() draws them)
        runner._rng.integers(0, 2**31 - 1, size=args.chunk)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t1 = time.perf_counter()
    groups = runner.sample(num_groups=args.chunk)
    explore_s = time.perf_counter() - t1
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    load1 = os.getloadavg()
    env = environments.make(cfg.env, dict(cfg.env_config or {}))
    tok = runner.backend.tokenizer
    stops = set(int(t) for t in runner.backend.stop_token_ids)

    def non_canonical(ids) -> bool:
        """A response spelled in other tokens than the tokenizer's own tokenisation of its text."""
        ids = [int(t) for t in ids if int(t) not in stops]
        return bool(ids) and ids != tok.encode(tok.decode(ids), add_special_tokens=False)

    records = []
    try:
        for gi, g in enumerate(groups):
            base = [t for t in g.trajectories if t.kind.value == "base"]
            retries = [t for t in g.trajectories if t.kind.value == "retry"]
            refl = []
            for b in base:
                r = b.info.get("reflection")
                if not r:
                    continue
                parsed, out = r[0], r[2]
                pivot = parsed.report.pivot if parsed is not None and parsed.ok and parsed.report is not None else None
                oracle = env.oracle_pivot(b.seed, list(b.actions)) if b.actions else None
                q = pivot_quality(pivot, oracle)
                refl.append(
                    {
                        "status": parsed.status.value if parsed is not None else "generation_error",
                        "ok": bool(parsed is not None and parsed.ok),
                        "pivot": pivot,
                        "oracle_pivot": oracle,
                        "turns": len(b.actions),
                        "success": bool(b.success),
                        "tokens": len(out.token_ids) if out is not None else 0,
                        "pivot_accuracy": None if q is None else q["pivot_accuracy"],
                        "pivot_error": None if q is None else q["pivot_error"],
                    }
                )
            records.append(
                {
                    "model": model,
                    "chunk": chunk_index,
                    "chunk_size": args.chunk,
                    "group": chunk_index * args.chunk + gi,
                    "task_seed": base[0].seed if base else None,
                    "env": cfg.env,
                    "env_config": dict(cfg.env_config or {}),
                    "group_size": args.group_size,
                    "seed": args.seed,
                    "overrides": json.loads(args.set) if args.set else {},
                    "base_successes": sum(bool(t.success) for t in base),
                    "base_episodes": len(base),
                    "base_turns": [t.num_turns for t in base],
                    "lost": len(g.lost),
                    "reflections": refl,
                    "retries": len(retries),
                    "retry_successes": sum(bool(t.success) for t in retries),
                    # generated tokens as the env runner counts them (a retry's replayed prefix is not generated again)
                    "base_generated_tokens": sum(generated_anew(t) for t in base),
                    "retry_generated_tokens": sum(generated_anew(t) for t in retries),
                    # actions and reports not in the tokenizer's own tokens (vLLM's character grammar)
                    "actions": sum(1 for t in base for s in t.segments if s.role == "response"),
                    "actions_non_canonical": sum(
                        non_canonical(s.token_ids) for t in base for s in t.segments if s.role == "response"
                    ),
                    "reports_non_canonical": sum(
                        non_canonical(b.info["reflection"][2].token_ids)
                        for b in base
                        if b.info.get("reflection") and b.info["reflection"][2] is not None
                    ),
                    "chunk_explore_s": round(explore_s, 1),
                    "chunk_engine_start_s": round(start_s, 1),
                    "chunk_cpu_s": round((cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime), 1),
                    "load_before": load0,
                    "load_after": load1,
                    "cpu": cpu_model(),
                    "cpus": os.cpu_count(),
                    "backend": getattr(runner.backend, "name", "?"),
                    "when": time.strftime("%Y-%m-%d %H:%M:%S"),
                }
            )
    finally:
        env.close()
        runner.stop()
    return records


def summarize(records: List[Dict[str, Any]], model: str) -> Dict[str, Any]:
    rs = [r for r in records if r["model"] == model]
    refl = [x for r in rs for x in r["reflections"]]
    k = sum(r["base_successes"] for r in rs)
    n = sum(r["base_episodes"] for r in rs)
    v = sum(x["ok"] for x in refl)
    scored = [x for x in refl if x["pivot_accuracy"] is not None]
    acc = sum(x["pivot_accuracy"] for x in scored)
    chunks = {r["chunk"]: r for r in rs}
    tokens = _generated_tokens(rs, refl)
    return {
        **tokens,
        "model": model,
        "groups": len(rs),
        "base_successes": k,
        "base_episodes": n,
        "base_success_ci95": wilson(k, n),
        "reflections": len(refl),
        "valid": v,
        "valid_ci95": wilson(v, len(refl)),
        "pivot_scored": len(scored),
        "pivot_correct": int(acc),
        "pivot_ci95": wilson(int(acc), len(scored)),
        "pivot_error_mean": (sum(x["pivot_error"] for x in scored) / len(scored)) if scored else float("nan"),
        "retries": sum(r["retries"] for r in rs),
        "retry_successes": sum(r["retry_successes"] for r in rs),
        "explore_s_per_group": sum(c["chunk_explore_s"] for c in chunks.values()) / max(len(rs), 1),
        "cpu_s_per_group": sum(c["chunk_cpu_s"] for c in chunks.values()) / max(len(rs), 1),
        "load": [round(x, 1) for c in chunks.values() for x in (c["load_before"][0], c["load_after"][0])],
        # None where the records predate the tokenisation fields
        "actions": sum(r["actions"] for r in rs) if all("actions" in r for r in rs) else None,
        "actions_non_canonical": sum(r.get("actions_non_canonical", 0) for r in rs),
        "reports_non_canonical": sum(r.get("reports_non_canonical", 0) for r in rs),
    }


def _generated_tokens(rs: List[Dict[str, Any]], refl: List[Dict[str, Any]]) -> Dict[str, float]:
    """Generated tokens per reflection and per sample (base episodes and retries, reports included,
    as ``r3l/generated_tokens_per_sample`` counts them), and the R3L/GRPO ratio of the latter when
    GRPO's sample is a base episode of the same untrained policy (its tokens per base episode).
    NaN where the records predate the token fields."""
    nan = float("nan")
    if not rs or any("base_generated_tokens" not in r for r in rs):
        return {
            "tokens_per_reflection": nan,
            "generated_per_sample": nan,
            "generated_per_base_episode": nan,
            "generated_ratio_vs_grpo": nan,
        }
    base = sum(r["base_generated_tokens"] for r in rs)
    retry = sum(r["retry_generated_tokens"] for r in rs)
    report = sum(x.get("tokens", 0) for x in refl)
    n_base = sum(r["base_episodes"] for r in rs)
    n = n_base + sum(r["retries"] for r in rs)
    per_sample = (base + retry + report) / max(n, 1)
    per_base = base / max(n_base, 1)
    return {
        "tokens_per_reflection": report / max(len(refl), 1),
        "generated_per_sample": per_sample,
        "generated_per_base_episode": per_base,
        "generated_ratio_vs_grpo": per_sample / per_base if per_base else nan,
    }


def table(records: List[Dict[str, Any]], models: List[str]) -> str:
    head = (
        "model",
        "groups",
        "base ok",
        "95% CI",
        "valid refl",
        "95% CI",
        "pivot acc",
        "95% CI",
        "pivot err",
        "retries ok",
        "tok/report",
        "gen tok/sample",
        "R3L/GRPO gen",
        "s/group",
        "CPU s/group",
        "load 1-min",
    )
    f = lambda ci: f"{ci[0]:.2f}-{ci[1]:.2f}"  # noqa: E731
    rows = []
    for m in models:
        s = summarize(records, m)
        if not s["groups"]:
            continue
        rows.append(
            (
                m,
                str(s["groups"]),
                f"{s['base_successes']}/{s['base_episodes']}",
                f(s["base_success_ci95"]),
                f"{s['valid']}/{s['reflections']}",
                f(s["valid_ci95"]),
                f"{s['pivot_correct']}/{s['pivot_scored']}",
                f(s["pivot_ci95"]),
                f"{s['pivot_error_mean']:+.1f}",
                f"{s['retry_successes']}/{s['retries']}",
                f"{s['tokens_per_reflection']:.1f}",
                f"{s['generated_per_sample']:.1f}",
                f"{s['generated_ratio_vs_grpo']:.2f}",
                f"{s['explore_s_per_group']:.0f}",
                f"{s['cpu_s_per_group']:.0f}",
                f"{min(s['load']):.1f}-{max(s['load']):.1f}",
            )
        )
    return harness.markdown_table(head, rows)  # as docs/benchmarks.md quotes it


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated model ids")
    ap.add_argument("--groups", type=int, default=4, help="task groups per model")
    ap.add_argument("--chunk", type=int, default=2, help="groups explored per runner (one training iteration's worth)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", default="", help="extra R3LConfig training options as JSON")
    ap.add_argument("--tag", default="default", help="results file name (benchmarks/results/model_compare/<tag>.jsonl)")
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "CHUNK"), help=argparse.SUPPRESS)  # the subprocess' job
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{args.tag}.jsonl"
    models = [m.strip() for m in args.models.split(",") if m.strip()]

    if args.one:
        from rllib_r3l.cli.console import routed_output

        model, chunk = args.one[0], int(args.one[1])
        with routed_output(str(OUT / f"{args.tag}.log"), verbose=False) as con:
            recs = run_chunk(model, chunk, args)
            harness.append_jsonl(path, recs)
            con.line(
                f"{model} chunk {chunk}: {sum(r['base_successes'] for r in recs)}/"
                f"{sum(r['base_episodes'] for r in recs)} base successes, {recs[0]['chunk_explore_s']:.0f} s"
            )
        return 0

    if not args.table_only:
        n_chunks = -(-args.groups // args.chunk)
        for c in range(n_chunks):
            for m in models:
                done = [r for r in harness.read_jsonl(path) if r["model"] == m and r["chunk"] == c]
                if any(r["chunk_size"] != args.chunk for r in done):
                    print(f"{path} was measured with another --chunk; use another --tag", flush=True)
                    return 2
                if done:
                    print(f"{m} chunk {c}: already measured (skipped)", flush=True)
                    continue
                print(f"{m} chunk {c}: exploring {args.chunk} groups (load {os.getloadavg()[0]:.1f}) ...", flush=True)
                cmd = [sys.executable, __file__, "--one", m, str(c)] + [
                    f"--{k.replace('_', '-')}={v}"
                    for k, v in (
                        ("models", args.models),
                        ("chunk", args.chunk),
                        ("group_size", args.group_size),
                        ("seed", args.seed),
                        ("set", args.set),
                        ("tag", args.tag),
                    )
                ]
                rc = subprocess.call(cmd)
                if rc != 0:
                    print(f"{m} chunk {c}: failed (exit {rc}); see {OUT / (args.tag + '.log')}", flush=True)
                    return rc
    recs = harness.read_jsonl(path)
    if recs:
        r0 = recs[0]
        print(
            f"\n{r0['cpu']}, {r0['cpus']} CPUs; {r0['env']} {r0['env_config'] or '(defaults)'}, group size "
            f"{r0['group_size']}, seed {r0['seed']}, backend {r0['backend']}"
        )
        print(table(recs, models))
        for m in models:
            s = summarize(recs, m)
            if s["groups"] and s["actions"] is not None:
                print(
                    f"{m}: base-episode actions not in the tokenizer's own tokens {s['actions_non_canonical']}/"
                    f"{s['actions']}; reports {s['reports_non_canonical']}/{s['reflections']}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
