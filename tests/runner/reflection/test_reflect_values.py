"""Reflection (rllib_r3l.runner.reflection.reflect), exact values the property tests in test_reflect.py leave open:
statistics and their metrics, the schema as a whole, the prompt's reward/status/step texts, the
wrapper object's raw text and the error messages."""

from __future__ import annotations

import json

import pytest

from rllib_r3l.runner.reflection.reflect import (
    ParseStatus,
    ReflectionStats,
    build_reflection_messages,
    format_guidance,
    parse_report,
    report_json_schema,
)

REPORT = {"summary": "s", "root_cause": "r", "outcome": "failure", "suggestion": "go", "retry_from_step": 1}


def test_stats_add_statuses_and_results_and_give_exact_metrics():
    st = ReflectionStats(counts={})  # statuses never seen count 0
    st.add(ParseStatus.VALID)  # a bare VALID status is a retry
    st.add(ParseStatus.PERFECT)
    st.add("bad_json")
    st.add(parse_report(json.dumps(REPORT), 3))  # VALID, failure: a retry
    st.add(parse_report(json.dumps({**REPORT, "outcome": "success"}), 3))  # PERFECT: none
    m = st.as_metrics(prefix="r/")
    assert m == {
        **{f"r/{s.value}": 0 for s in ParseStatus},
        "r/valid": 2,
        "r/perfect": 2,
        "r/bad_json": 1,
        "r/total": 5,
        "r/retries": 2,
        "r/valid_rate": 4 / 5,
    }
    only_valid = ReflectionStats(counts={ParseStatus.VALID: 3})
    assert (
        only_valid.as_metrics()["reflection_valid_rate"] == 1.0 and only_valid.as_metrics()["reflection_perfect"] == 0
    )
    assert ReflectionStats().as_metrics()["reflection_valid_rate"] == 0.0


def test_schema_in_full():
    text = {"type": "string", "minLength": 1, "maxLength": 40}
    assert report_json_schema(3, failed=True, max_chars=40) == {
        "type": "object",
        "properties": {
            "summary": text,
            "root_cause": text,
            "outcome": {"type": "string", "enum": ["failure"]},
            "suggestion": text,
            "retry_from_step": {"type": "integer", "minimum": 0, "maximum": 2},
        },
        "required": ["summary", "root_cause", "outcome", "suggestion", "retry_from_step"],
        "additionalProperties": False,
    }
    s = report_json_schema()
    assert s["properties"]["outcome"] == {"type": "string", "enum": ["success", "success_but_inefficient", "failure"]}
    assert s["properties"]["suggestion"] == {"anyOf": [{"type": "string", "minLength": 1}, {"type": "null"}]}
    assert s["properties"]["retry_from_step"] == {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]}


def test_prompt_texts_for_reward_status_rules_and_the_final_observation():
    fields = {
        "actions": ["a", "b"],
        "observations": ["o0", "o1", "o2"],
        "task": "t",
        "reward": None,
        "status": "env_error",
    }
    user = build_reflection_messages(fields)[1]["content"]
    assert "Final reward: (unknown); the episode ended with status: env_error\n" in user
    assert "## Rules of the environment\n(no separate rules; see the task and the observations)\n" in user
    assert "### After step 1\nFinal observation:\no2" in user
    user = build_reflection_messages({**fields, "reward": 0.123456, "success": False, "status": "ok"})[1]["content"]
    assert "Final reward: 0.1235 (the task was not completed)\n" in user  # "ok": no status note


def test_a_wrapped_report_keeps_the_whole_object_as_its_raw_text():
    text = json.dumps({"reflection": REPORT})
    r = parse_report(text, 3)
    assert r.status is ParseStatus.VALID and r.report.raw == text and r.report.pivot == 1


def test_error_messages():
    assert parse_report("{1, 2}", 3).error == "expected a JSON object, got a set"
    with pytest.raises(TypeError, match=r"^expected a ReflectionReport, got int$"):
        format_guidance(42)
