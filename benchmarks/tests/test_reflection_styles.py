"""``benchmarks/reflection_styles.py``'s table and paired statistics on hand-made per-episode records
(the measurement itself is a benchmark, not a test)."""

from __future__ import annotations

import math

import pytest

from benchmarks import reflection_styles as rs


def _rec(style, episode, *, valid, acc=None, oracle=0, ran=False, ok=False, tokens=70, s=0.5, finish="stop"):
    return {
        "style": style,
        "episode": episode,
        "chunk": 0,
        "valid": valid,
        "status": "valid" if valid else "no_json",
        "pivot": 0 if valid else None,
        "oracle_pivot": oracle,
        "pivot_accurate": acc if valid and oracle is not None else None,
        "retry_ran": ran,
        "retry_success": ok,
        "tokens": tokens,
        "s_per_report": s,
        "finish_reason": finish,
        "prompt_tokens": 100,
        "cached_prompt_tokens": 50 if style == "structured" else 0,
    }


# structured: all valid; pivots right on e0 and e2 (e3 has no oracle pivot); every report retried, e1's retry succeeds
STRUCTURED = [
    _rec("structured", 0, valid=True, acc=True, ran=True, tokens=70),
    _rec("structured", 1, valid=True, acc=False, oracle=1, ran=True, ok=True, tokens=80),
    _rec("structured", 2, valid=True, acc=True, ran=True, tokens=90),
    _rec("structured", 3, valid=True, oracle=None, ran=True, tokens=60),
]
# paper: e0 and e3 truncated at 512 tokens (invalid); e1 and e2 valid and right; e1's retry succeeds
PAPER = [
    _rec("paper", 0, valid=False, tokens=512, s=2.0, finish="length"),
    _rec("paper", 1, valid=True, acc=True, oracle=1, ran=True, ok=True, tokens=200, s=2.0),
    _rec("paper", 2, valid=True, acc=True, ran=True, tokens=300, s=2.0),
    _rec("paper", 3, valid=False, oracle=None, tokens=512, s=2.0, finish="length"),
]
RECORDS = STRUCTURED + PAPER


def test_summarize_style_counts_on_hand_values():
    s = rs.summarize_style(STRUCTURED)
    assert (s["episodes"], s["valid"], s["pivot_accurate"], s["pivot_scored"]) == (4, 4, 2, 3)
    assert (s["retries"], s["retry_successes"], s["truncated"], s["reports"]) == (4, 1, 0, 4)
    assert s["tokens_mean"] == 75.0 and s["s_per_report_mean"] == 0.5 and s["cached_prompt_share"] == 0.5
    p = rs.summarize_style(PAPER)
    assert (p["valid"], p["pivot_accurate"], p["pivot_scored"]) == (2, 2, 2)
    assert (p["retries"], p["retry_successes"], p["truncated"]) == (2, 1, 2)
    assert p["tokens_mean"] == (512 + 200 + 300 + 512) / 4 and p["s_per_report_mean"] == 2.0


def test_mcnemar_exact_on_hand_values():
    assert rs.mcnemar_exact(0, 0) == 1.0
    assert rs.mcnemar_exact(0, 2) == 0.5  # 2 * (1/4)
    assert rs.mcnemar_exact(1, 1) == 1.0  # 2 * (3/4), capped
    assert rs.mcnemar_exact(0, 6) == 2 / 64
    assert rs.mcnemar_exact(9, 1) == pytest.approx(2 * (1 + 10) / 1024)


def test_paired_differences_paper_minus_structured_on_hand_values():
    d = rs.paired_differences(RECORDS)
    v = d["valid"]  # differences -1, 0, 0, -1: mean -0.5, sd sqrt(1/3), t(3) = 3.1824463
    half = 3.1824463 * math.sqrt(1 / 3) / 2
    assert v["n"] == 4 and v["mean"] == -0.5
    assert v["lo"] == pytest.approx(-0.5 - half) and v["hi"] == pytest.approx(-0.5 + half)
    assert (v["a_only"], v["b_only"], v["mcnemar_p"]) == (0, 2, 0.5)
    # episodes with an oracle pivot (e0-e2), an invalid report counting 0: paper 0,1,1 vs structured 1,0,1
    a = d["pivot_accurate"]
    assert a["n"] == 3 and a["mean"] == 0.0 and (a["a_only"], a["b_only"], a["mcnemar_p"]) == (1, 1, 1.0)
    # both valid and scored: e1 and e2, paper 1,1 vs structured 0,1
    b = d["pivot_accurate_both_valid"]
    assert b["units"] == [1, 2] and b["mean"] == 0.5 and (b["a_only"], b["b_only"]) == (1, 0)
    r = d["retry_success"]  # e1 succeeds under both: no difference, no discordant pair
    assert r["n"] == 4 and r["mean"] == 0.0 and r["std"] == 0.0 and r["mcnemar_p"] == 1.0
    t = d["tokens"]  # 442, 120, 210, 452
    assert t["mean"] == 306.0 and "mcnemar_p" not in t


def test_paired_differences_need_both_styles_and_pair_by_episode():
    assert rs.paired_differences(STRUCTURED) == {}
    # an episode only one style has (an interrupted run) is left out of the pairs
    d = rs.paired_differences(STRUCTURED + PAPER[1:])
    assert d["valid"]["units"] == [1, 2, 3] and d["valid"]["mean"] == pytest.approx(-1 / 3)


def test_tables_show_the_counts():
    st = rs.style_table(RECORDS)
    lines = st.splitlines()
    assert lines[2] == "| structured | 4/4 | 2/3 | 1/4 | 1/4 | 75.0 | 0.50 | 0/4 | 50 % |"
    assert lines[3] == "| paper | 2/4 | 2/2 | 1/4 | 1/2 | 381.0 | 2.00 | 2/4 | 0 % |"
    pt = rs.paired_table(RECORDS)
    assert "| valid | 4 | -0.50 [-1.42, +0.42] | 0 / 2 | 0.500 |" in pt
    assert "| tokens | 4 | +306.0 [" in pt
