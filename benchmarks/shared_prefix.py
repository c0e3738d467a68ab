"""Learner cost with and without exact shared-prefix training, on an R3L-shaped batch.

    .venv/bin/python benchmarks/shared_prefix.py [--groups 1] [--turns 10] [--reps 2] [--model default]
    .venv/bin/python benchmarks/shared_prefix.py --turns 20 --obs 170 --micro-batch-tokens 8192  # twc-long rows
    .venv/bin/python benchmarks/shared_prefix.py --capture 3 --out DIR   # the main job's batches
    .venv/bin/python benchmarks/shared_prefix.py --capture 1 --out DIR --env r3l/TextWorldExpress \
        --env-config '{"game": "twc", "max_turns": 20}'                   # a longer game's
    .venv/bin/python benchmarks/shared_prefix.py --batches DIR/batch*.pt

``--capture N`` runs N iterations of the embedded default (``R3LConfig()``, the main job's
configuration) and saves every training batch the learner receives; ``--batches`` then times the
learner on those real batches instead of the synthetic one. Otherwise the batch mirrors a
coin-collector R3L group (measured shapes, docs/benchmarks.md): a task prompt (system + rules +
first observation, ~260 tokens), then turns of an observation (~100 tokens) and a short
choice-decoded response (~6 tokens). Each group holds 4 base episodes and 4 retries; retry
``i`` replays its base up to pivot ``k_i`` (tokens identical up to the pivot turn's prompt) and
diverges after; pivotal credit: responses of turns >= k carry credit in the retry and its base.
The learners run one update each per repetition, interleaved, on the same batch: ``off``
(share_prefixes=False), ``masked`` (shared, a continuation attends to its prefix's cache through
transformers' masked SDPA) and ``cascade`` (shared, through ``rllib_r3l.learner.cascade_attention``, the
default on CPU); the table gives seconds, forward tokens, credited tokens and their ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch


def rseq(rng, n, vocab):
    return rng.integers(100, vocab, size=n).tolist()


def r3l_group(rng, vocab, turns, prompt=260, obs=100, resp=6):
    """Rows (token lists) and credited spans for one group: 4 bases, 4 retries."""
    task = rseq(rng, prompt, vocab)
    rows, credit = [], []
    pivots = [max(1, turns * f // 10) for f in (2, 4, 6, 8)]
    for k in pivots:
        base, spans = list(task), []
        for t in range(turns):
            if t:
                base += rseq(rng, obs, vocab)
            spans.append((len(base), len(base) + resp, t))
            base += rseq(rng, resp, vocab)
        # the retry: the base's tokens up to the pivot turn's prompt, then its own turns
        cut = spans[k][0]
        retry, rspans = base[:cut], [s for s in spans if s[2] < k]
        for t in range(k, turns):
            if t > k:
                retry += rseq(rng, obs, vocab)
            rspans.append((len(retry), len(retry) + resp, t))
            retry += rseq(rng, resp, vocab)
        for r, sp in ((base, spans), (retry, rspans)):
            rows.append(r)
            credit.append([(a, b) for a, b, t in sp if t >= k])  # pivotal credit
    return rows, credit


def make_batch(groups, turns, vocab, seed=0, prompt=260, obs=100):
    rng = np.random.default_rng(seed)
    rows, credit = [], []
    for _ in range(groups):
        r, c = r3l_group(rng, vocab, turns, prompt=prompt, obs=obs)
        rows += r
        credit += c
    B, T = len(rows), max(len(r) for r in rows)
    ids = torch.zeros(B, T, dtype=torch.long)
    att = torch.zeros(B, T, dtype=torch.long)
    loss = torch.zeros(B, T)
    for i, (r, c) in enumerate(zip(rows, credit)):
        ids[i, : len(r)] = torch.tensor(r)
        att[i, : len(r)] = 1
        for a, b in c:
            loss[i, a:b] = 1.0
    adv = torch.tensor(rng.normal(size=B), dtype=torch.float32)
    return {
        "input_ids": ids,
        "attention_mask": att,
        "loss_mask": loss,
        "sampler_logprobs": torch.zeros(B, T),
        "advantages": adv,
        "weights": torch.ones(B),
        "on_policy": torch.ones(B),
        "num_loss_tokens": loss.sum(1),
    }


def build_learner(model, share, micro_batch_tokens=2048):
    import gymnasium as gym
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_r3l import R3LConfig

    cfg = R3LConfig().training(
        backend="transformers",
        lr=1e-6,
        share_prefixes=share,
        micro_batch_tokens=micro_batch_tokens,
        **({} if model == "default" else {"model": model}),
    )
    space = (gym.spaces.Text(max_length=8), gym.spaces.Text(max_length=8))
    learner = cfg.build_learner(env=None, spaces={"__env__": space, DEFAULT_MODULE_ID: space})
    learner.build()
    return learner


def capture(iterations: int, out: str, env=None, env_config=None) -> None:
    """Run the embedded default (``env``/``env_config`` replaced when given) for ``iterations``
    and save each training batch to ``out``."""
    import ray

    import rllib_r3l  # noqa: F401  (registers "R3L")
    from rllib_r3l import R3LConfig
    from rllib_r3l.learner.torch_learner import R3LTorchLearner

    os.makedirs(out, exist_ok=True)
    original = R3LTorchLearner._update
    saved = []

    def _update(self, batch):
        path = os.path.join(out, f"batch{len(saved) + 1}.pt")
        torch.save({mid: {k: v for k, v in b.items() if isinstance(v, torch.Tensor)} for mid, b in batch.items()}, path)
        saved.append(path)
        return original(self, batch)

    R3LTorchLearner._update = _update
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    try:
        cfg = R3LConfig()
        if env is not None or env_config is not None:
            cfg = cfg.environment(
                env=env or cfg.env, env_config=env_config if env_config is not None else cfg.env_config
            )
        algo = cfg.build_algo()
        for it in range(iterations):
            algo.train()
            print(f"iteration {it + 1}: {len(saved)} batch(es) saved in {out}", flush=True)
        algo.stop()
    finally:
        R3LTorchLearner._update = original
        ray.shutdown()


def load_batches(paths):
    from ray.rllib.core import DEFAULT_MODULE_ID

    return [torch.load(p)[DEFAULT_MODULE_ID] for p in paths]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capture", type=int, metavar="N", help="save the main job's batches of N iterations to --out")
    ap.add_argument("--out", default="results/shared_prefix_batches")
    ap.add_argument("--env", help="with --capture: the environment (default: the embedded default's)")
    ap.add_argument("--env-config", type=json.loads, help="with --capture: the environment's config, JSON")
    ap.add_argument("--batches", nargs="*", help="time the learner on these captured batches")
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--model", default="default")
    ap.add_argument("--prompt", type=int, default=260, help="task prompt tokens of the synthetic batch")
    ap.add_argument("--obs", type=int, default=100, help="observation tokens a turn of the synthetic batch")
    ap.add_argument("--micro-batch-tokens", type=int, default=2048)
    ap.add_argument("--variants", default="off,masked,cascade", help="comma-separated: off, masked, cascade")
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if args.capture:
        capture(args.capture, args.out, env=args.env, env_config=args.env_config)
        return 0
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_r3l.learner import rl_module
    from rllib_r3l.learner.precision import uses_autocast

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(variants) - {"off", "masked", "cascade"}
    if unknown:
        ap.error(f"--variants: unknown {sorted(unknown)}; choose from off, masked, cascade")
    learners = {v: build_learner(args.model, v != "off", args.micro_batch_tokens) for v in variants}
    vocab = learners[variants[0]].module[DEFAULT_MODULE_ID].lm.config.vocab_size
    batches = (
        load_batches(args.batches)
        if args.batches
        else [make_batch(args.groups, args.turns, vocab, prompt=args.prompt, obs=args.obs)]
    )
    from rllib_r3l.cli.run_info import cpu_model

    cpu = cpu_model()
    print(
        f"CPU: {cpu}; autocast bf16: {uses_autocast('auto', 'cpu')}; {len(batches)} batch(es), "
        f"{sum(len(b['input_ids']) for b in batches)} rows, {sum(int(b['attention_mask'].sum()) for b in batches)} "
        f"tokens, {sum(int(b['loss_mask'].sum()) for b in batches)} credited"
    )
    print(f"micro_batch_tokens {args.micro_batch_tokens}; variants {', '.join(variants)}")
    cascade_supported = rl_module.cascade_supported
    rows = {v: [] for v in variants}
    for rep in range(args.reps):
        for i, batch in enumerate(batches):
            for v in variants:
                lr = learners[v]
                # "masked": the shared path with transformers' masked attention on the caches
                rl_module.cascade_supported = (lambda *a: False) if v == "masked" else cascade_supported
                try:
                    c0, t0 = time.process_time(), time.perf_counter()
                    lr._update({DEFAULT_MODULE_ID: {k: t.clone() for k, t in batch.items()}})
                    wall, cpu_s = time.perf_counter() - t0, time.process_time() - c0
                finally:
                    rl_module.cascade_supported = cascade_supported
                m = {k: float(x) for k, x in lr.metrics.reduce()["r3l"]["learner"].items()}
                rows[v].append((wall, cpu_s, m["forward_tokens"], m["trained_tokens"]))
                print(
                    f"rep {rep} batch {i + 1} {v:8s}: {wall:7.1f} s wall, {cpu_s:7.1f} s CPU, "
                    f"{int(m['forward_tokens'])} forward tokens, {int(m['trained_tokens'])} credited",
                    flush=True,
                )
    print("\n| variant | wall s (mean) | CPU s (mean) | forward tokens | forward / credited |")
    print("|---|---|---|---|---|")
    for v in variants:
        w, c, f, t = (np.mean([r[i] for r in rows[v]]) for i in range(4))
        print(f"| {v} | {w:.1f} | {c:.1f} | {int(f)} | {f / t:.1f} |")
    if "off" in rows:
        w_off, f_off = (np.mean([r[i] for r in rows["off"]]) for i in (0, 2))
        for v in variants:
            if v != "off":
                w, f = (np.mean([r[i] for r in rows[v]]) for i in (0, 2))
                print(f"ratios {v}/off: wall {w / w_off:.2f}, forward tokens {f / f_off:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
