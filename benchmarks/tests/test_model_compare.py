"""``benchmarks/model_compare.py``'s token accounting on hand values (the exploration itself is a
benchmark, not a test)."""

from __future__ import annotations

import math

from benchmarks import model_compare as mc


def _group(base_tok, retry_tok, retries, report_tokens):
    return {
        "model": "m",
        "chunk": 0,
        "base_episodes": 4,
        "base_successes": 0,
        "retries": retries,
        "retry_successes": 0,
        "base_generated_tokens": base_tok,
        "retry_generated_tokens": retry_tok,
        "reflections": [{"ok": True, "pivot_accuracy": 1.0, "pivot_error": 0, "tokens": t} for t in report_tokens],
        "chunk_explore_s": 10.0,
        "chunk_cpu_s": 20.0,
        "load_before": [1.0],
        "load_after": [1.0],
    }


def test_generated_tokens_per_sample_count_reports_once_and_ratio_is_against_a_base_episode():
    recs = [_group(160, 120, 4, [60, 70, 65, 65]), _group(200, 80, 2, [50, 50, 50, 50])]
    s = mc.summarize(recs, "m")
    # 8 base episodes (360 tokens), 6 retries (200), 8 reports (460): 1020 tokens over 14 samples
    assert s["tokens_per_reflection"] == 460 / 8
    assert s["generated_per_sample"] == 1020 / 14
    assert s["generated_per_base_episode"] == 360 / 8
    assert math.isclose(s["generated_ratio_vs_grpo"], (1020 / 14) / 45)


def test_records_without_token_fields_give_nan_not_zero():
    old = _group(160, 120, 4, [60, 70, 65, 65])
    del old["base_generated_tokens"]
    s = mc.summarize([old], "m")
    assert math.isnan(s["generated_per_sample"]) and math.isnan(s["generated_ratio_vs_grpo"])
    assert "nan" in mc.table([old], ["m"])
