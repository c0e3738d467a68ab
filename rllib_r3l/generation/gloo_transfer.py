"""Our CPU weight-transfer engine for vLLM's factories (``"r3l_gloo"``): the life cycle and wire
format of vLLM's NCCL engine over a gloo group, so CPU engines (and GPU engines fed by a CPU learner)
take the path GPU engines take (:mod:`rllib_r3l.generation.weight_transfer` chooses and drives it).

Engine side (each vLLM worker): join the group at rank ``rank_offset + worker rank``; per update
receive the packed buffers (cut by :func:`chunk_plan`, vLLM's ``pack_tensors`` rule), two in flight,
and load each through vLLM's layerwise reload as the NCCL engine does (``start_weight_update`` /
``finish_weight_update``), then refresh a tied output head. Trainer side (rank 0): open the TCP
store, ask the engines to join (the client), join; per round fill reused buffers with one copy per
tensor that also casts it to the wire dtype, broadcast each while the next fills.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, ClassVar, Dict, List

import torch

from rllib_r3l.generation import shm_plane
from rllib_r3l.generation.buffer_plan import chunk_plan, starts
from rllib_r3l.generation.vllm_weights import quiet_reload_logs, refresh_tied_lm_head

GLOO = "r3l_gloo"
CPU_BUFFER_BYTES = 16 << 20  # many buffers a model: packing, sending and loading overlap

__all__ = ["GLOO", "CPU_BUFFER_BYTES", "chunk_plan", "register", "trainer_init_info"]


# ------------------------------------------------------------------------------------------------------
# the gloo engines (dataclasses and classes subclass vLLM's, so they are defined on first use)
_CLASSES: Dict[str, Any] = {}


def _gloo_group(host: str, port: int, rank: int, world_size: int, timeout_s: float, store=None):
    """A gloo group outside torch.distributed's global state (rank 0 hosts the TCP store; the trainer
    opens it first with :func:`_store`, so the engines do not connect into a retry back-off).

    Not vLLM's ``stateless_init_torch_distributed_process_group``: its ``init_gloo_process_group``
    silences fd 1 with ``suppress_stdout`` (``vllm/utils/system_utils.py:58``), which is not
    thread-safe; the trainer and an in-process engine join in two threads of one process, and the
    interleaved save/restore left the process' stdout on /dev/null."""
    from torch.distributed import PrefixStore
    from torch.distributed.distributed_c10d import ProcessGroupGloo

    store = store or _store(host, port, rank, world_size, timeout_s)
    return ProcessGroupGloo(PrefixStore("r3l_weight_transfer", store), rank, world_size, timedelta(seconds=timeout_s))


def _store(host: str, port: int, rank: int, world_size: int, timeout_s: float):
    from torch.distributed import TCPStore

    return TCPStore(
        host, port, world_size, is_master=rank == 0, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
    )


def _broadcast(group, tensor: torch.Tensor):
    from torch.distributed import BroadcastOptions

    opts = BroadcastOptions()
    opts.rootRank = 0
    return group.broadcast([tensor], opts)


def _plan(meta, buffer_bytes: int):
    """``(sizes, chunk plan, bytes of the largest chunk)`` of one round, the same on both ends."""
    sizes = [math.prod(m.shape) * m.dtype.itemsize for m in meta]
    plan = chunk_plan(sizes, buffer_bytes)
    return sizes, plan, max((sum(sizes[i : i + c]) for i, c in zip(starts(plan), plan)), default=0)


