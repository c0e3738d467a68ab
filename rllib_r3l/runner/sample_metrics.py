"""What one ``sample()`` of the env runner logs: episodes, generated and prompt tokens, prefix-cache
use, phase timers, reflection statistics and the fault counters (``r3l/faults/...``)."""

from __future__ import annotations

from collections import Counter
from typing import Any, List

import numpy as np

from rllib_r3l.runner.rollout import ROLLOUT_TIMERS

# Runner counters logged per sample under r3l/faults/ (the difference over the sample).
FAULT_COUNTERS = (
    "env_errors",
    "generation_errors",
    "replay_mismatch",
    "context_overflow",
    "truncated_responses",
    "invalid_actions",
    "retries_skipped",
    "reflection_generation_errors",
    "env_close_errors",
    "reflection_contradicts_reward",
    "env_create_errors",
    "retries_empty",
    "reflection_sft_items_too_long",
    "retry_sft_items_too_long",
    "oracle_errors",
    "oracle_no_pivot",
    "engine_rebuilds",
    "engine_failures_after_rebuild",
    "engine_rebuilt_behind",
)


def log_sample_metrics(runner: Any, groups: List[Any], seconds: float, before: Counter, reflect_seconds: float) -> None:
    """Log one ``sample()`` into ``runner.metrics``: episodes, tokens, prefix-cache use, phase timers,
    reflection statistics and every fault counter (the difference of ``runner.counters`` to ``before``)."""
    m = runner.metrics
    base = [t for g in groups for t in g.trajectories if t.kind.value == "base"]
    retries = [t for g in groups for t in g.trajectories if t.kind.value == "retry"]
    samples = [t for g in groups for t in g.trajectories if t.kind.value in ("base", "retry")]
    lost = [t for g in groups for t in g.lost]
    m.log_value("num_groups", len(groups), reduce="sum")
    # every base and retry episode started, lost ones included: what a trajectory budget counts
    for key in ("episodes_started", "retries_cut_by_budget"):
        m.log_value(("r3l", key), runner.counters[key] - before.get(key, 0), reduce="sum")
    m.log_value("num_episodes", len(base), reduce="sum")
    if base:
        m.log_value("episode_return_mean", float(np.mean([t.reward for t in base])), reduce="mean", window=1)
        m.log_value("success_rate", float(np.mean([t.success for t in base])), reduce="mean", window=1)
        m.log_value("episode_len_mean", float(np.mean([t.num_turns for t in base])), reduce="mean", window=1)
    if samples:
        turns = sum(t.num_turns - (t.pivot or 0) for t in samples)
        gen = sum(generated_anew(t) for t in samples)
        reports = [
            t.info["reflection"][2] for t in base if t.info.get("reflection") and t.info["reflection"][2] is not None
        ]
        gen += sum(len(o.token_ids) for o in reports)
        # the cost of reflecting, apart from the rollouts': tokens the reflector wrote, reports cut at
        # max_reflection_tokens
        m.log_value(("r3l", "generated_tokens_reflect"), sum(len(o.token_ids) for o in reports), reduce="sum")
        m.log_value(("r3l", "reflections_truncated"), sum(o.finish_reason == "length" for o in reports), reduce="sum")
        m.log_value(("r3l", "rollout_turns_per_sample"), turns / len(samples), reduce="mean", window=1)
        m.log_value(("r3l", "generated_tokens_per_sample"), gen / len(samples), reduce="mean", window=1)
        m.log_value(("r3l", "generated_tokens"), gen, reduce="sum")
        m.log_value(("r3l", "generated_tokens_per_s"), gen / max(seconds, 1e-9), reduce="mean", window=1)
        # prompt tokens submitted to the engine (every turn's context and every reflection prompt):
        # under choice decoding the rollout cost is mostly this prefill, not the few generated tokens
        prompt = runner.counters["prompt_tokens"] - before.get("prompt_tokens", 0)
        m.log_value(("r3l", "prompt_tokens"), prompt, reduce="sum")
        m.log_value(("r3l", "prompt_tokens_per_sample"), prompt / len(samples), reduce="mean", window=1)
        # what the engine really computed: submitted minus what its prefix cache served, per phase
        computed = 0
        for phase in ("base", "retry", "reflect"):
            sub = runner.counters[f"prompt_tokens_{phase}"] - before.get(f"prompt_tokens_{phase}", 0)
            hit = runner.counters[f"prompt_tokens_cached_{phase}"] - before.get(f"prompt_tokens_cached_{phase}", 0)
            computed += sub - hit
            if sub:
                m.log_value(("r3l", f"prompt_tokens_computed_{phase}"), sub - hit, reduce="sum")
                m.log_value(("r3l", f"prefix_cache_hit_rate_{phase}"), hit / sub, reduce="mean", window=1)
        m.log_value(("r3l", "prompt_tokens_computed_per_sample"), computed / len(samples), reduce="mean", window=1)
    m.log_value(("r3l", "rollout_seconds"), seconds, reduce="mean", window=1)
    # the part of rollout_seconds spent reflecting, and (once) the engine start before the first sample
    m.log_value(("r3l", "timers", "reflect_s"), reflect_seconds, reduce="mean", window=1)
    # where the rollout time went (rollout.EpisodeRunner): the engine per phase (constraint and
    # grammar set-up happen inside the engine's generate call and are part of it), environment
    # steps, resets (with environment creation) and a retry's replay of its base's prefix
    for name in ROLLOUT_TIMERS:
        m.log_value(
            ("r3l", "timers", f"{name}_s"),
            runner.counters[f"seconds_{name}"] - before.get(f"seconds_{name}", 0),
            reduce="mean",
            window=1,
        )
    if not runner._engine_start_logged:
        runner._engine_start_logged = True
        m.log_value(
            ("r3l", "timers", "engine_start_s"), runner.counters["backend_start_seconds"], reduce="mean", window=1
        )
    if retries or base:
        m.log_value(("r3l", "num_retries"), len(retries), reduce="sum")
    # reflect_on="failures": successful base episodes passed over (not lost: not reflected on by design)
    m.log_value(
        ("r3l", "reflections_skipped_successes"),
        runner.counters["reflections_skipped_successes"] - before.get("reflections_skipped_successes", 0),
        reduce="sum",
    )
    for k, v in runner._explorer.pop_metrics().items():
        m.log_value(("r3l", k), v, reduce="mean", window=1)
    m.log_value(("r3l", "faults", "episodes_lost"), len(lost), reduce="sum")
    for k in FAULT_COUNTERS:
        m.log_value(("r3l", "faults", k), runner.counters[k] - before.get(k, 0), reduce="sum")
    for k in [k for k in runner.counters if k.startswith("injected_")]:  # fault_injection (testing aid)
        m.log_value(("r3l", "faults", k), runner.counters[k] - before.get(k, 0), reduce="sum")


def generated_anew(t) -> int:
    """Response tokens a trajectory generated itself: a retry's reused prefix (generated by its base
    episode, replayed here) is not counted again."""
    if not t.pivot:
        return t.num_generated_tokens
    return t.num_generated_tokens - sum(
        len(s.token_ids) for s in t.segments if s.role == "response" and s.turn < t.pivot
    )
