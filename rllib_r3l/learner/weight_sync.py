"""Weight sync from the learner to the generation engines (paper K.1: S = 1, after every update).

Two paths. **Transfer engines** (:class:`WeightTransferSync`, the default wherever the engines' vLLM
has the weight-transfer engine API)::

    learner rank 0: its live weights (HF names; LoRA: merged, DeepSpeed: gathered), cast to the
                    engines' dtype, packed into buffers, broadcast to every engine worker
                    (vLLM's NCCL or IPC engine on GPU; ours over gloo on CPU:
                    rllib_r3l.generation.weight_transfer); no driver, no object store
    every worker:   receives and loads through vLLM's layerwise reload; prefix cache reset
    (an engine on a GPU with its workers in the learner's process, the default layout: no transfer
    engine, its workers load the learner's tensors in place, ``VLLMBackend.load_weights_in_place``)

**Object store** (the fallback, chosen once with one log line saying why): the learner's
``get_state(inference_only=True)`` goes through the driver's ``ray.put`` to every runner, whose engine
reloads it in buckets of whole decoder layers; LoRA sends merged layers. What is sent, and how it is
bucketed: :mod:`rllib_r3l.learner.engine_state`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from rllib_r3l import ray_internals

logger = logging.getLogger(__name__)

__all__ = ["WeightTransferSync", "sync_weights_via_transfer", "send_weights"]


# ------------------------------------------------------------------------------------------------------
# vLLM's weight-transfer engines: learner rank 0 broadcasts straight into every engine worker (no
# driver, no object store), in the engine's dtype, in packed buffers
# (rllib_r3l.generation.weight_transfer). The object store (engine_state) stays the fallback, chosen once.
# ------------------------------------------------------------------------------------------------------
def _on_engine(backend: Any, method: str, args: tuple) -> Dict[str, Any]:
    """One control-plane call on an engine; never raises (RLlib's ``apply`` kills a runner that does)."""
    if backend is None:
        return {"error": "engine not started", "not_ready": True}
    fn = getattr(backend, method, None)
    if fn is None:
        return {
            "error": f"the {getattr(backend, 'name', type(backend).__name__)} backend has no weight-transfer API",
            "unsupported": True,
        }
    try:
        return {"value": fn(*args)}
    except Exception:  # noqa: BLE001 - reported to the trainer, which falls back
        return {"error": traceback.format_exc()}


def _on_runner(runner: Any, method: str, args: tuple) -> Dict[str, Any]:
    out = _on_engine(getattr(runner, "_backend", None), method, args)
    keeper = getattr(runner, "_keeper", None)
    if method == "finish_weight_update" and "error" not in out and keeper is not None:
        keeper.engine_moved_on()  # a rebuilt engine could not get these weights from the runner
    return out


class LocalEngines:
    """Engines in this process (the main job's runner, tests): each call on all of them in threads (a
    transfer group's members must join and receive together), one call at a time, as a runner actor
    takes them: a failed round's receive, left running by the sender, ends before the shutdown after it."""

    in_process = True

    def __init__(self, backends: Sequence[Any]) -> None:
        self.backends = list(backends)
        self.one_at_a_time = threading.Lock()

    def call(self, method: str, per_engine_args: Sequence[tuple]) -> List[Dict[str, Any]]:
        with self.one_at_a_time, ThreadPoolExecutor(max_workers=len(self.backends)) as exe:
            return list(exe.map(lambda ba: _on_engine(ba[0], method, ba[1]), zip(self.backends, per_engine_args)))


class RunnerEngines:
    """The engines of remote env runners, through their actor handles (picklable: a learner actor
    that sends uses it too)."""

    in_process = False

    def __init__(self, handles: Sequence[Any]) -> None:
        self.handles = list(handles)

    def call(self, method: str, per_engine_args: Sequence[tuple]) -> List[Dict[str, Any]]:
        import ray

        return ray.get([h.apply.remote(_on_runner, method, a) for h, a in zip(self.handles, per_engine_args)])


@dataclass
class TransferPlan:
    """One transfer group: what the sender (wherever it runs) needs to open and feed it."""

    session: str
    backend: str
    engines: Any  # LocalEngines | RunnerEngines
    rank_offsets: List[int]  # of each engine's first worker, after the trainer's rank 0
    world_size: int
    dtype: str
    skip: List[str]
    buffer_bytes: Optional[int] = None


class EngineClient:
    """vLLM's ``VLLMWeightSyncClient`` (four control-plane calls) over several independent engines:
    each engine's workers get their own ranks in the one group."""

    def __init__(self, plan: TransferPlan) -> None:
        self.plan = plan

    def _all(self, method: str, per_engine_args: Optional[Sequence[tuple]] = None) -> List[Any]:
        args = per_engine_args or [()] * len(self.plan.rank_offsets)
        out = self.plan.engines.call(method, args)
        errors = [r["error"] for r in out if "error" in r]
        if errors:
            raise RuntimeError(f"{method} failed on {len(errors)} engine(s):\n{errors[0]}")
        return [r["value"] for r in out]

    def init_weight_transfer_engine(self, init_info: Dict[str, Any]) -> None:
        per_engine = [
            dict(init_info, rank_offset=off) if "rank_offset" in init_info else init_info
            for off in self.plan.rank_offsets
        ]  # (IPC has no ranks)
        self._all("init_weight_transfer", [(self.plan.backend, info, self.plan.session) for info in per_engine])

    def start_weight_update(self) -> None:
        self._all("start_weight_update")

    def update_weights(self, update_info: Dict[str, Any]) -> None:
        self._all("receive_weights", [(update_info,)] * len(self.plan.rank_offsets))

    def finish_weight_update(self, weight_version: Optional[str] = None) -> None:
        self._all("finish_weight_update")

    def shutdown_weight_transfer_engine(self) -> None:
        self.plan.engines.call("shutdown_weight_transfer", [()] * len(self.plan.rank_offsets))


_SENDER: Dict[str, Any] = {}  # this process' open trainer engine: {"session", "engine", "source"}


def close_sender() -> None:
    if _SENDER:
        with contextlib.suppress(Exception):
            _SENDER["engine"].shutdown()
        _SENDER.clear()


def send_weights(plan: TransferPlan, named_tensors: Iterable[Tuple[str, torch.Tensor]]) -> float:
    """Rank 0's send: opens the plan's transfer group on first use (vLLM's trainer factory), then one
    full round (start, broadcast while the engines receive, finish). Returns the seconds it took.
    ``"direct"``: no group, the engines in this process load the tensors (:func:`load_in_process`)."""
    from rllib_r3l.generation import weight_transfer as wt

    t0 = time.perf_counter()
    if plan.backend == wt.DIRECT:
        load_in_process(plan, named_tensors)
        return time.perf_counter() - t0
    if _SENDER.get("session") != plan.session:
        close_sender()
        source = wt.StateSource(getattr(torch, plan.dtype), "cpu" if plan.backend == wt.GLOO else "cuda", plan.skip)
        host = "127.0.0.1" if plan.engines.in_process else _node_ip()
        from vllm.utils.network_utils import get_open_port

        port = 0 if plan.backend == wt.GLOO else get_open_port()  # gloo: the OS picks one as the store binds
        engine = wt.trainer_init(
            plan.backend,
            client=EngineClient(plan),
            source=source,
            master_address=host,
            master_port=port,
            world_size=plan.world_size,
            buffer_bytes=plan.buffer_bytes,
        )
        _SENDER.update(session=plan.session, engine=engine, source=source)
    source = _SENDER["source"].refresh(named_tensors)
    try:
        _SENDER["engine"].send_weights()
    except BaseException:
        close_sender()
        raise
    finally:
        source.release()
    return time.perf_counter() - t0


def load_in_process(plan: TransferPlan, named_tensors: Iterable[Tuple[str, torch.Tensor]]) -> None:
    """The ``"direct"`` plan: engines whose workers share this process load the learner's tensors in
    place (``VLLMBackend.load_weights_in_place``: vLLM's layerwise reload, the prefix cache reset), as they
    are (the copy into the parameters casts); no transfer engine, no packing, no CUDA IPC handles. Each
    engine then counts as in the plan's session (a rebuilt one is not, and re-opens the plan)."""
    if not plan.engines.in_process:
        raise RuntimeError("the 'direct' weight sync needs the engines in the sender's process")
    named = list(named_tensors)
    out = plan.engines.call("load_weights_in_place", [(named, plan.session)] * len(plan.engines.backends))
    errors = [r["error"] for r in out if "error" in r]
    if errors:
        raise RuntimeError(f"load_weights_in_place failed on {len(errors)} engine(s):\n{errors[0]}")


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def learner_weights(learner: Any) -> List[Tuple[str, torch.Tensor]]:
    """The engines' weights from one learner, HF names: the live parameters (no copy), or, with LoRA
    or DeepSpeed, what the learner's ``get_state(inference_only=True)`` syncs (merged / gathered)."""
    from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID

    module = learner.module[DEFAULT_MODULE_ID]
    module = module.unwrapped() if hasattr(module, "unwrapped") else module
    if getattr(module, "lora", None) or hasattr(learner, "_gathered") or not hasattr(module, "hf_state_dict"):
        state = learner.get_state(components=COMPONENT_RL_MODULE, inference_only=True)[COMPONENT_RL_MODULE]
        state = state.get(DEFAULT_MODULE_ID, state)  # "lm."-prefixed names (rl_module.hf_named_tensors)
        return [(k[3:] if k.startswith("lm.") else k, torch.as_tensor(v)) for k, v in state.items()]
    return list(module.hf_state_dict().items())


def sender_info(learner: Any) -> Dict[str, Any]:
    """Where the sender's weights live: its GPU (for the choice of engine), its trainer ranks, its process."""
    import torch.distributed as dist
    from ray.rllib.core import DEFAULT_MODULE_ID

    p = next(learner.module[DEFAULT_MODULE_ID].parameters(), None)
    cuda = p is not None and p.is_cuda
    return {
        "cuda": cuda,
        "gpu_uuid": str(torch.cuda.get_device_properties(p.device).uuid) if cuda else None,
        "ranks": dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1,
        "pid": os.getpid(),  # an engine whose workers run in this process loads the tensors directly
    }


def _send_from_learner(learner: Any, plan: TransferPlan) -> Dict[str, Any]:
    try:
        return {"value": send_weights(plan, learner_weights(learner))}
    except Exception:  # noqa: BLE001 - reported to the driver, which falls back
        return {"error": traceback.format_exc()}


class WeightTransferSync:
    """The driver's choice between the two sync paths, made once and logged once, and the transfer
    group's upkeep: a group is (re)opened when the engines change (a restarted runner, a rebuilt
    engine: its session differs); a failed send closes it and that sync takes today's path; a second
    failure in a row makes today's path permanent. The first sync always takes today's path (it
    also hands each runner the state its engine keeper rebuilds a dead engine from)."""

    def __init__(self, mode: str = "auto", buffer_bytes: Optional[int] = None) -> None:
        self.mode, self.buffer_bytes = mode, buffer_bytes
        self.disabled: Optional[str] = None
        self.plan: Optional[TransferPlan] = None
        self.syncs = self.failures = 0
        self._engine_ids: Optional[list] = None
        self._opened = False
        self.last_send_seconds: Optional[float] = None

    def _disable(self, reason: str) -> bool:
        self.disabled = reason
        logger.info("weight sync: learner -> object store -> engines (%s)", reason)
        return False

    def sync(self, learner_group: Any, env_runner_group: Any) -> bool:
        """True when this sync went through the transfer engines; False: the caller takes today's path."""
        self.syncs += 1
        if self.disabled or (self.mode == "off" and self._disable("backend_options.weight_transfer='off'")):
            return False
        if env_runner_group.num_remote_workers() > 0:
            ids = list(env_runner_group.healthy_worker_ids())
            engines = RunnerEngines([ray_internals.actor(env_runner_group, i) for i in ids])
        elif not learner_group.is_local:
            return self._disable("the learners run in actors and the engine in the driver")
        else:
            ids, engines = [0], LocalEngines([getattr(env_runner_group.local_env_runner, "_backend", None)])
        try:
            infos = engines.call("weight_transfer_info", [()] * len(ids))
        except Exception:  # noqa: BLE001 - a runner died: RLlib's path and fault tolerance handle it
            return False
        unsupported = next((r["error"] for r in infos if r.get("unsupported")), None)
        if unsupported or any("error" in r and not r.get("not_ready") for r in infos):
            return self._disable(
                unsupported or next(r["error"] for r in infos if "error" in r).strip().splitlines()[-1]
            )
        if any("error" in r for r in infos) or self.syncs == 1:
            return False  # an engine not started yet (it loads the state today's path leaves it)
        infos = [r["value"] for r in infos]
        reason = next((i["reason"] for i in infos if i["reason"]), None)
        if reason:
            return self._disable(reason)
        try:
            if self.plan is None or self._engine_ids != ids or any(i["session"] != self.plan.session for i in infos):
                self._open(learner_group, engines, ids, infos)
            out = self._on_rank0(learner_group, _send_from_learner, plan=self.plan)
            if "error" in out[0]:
                raise RuntimeError(out[0]["error"])
        except Exception as e:  # noqa: BLE001
            return self._failed(e)
        self.failures, self.last_send_seconds = 0, out[0]["value"]
        return True

    @staticmethod
    def _on_rank0(learner_group: Any, fn: Any, **kwargs) -> List[Any]:
        if learner_group.is_local:
            return [fn(ray_internals.local_learner(learner_group), **kwargs)]
        first = ray_internals.actor_ids(learner_group)[0]  # rank 0, whose state RLlib syncs
        out = []
        for result in learner_group.foreach_learner(fn, remote_actor_ids=[first], **kwargs):  # RemoteCallResults
            if not result.ok:
                raise result.get()  # the learner's error
            out.append(result.get())
        return out

    def _open(self, learner_group: Any, engines: Any, ids: list, infos: List[Dict[str, Any]]) -> None:
        from rllib_r3l.generation import weight_transfer as wt

        if self.plan is not None:
            with contextlib.suppress(Exception):  # an engine of the old group may be gone
                EngineClient(self.plan).shutdown_weight_transfer_engine()
        offsets, n = [], 1
        for i in infos:
            offsets.append(n)
            n += i["world_size"]
        sender = self._on_rank0(learner_group, sender_info)[0]
        backend = wt.choose_backend(infos, sender, infos[0]["requested"])
        first, self._opened = not self._opened, True
        self.plan = TransferPlan(
            uuid.uuid4().hex, backend, engines, offsets, n, infos[0]["dtype"], infos[0]["skip"], self.buffer_bytes
        )
        self._engine_ids = ids
        how = (
            "loaded in place (the engine's workers share the learner's process)"
            if backend == wt.DIRECT
            else f"through vLLM's weight-transfer engine {backend!r}"
        )
        (logger.info if first else logger.warning)(
            "weight sync: learner rank 0 -> %d engine worker(s) %s, in %s%s",
            n - 1,
            how,
            infos[0]["dtype"],
            "" if first else " (group re-opened)",
        )

    def _failed(self, error: Exception) -> bool:
        self.failures += 1
        logger.warning("weight sync through the transfer engine failed; this sync takes the object store:\n%s", error)
        if self.plan is not None:
            with contextlib.suppress(Exception):
                EngineClient(self.plan).shutdown_weight_transfer_engine()
        self.plan = None
        close_sender()
        if self.failures >= 2:
            return self._disable("the transfer engine failed twice in a row")
        return False


def sync_weights_via_transfer(algo: Any) -> bool:
    """``R3L._sync_weights``' first step: True when the weights went through the transfer engines."""
    sync = getattr(algo, "_r3l_weight_transfer", None)
    if sync is None:
        opts = dict(algo.config.backend_options or {})
        sync = algo._r3l_weight_transfer = WeightTransferSync(
            opts.get("weight_transfer", "auto"), opts.get("weight_bucket_bytes")
        )
    return sync.sync(algo.learner_group, algo.env_runner_group)
