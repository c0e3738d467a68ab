"""Weight-sync seconds versus model size, both paths: learner state -> every engine, in place (not a test).

    python benchmarks/weight_sync_benchmark.py                                    # tiny and default, both paths
    python benchmarks/weight_sync_benchmark.py --models default,synthetic:qwen2.5-1.5b --out sync.json
    python benchmarks/weight_sync_benchmark.py --models tiny,default --backends vllm,transformers --paths object_store
    python benchmarks/weight_sync_benchmark.py --models /path/to/Qwen2.5-1.5B-Instruct --runners 2

Each engine lives in its own Ray actor (as in R3LEnvRunner); the learner is in the driver
(``num_learners=0``). Two paths (``--paths``):

* ``object_store`` (the fallback): ``state_s`` the module's ``get_state(inference_only=True)`` (fp32
  CPU tensors), ``put_s`` one ``ray.put``, ``update_s`` ``backend.update_weights`` inside a runner
  (buckets of whole decoder layers through ``collective_rpc``), ``e2e_s`` from ``ray.put`` until every
  engine holds the weights;
* ``transfer`` (the default where vLLM has the API): ``rllib_r3l.learner.weight_sync.send_weights``,
  the learner broadcasting straight into the engines through vLLM's weight-transfer engines (ours over
  gloo on CPU), in the engine's dtype; ``update_s`` the engine's start -> finish, ``e2e_s`` the
  sender's round; ``init_s`` the first round, which opens the group.

``wire_mib`` is what travels (fp32 state or engine-dtype tensors; a tied lm_head is not sent), ``mib_s``
= wire_mib / e2e_s. Real models are checked by scoring (``max_logprob_err`` against ``baseline_err``,
the same difference before any sync); ``synthetic:qwen2.5-1.5b`` is Qwen2.5-1.5B's shapes with random
bf16 weights (the engine loads dummy weights) and is checked by reading tensors back. On it the
object-store path sends the embeddings and the first ``--synthetic-layers`` decoder layers only (the
fp32 state of all 28 would need ~19 GB here: state, object-store copy and the engine's cast) and its
``e2e_s`` is extrapolated to all of them by bytes (``extrapolated_e2e_s``); with ``--paths object_store``
alone the engine itself has only those layers (a dummy-weight engine of the full shapes takes 3 GB).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SYNTHETIC = {
    "qwen2.5-1.5b": dict(  # Qwen2.5-1.5B-Instruct's config.json, the shapes that matter
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        hidden_act="silu",
        max_position_embeddings=32768,
        max_window_layers=28,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
        use_sliding_window=False,
        bos_token_id=151643,
        eos_token_id=151645,
    )
}


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
            self._backend = make_backend(backend, path, **options)
            self.start_s = time.perf_counter() - t0

        def apply(self, func, *args, **kwargs):  # as RLlib's runner actors (weight_sync.RunnerEngines)
            return func(self, *args, **kwargs)

        def start_seconds(self) -> float:
            return self.start_s

        def last_update(self) -> float:
            return self._backend.last_update_seconds

        def update(self, state) -> float:
            from rllib_r3l.learner.rl_module import hf_named_tensors

            t0 = time.perf_counter()
            self._backend.update_weights(hf_named_tensors(state))
            return time.perf_counter() - t0

        def score(self, prompt, cont):
            return self._backend.score(prompt, cont)

        def params(self, names):
            def read(worker):
                model = getattr(worker, "worker", worker).model_runner.get_model()
                own = dict(model.named_parameters())
                return {n: own[n].detach().clone() for n in names}

            return self._backend._llm.collective_rpc(read)[0]

    return Engine


class SyntheticLearner:
    """Random bf16 tensors of a model's HF names and shapes (no forward pass)."""

    def __init__(self, config: dict, layers: Optional[int] = None) -> None:
        """``layers``: only the embeddings, the final norm and that many decoder layers (memory)."""
        import torch
        import transformers

        cfg = transformers.AutoConfig.for_model(**config)
        with torch.device("meta"):
            meta = transformers.AutoModelForCausalLM.from_config(cfg)
        shapes = {
            n: p.shape for n, p in meta.state_dict().items() if not (n == "lm_head.weight" and cfg.tie_word_embeddings)
        }
        self.n_params = sum(math.prod(s) for s in shapes.values())
        gen = torch.Generator().manual_seed(0)
        self.weights = {
            n: (torch.randn(s, generator=gen, dtype=torch.float32) * 0.02).to(torch.bfloat16)
            for n, s in shapes.items()
            if layers is None or _layer(n) < layers
        }

    def object_store_state(self, layers: int) -> dict:
        """The fp32 state of the embeddings, the final norm and the first ``layers`` decoder layers (the
        rest of the bf16 weights is dropped: memory)."""
        self.weights = {n: t for n, t in self.weights.items() if _layer(n) < layers}
        return {"lm." + n: t.float() for n, t in self.weights.items()}


