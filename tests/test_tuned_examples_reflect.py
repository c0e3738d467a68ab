"""Every CPU tuned example with reflection on reaches a valid report: its reflection step, with the
example's own model, backend (``auto`` as a user gets it), environment and reflection settings, on a
few of its own failed base episodes.

What it proves: the example's ``max_reflection_tokens`` fits a report the example's engine writes and
the engine holds the report to its schema. For ``toy_corridor_tiny`` (a random model, which writes no
JSON on its own) only the grammar can make a report valid, so this is the check that the transformers
backend enforces the schema within the budget; for ``coin_collector`` (SmolLM2-135M) that the default
model's reports close within its budget. It proves nothing about what the reports say.
"""

from __future__ import annotations

import glob
import os
from collections import Counter

import pytest

from rllib_r3l.cli import commands as cli
from tests import REPO_ROOT

CPU = sorted(glob.glob(os.path.join(str(REPO_ROOT), "tuned_examples", "cpu", "*.yaml")))
# the real default model on a 2-core CPU: a minute with vLLM, a few with the transformers backend
SLOW = {"coin_collector.yaml"}
# examples whose reflection step is another example's (the same model, environment and reflection options):
# checked once, under the other's name
SAME_REFLECTION = {"coin_collector_async.yaml": "coin_collector.yaml"}
REFLECTION_OPTIONS = (
    "model_id",
    "env",
    "env_config",
    "reflect",
    "reflector",
    "reflection_style",
    "reflection_context",
    "reflection_structured",
    "reflection_max_chars",
    "max_reflection_tokens",
    "reflection_temperature",
    "backend",
    "backend_options",
    "action_decoding",
    "max_turns",
    "max_response_tokens",
    "max_context_tokens",
)


def _experiments():
    for path in CPU:
        name = os.path.basename(path)
        if name in SAME_REFLECTION:
            continue
        marks = [pytest.mark.slow] if name in SLOW else []
        for exp in cli.load_yaml_file(path):
            yield pytest.param(path, exp, marks=marks, id=f"{name}:{exp}")


def test_every_cpu_example_is_covered():
    assert {os.path.basename(p) for p in CPU} == {
        "toy_corridor_tiny.yaml",
        "coin_collector.yaml",
        "coin_collector_grpo.yaml",
        "coin_collector_async.yaml",
    }


@pytest.mark.parametrize("name, same_as", sorted(SAME_REFLECTION.items()))
def test_an_example_checked_under_another_has_its_reflection_step(name, same_as):
    def options(file):
        path = os.path.join(str(REPO_ROOT), "tuned_examples", "cpu", file)
        [(exp, spec)] = cli.prepare_experiments(path).items()
        cfg = cli.validate_config(spec["config"], where=exp)
        return {k: getattr(cfg, k) for k in REFLECTION_OPTIONS}

    assert options(name) == options(same_as)


def failed_episodes(explorer, runner, seeds, want):
    from rllib_r3l.runner.rollout import EpisodeSpec

    failed = []
    for s in seeds:
        bases = [b for b in runner.run([EpisodeSpec(seed=s, group_id=f"g{s}")]) if b is not None]
        for b in bases:
            b.success = explorer.is_success(b)
        failed += explorer._to_reflect(bases)
        if len(failed) >= want:
            break
    return failed


@pytest.mark.slow
@pytest.mark.parametrize("path, experiment", list(_experiments()))
def test_the_examples_reflection_step_reaches_a_valid_report(path, experiment):
    import environments
    from rllib_r3l.generation import make_backend, resolve_backend_name
    from rllib_r3l.models import load_tokenizer, resolve_model
    from rllib_r3l.runner.chat import ChatFormat
    from rllib_r3l.runner.env_runner import engine_options
    from rllib_r3l.runner.explore import ExploreOptions, Explorer
    from rllib_r3l.runner.rollout import EpisodeRunner, RolloutOptions

    spec = cli.prepare_experiments(path, only=[experiment])[experiment]
    cfg = cli.validate_config(spec["config"], where=experiment)
    if not cfg.reflect:  # the GRPO baseline: no reflection step to check
        assert "grpo" in experiment or "no-reflect" in experiment
        return
    model = resolve_model(cfg.model_id)
    backend = make_backend(resolve_backend_name(cfg.backend), model, seed=0, **engine_options(cfg))
    try:
        chat = ChatFormat(load_tokenizer(model))
        runner = EpisodeRunner(
            backend,
            chat,
            lambda: environments.make(cfg.env, dict(cfg.env_config or {})),
            RolloutOptions.from_config(cfg),
            Counter(),
        )
        explorer = Explorer(runner, chat, ExploreOptions.from_config(cfg))
        failed = failed_episodes(explorer, runner, range(8), want=3)
        assert failed, f"{experiment}: no failed base episode in 8 seeds to reflect on"
        results = explorer.reflect(failed[:3])
    finally:
        backend.close()
    statuses = [p.status.value if p is not None else "generation_error" for p, _, _ in results]
    cut = sum(o is not None and o.finish_reason == "length" for _, _, o in results)
    assert any(p is not None and p.ok for p, _, _ in results), (
        f"{experiment}: no valid report in {statuses}; {cut} cut at max_reflection_tokens={cfg.max_reflection_tokens}"
    )
    assert any(p is not None and p.triggers_retry for p, _, _ in results)  # a failure's report asks for a retry
