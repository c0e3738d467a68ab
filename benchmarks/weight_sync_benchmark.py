"""Weight-sync seconds versus model size: learner state -> every engine, in place (not a test).

    python benchmarks/weight_sync_benchmark.py                          # tiny and default, vLLM
    python benchmarks/weight_sync_benchmark.py --models tiny,default --backends vllm,transformers
    python benchmarks/weight_sync_benchmark.py --models /path/to/Qwen2.5-1.5B-Instruct --runners 2

For each model and backend it measures the pieces of one sync (what ``R3L.training_step`` does
after an update with S = 1):

* ``state_s``:  the learner module's ``get_state(inference_only=True)`` (CPU tensors);
* ``put_s``:    ``ray.put`` of that state (one object-store copy, shared by every runner);
* ``update_s``: ``backend.update_weights`` inside one runner process (vLLM: buckets of whole decoder
  layers through ``collective_rpc``; ``--bucket-mib`` sets the bucket; median of ``--reps``);
* ``e2e_s``:    driver-side wall time from ``ray.put`` until all ``--runners`` engines hold the new
  weights (each runner fetches the object and updates; runners work in parallel);

and checks that the engine then scores like the learner's weights (``max_logprob_err``; compare
with ``baseline_err``, the same difference before any sync: engine dtype and kernels). Each engine lives in its own Ray
actor (as in R3LEnvRunner). Prints a table and writes ``--out`` (JSON) if given.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _engine_actor_cls():
    import ray

    @ray.remote
    class Engine:
        def __init__(self, backend: str, path: str, options: dict, threads: int) -> None:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            import torch

            torch.set_num_threads(threads)
            from rllib_r3l.generation import make_backend

            t0 = time.perf_counter()
            self.backend = make_backend(backend, path, **options)
            self.start_s = time.perf_counter() - t0

        def start_seconds(self) -> float:
            return self.start_s

        def update(self, state) -> float:
            from rllib_r3l.learner.rl_module import hf_named_tensors

            t0 = time.perf_counter()
            self.backend.update_weights(hf_named_tensors(state))
            return time.perf_counter() - t0

        def score(self, prompt, cont):
            return self.backend.score(prompt, cont)

        def num_buckets(self, state) -> int:
            from rllib_r3l.learner.rl_module import hf_named_tensors
            from rllib_r3l.learner.weight_sync import num_buckets

            return num_buckets(hf_named_tensors(state), getattr(self.backend, "weight_bucket_bytes", None))

    return Engine


def run_one(model: str, backend: str, args) -> dict:
    import ray
    import torch

    from rllib_r3l.models import load_tokenizer, resolve_model
    from rllib_r3l.learner.rl_module import R3LCausalLMModule
    from rllib_r3l.learner.weight_sync import state_nbytes

    path = resolve_model(model)
    module = R3LCausalLMModule(model_config={"model_id": path, "model_dtype": args.learner_dtype})
    n_params = sum(p.numel() for p in module.parameters())
    options = {}
    if backend == "vllm":
        options = {"weight_bucket_bytes": int(args.bucket_mib) << 20, "max_model_len": 2048}
        if args.gpu:
            options["gpu_memory_utilization"] = args.gpu_memory_utilization
        else:
            options["kv_cache_gib"] = 0.25
    Engine = _engine_actor_cls()
    res = {"num_gpus": 1.0 / args.runners} if args.gpu else {"num_cpus": 0}
    engines = [Engine.options(**res).remote(backend, path, options, args.threads) for _ in range(args.runners)]
    start_s = max(ray.get([e.start_seconds.remote() for e in engines]))

    tok = load_tokenizer(path)
    prompt = tok("You are in the kitchen. Your task: find the coin.", add_special_tokens=False)["input_ids"]
    cont = tok(" go north", add_special_tokens=False)["input_ids"]

    def learner_logprobs():
        with torch.no_grad():
            ids = torch.tensor([prompt + cont])
            lp = torch.log_softmax(module.lm(input_ids=ids).logits[0].float(), -1)
        return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(cont)]

    def max_err() -> float:
        want = learner_logprobs()
        got = ray.get([e.score.remote(prompt, cont) for e in engines])
        return max(abs(a - b) for g in got for a, b in zip(g, want))

    baseline_err = max_err()  # engine dtype/kernels vs the fp32 learner, before any sync
    rows = {"state_s": [], "put_s": [], "update_s": [], "e2e_s": []}
    for rep in range(args.reps):
        with torch.no_grad():  # a different "update" each time
            for p in module.parameters():
                p.add_(torch.randn_like(p) * 1e-3)
        t0 = time.perf_counter()
        state = module.get_state(inference_only=True)
        rows["state_s"].append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        ref = ray.put(state)
        rows["put_s"].append(time.perf_counter() - t1)
        per_engine = ray.get([e.update.remote(ref) for e in engines])
        rows["e2e_s"].append(time.perf_counter() - t1)
        rows["update_s"].append(statistics.median(per_engine))
        del ref
    nbytes = state_nbytes(state.items())
    buckets = ray.get(engines[0].num_buckets.remote(state))

    err = max_err()  # the engines now score like the learner's (perturbed) weights
    for e in engines:
        ray.kill(e)
    med = {k: statistics.median(v) for k, v in rows.items()}
    return {"model": model, "backend": backend, "params_m": n_params / 1e6, "state_mib": nbytes / (1 << 20),
            "buckets": buckets, "runners": args.runners, "engine_start_s": start_s, **med,
            "max_logprob_err": err, "baseline_err": baseline_err}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,default")
    ap.add_argument("--backends", default="vllm")
    ap.add_argument("--runners", type=int, default=1, help="engines (Ray actors) receiving every sync")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bucket-mib", type=int, default=1024, help="vLLM weight_bucket_bytes in MiB")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per engine actor (CPU)")
    ap.add_argument("--learner-dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--gpu", action="store_true", help="engines on GPUs (num_gpus = 1/runners each)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--num-cpus", type=int, default=4)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import ray

    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    results = []
    try:
        for model in args.models.split(","):
            for backend in args.backends.split(","):
                r = run_one(model.strip(), backend.strip(), args)
                results.append(r)
                print(json.dumps(r), flush=True)
    finally:
        ray.shutdown()
    cols = ("model", "backend", "params_m", "state_mib", "buckets", "runners", "state_s", "put_s", "update_s",
            "e2e_s", "max_logprob_err", "baseline_err")
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in results:
        print("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
