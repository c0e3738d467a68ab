"""The generation engine dying inside an env runner (issue 37): probe, rebuild with the latest weights,
count; a second failure in the same sample ends that sample's exploration instead of hanging.

A real runner (tiny model, ToyCorridor, transformers engine); the engine's death is injected
(``faults.inject(config, {"engine_death_at_calls": [...]})``: that call and every later one raise, as
calls into a crashed engine do)."""

from __future__ import annotations

import pytest
import torch
from ray.rllib.core import COMPONENT_RL_MODULE

from rllib_r3l import R3LConfig
from rllib_r3l.reliability import faults
from rllib_r3l.runner.env_runner import R3LEnvRunner


def _runner(plan, **training):
    opts = dict(
        model="tiny", group_size=4, tasks_per_iteration=2, backend="transformers", max_response_tokens=8, reflect=False
    )
    opts.update(training)
    cfg = R3LConfig().environment("r3l/ToyCorridor", env_config={"num_rooms": 3}).training(**opts).debugging(seed=0)
    return R3LEnvRunner(config=faults.inject(cfg, plan))


def _engine_model(runner):
    b = runner.backend
    while not hasattr(b, "model"):  # through the fault (and seeding) wrappers to the transformers engine
        b = getattr(b, "backend", None) or b.inner
    return b.model


def _shifted_state(runner):
    """A module state unlike the weights on disk (what a learner update would have sent)."""
    return {
        f"lm.{k}": v.detach().clone() + 0.01
        for k, v in _engine_model(runner).state_dict().items()
        if k != "lm_head.weight"
    }


def _faults(metrics):
    return metrics["r3l"]["faults"]


@pytest.mark.slow
def test_a_dead_engine_is_rebuilt_with_the_latest_weights_and_its_episodes_counted_lost():
    runner = _runner({"engine_death_at_calls": [2]})
    try:
        runner.backend  # noqa: B018 - the property starts the engine; then weights sync into it as the algorithm does
        state = _shifted_state(runner)
        runner.set_state({COMPONENT_RL_MODULE: state})
        old = runner.backend
        groups = runner.sample()
        f = _faults(runner.get_metrics())
        lost = sum(len(g.lost) for g in groups)
        assert f["injected_engine_death"] == 1 and f["engine_rebuilds"] == 1
        assert f["generation_errors"] >= 1 and lost >= 1 and f["episodes_lost"] == lost
        assert runner.backend is not old
        new_sd = _engine_model(runner).state_dict()
        for k, v in state.items():  # the rebuilt engine holds the synced weights, not the ones on disk
            torch.testing.assert_close(new_sd[k[len("lm.") :]], v)
        # the next iteration samples normally on the rebuilt engine
        groups = runner.sample()
        f = _faults(runner.get_metrics())
        assert f["generation_errors"] == 0 and f["engine_rebuilds"] == 0 and f["episodes_lost"] == 0
        assert all(g.complete for g in groups)
    finally:
        runner.stop()


def test_an_engine_that_fails_again_after_its_rebuild_ends_the_sample_instead_of_hanging():
    # every generate call kills the engine; with 2 rounds of dynamic sampling the runner would explore on
    runner = _runner({"engine_death_prob": 1.0}, dynamic_sampling_rounds=2)
    try:
        runner.sample()
        m = runner.get_metrics()
        f = _faults(m)
        assert f["engine_rebuilds"] == 1 and f["engine_failures_after_rebuild"] == 1
        assert m["r3l"]["dynamic_sampling"]["extra_rounds"] == 1  # the second extra round never started
        runner.sample()  # a new iteration gets one rebuild again, and ends again: no hang, no raise
        assert _faults(runner.get_metrics())["engine_rebuilds"] == 1
    finally:
        runner.stop()


def test_a_transient_generation_error_keeps_the_engine_that_still_answers(monkeypatch):
    runner = _runner({})
    try:
        backend = runner.backend
        real = backend.generate
        calls = []

        def once_failing(requests, **kw):
            calls.append(len(requests))
            if len(calls) == 1:
                raise RuntimeError("a bad request")
            return real(requests, **kw)

        monkeypatch.setattr(backend, "generate", once_failing)
        runner.sample()
        f = _faults(runner.get_metrics())
        assert f["generation_errors"] == 1 and f["engine_rebuilds"] == 0
        assert runner.backend is backend
        assert 1 in calls[1:]  # the health probe: one request of one token, answered
    finally:
        runner.stop()


@pytest.mark.parametrize(
    "plan,needle",
    [({"engine_death_prob": 2}, "must be a probability"), ({"engine_death_at_calls": [-1]}, "list of integers >= 0")],
)
def test_engine_fault_plans_are_validated(plan, needle):
    with pytest.raises(ValueError, match=needle):
        faults.inject(R3LConfig(), plan)


@pytest.mark.slow
def test_an_engine_rebuilt_after_a_weight_transfer_stops_the_sample_and_the_runner_waits_for_the_weights():
    """Weights that came by weight transfer went into the engine only: the runner's keeper holds the
    older state it last loaded. A rebuild then loads that older state; rather than sample from it, the
    runner ends the sample (counted) and refuses the next until the driver restores its weights."""
    from types import SimpleNamespace

    from rllib_r3l.learner.weight_sync import _on_runner
    from rllib_r3l.runner.dispatch import sample_fn as _sample_fn

    runner = _runner({"engine_death_at_calls": [2]}, dynamic_sampling_rounds=2)
    try:
        runner.backend  # noqa: B018 - the property starts the engine
        runner.set_state({COMPONENT_RL_MODULE: _shifted_state(runner)})
        # a transfer lands: the weight-sync control plane's last call on the runner marks the keeper behind
        engine = SimpleNamespace(finish_weight_update=lambda: None)
        real_backend, runner._backend = runner._backend, engine
        assert _on_runner(runner, "finish_weight_update", ()) == {"value": None}
        runner._backend = real_backend
        assert runner._keeper.behind and not runner.needs_weights()
        runner.sample()
        m = runner.get_metrics()
        f = _faults(m)
        assert f["engine_rebuilds"] == 1 and f["engine_rebuilt_behind"] == 1
        assert m["r3l"]["dynamic_sampling"]["extra_rounds"] == 0  # exploration stopped at the rebuild
        assert runner.needs_weights()
        before = runner.get_state()["num_groups_sampled"]
        assert _sample_fn(2, {})(runner) == (None, "env_runners_behind_weights", runner.worker_index, None)
        assert runner.get_state()["num_groups_sampled"] == before  # it refused: nothing sampled
        runner.set_state({COMPONENT_RL_MODULE: _shifted_state(runner)})  # the driver's restore
        assert not runner.needs_weights() and not runner._keeper.behind
        groups, metrics, *_ = _sample_fn(2, {})(runner)
        # two groups a round; a round whose groups carry no signal draws another (dynamic_sampling_rounds=2)
        assert len(groups) in (2, 4, 6) and _faults(metrics)["engine_rebuilds"] == 0
        assert all(g.complete for g in groups)
    finally:
        runner.stop()
