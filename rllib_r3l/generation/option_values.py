"""The values of ``backend_options``: each checked before a model loads (else ``max_batch_size: -1`` makes
the transformers backend return nothing and the run waits forever, ``num_threads: 0`` and ``device: cuda``
on a CPU machine are tracebacks in every runner, and ``--dry-run`` calls them valid).

:func:`value_problem` gives ``""`` or why one option's value cannot work, with the values that can.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

DTYPES = ("auto", "float32", "bfloat16", "float16", "float", "half")  # what vLLM and transformers both read


def _int(low: int, none: bool = False) -> Tuple[Callable[[Any], bool], str]:
    ok = lambda v: (none and v is None) or (isinstance(v, int) and not isinstance(v, bool) and v >= low)  # noqa: E731
    return ok, ("None or " if none else "") + f"an integer >= {low}"


def _number(low: float, high: float = float("inf"), none: bool = False) -> Tuple[Callable[[Any], bool], str]:
    ok = lambda v: (
        (none and v is None)
        or (
            isinstance(v, (int, float))
            and not isinstance(v, bool)  # noqa: E731
            and low < v <= high
        )
    )
    return ok, ("None or " if none else "") + (
        f"a number > {low}" + (f" and <= {high}" if high != float("inf") else "")
    )


def _one_of(values, none: bool = False) -> Tuple[Callable[[Any], bool], str]:
    ok = lambda v: (none and v is None) or (isinstance(v, str) and v in values)  # noqa: E731
    return ok, ("None or " if none else "") + "one of " + ", ".join(repr(v) for v in values)


def _bool(none: bool = False) -> Tuple[Callable[[Any], bool], str]:
    return (lambda v: (none and v is None) or isinstance(v, bool)), ("None, " if none else "") + "True or False"


def _token_ids(v: Any) -> bool:
    return v is None or (
        isinstance(v, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v)
    )


RULES: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "dtype": _one_of(DTYPES, none=True),
    "max_batch_size": _int(1),
    "num_threads": _int(1, none=True),
    "seed": _int(0, none=True),
    "max_model_len": _int(1, none=True),
    "kv_cache_gib": _number(0, none=True),
    "gpu_memory_utilization": _number(0, 1, none=True),
    "tensor_parallel_size": _int(1),
    "max_num_seqs": _int(1, none=True),
    "weight_bucket_bytes": _int(1, none=True),
    "weight_transfer": _one_of(("auto", "off", "nccl", "ipc", "gloo")),
    "enable_prefix_caching": _bool(none=True),
    "enforce_eager": _bool(none=True),
    "enable_sleep_mode": _bool(),
    "compact_json": _bool(),
    "stop_token_ids": (_token_ids, "None or a list of token ids (integers >= 0)"),
    "choice_tokenization": _one_of(("canonical", "any")),
    "engine_kwargs": (lambda v: v is None or isinstance(v, dict), "None or a mapping of vLLM engine arguments"),
}


def value_problem(key: str, value: Any, here: bool = True) -> str:
    """``""``, or why ``value`` cannot work for backend option ``key`` (keys without a rule pass). ``here``: the
    backend runs in this process, so a CUDA device needs a GPU here (a config's runners may run elsewhere)."""
    if key == "device":
        return _device_problem(value, here)
    rule = RULES.get(key)
    if rule is None or rule[0](value):
        return ""
    return f"{key} must be {rule[1]}, got {value!r}"


def _device_problem(value: Any, here: bool) -> str:
    if value is None:
        return ""
    import torch

    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        return f"device must be None (the GPU where there is one), 'cpu' or 'cuda[:N]', got {value!r}"
    if here and device.type == "cuda" and not torch.cuda.is_available():
        return f"device {value!r}: this machine has no CUDA GPU (torch.cuda.is_available() is False); use 'cpu' or None"
    return ""
