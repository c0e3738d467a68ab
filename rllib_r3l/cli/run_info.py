"""What a run is and what it runs on: the facts the console's header shows (paper-independent).

:func:`run_info` reads an ``R3LConfig`` and this machine (CPU model, cores, native bf16, the engine's
dtype and the learner's precision as the backend and learner will resolve them); benchmarks quote
:func:`cpu_model` with every number.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any, Dict, Mapping, Optional

__all__ = ["cpu_model", "engine_dtype", "learner_precision", "run_info", "expected_episodes"]


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo, else lscpu, else platform)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.M)
        if m:
            return m.group(1).strip()
    except (OSError, subprocess.SubprocessError):
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


def engine_dtype(config) -> str:
    """The generation engine's dtype as the backend will resolve it (``backend_options.dtype`` first)."""
    from rllib_r3l.generation import resolve_backend_name

    opts = dict(config.backend_options or {})
    if opts.get("dtype"):
        return str(opts["dtype"])
    if resolve_backend_name(config.backend) == "transformers":
        return "float32"
    if (config.num_gpus_per_env_runner or 0) > 0:
        return "auto (the model's)"
    from rllib_r3l.generation.vllm_engine import cpu_default_dtype

    return cpu_default_dtype()


def learner_precision(config) -> str:
    """``bf16 autocast (fp32 weights)`` or ``fp32``, as the learner resolves ``mixed_precision``."""
    from rllib_r3l.learner.precision import uses_autocast

    device = "cuda" if (config.num_gpus_per_learner or 0) > 0 else "cpu"
    auto = uses_autocast(config.mixed_precision, device)
    weights = config.model_dtype
    weights = "bf16" if weights == "bfloat16" else "fp32"
    return (
        f"bf16 autocast ({weights} weights)" if auto else f"{weights}"
    ) + f", mixed_precision={config.mixed_precision}"


def run_info(config, *, title: str = "R3L", log: Optional[str] = None, verbose: bool = False) -> Dict[str, Any]:
    """What :func:`header_lines` shows, read from ``config`` (an ``R3LConfig``) and this machine."""
    from rllib_r3l.generation import resolve_backend_name
    from rllib_r3l.learner.precision import native_bf16

    reflect = bool(config.reflect)
    r = int(config.retries_per_failure)
    base = config.group_size if not reflect else max(1, config.group_size // (1 + r))
    return {
        "title": title,
        "model": config.model_id,
        "env": str(config.env),
        "env_config": dict(config.env_config or {}),
        "backend": resolve_backend_name(config.backend),
        "engine_dtype": engine_dtype(config),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "native_bf16": native_bf16("cpu"),
        "learner_precision": learner_precision(config),
        "tasks": int(config.tasks_per_iteration),
        "base_per_task": base,
        "max_retries_per_task": base * r if reflect else 0,
        "reflect": reflect,
        "reflect_on": str(config.reflect_on),
        "dynamic_sampling_rounds": int(config.dynamic_sampling_rounds),
        "log": log,
        "verbose": verbose,
    }


def expected_episodes(info: Mapping[str, Any]) -> Optional[int]:
    return int(info["tasks"]) * int(info["base_per_task"]) if info.get("tasks") else None
