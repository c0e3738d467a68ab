"""Does vLLM's n-gram speculative decoding (prompt lookup) shorten a reflection wave?

    .venv/bin/python benchmarks/speculative_decoding.py                 # off, k=2, k=4, default model
    .venv/bin/python benchmarks/speculative_decoding.py --k 0 4 --reps 3

Decode is bound by per-step cost at 8-16 requests on a 2-core CPU (docs/benchmarks.md section 5),
and a report quotes its transcript (actions, rooms), so drafting tokens from the prompt might
save steps. Each setting gets its own engine (a fresh process): 8 requests on one cached
coin-collector-like log generate up to ``--tokens`` tokens, free and held to the report's JSON
schema; waves alternate ``--reps`` times. Speculative decoding needs
``choice_tokenization="any"``: vLLM rejects custom logits processors (the canonical-choice one)
when it is on, so every setting here runs with "any". The table counts NaN sampler log-probs, which
the learner's metrics would receive. Not a test: a benchmark (docs/benchmarks.md section 5).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def child(model: str, k: int, reps: int, tokens: int) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from rllib_r3l.generation import make_backend
    from rllib_r3l.generation.base import GenerationRequest
    from rllib_r3l.models import load_tokenizer, resolve_model
    from rllib_r3l.runner.reflection.reflect import report_json_schema

    path = resolve_model(model)
    tok = load_tokenizer(path)
    kw = {}
    if k > 0:
        kw["engine_kwargs"] = {"speculative_config": {"method": "ngram", "num_speculative_tokens": k,
                                                      "prompt_lookup_max": 4, "prompt_lookup_min": 2}}
    engine = make_backend("vllm", path, seed=0, choice_tokenization="any", **kw)
    log = "".join(f"Turn {i}: You are in the kitchen. Exits: north, east. Admissible: go north, go east, "
                  f"take coin.\nAction: go {'north' if i % 2 else 'east'}\n" for i in range(12))
    text = tok.apply_chat_template([{"role": "user", "content": log + "\nReflect on this episode. Reply with a "
                                     "JSON report: outcome, summary, root_cause, suggestion, pivot."}],
                                   add_generation_prompt=True, tokenize=False)
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    prompts = [prompt + tok(str(i), add_special_tokens=False)["input_ids"] for i in range(8)]
    schema = report_json_schema(12, failed=True, max_chars=100)
    engine.generate([GenerationRequest(p, 2) for p in prompts], temperature=1.0)  # cache the prompts
    for rep in range(reps):
        for kind in ("free", "json"):
            reqs = [GenerationRequest(p, tokens, json_schema=schema if kind == "json" else None) for p in prompts]
            t0 = time.perf_counter()
            outs = engine.generate(reqs, temperature=1.0)
            dt = time.perf_counter() - t0
            lps = [x for o in outs for x in o.logprobs]
            print(json.dumps({"k": k, "rep": rep, "wave": kind, "s": dt, "tokens": sum(len(o.token_ids) for o in outs),
                              "longest": max(len(o.token_ids) for o in outs),
                              "nan_logprobs": sum(1 for x in lps if math.isnan(x)), "logprobs": len(lps),
                              "load": os.getloadavg()[0]}), flush=True)
    engine.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--k", type=int, nargs="+", default=[0, 2, 4], help="speculative tokens (0 = off)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=90)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        child(args.model, args.child, args.reps, args.tokens)
        return 0
    from rllib_r3l.cli.run_info import cpu_model

    print(f"# {cpu_model()}, {os.cpu_count()} cores; model {args.model}; 8 requests, up to {args.tokens} tokens; "
          f"choice_tokenization='any' in every setting")
    print("| speculative tokens | rep | wave | s | tokens | longest | NaN log-probs | load 1-min |\n|---|---|---|---|---|---|---|---|")
    for k in args.k:
        cmd = [sys.executable, __file__, "--child", str(k), "--model", args.model, "--reps", str(args.reps),
               "--tokens", str(args.tokens)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
        if proc.returncode != 0 or not rows:
            print(f"| {k} | - | failed (rc {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]} | | | | | |")
            continue
        for r in rows:
            print(f"| {k or 'off'} | {r['rep']} | {r['wave']} | {r['s']:.2f} | {r['tokens']} | {r['longest']} | "
                  f"{r['nan_logprobs']} / {r['logprobs']} | {r['load']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