def _layer(name: str) -> int:
    m = re.search(r"\.layers\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def synthetic_dir(name: str, tokenizer_from: str, layers: Optional[int] = None) -> str:
    """A model directory of the shapes (``layers``: only that many decoder layers) for a dummy-weight engine."""
    config = dict(SYNTHETIC[name], **({"num_hidden_layers": layers, "max_window_layers": layers} if layers else {}))
    path = Path(tempfile.gettempdir()) / f"r3l_synthetic_{name}_{config['num_hidden_layers']}"
    path.mkdir(exist_ok=True)
    for f in Path(tokenizer_from).iterdir():  # a tokenizer (ids below the model's vocabulary)
        if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(f, path / f.name)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return str(path)


def transfer_plan(handles, buffer_bytes, sender):
    from rllib_r3l.generation.weight_transfer import choose_backend
    from rllib_r3l.learner import weight_sync as ws

    runner_engines = ws.RunnerEngines(handles)
    infos = [r["value"] for r in runner_engines.call("weight_transfer_info", [()] * len(handles))]
    assert not infos[0]["reason"], infos[0]["reason"]
    offsets, n = [], 1
    for i in infos:
        offsets.append(n)
        n += i["world_size"]
    return ws.TransferPlan(
        uuid.uuid4().hex,
        choose_backend(infos, sender, infos[0]["requested"]),
        runner_engines,
        offsets,
        n,
        infos[0]["dtype"],
        infos[0]["skip"],
        buffer_bytes,
    )


_REAL_PROBE: list = []  # shm_plane.create_probe, put back after a transfer_socket path


def run_one(model: str, backend: str, args) -> list:
    import ray
    import torch

    from rllib_r3l.learner import weight_sync as ws
    from rllib_r3l.learner.engine_state import num_buckets, state_nbytes
    from rllib_r3l.learner.rl_module import hf_named_tensors
    from rllib_r3l.models import load_tokenizer, resolve_model

    synthetic = model.startswith("synthetic:")
    options = {"weight_bucket_bytes": int(args.bucket_mib) << 20, "max_model_len": 512} if backend == "vllm" else {}
    if synthetic:
        # the object-store path alone: an engine of the first --synthetic-layers layers (memory), extrapolated
        only_store = "transfer" not in args.paths.split(",")
        subset = args.synthetic_layers if only_store else None
        path = synthetic_dir(model.split(":", 1)[1], resolve_model("tiny"), subset)
        learner = SyntheticLearner(SYNTHETIC[model.split(":", 1)[1]], subset)
        module, n_params = None, learner.n_params
        options["engine_kwargs"] = {"load_format": "dummy"}
    else:
        from rllib_r3l.learner.rl_module import R3LCausalLMModule

        path = resolve_model(model)
        module = R3LCausalLMModule(model_config={"model_id": path, "model_dtype": args.learner_dtype})
        if args.gpu:
            module.to("cuda")
        n_params = sum(p.numel() for p in module.parameters())
    if backend == "vllm":
        options.update({"gpu_memory_utilization": args.gpu_memory_utilization} if args.gpu else {"kv_cache_gib": 0.25})
    Engine = _engine_actor_cls()
    res = {"num_gpus": 1.0 / args.runners} if args.gpu else {"num_cpus": 0}
    engines = [Engine.options(**res).remote(backend, path, options, args.threads) for _ in range(args.runners)]
    start_s = max(ray.get([e.start_seconds.remote() for e in engines]))
    base = {
        "model": model,
        "backend": backend,
        "params_m": n_params / 1e6,
        "runners": args.runners,
        "engine_start_s": start_s,
    }

    tok = load_tokenizer(path)
    prompt = tok("You are in the kitchen. Your task: find the coin.", add_special_tokens=False)["input_ids"]
    cont = tok(" go north", add_special_tokens=False)["input_ids"]

    def max_err() -> float:
        with torch.no_grad():
            ids = torch.tensor([prompt + cont], device=next(module.parameters()).device)
            lp = torch.log_softmax(module.lm(input_ids=ids).logits[0].float(), -1)
        want = [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(cont)]
        got = ray.get([e.score.remote(prompt, cont) for e in engines])
        return max(abs(a - b) for g in got for a, b in zip(g, want))

    def perturb() -> None:  # a different "update" each time
        if module is not None:
            with torch.no_grad():
                for p in module.parameters():
                    p.add_(torch.randn_like(p) * 1e-3)

    baseline_err = None if synthetic else max_err()
    rows = []
    for path_name in args.paths.split(","):
        if path_name.startswith("transfer") and backend != "vllm":
            continue
        from rllib_r3l.generation import shm_plane

        # transfer_socket: every buffer over the gloo socket, as for engines on other machines
        _REAL_PROBE[:] = _REAL_PROBE or [shm_plane.create_probe]
        shm_plane.create_probe = (lambda *a, **k: None) if path_name == "transfer_socket" else _REAL_PROBE[0]
        t = {"state_s": [], "put_s": [], "update_s": [], "e2e_s": []}
        row = dict(base, path=path_name)
        if path_name == "object_store":
            for _ in range(args.reps):
                perturb()
                t0 = time.perf_counter()
                state = (
                    learner.object_store_state(args.synthetic_layers)
                    if synthetic
                    else module.get_state(inference_only=True)
                )
                t["state_s"].append(time.perf_counter() - t0)
                t1 = time.perf_counter()
                ref = ray.put(state)
                t["put_s"].append(time.perf_counter() - t1)
                t["update_s"].append(statistics.median(ray.get([e.update.remote(ref) for e in engines])))
                t["e2e_s"].append(time.perf_counter() - t1)
                del ref
            row["wire_mib"] = state_nbytes(state.items()) / (1 << 20)
            row["buckets"] = num_buckets(hf_named_tensors(state), options.get("weight_bucket_bytes"))
            if synthetic:  # the whole set's fp32 bytes over the sent part's
                row["extrapolated_e2e_s"] = statistics.median(t["e2e_s"]) * n_params * 4 / (1 << 20) / row["wire_mib"]
            del state
        else:
            cuda = module is not None and next(module.parameters()).is_cuda
            sender = {
                "cuda": cuda,
                "gpu_uuid": str(torch.cuda.get_device_properties(0).uuid) if cuda else None,
                "ranks": 1,
            }
            plan = transfer_plan(engines, args.transfer_buffer_mib << 20 if args.transfer_buffer_mib else None, sender)
            row["engine"] = plan.backend
            named = (
                (lambda: list(learner.weights.items())) if synthetic else (lambda: list(module.hf_state_dict().items()))
            )
            row["init_s"] = ws.send_weights(plan, named())
            for _ in range(args.reps):
                perturb()
                t0 = time.perf_counter()
                items = named()
                t["state_s"].append(time.perf_counter() - t0)
                t["e2e_s"].append(ws.send_weights(plan, items))
                t["update_s"].append(statistics.median(ray.get([e.last_update.remote() for e in engines])))
            dtype = getattr(torch, plan.dtype)
            row["wire_mib"] = sum(
                x.numel() * (dtype.itemsize if x.is_floating_point() else x.element_size())
                for n, x in items
                if n not in plan.skip
            ) / (1 << 20)
            if synthetic:
                names = ["model.embed_tokens.weight", "model.norm.weight", "model.layers.27.input_layernorm.weight"]
                got = ray.get(engines[0].params.remote(names))
                row["exact"] = all(torch.equal(got[n], learner.weights[n].to(dtype)) for n in names)
            ws.close_sender()
        row.update({k: statistics.median(v) if v else None for k, v in t.items()})
        row["mib_s"] = row["wire_mib"] / row["e2e_s"]
        if not synthetic:
            row["max_logprob_err"], row["baseline_err"] = max_err(), baseline_err
        rows.append(row)
        print(json.dumps(row), flush=True)
    for e in engines:
        ray.kill(e)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,default")
    ap.add_argument("--backends", default="vllm")
    ap.add_argument(
        "--paths",
        default="transfer,object_store",
        help="transfer (shared memory where the engines are on this machine), transfer_socket (the "
        "gloo socket only, as for other machines), object_store; synthetic: the object store last",
    )
    ap.add_argument("--runners", type=int, default=1, help="engines (Ray actors) receiving every sync")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bucket-mib", type=int, default=1024, help="vLLM weight_bucket_bytes in MiB (object store)")
    ap.add_argument("--transfer-buffer-mib", type=int, default=0, help="packed buffer (0: 128 MiB CPU, 1 GiB GPU)")
    ap.add_argument("--synthetic-layers", type=int, default=4, help="decoder layers the object-store path sends")
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
    import torch

    from rllib_r3l.cli.run_info import cpu_model

    torch.set_num_threads(args.threads)
    meta = {
        "cpu": cpu_model(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "loadavg_start": os.getloadavg(),
    }
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    results = []
    try:
        for model in args.models.split(","):
            for backend in args.backends.split(","):
                results += run_one(model.strip(), backend.strip(), args)
    finally:
        ray.shutdown()
    meta["loadavg_end"] = os.getloadavg()
    print(json.dumps(meta))
    cols = (
        "model",
        "path",
        "engine",
        "params_m",
        "wire_mib",
        "runners",
        "state_s",
        "put_s",
        "update_s",
        "e2e_s",
        "mib_s",
        "init_s",
        "extrapolated_e2e_s",
        "max_logprob_err",
        "baseline_err",
        "exact",
    )
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in results:
        print(
            "| " + " | ".join(f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r.get(c, "–")) for c in cols) + " |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": results}, indent=1))


if __name__ == "__main__":
    main()
