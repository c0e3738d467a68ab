"""``benchmarks/model_compare.py``'s token accounting on hand values (the exploration itself is a
benchmark, not a test)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import model_compare as mc  # noqa: E402


def _group(base_tok, retry_tok, retries, report_tokens):
    return {"model": "m", "chunk": 0, "base_episodes": 4, "base_successes": 0, "retries": retries,
            "retry_successes": 0, "base_generated_tokens": base_tok, "retry_generated_tokens": retry_tok,
            "reflections": [{"ok": True, "pivot_accuracy": 1.0, "pivot_error": 0, "tokens": t} for t in report_tokens],
            "chunk_explore_s": 10.0, "chunk_cpu_s": 20.0, "load_before": [1.0], "load_after": [1.0]}


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


def test_a_retry_counts_only_the_tokens_it_generated_after_its_pivot():
    from rllib_r3l.runner.env_runner import generated_anew
    from rllib_r3l.trajectory import Kind, Segment, Trajectory

    segs = [Segment("prompt", [1, 2], turn=-1)]
    for turn, n in enumerate((3, 4, 5)):  # responses of 3, 4 and 5 tokens at turns 0, 1, 2
        segs += [Segment("prompt", [7], turn=turn), Segment("response", [9] * n, turn=turn)]
    base = Trajectory(segments=segs, reward=0.0, group_id="g", kind=Kind.BASE, seed=0)
    retry = Trajectory(segments=segs, reward=1.0, group_id="g", kind=Kind.RETRY, seed=0, pivot=2)
    assert generated_anew(base) == 12
    assert generated_anew(retry) == 5  # turns 0-1 (7 tokens) were replayed from the base episode
