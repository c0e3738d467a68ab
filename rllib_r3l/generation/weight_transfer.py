"""The learner -> engine weight sync through vLLM's weight-transfer engine API
(``vllm.distributed.weight_transfer``), with a CPU engine of our own registered in its factory.

The API (vLLM 0.32) as used here:

* engine side: each vLLM worker holds a ``WeightTransferEngine`` (``WeightTransferEngineFactory``
  builds it by backend name) and exposes ``init_weight_transfer_engine(init_info)``,
  ``start_weight_update()``, ``update_weights(update_info)``, ``finish_weight_update()`` and
  ``shutdown_weight_transfer_engine()``; ``vllm.LLM`` forwards each to every worker through
  ``collective_rpc`` (``entrypoints/rl/offline.py``).
* trainer side: ``WeightTransferTrainerFactory.trainer_init(init_info, client=, source=)`` opens the
  trainer's end (rank 0) while the ``client`` (any object with the four control-plane methods) asks
  the engines to join; ``send_weights()`` then runs start -> update (workers receive, concurrently
  with the trainer's broadcast) -> finish. ``source`` is a ``WeightSource``: ``metadata()`` (name,
  wire dtype, shape) and a fresh ``(name, tensor)`` stream per round.

GPU: vLLM's own ``"nccl"`` engines (one PyNccl broadcast from the trainer, packed 1 GiB buffers), or
its ``"ipc"`` engines when the one engine, in another process, shares the learner's GPU; an engine whose
workers run in the learner's own process (the default layout) takes no transfer engine: ``"direct"``, the
learner's tensors loaded in place (:func:`choose_backend`; CUDA IPC is built to cross processes).
CPU: vLLM's engines cannot run there (``base.py:502`` ``torch.accelerator.synchronize()`` and
``nccl_common.py:203`` ``torch.accelerator.current_device_index()`` raise without an accelerator,
``packed_tensor.py:24`` builds ``torch.cuda.Stream``s, the IPC engine rebuilds CUDA IPC handles), so
:mod:`rllib_r3l.generation.gloo_transfer` registers ``"r3l_gloo"``: the same life cycle and wire
format over a gloo group. It also serves GPU engines whose sender has no GPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

from rllib_r3l.generation.gloo_transfer import GLOO, chunk_plan, register

logger = logging.getLogger(__name__)

NCCL = "nccl"
IPC = "ipc"
DIRECT = "direct"  # no transfer engine: the engine's workers share the sender's process and load its tensors
GPU_BUFFER_BYTES = 1 << 30  # vLLM's default

__all__ = [
    "GLOO",
    "NCCL",
    "IPC",
    "DIRECT",
    "api_missing_reason",
    "choose_backend",
    "engine_info",
    "register",
    "install_on_worker",
    "leave_transfer_group",
    "StateSource",
    "trainer_init",
    "chunk_plan",
]


def api_missing_reason() -> Optional[str]:
    """None when this vLLM has the weight-transfer engine API; else why not (one line)."""
    try:
        import vllm
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory  # noqa: F401
    except ImportError as e:
        return f"vllm.distributed.weight_transfer is not importable ({e})"
    missing = [
        m
        for m in ("init_weight_transfer_engine", "start_weight_update", "update_weights", "finish_weight_update")
        if not hasattr(vllm.LLM, m)
    ]
    return f"vllm.LLM lacks {', '.join(missing)}" if missing else None


def engine_info(backend: Any, parallel_config: Any, in_process: bool = False) -> Dict[str, Any]:
    """A ``VLLMBackend``'s ``weight_transfer_info``: why not (None: the API is there), its device(s),
    dtype (the wire dtype), workers, what not to send (a tied head), the group it is in, and the
    process it runs in (``pid``) with whether its workers run there too (``in_process``)."""
    off = backend.weight_transfer == "off"
    uuids = (
        []
        if backend.on_cpu
        else [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]
    )
    return {
        "reason": "backend_options.weight_transfer='off'" if off else api_missing_reason(),
        "requested": backend.weight_transfer,
        "device": "cpu" if backend.on_cpu else "cuda",
        "gpu_uuids": uuids,
        "dtype": str(backend.dtype).split(".")[-1],
        "session": backend.transfer_session,
        "world_size": int(parallel_config.world_size * parallel_config.data_parallel_size),
        "skip": ["lm_head.weight"] if backend.tie_word_embeddings else [],
        "pid": os.getpid(),
        "in_process": bool(in_process),
    }


def choose_backend(engines: Sequence[Dict[str, Any]], sender: Dict[str, Any], requested: str = "auto") -> str:
    """Which engine moves the weights, from each engine's ``weight_transfer_info`` and the sender's
    ``{"cuda", "gpu_uuid", "ranks", "pid"}``: none (``"direct"``: the engine loads the sender's tensors in
    place) when every engine is on a GPU with its workers in the sender's process (vLLM's IPC engine
    exports CUDA IPC handles for another process to open; NCCL would need two ranks in one process);
    else vLLM's ``"ipc"`` when the only engine (one worker) shares the sender's GPU (NCCL refuses two
    ranks on one device), vLLM's ``"nccl"`` when the engines are on other GPUs, ours over gloo otherwise
    (CPU engines, a CPU learner, a mix). A CPU engine in the sender's process keeps ours over gloo
    (the measured CPU path: shared memory, the cast overlapped with the engine's loading)."""
    if requested not in ("auto", NCCL, IPC, GLOO):
        raise ValueError(
            f"backend_options.weight_transfer must be 'auto', 'off', {NCCL!r}, {IPC!r} or {GLOO!r}; got {requested!r}"
        )
    if requested != "auto":
        return requested
    pid = sender.get("pid")
    if pid is not None and engines and all(e.get("in_process") and e.get("pid") == pid for e in engines):
        if all(e["device"] == "cuda" for e in engines):
            return DIRECT
    if not sender.get("cuda") or any(e["device"] != "cuda" for e in engines):
        return GLOO
    shared = [e for e in engines if sender.get("gpu_uuid") in e.get("gpu_uuids", ())]
    if not shared:
        return NCCL
    if len(engines) == 1 and engines[0]["world_size"] == 1 and sender.get("ranks", 1) == 1:
        return IPC
    return GLOO


def install_on_worker(worker, backend: str) -> str:
    """Runs on each vLLM worker (``collective_rpc``): give it a weight-transfer engine of ``backend``
    unless it has one (an engine built with ``weight_transfer_config`` already does)."""
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory

    register()
    inner = getattr(worker, "worker", worker)  # vLLM's WorkerWrapperBase forwards reads, not writes
    current = getattr(inner, "weight_transfer_engine", None)
    if current is not None and current.config.backend == backend:
        return backend
    if current is not None:
        current.shutdown()
    inner.weight_transfer_engine = WeightTransferEngineFactory.create_engine(
        WeightTransferConfig(backend=backend), inner.vllm_config, inner.device, inner.model_runner.get_model()
    )
    return backend


def leave_transfer_group(llm) -> int:
    """An engine (``vllm.LLM``) leaves its transfer group: a round begun and not finished (a failed one,
    before the caller's fallback) is aborted on every worker first
    (:func:`~rllib_r3l.generation.vllm_weights.abort_weight_update_on_worker`), then vLLM's
    ``shutdown_weight_transfer_engine``. Returns the layers the abort put back (on all workers)."""
    from rllib_r3l.generation.vllm_weights import abort_weight_update_on_worker

    if llm is None:  # a closed engine
        return 0
    aborted = 0
    try:
        aborted = sum(llm.collective_rpc(abort_weight_update_on_worker))
    except Exception as e:  # noqa: BLE001 - the engine may be gone; the fallback reloads every weight
        logger.warning("could not abort the weight update a failed round began: %s", e)
    if aborted:
        logger.info("weight sync: the failed round's layerwise reload aborted (%d layers kept their weights)", aborted)
    with contextlib.suppress(Exception):
        llm.shutdown_weight_transfer_engine()
    return aborted


def trainer_init(
    backend: str,
    *,
    client,
    source,
    master_address: str,
    master_port: int,
    world_size: int,
    buffer_bytes: Optional[int] = None,
    timeout_s: float = 600.0,
):
    """The trainer's end (rank 0) of a new transfer group, through vLLM's trainer factory."""
    from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

    if backend == NCCL:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        info = NCCLTrainerInitInfo(
            master_address=master_address,
            master_port=master_port,
            world_size=world_size,
            packed=True,
            packed_buffer_size_bytes=buffer_bytes or GPU_BUFFER_BYTES,
            rank=0,
        )
    elif backend == IPC:  # no rendezvous: CUDA IPC handles of packed buffers on the shared GPU
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        info = IPCTrainerInitInfo(packed=True, packed_buffer_size_bytes=buffer_bytes or GPU_BUFFER_BYTES, rank=0)
    else:
        from rllib_r3l.generation.gloo_transfer import trainer_init_info

        info = trainer_init_info(
            master_address=master_address,
            master_port=master_port,
            world_size=world_size,
            buffer_bytes=buffer_bytes,
            timeout_s=timeout_s,
        )
    return WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)


