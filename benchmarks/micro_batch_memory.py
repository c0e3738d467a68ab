"""The learner's peak memory and update time against ``micro_batch_tokens`` (issue 16: peak RSS).

    .venv/bin/python benchmarks/micro_batch_memory.py 4096      # one setting per process (peak RSS is per process)
    .venv/bin/python benchmarks/micro_batch_memory.py 2048

One real R3L learner (SmolLM2-135M-Instruct, fp32 on a CPU without bf16, ``micro_batch_size=4``)
updates twice on a fixed coin-collector-shaped batch: 8 trajectories of 1,200 tokens, 10 responses of
6 credited tokens each, advantages +-1. Prints one ``RESULT`` line: wall and process CPU seconds
per update, peak RSS of the process (GB), micro-batches and forward tokens.
"""
import os, sys, time, json, resource
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
mbt = int(sys.argv[1])
import numpy as np, torch, ray
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
import rllib_r3l  # noqa
from rllib_r3l import R3LConfig
from rllib_r3l.cli.main import find_r3l_metrics
from rllib_r3l.models import resolve_model
path = resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
cfg = R3LConfig().training(model=path, micro_batch_size=4, micro_batch_tokens=mbt, lr=1e-6, backend="transformers")
ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
algo = cfg.build_algo()
B, T = 8, 1200
g = torch.Generator().manual_seed(0)
ids = torch.randint(100, 40000, (B, T), generator=g).numpy().astype(np.int64)
lm = np.zeros((B, T), np.float32)
for i in range(B):
    for t in range(10):  # 10 responses of 6 tokens spread over the episode (like coin collector)
        s = 260 + t * 94
        lm[i, s:s + 6] = 1.0
adv = np.where(np.arange(B) % 2 == 0, 1.0, -1.0).astype(np.float32)
batch = {"input_ids": ids, "attention_mask": np.ones((B, T), np.int64), "loss_mask": lm,
         "sampler_logprobs": np.zeros((B, T), np.float32), "advantages": adv.astype(np.float32),
         "weights": np.ones(B, np.float32), "on_policy": np.ones(B, np.float32), "num_loss_tokens": lm.sum(1)}
times = []
for k in range(2):
    t0, c0 = time.time(), time.process_time()
    res = algo.learner_group.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(batch))}, env_steps=B),
                                    timesteps={}, num_epochs=1, minibatch_size=None)
    r = res[0] if isinstance(res, list) else res
    m = find_r3l_metrics(r, "learner") or {}
    times.append((round(time.time() - t0, 1), round(time.process_time() - c0, 1)))
print("RESULT", json.dumps({"micro_batch_tokens": mbt, "steps_wall_cpu": times, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
                            "micro_batches": str(m.get("micro_batches")), "forward_tokens": str(m.get("forward_tokens"))}), flush=True)
algo.stop(); ray.shutdown()
