"""Learner throughput: our R3LTorchLearner vs TRL's GRPOTrainer vs bare fwd+bwd+AdamW (issue 7, item 2).

    python benchmarks/learner_throughput.py                          # fp32, 8 x (200 + 64) tokens, 2 reps
    python benchmarks/learner_throughput.py --dtype bfloat16 --reps 3 --steps 3

All three train the same model (default SmolLM2-135M-Instruct) on the same fixed batch: B sequences
of P prompt + C completion tokens (random token ids, fixed seed), loss on the C completion tokens,
one AdamW step per batch (lr 1e-6, weight decay 0.01, grad-norm clip 1.0), no KL/reference model,
no gradient checkpointing, the same weights dtype (``--dtype``) and the same autocast (``--autocast``:
"none" = none anywhere; "bfloat16" = bf16 autocast over fp32 weights in all three: R3L
``mixed_precision="bfloat16"``, TRL ``bf16=True``, bare ``torch.autocast``).

* ``r3l``  - ``R3LConfig(...).build_algo()`` and ``algo.learner_group.update(MultiAgentBatch)``, i.e.
  the exact call ``R3L.training_step`` makes (micro_batch_size = B: one forward/backward).
* ``trl``  - ``trl.GRPOTrainer`` with generation replaced by the same fixed batch (a subclass returns
  it from ``_generate_and_score_completions``), so a timed step is TRL's loss + backward + optimizer.
* ``bare`` - HF model forward (LM head over every position) + token-mean -A*logp + backward +
  clip + AdamW: the practical ceiling. ``bare_sel`` applies the head at completion positions only.

Each implementation runs in its own subprocess (memory; thread state), one warm-up step then
``--steps`` timed steps; the implementations are interleaved (order rotated every rep) and every
run records process CPU time / wall (2.0 = both cores ours) and the load average. Tokens/s counts
all B x (P + C) sequence tokens per step (the convention of docs/machine-facts.md); completion
tokens/s is also given. Results: benchmarks/results/learner_throughput.json (+ .csv).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402

OUT = harness.RESULTS
DTYPES = {"float32": "float32", "bfloat16": "bfloat16"}


def fixed_batch(args, vocab: int):
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, vocab - 1, (args.batch, args.prompt + args.completion), generator=g)
    adv = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(args.batch)])
    return ids, adv


def _timed(step, n_warm, n, meter):
    for _ in range(n_warm):
        step()
    steps = []
    for _ in range(n):
        w0, c0, l0 = time.perf_counter(), time.process_time(), os.getloadavg()[0]
        step()
        steps.append({"wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0, "load": l0})
        meter(steps[-1])
    return steps


def run_bare(args, path, head_at_completion: bool):
    import torch
    from transformers import AutoModelForCausalLM

    from rllib_r3l.learner import precision

    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.config.use_cache = False
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    ids, adv = fixed_batch(args, model.config.vocab_size)
    P = args.prompt

    def step():
        opt.zero_grad(set_to_none=True)
        with precision.autocast(args.autocast, "cpu"):
            loss = forward_loss()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    def forward_loss():
        if head_at_completion:
            h = model.get_decoder()(input_ids=ids).last_hidden_state[:, P - 1 : -1]
            logits = model.get_output_embeddings()(h).float()
        else:
            logits = model(input_ids=ids).logits[:, P - 1 : -1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, P:].unsqueeze(-1)).squeeze(-1)
        return -(adv[:, None] * logp).mean()

    return _timed(step, 1, args.steps, lambda s: None)


def run_r3l(args, path):
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import numpy as np
    import ray
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    import rllib_r3l  # noqa: F401
    from rllib_r3l import R3LConfig
    from rllib_r3l.cli.main import find_r3l_metrics

    cfg = R3LConfig().training(
        model=path,
        model_dtype=args.dtype,
        micro_batch_size=args.micro_batch or args.batch,
        micro_batch_tokens=None,
        mixed_precision=args.autocast,
        lr=1e-6,
        backend="transformers",
        num_threads=args.threads,
    )
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    algo = cfg.build_algo()
    from transformers import AutoConfig

    ids, adv = fixed_batch(args, AutoConfig.from_pretrained(path).vocab_size)
    B, T = ids.shape
    loss_mask = np.zeros((B, T), dtype=np.float32)
    loss_mask[:, args.prompt :] = 1.0
    batch = {
        "input_ids": ids.numpy().astype(np.int64),
        "attention_mask": np.ones((B, T), dtype=np.int64),
        "loss_mask": loss_mask,
        "sampler_logprobs": np.zeros((B, T), dtype=np.float32),
        "advantages": adv.numpy().astype(np.float32),
        "weights": np.ones(B, dtype=np.float32),
        "on_policy": np.ones(B, dtype=np.float32),
        "num_loss_tokens": loss_mask.sum(1).astype(np.float32),
    }
    internal = []

    def step():
        res = algo.learner_group.update(
            batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(batch))}, env_steps=B),
            timesteps={},
            num_epochs=1,
            minibatch_size=None,
        )
        r = res[0] if isinstance(res, list) else res
        found = find_r3l_metrics(r, "learner")
        internal.append(found or {})

    steps = _timed(step, 1, args.steps, lambda s: None)
    for s, m in zip(steps, internal[1:]):
        if "update_seconds" in m:
            s["internal_update_s"] = float(_peek(m["update_seconds"]))
            s["internal_trained_tokens"] = float(_peek(m["trained_tokens"]))
    algo.stop()
    ray.shutdown()
    return steps


def _peek(v):
    return v.peek() if hasattr(v, "peek") else v


def run_trl(args, path):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    tok = AutoTokenizer.from_pretrained(path)
    ids, adv = fixed_batch(args, model.config.vocab_size)
    P = args.prompt
    fixed = {
        "prompt_ids": ids[:, :P],
        "prompt_mask": torch.ones(args.batch, P, dtype=torch.long),
        "completion_ids": ids[:, P:],
        "completion_mask": torch.ones(args.batch, args.completion, dtype=torch.long),
        "advantages": adv,
        "num_items_in_batch": torch.tensor(float(args.batch * args.completion)),
    }

    class FixedBatchGRPO(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):  # no generation: the same batch every step
            return {k: v.clone() for k, v in fixed.items()}

    steps, marks = [], {}

    class Timer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            marks.update(w=time.perf_counter(), c=time.process_time(), l=os.getloadavg()[0])

        def on_step_end(self, a, state, control, **kw):
            steps.append(
                {
                    "wall_s": time.perf_counter() - marks["w"],
                    "cpu_s": time.process_time() - marks["c"],
                    "load": marks["l"],
                }
            )

    tmp = tempfile.mkdtemp(prefix="trl-bench-")
    conf = GRPOConfig(
        output_dir=tmp,
        per_device_train_batch_size=args.batch,
        num_generations=args.batch,
        max_completion_length=args.completion,
        max_steps=1 + args.steps,
        learning_rate=1e-6,
        weight_decay=0.01,
        max_grad_norm=1.0,
        beta=0.0,
        bf16=args.autocast == "bfloat16",
        fp16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        logging_steps=10_000,
        save_strategy="no",
        report_to="none",
        dataloader_num_workers=0,
        seed=0,
    )
    ds = Dataset.from_dict({"prompt": ["x"] * (args.batch * (args.steps + 2))})
    trainer = FixedBatchGRPO(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=conf,
        train_dataset=ds,
        processing_class=tok,
        callbacks=[Timer()],
    )
    torch.set_num_threads(args.threads)
    trainer.train()
    return steps[1:]


def worker(args):
    import torch

    from rllib_r3l.models import resolve_model

    torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    impl = args.worker
    if impl == "r3l":
        steps = run_r3l(args, path)
    elif impl == "trl":
        steps = run_trl(args, path)
    elif impl in ("bare", "bare_sel"):
        steps = run_bare(args, path, head_at_completion=impl == "bare_sel")
    else:
        raise SystemExit(f"unknown implementation {impl}")
    return {"impl": impl, "steps": steps}


def runs_from_log(path, tokens):
    """Runs rebuilt from the launcher's per-step lines ("rep R impl step W s ... cpu/wall C load L")."""
    import re

    runs = {}
    for line in open(path):
        m = re.match(r"rep (\d+) (\S+)\s+step\s+([\d.]+) s .* cpu/wall ([\d.]+)\s+load ([\d.]+)", line)
        if m:
            rep, impl, w, cw, load = int(m[1]), m[2], float(m[3]), float(m[4]), float(m[5])
            runs.setdefault((rep, impl), {"impl": impl, "rep": rep, "steps": []})["steps"].append(
                {"wall_s": w, "cpu_s": w * cw, "load": load}
            )
    return list(runs.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--impls", default="r3l,trl,bare")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=200)
    ap.add_argument("--completion", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=list(DTYPES))
    ap.add_argument(
        "--autocast",
        default="none",
        choices=["none", "bfloat16"],
        help="bf16 autocast over the --dtype weights, in all implementations",
    )
    ap.add_argument("--micro-batch", type=int, default=0, help="r3l micro_batch_size (0 = the batch size)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run (after 1 warm-up step)")
    ap.add_argument("--reps", type=int, default=2, help="interleaved repetitions")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", default="")
    ap.add_argument("--from-log", default=None, help="summarise the step lines of a launcher log (a run cut short)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        harness.emit_result(worker(args))
        return
    impls = [i for i in args.impls.split(",") if i]
    if args.from_log:
        summarise(args, impls, runs_from_log(args.from_log, args.batch * (args.prompt + args.completion)))
        return
    tokens = args.batch * (args.prompt + args.completion)
    runs = []
    for rep in range(args.reps):
        order = impls[rep % len(impls) :] + impls[: rep % len(impls)]
        for impl in order:
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                impl,
                "--model",
                args.model,
                "--batch",
                str(args.batch),
                "--prompt",
                str(args.prompt),
                "--completion",
                str(args.completion),
                "--dtype",
                args.dtype,
                "--autocast",
                args.autocast,
                "--micro-batch",
                str(args.micro_batch),
                "--steps",
                str(args.steps),
                "--threads",
                str(args.threads),
            ]
            r, p = harness.run_child(cmd, dict(os.environ, RAY_AUTH_MODE="disabled", TOKENIZERS_PARALLELISM="false"))
            if r is None:
                print(f"{impl} failed (rc={p.returncode}):\n{p.stderr[-4000:]}", file=sys.stderr)
                continue
            r["rep"] = rep
            runs.append(r)
            for s in r["steps"]:
                print(
                    f"rep {rep} {impl:8s} step {s['wall_s']:6.2f} s  {tokens / s['wall_s']:6.1f} tok/s  "
                    f"cpu/wall {s['cpu_s'] / s['wall_s']:.2f}  load {s['load']:.1f}",
                    flush=True,
                )
    summarise(args, impls, runs)


def summarise(args, impls, runs) -> None:
    """Table, ratios and raw files. Besides wall tok/s: tok per CPU-second of the process (less
    sensitive to other processes on a shared machine than wall time; 2 threads => at most 2 CPU-s/s)."""
    import statistics

    tokens = args.batch * (args.prompt + args.completion)
    summ = {}
    for impl in impls:
        st = [s for r in runs if r["impl"] == impl for s in r["steps"]]
        if not st:
            continue
        walls = sorted(s["wall_s"] for s in st)
        summ[impl] = {
            "steps": len(st),
            "median_step_s": statistics.median(walls),
            "best_step_s": walls[0],
            "median_tok_per_s": tokens / statistics.median(walls),
            "best_tok_per_s": tokens / walls[0],
            "median_completion_tok_per_s": args.batch * args.completion / statistics.median(walls),
            "median_tok_per_cpu_s": statistics.median(tokens / s["cpu_s"] for s in st),
            "mean_cpu_over_wall": statistics.mean(s["cpu_s"] / s["wall_s"] for s in st),
            "mean_load": statistics.mean(s["load"] for s in st),
        }
    print(
        f"\nmodel {args.model}, {args.dtype} weights, autocast {args.autocast}, {args.batch} x ({args.prompt} + "
        f"{args.completion}) tokens, "
        f"threads={args.threads}, {args.reps} interleaved reps x {args.steps} steps, {os.cpu_count()} CPUs"
    )
    print(
        "| learner | steps | median step s | median tok/s | best tok/s | completion tok/s | tok per CPU-s | cpu/wall "
        "| load |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for impl, s in summ.items():
        print(
            f"| {impl} | {s['steps']} | {s['median_step_s']:.2f} | {s['median_tok_per_s']:.1f} | "
            f"{s['best_tok_per_s']:.1f} | "
            f"{s['median_completion_tok_per_s']:.1f} | {s['median_tok_per_cpu_s']:.1f} | "
            f"{s['mean_cpu_over_wall']:.2f} | "
            f"{s['mean_load']:.1f} |"
        )
    ratios = {}
    for a, b in (("r3l", "trl"), ("r3l", "bare"), ("trl", "bare"), ("r3l", "bare_sel")):
        if a in summ and b in summ:
            ratios[f"{a}/{b}"] = {
                k: summ[a][k] / summ[b][k] for k in ("median_tok_per_s", "best_tok_per_s", "median_tok_per_cpu_s")
            }
            r = ratios[f"{a}/{b}"]
            print(
                f"ratio {a}/{b}: wall median {r['median_tok_per_s']:.2f}, wall best {r['best_tok_per_s']:.2f}, "
                f"per CPU-s {r['median_tok_per_cpu_s']:.2f}"
            )
    OUT.mkdir(parents=True, exist_ok=True)
    autocast = "_autocast_bf16" if args.autocast == "bfloat16" else ""
    name = f"learner_throughput_{args.dtype}{autocast}{('_' + args.tag) if args.tag else ''}"
    with open(OUT / f"{name}.json", "w") as f:
        json.dump(
            {
                "args": {k: v for k, v in vars(args).items()},
                "tokens_per_step": tokens,
                "runs": runs,
                "summary": summ,
                "ratios": ratios,
                "when": time.strftime("%Y-%m-%d %H:%M:%S"),
            },
            f,
            indent=1,
        )
    with open(OUT / f"{name}.csv", "w") as f:
        f.write("rep,impl,step,wall_s,cpu_s,load,tok_per_s\n")
        for r in runs:
            for i, s in enumerate(r["steps"]):
                f.write(
                    f"{r['rep']},{r['impl']},{i},{s['wall_s']:.3f},{s['cpu_s']:.3f},{s['load']:.2f},"
                    f"{tokens / s['wall_s']:.1f}\n"
                )
    print(f"wrote {OUT / (name + '.json')}")


if __name__ == "__main__":
    main()