def _send_packed(group, pairs, meta, buffer_bytes: int, num_buffers: int, slots: List[torch.Tensor], shm=None):
    """Rank 0's data plane: each buffer (``chunk_plan``) filled by one copy per tensor that also casts it
    to the wire dtype, broadcast while the next one fills; the ``num_buffers`` buffers are kept for the
    next round (``slots``, returned). The receivers cut the stream by the same plan. With ``shm``
    (:class:`~rllib_r3l.generation.shm_plane.ShmSlots`) the buffers are shared files: a filled buffer is
    announced by a header broadcast and free again after an all-reduce the engines join once they have
    copied it out."""
    sizes, plan, need = _plan(meta, buffer_bytes)
    if shm is not None:
        slots = shm.ensure(need)
    elif len(slots) != num_buffers or slots[0].numel() < need:
        slots = [torch.empty(need, dtype=torch.uint8) for _ in range(num_buffers)]
    works: List[Any] = [None] * num_buffers
    headers: List[Any] = []  # kept until their broadcasts complete
    k = 0
    for chunk, (start, count) in enumerate(zip(starts(plan), plan)):
        slot = chunk % num_buffers
        if works[slot] is not None:
            works[slot].wait()
        off, buf = 0, slots[slot]
        for i in range(start, start + count):
            name, t = next(pairs)
            m, k = meta[i], k + 1
            if name != m.name or tuple(t.shape) != tuple(m.shape):
                raise ValueError(f"WeightSource yielded {name!r} {tuple(t.shape)} where metadata() declared {m}")
            dst = buf[off : off + sizes[i]]
            try:
                dst.view(m.dtype).view(m.shape).copy_(t)
            except RuntimeError:  # an offset the wire dtype cannot view
                dst.copy_(t.to(m.dtype).reshape(-1).view(torch.uint8))
            off += sizes[i]
        if shm is None:
            works[slot] = _broadcast(group, buf[:off])
        else:
            header, done = torch.tensor([chunk], dtype=torch.int64), torch.zeros(1)
            headers.append((_broadcast(group, header), (header, done)))
            works[slot] = group.allreduce([done])
    for w in works:
        if w is not None:
            w.wait()
    for w, _t in headers:
        w.wait()
    if next(pairs, None) is not None:
        raise ValueError(f"WeightSource yielded more than the {k} tensors metadata() declared")
    return slots if shm is None else []


def _agree_on_shm(group, sees: bool) -> bool:
    """Every member of the group says whether it can use the shared-memory plane; True only if all can."""
    from torch.distributed import AllreduceOptions, ReduceOp

    flag = torch.tensor([1.0 if sees else 0.0])
    opts = AllreduceOptions()
    opts.reduceOp = ReduceOp.MIN
    group.allreduce([flag], opts).wait()
    return bool(flag.item() == 1.0)


class _OwnsGroup:
    group = None
    shm = None

    def shutdown(self) -> None:
        shm, self.shm = self.shm, None
        if shm is not None:
            shm.close()
        group, self.group = self.group, None
        if group is not None:
            with contextlib.suppress(Exception):
                group.shutdown()


