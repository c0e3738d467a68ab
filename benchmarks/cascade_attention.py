"""Shared-prefix training's continuations: cascade attention against transformers' masked SDPA.

    .venv/bin/python benchmarks/cascade_attention.py                       # the default shapes
    .venv/bin/python benchmarks/cascade_attention.py --shapes 1004x2646x2 --reps 5

A shape ``PxLxN`` is a prefix of ``P`` tokens with ``N`` continuations of ``L`` tokens each, the
trie node layout ``rl_module.shared_prefix_hidden`` runs: the prefix alone, then the ``N`` leaves
as one batch on its expanded KV cache. For each shape the real default model (SmolLM2-135M-Instruct,
fp32 weights under the learner's bf16 autocast where the CPU has native bf16) runs forward +
backward of that trie, ``masked`` (the leaves attend through transformers' SDPA with an explicit
``[L, P + L]`` mask) and ``cascade`` (``rllib_r3l.learner.cascade_attention``, the default on CPU)
alternating, ``--reps`` times each after one warm-up, then ``flat``: the ``N`` rows unshared, one
``P + L`` row at a time (what the learner runs when a micro-batch cut separates them). Prints
median CPU seconds and the ratios; the hidden states' gradient is the same either way
(``tests/learner/test_cascade_attention.py``, ``tests/learner/test_prefix_sharing.py``).

The defaults: an R3L pair on TextWorldExpress twc (a base and its retry of ~3,650 tokens, the
pivot after ~1,000, the prefix both share), the same pair with a late pivot, a coin-collector
group (4 items of ~1,300 tokens after a 300-token task prompt) and a short group (4 x 400 on 300).
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time

import torch

DEFAULT_SHAPES = "1004x2646x2,2412x1238x2,300x1000x4,300x400x4"


def parse_shape(text: str):
    try:
        p, l, n = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected PxLxN, e.g. 1004x2646x2") from None
    if p < 1 or l < 1 or n < 1:
        raise argparse.ArgumentTypeError(f"shape {text!r}: P, L and N must be >= 1")
    return p, l, n


def rows_for(p: int, l: int, n: int, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(100, vocab, (p,), generator=g)
    return torch.stack([torch.cat([prefix, torch.randint(100, vocab, (l,), generator=g)]) for _ in range(n)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"comma-separated PxLxN (default {DEFAULT_SHAPES})")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    args = ap.parse_args(argv)
    shapes = [parse_shape(s) for s in args.shapes.split(",") if s.strip()]

    from rllib_r3l.learner import rl_module
    from rllib_r3l.learner.precision import autocast, uses_autocast
    from rllib_r3l.models import load_causal_lm, resolve_model

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_causal_lm(resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct"), dtype="float32").train()
    dec = lm.get_decoder()
    vocab = lm.config.vocab_size
    info = {}
    for line in open("/proc/cpuinfo"):
        key, _, val = line.partition(":")
        info.setdefault(key.strip(), val.strip())
    bf16 = uses_autocast("auto", "cpu")
    print(
        f"CPU: {info.get('model name', platform.processor())} (family {info.get('cpu family', '?')} model "
        f"{info.get('model', '?')}), {torch.get_num_threads()} threads; learner bf16 autocast: {bf16}; "
        f"reps {args.reps}",
        flush=True,
    )
    supported = rl_module.cascade_supported

    def run(ids: torch.Tensor, variant: str) -> float:
        rl_module.cascade_supported = (lambda *a: False) if variant == "masked" else supported
        c0 = time.process_time()
        try:
            with autocast("auto", "cpu") if bf16 else contextlib.nullcontext():
                if variant == "flat":
                    loss = sum(
                        dec(input_ids=ids[i : i + 1]).last_hidden_state.float().square().mean()
                        for i in range(ids.shape[0])
                    )
                else:
                    h = rl_module.shared_prefix_hidden(dec, ids, [ids.shape[1]] * ids.shape[0])
                    loss = h.float().square().mean()
            loss.backward()
        finally:
            rl_module.cascade_supported = supported
        lm.zero_grad(set_to_none=True)
        return time.process_time() - c0

    print(
        "\n| prefix P | leaves N x L | masked CPU s | cascade CPU s | flat CPU s | cascade / masked | cascade / flat |"
    )
    print("|---|---|---|---|---|---|---|")
    for p, l, n in shapes:
        ids = rows_for(p, l, n, vocab)
        times = {"masked": [], "cascade": [], "flat": []}
        for v in ("masked", "cascade"):
            run(ids, v)  # warm-up
        for _ in range(args.reps):
            for v in ("masked", "cascade"):
                times[v].append(run(ids, v))
        for _ in range(max(1, args.reps // 2)):
            times["flat"].append(run(ids, "flat"))
        med = {v: statistics.median(t) for v, t in times.items()}
        print(
            f"| {p} | {n} x {l} | {med['masked']:.1f} | {med['cascade']:.1f} | {med['flat']:.1f} | "
            f"{med['cascade'] / med['masked']:.2f} | {med['cascade'] / med['flat']:.2f} |",
            flush=True,
        )
        print(
            f"<!-- raw {p}x{l}x{n}: "
            + "; ".join(f"{v} {', '.join(f'{x:.1f}' for x in t)}" for v, t in times.items())
            + " -->",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
