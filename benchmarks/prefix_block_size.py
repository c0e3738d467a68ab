"""vLLM prefix-cache block size on a multi-turn rollout's shape (issue 12/16: the rollout's cost).

    .venv/bin/python benchmarks/prefix_block_size.py                    # 128 vs 32, two reps each
    .venv/bin/python benchmarks/prefix_block_size.py --sizes 128,64,32 --reps 1 --turns 10

The engine's prefix cache serves whole blocks only. A multi-turn episode's prompt grows by one turn
(observation + chat template, ~45 tokens on compact coin collector) each time it is sent, so besides
the new tokens the engine recomputes the tail of the prompt's last cached block: on average half a
block. With vLLM's CPU default of 128 that is as much again as the new tokens.

Each (size, rep) runs in a fresh process (its own engine, SmolLM2-135M-Instruct, the machine's CPU
default dtype): ``--episodes`` prompts of a ~250-token system text, then ``--turns`` waves that append
a ~40-token user turn and decode one action by choice (7 coin-collector actions), as the runner does.
Reported: prompt tokens submitted and computed (vLLM's ``num_cached_tokens``), the rollout's process
CPU seconds (all engine threads) and wall seconds, and each size's ratio to the first. Sizes run
interleaved (128, 32, 128, 32, ...) so that a load change hits both. Not a test: a benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
ACTIONS = ["move north", "move south", "move east", "move west", "take coin", "open door to north", "look"]
WORDS = "room kitchen hallway door open closed north south east west coin take move look see there is a the".split()


def child(block_size: int, episodes: int, turns: int) -> Dict[str, Any]:
    """One rollout with a fresh engine whose prefix-cache block is ``block_size``."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from rllib_r3l.generation import make_backend
    from rllib_r3l.generation.base import GenerationRequest
    from rllib_r3l.models import load_tokenizer, resolve_model

    path = resolve_model(MODEL)
    tok = load_tokenizer(path)
    t0 = time.perf_counter()
    engine = make_backend("vllm", path, engine_kwargs={"block_size": block_size})
    start_s = time.perf_counter() - t0
    rng = random.Random(0)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    def ids(s: str) -> List[int]:
        return tok(s, add_special_tokens=False)["input_ids"]

    prompts = [
        ids(f"<|im_start|>system\nYou are an agent. Episode {i}. {text(180)}<|im_end|>\n") for i in range(episodes)
    ]
    submitted = computed = 0
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(turns):
        prompts = [p + ids(f"<|im_start|>user\n{text(28)}<|im_end|>\n<|im_start|>assistant\n") for p in prompts]
        outs = engine.generate([GenerationRequest(p, max_tokens=8, choices=ACTIONS) for p in prompts], temperature=1.0)
        for i, o in enumerate(outs):
            submitted += len(prompts[i])
            computed += len(prompts[i]) - o.cached_prompt_tokens
            prompts[i] = prompts[i] + list(o.token_ids) + ids("\n")
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    engine.close()
    return {
        "block_size": block_size,
        "prompt_submitted": submitted,
        "prompt_computed": computed,
        "cpu_s": round(cpu, 1),
        "wall_s": round(wall, 1),
        "engine_start_s": round(start_s, 1),
        "final_prompt_tokens": len(prompts[0]),
    }


def table(rows: List[Dict[str, Any]], sizes: List[int]) -> List[str]:
    by = {s: [r for r in rows if r["block_size"] == s] for s in sizes}
    ref = by[sizes[0]]

    def mean(rs, k):
        return statistics.mean(r[k] for r in rs) if rs else float("nan")

    head = (
        "block size",
        "runs",
        "prompt tokens submitted",
        "computed",
        "computed ratio",
        "rollout CPU s",
        "CPU ratio",
        "wall s",
    )
    return harness.markdown_table(
        head,
        [
            (
                s,
                len(rs),
                f"{mean(rs, 'prompt_submitted'):,.0f}",
                f"{mean(rs, 'prompt_computed'):,.0f}",
                f"{mean(rs, 'prompt_computed') / mean(ref, 'prompt_computed'):.2f}",
                ", ".join(f"{r['cpu_s']:.1f}" for r in rs),
                f"{mean(rs, 'cpu_s') / mean(ref, 'cpu_s'):.2f}",
                ", ".join(f"{r['wall_s']:.1f}" for r in rs),
            )
            for s, rs in by.items()
            if rs
        ],
    ).splitlines()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--sizes", default="128,32", help="block sizes (multiples of 32 on CPU); the first is the reference"
    )
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of each engine process")
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        harness.emit_result(child(args.child, args.episodes, args.turns))
        return
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    bad = [s for s in sizes if s <= 0 or s % 16]
    if bad:
        raise SystemExit(f"--sizes: {bad} are not positive multiples of 16 (vLLM's CPU kernels want multiples of 32)")
    env = harness.child_env(OMP_NUM_THREADS=str(args.threads))
    print(f"# {harness.machine()}; {args.episodes} episodes x {args.turns} turns", flush=True)
    rows: List[Dict[str, Any]] = []
    for rep in range(args.reps):
        for s in sizes:
            cmd = [
                sys.executable,
                __file__,
                "--child",
                str(s),
                "--episodes",
                str(args.episodes),
                "--turns",
                str(args.turns),
            ]
            got, p = harness.run_child(cmd, env)
            if got is None:
                raise SystemExit(f"block size {s} failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
            rows.append(dict(got, rep=rep, load=round(os.getloadavg()[0], 1)))
            print(f"  rep {rep} block {s}: {rows[-1]}", flush=True)
    print("\n".join(table(rows, sizes)))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        from rllib_r3l.cli.run_info import cpu_model

        Path(args.out).write_text(json.dumps({"cpu": cpu_model(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