def _classes() -> Dict[str, Any]:
    if _CLASSES:
        return _CLASSES
    from vllm.distributed.weight_transfer.base import (
        TrainerInitInfo,
        TrainerWeightTransferEngine,
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine
    from vllm.distributed.weight_transfer.packed_tensor import unpack_tensor

    @dataclass
    class GlooInitInfo(WeightTransferInitInfo):
        master_address: str
        master_port: int
        rank_offset: int
        world_size: int
        buffer_bytes: int = CPU_BUFFER_BYTES
        num_buffers: int = 2
        timeout_s: float = 600.0
        shm_token: str = ""  # the sender's shared-memory probe (shm_plane.py); "" = gloo only

    @dataclass
    class GlooUpdateInfo(WeightTransferUpdateInfo):  # as vLLM's NCCL update info
        names: List[str]
        dtype_names: List[str]
        shapes: List[List[int]]

    @dataclass
    class GlooTrainerInitInfo(TrainerInitInfo):
        backend: ClassVar[str] = GLOO
        master_address: str
        master_port: int
        world_size: int
        buffer_bytes: int = CPU_BUFFER_BYTES
        num_buffers: int = 2
        timeout_s: float = 600.0
        shared_memory: bool = True  # the shm_plane.py data plane where every engine is on this machine

    class GlooWeightTransferEngine(_OwnsGroup, WeightTransferEngine):
        """Engine side: receive packed buffers from rank 0, load them through the layerwise reload."""

        init_info_cls = GlooInitInfo
        update_info_cls = GlooUpdateInfo

        def __init__(self, config, vllm_config, device, model) -> None:
            super().__init__(config, vllm_config, device, model)
            self.group = None
            self.buffer_bytes, self.num_buffers = CPU_BUFFER_BYTES, 2
            self.loaded_embedding = False

        def init_transfer_engine(self, init_info) -> None:
            self.shutdown()  # a re-opened group replaces the old one
            pc = self.parallel_config  # this worker's rank, as vLLM's NCCL engine computes it
            rank = pc.data_parallel_index * pc.world_size + pc.rank + init_info.rank_offset
            self.buffer_bytes, self.num_buffers = init_info.buffer_bytes, init_info.num_buffers
            self.group = _gloo_group(
                init_info.master_address, init_info.master_port, rank, init_info.world_size, init_info.timeout_s
            )
            if _agree_on_shm(self.group, shm_plane.sees_probe(init_info.shm_token)):
                self.shm = shm_plane.ShmSlots(init_info.shm_token, self.num_buffers, owner=False)

        def start_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            self.loaded_embedding = False
            initialize_layerwise_reload(self.model)

        def update_weights(self, update_info: Dict[str, Any]) -> None:
            # vLLM's base class ends with torch.accelerator.synchronize(), which raises on CPU
            self.receive_weights(self.parse_update_info(update_info))
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        def receive_weights(self, update_info) -> None:
            if self.group is None:
                raise RuntimeError("gloo weight transfer not initialized: call init_transfer_engine() first")
            dtypes = [getattr(torch, d) for d in update_info.dtype_names]
            sizes = [math.prod(s) * d.itemsize for s, d in zip(update_info.shapes, dtypes)]
            if self.shm is not None:
                return self._receive_shm(update_info, dtypes, sizes)
            pending: deque = deque()
            start = 0
            with quiet_reload_logs():
                for count in chunk_plan(sizes, self.buffer_bytes):
                    sl = slice(start, start + count)
                    start += count
                    buf = torch.empty(sum(sizes[sl]), dtype=torch.uint8)
                    pending.append((_broadcast(self.group, buf), buf, sl))
                    if len(pending) >= self.num_buffers:
                        self._load(*pending.popleft(), update_info, dtypes, sizes)
                while pending:
                    self._load(*pending.popleft(), update_info, dtypes, sizes)

        def _receive_shm(self, info, dtypes, sizes) -> None:
            """Per buffer: wait for its header, copy it out of the shared file, release it (the all-reduce
            the sender waits on before filling it again), then load the copy."""
            plan = chunk_plan(sizes, self.buffer_bytes)
            need = max((sum(sizes[i : i + c]) for i, c in zip(starts(plan), plan)), default=0)
            released = []
            with quiet_reload_logs():
                for chunk, (start, count) in enumerate(zip(starts(plan), plan)):
                    header = torch.zeros(1, dtype=torch.int64)
                    _broadcast(self.group, header).wait()
                    if int(header.item()) != chunk:
                        raise RuntimeError(
                            f"shared-memory weight transfer out of step: buffer {int(header.item())} "
                            f"announced where {chunk} was expected"
                        )
                    sl = slice(start, start + count)
                    buf = self.shm.ensure(need)[chunk % self.num_buffers][: sum(sizes[sl])].clone()
                    done = torch.zeros(1)
                    released.append((self.group.allreduce([done]), done))
                    self._load(None, buf, sl, info, dtypes, sizes)
            for work, _t in released:
                work.wait()

        def _load(self, work, buf, sl, info, dtypes, sizes) -> None:
            if work is not None:
                work.wait()
            names = info.names[sl]
            tensors = unpack_tensor(buf, names, info.shapes[sl], dtypes[sl], sizes[sl])
            self.loaded_embedding |= any(n.endswith("embed_tokens.weight") for n in names)
            self.model.load_weights(tensors)

        def finish_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            with quiet_reload_logs():
                finalize_layerwise_reload(self.model, self.model_config)
            if self.loaded_embedding:
                refresh_tied_lm_head(self.model)

    class GlooTrainerWeightTransferEngine(_OwnsGroup, TrainerWeightTransferEngine):
        """Trainer side (rank 0 sends): the NCCL trainer engine's round trip over gloo."""

        init_info_cls = GlooTrainerInitInfo

        def __init__(self, *, client, source, is_sender=True, buffer_bytes=CPU_BUFFER_BYTES, num_buffers=2):
            super().__init__(client=client, source=source, is_sender=is_sender)
            self.buffer_bytes, self.num_buffers = buffer_bytes, num_buffers
            self.group, self.slots = None, []

        @classmethod
        def trainer_init(cls, init_info, *, client, source=None):
            if source is None:
                raise ValueError("the gloo trainer engine needs a WeightSource")
            engine = cls(
                client=client,
                source=source,
                is_sender=init_info.is_sender,
                buffer_bytes=init_info.buffer_bytes,
                num_buffers=init_info.num_buffers,
            )
            if not engine.is_sender:
                return engine
            # the store binds first (master_port 0: a port the OS picks, no race with other processes)
            store = _store(
                init_info.master_address, init_info.master_port, 0, init_info.world_size, init_info.timeout_s
            )
            shm_plane.sweep()
            token = shm_plane.create_probe() if init_info.shared_memory else None
            worker_info = GlooInitInfo(
                master_address=init_info.master_address,
                master_port=store.port,
                rank_offset=1,
                world_size=init_info.world_size,
                buffer_bytes=init_info.buffer_bytes,
                num_buffers=init_info.num_buffers,
                timeout_s=init_info.timeout_s,
                shm_token=token or "",
            )
            try:
                with ThreadPoolExecutor(max_workers=1) as exe:  # the workers block in the rendezvous
                    future = exe.submit(client.init_weight_transfer_engine, asdict(worker_info))
                    engine.group = _gloo_group(
                        init_info.master_address, store.port, 0, init_info.world_size, init_info.timeout_s, store=store
                    )
                    if _agree_on_shm(engine.group, token is not None):  # every engine reads the probe
                        engine.shm = shm_plane.ShmSlots(token, init_info.num_buffers, owner=True)
                    future.result()
            finally:
                shm_plane.remove_probe(token)
            return engine

        def send_weights(self) -> None:
            meta = self.source.metadata()
            if not self.is_sender:
                for _ in self.source:
                    pass
                return
            info = GlooUpdateInfo(
                names=[m.name for m in meta],
                dtype_names=[str(m.dtype).split(".")[-1] for m in meta],
                shapes=[list(m.shape) for m in meta],
            )
            self.client.start_weight_update()
            exe = ThreadPoolExecutor(max_workers=1)
            try:  # the engines receive (update_weights) while this thread broadcasts
                future = exe.submit(self.client.update_weights, asdict(info))
                self._broadcast(meta)
                future.result()
            finally:
                exe.shutdown(wait=False)  # a failed broadcast leaves the receivers blocked: do not join
            self.client.finish_weight_update()

        def _broadcast(self, meta) -> None:
            raw = getattr(self.source, "raw", None)  # uncast: the cast happens in the copy into the buffer
            pairs = raw() if raw else NCCLTrainerWeightTransferEngine._checked_iter(self.source, meta)
            self.slots = _send_packed(
                self.group, pairs, meta, self.buffer_bytes, self.num_buffers, self.slots, shm=self.shm
            )

    _CLASSES.update(
        GlooInitInfo=GlooInitInfo,
        GlooUpdateInfo=GlooUpdateInfo,
        GlooTrainerInitInfo=GlooTrainerInitInfo,
        GlooWeightTransferEngine=GlooWeightTransferEngine,
        GlooTrainerWeightTransferEngine=GlooTrainerWeightTransferEngine,
    )
    return _CLASSES


def register() -> None:
    """Register the gloo engines in vLLM's two factories (idempotent; needed in every process that
    builds one: the learner's and each engine worker's)."""
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory, WeightTransferTrainerFactory

    c = _classes()
    if GLOO not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(GLOO, c["GlooWeightTransferEngine"])
    if GLOO not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(GLOO, c["GlooTrainerWeightTransferEngine"])


def trainer_init_info(
    *,
    master_address: str,
    master_port: int,
    world_size: int,
    buffer_bytes=None,
    timeout_s: float = 600.0,
    shared_memory: bool = True,
):
    """The trainer's init info (vLLM's ``WeightTransferTrainerFactory`` dispatches on its ``backend``)."""
    register()
    return _classes()["GlooTrainerInitInfo"](
        master_address=master_address,
        master_port=master_port,
        world_size=world_size,
        buffer_bytes=buffer_bytes or CPU_BUFFER_BYTES,
        timeout_s=timeout_s,
        shared_memory=shared_memory,
        rank=0,
    )
