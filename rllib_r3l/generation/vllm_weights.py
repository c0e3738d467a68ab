"""Replacing a running vLLM engine's weights in place (the learner -> engine weight sync, paper §4).

:func:`weight_buckets` cuts the learner's weights into buckets of about ``bucket_bytes`` without
splitting a decoder layer (vLLM fuses q/k/v and gate/up inside one); each bucket is loaded on every
worker by :func:`reload_weights_on_worker` through ``collective_rpc``. :mod:`rllib_r3l.learner.weight_sync`
plans the sync; :class:`rllib_r3l.generation.vllm_backend.VLLMBackend` drives it.
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

__all__ = [
    "group_key",
    "weight_buckets",
    "reload_weights_on_worker",
    "abort_weight_update_on_worker",
    "refresh_tied_lm_head",
    "quiet_reload_logs",
]

_LAYER_RE = re.compile(r"^(.*?\.layers\.\d+)\.")
_RELOAD_LOGGERS = (
    "vllm.model_executor.model_loader.reload.inplace",
    "vllm.model_executor.model_loader.reload.layerwise",
    "vllm.model_executor.models.utils",  # "Attempted to load weight ... with dtype ..."
)


def group_key(name: str) -> str:
    """The module whose weights must be reloaded together (vLLM fuses q/k/v and gate/up inside a
    decoder layer, and a layer loaded only in part would be filled with garbage)."""
    m = _LAYER_RE.match(name)
    if m:
        return m.group(1)
    return name.rsplit(".", 1)[0] if "." in name else name


def weight_buckets(
    named_tensors: Iterable[Tuple[str, torch.Tensor]],
    bucket_bytes: Optional[int],
    skip: Sequence[str] = (),
    dtype: Optional[torch.dtype] = None,
) -> List[List[Tuple[str, torch.Tensor]]]:
    """Split weights into buckets of about ``bucket_bytes`` without splitting a decoder layer,
    cast to ``dtype`` (the engine's) when given.

    ``bucket_bytes=None`` or ``<= 0``: one bucket.
    """
    groups: Dict[str, List[Tuple[str, torch.Tensor]]] = {}
    for name, tensor in named_tensors:
        if name in skip:
            continue
        t = tensor.detach()
        if dtype is not None and t.is_floating_point() and t.dtype != dtype:
            t = t.to(dtype)
        groups.setdefault(group_key(name), []).append((name, t))
    if not bucket_bytes or bucket_bytes <= 0:
        flat = [item for g in groups.values() for item in g]
        return [flat] if flat else []
    buckets: List[List[Tuple[str, torch.Tensor]]] = []
    current: List[Tuple[str, torch.Tensor]] = []
    size = 0
    for group in groups.values():
        gsize = sum(t.numel() * t.element_size() for _, t in group)
        if current and size + gsize > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.extend(group)
        size += gsize
    if current:
        buckets.append(current)
    return buckets


@contextlib.contextmanager
def quiet_reload_logs():
    """vLLM warns about every layer a reload does not hold (the tied lm_head, rotary buffers, the
    layers of other buckets; those keep their current values) and about fp32 -> bf16 casts (done by
    the in-place copy): noise here."""
    saved = []
    for name in _RELOAD_LOGGERS:
        lg = logging.getLogger(name)
        saved.append((lg, lg.level))
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in saved:
            lg.setLevel(level)


def reload_weights_on_worker(worker, weights: List[Tuple[str, torch.Tensor]]) -> int:
    """Runs on each vLLM worker (through ``collective_rpc``): reload ``weights`` in place."""
    with quiet_reload_logs():
        reload = getattr(worker, "reload_weights", None)
        if reload is None:
            reload = worker.model_runner.reload_weights
        reload(weights_iterator=iter(weights))
        if any(n.endswith("embed_tokens.weight") for n, _ in weights):
            refresh_tied_lm_head(worker.get_model() if hasattr(worker, "get_model") else worker.model_runner.model)
    return len(weights)


def abort_weight_update_on_worker(worker) -> int:
    """Runs on each vLLM worker (``collective_rpc``): end a weight update that a failed round began and
    did not finish, so the engine serves whole weights and can start the next round. vLLM has no abort:
    a failed ``update_weights`` only clears the worker's flag, a failed sender leaves it set, and either
    way ``start_weight_update``'s layerwise reload stays begun (layers restored on the meta device,
    their loaders wrapped to buffer). Each layer not yet complete drops what it received, so
    ``finalize_layerwise_reload`` puts its kernel tensors back (the weights it had); a layer completed
    in the round keeps the new ones (the caller's fallback reloads every weight). Returns how many
    layers were waiting (0: no round was open)."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    inner = getattr(worker, "worker", worker)  # vLLM's WorkerWrapperBase forwards reads, not writes
    engine = getattr(inner, "weight_transfer_engine", None)
    model = engine.model if engine is not None else inner.model_runner.get_model()
    if engine is not None:
        engine.drain_pending()  # what an engine that defers its processing owes before a finalize
    waiting = [LAYERWISE_INFO[m] for m in model.modules() if m in LAYERWISE_INFO and LAYERWISE_INFO[m].can_load()]
    for info in waiting:
        if info.kernel_tensors is not None:  # a reload (not a first load): the layer keeps what it had
            info.loaded_weights, info.load_numel = [], 0
    if waiting:
        with quiet_reload_logs():  # "Failed to load weights" for each layer put back
            finalize_layerwise_reload(model, engine.model_config if engine is not None else inner.model_config)
    if engine is not None:
        engine.reset_weight_update_target()
        if getattr(engine, "loaded_embedding", False):  # ours: an embedding completed in the round
            refresh_tied_lm_head(model)
    if getattr(inner, "_weight_update_active", False):  # vLLM's flag: set, no round may start or shut down
        inner._weight_update_active = False
    return len(waiting)


def refresh_tied_lm_head(model) -> None:
    """A tied output head shares the embedding's parameter, but a reload post-processes only the
    embedding layer: on CPU the head keeps the packed GEMM copy of the *old* weights (the log-probs
    are then off after an embedding update; tests/generation/test_generation.py checks them). Re-run
    the head's post-processing (both weight-sync paths: this module's and
    :mod:`rllib_r3l.generation.weight_transfer`)."""
    head = getattr(model, "lm_head", None)
    embed = next((m for n, m in model.named_modules() if n.endswith("embed_tokens")), None)
    if head is None or embed is None or getattr(head, "weight", None) is not getattr(embed, "weight", False):
        return
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)  # a no-op for unquantized heads on GPU
