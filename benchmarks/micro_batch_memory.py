"""The learner's peak memory and update time against ``micro_batch_tokens`` (issue 16: peak RSS).

    .venv/bin/python benchmarks/micro_batch_memory.py 4096      # one setting per process (peak RSS is per process)
    .venv/bin/python benchmarks/micro_batch_memory.py 2048

One real R3L learner (SmolLM2-135M-Instruct, fp32 on a CPU without bf16, ``micro_batch_size=4``)
updates twice on a fixed coin-collector-shaped batch: 8 trajectories of 1,200 tokens, 10 responses of
6 credited tokens each, advantages +-1. Prints one ``RESULT`` line: wall and process CPU seconds
per update, peak RSS of the process (GB), micro-batches and forward tokens.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def coin_batch(rows: int = 8, length: int = 1200) -> Dict[str, Any]:
    """The fixed batch: random token ids, 10 credited responses of 6 tokens a row (like coin collector)."""
    import numpy as np
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40000, (rows, length), generator=g).numpy().astype(np.int64)
    lm = np.zeros((rows, length), np.float32)
    for i in range(rows):
        for t in range(10):  # 10 responses of 6 tokens spread over the episode
            s = 260 + t * 94
            lm[i, s : s + 6] = 1.0
    adv = np.where(np.arange(rows) % 2 == 0, 1.0, -1.0).astype(np.float32)
    return {
        "input_ids": ids,
        "attention_mask": np.ones((rows, length), np.int64),
        "loss_mask": lm,
        "sampler_logprobs": np.zeros((rows, length), np.float32),
        "advantages": adv,
        "weights": np.ones(rows, np.float32),
        "on_policy": np.ones(rows, np.float32),
        "num_loss_tokens": lm.sum(1),
    }


def measure(micro_batch_tokens: int, updates: int = 2, model: str = MODEL) -> Dict[str, Any]:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    import rllib_r3l  # noqa: F401  (registers R3L)
    from rllib_r3l import R3LConfig
    from rllib_r3l.cli.main import find_r3l_metrics
    from rllib_r3l.models import resolve_model

    cfg = R3LConfig().training(
        model=resolve_model(model),
        micro_batch_size=4,
        micro_batch_tokens=micro_batch_tokens,
        lr=1e-6,
        backend="transformers",
    )
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    algo = cfg.build_algo()
    batch = coin_batch()
    times: List[tuple] = []
    m: Dict[str, Any] = {}
    try:
        for _ in range(updates):
            t0, c0 = time.time(), time.process_time()
            res = algo.learner_group.update(
                batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(dict(batch))}, env_steps=len(batch["input_ids"])),
                timesteps={},
                num_epochs=1,
                minibatch_size=None,
            )
            m = find_r3l_metrics(res[0] if isinstance(res, list) else res, "learner") or {}
            times.append((round(time.time() - t0, 1), round(time.process_time() - c0, 1)))
    finally:
        algo.stop()
        ray.shutdown()
    return {
        "micro_batch_tokens": micro_batch_tokens,
        "steps_wall_cpu": times,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        **{k: _value(m.get(k)) for k in ("micro_batches", "forward_tokens")},
    }


def _value(v: Any) -> Any:
    """A learner metric's number (RLlib's stats objects: their ``peek()``)."""
    v = v.peek() if hasattr(v, "peek") else v
    return v if isinstance(v, (int, float)) or v is None else str(v)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("micro_batch_tokens", type=int, help="the learner's micro_batch_tokens (one setting a process)")
    ap.add_argument("--updates", type=int, default=2)
    ap.add_argument("--model", default=MODEL, help="the learner's model (tiny: a smoke run)")
    args = ap.parse_args(argv)
    harness.emit_result(measure(args.micro_batch_tokens, args.updates, args.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