class StateSource:
    """vLLM's ``WeightSource`` protocol (``metadata()`` and a fresh stream per pass; duck-typed, as the
    NCCL and gloo trainer engines use nothing else) over a learner's HF-named weights, cast to the engines' dtype (the
    wire dtype)
    on ``device`` (CUDA for NCCL). ``refresh(named_tensors)`` sets this round's weights; ``release()``
    drops them. Skipped names (a tied ``lm_head.weight``) are not sent."""

    def __init__(self, dtype: torch.dtype, device: str = "cpu", skip: Iterable[str] = ()) -> None:
        self.dtype, self.device, self.skip = dtype, torch.device(device), set(skip)
        self._items: List[Tuple[str, torch.Tensor]] = []

    def refresh(self, named_tensors: Iterable[Tuple[str, torch.Tensor]]) -> "StateSource":
        self._items = [(n, t) for n, t in named_tensors if n not in self.skip]
        return self

    def release(self) -> None:
        self._items = []

    def _wire_dtype(self, t: torch.Tensor) -> torch.dtype:
        return self.dtype if t.is_floating_point() else t.dtype

    def metadata(self):
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(n, self._wire_dtype(t), tuple(t.shape)) for n, t in self._items]

    def nbytes(self) -> int:
        return sum(t.numel() * self._wire_dtype(t).itemsize for _, t in self._items)

    def __iter__(self) -> Iterator[Tuple[str, torch.Tensor]]:
        for n, t in self._items:
            yield n, t.detach().to(device=self.device, dtype=self._wire_dtype(t))

    def raw(self) -> Iterator[Tuple[str, torch.Tensor]]:
        """The same stream uncast (the gloo engine casts while it packs: one pass, no temporary)."""
        return ((n, t.detach()) for n, t in self._items)
