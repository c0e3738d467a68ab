"""Tests for rllib_r3l.runner.reflection.reflect: report parsing (fuzzed), statistics, prompts, schema, guidance."""

from __future__ import annotations

import json
import os
import pathlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllib_r3l.runner.reflection.reflect import (
    DEFAULT_REFLECTION_TEMPLATE,
    REPORT_JSON_SCHEMA,
    REQUIRED_PLACEHOLDERS,
    Outcome,
    ParseResult,
    ParseStatus,
    ReflectionReport,
    ReflectionStats,
    build_reflection_messages,
    format_guidance,
    load_template,
    parse_report,
    report_json_schema,
)

# R3L_FUZZ_EXAMPLES raises the example count for a longer local fuzzing run.
FUZZ = settings(
    max_examples=int(os.environ.get("R3L_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def report(**overrides):
    d = {
        "summary": "The agent opened the drawer and then looped.",
        "root_cause": "Why did it fail? Because it repeated 'look'. Why? It ignored the hint.",
        "outcome": "failure",
        "suggestion": "Take the key from the drawer before going to the door.",
        "retry_from_step": 1,
    }
    for k, v in overrides.items():
        if v is _DROP:
            d.pop(k, None)
        else:
            d[k] = v
    return d


_DROP = object()


def check_invariants(res, num_turns):
    """Every result is either a usable report or a classified failure with a message."""
    assert isinstance(res, ParseResult)
    assert isinstance(res.status, ParseStatus)
    assert isinstance(res.error, str)
    assert res.ok == (res.status in (ParseStatus.VALID, ParseStatus.PERFECT))
    assert res.triggers_retry == (res.status is ParseStatus.VALID)
    if res.ok:
        r = res.report
        assert isinstance(r, ReflectionReport)
        assert res.error == ""
        assert r.summary and r.root_cause and isinstance(r.raw, str) and r.raw
        if res.status is ParseStatus.PERFECT:
            assert r.outcome is Outcome.SUCCESS and r.suggestion is None and r.pivot is None
        else:
            assert r.outcome is not Outcome.SUCCESS
            assert r.suggestion
            assert type(r.pivot) is int and 0 <= r.pivot < num_turns
    else:
        assert res.report is None
        assert res.error.strip()


# ==================================================================================================
# Property-based fuzzing
# ==================================================================================================
@FUZZ
@given(st.text(), st.integers(-3, 40))
def test_arbitrary_text_never_raises(text, k):
    check_invariants(parse_report(text, k), k)


_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 50), st.floats(allow_nan=True), st.text(max_size=20)
)
_pivots = st.one_of(
    _json_scalars, st.integers(-3, 30).map(str), st.integers(-3, 30).map(float), st.lists(st.integers(0, 5), max_size=2)
)
_outcomes = st.one_of(
    st.sampled_from(
        [
            "success",
            "failure",
            "success_but_inefficient",
            "Success",
            "FAILURE",
            "success but inefficient",
            "Success-But-Inefficient",
            "partial",
            "",
            "win",
        ]
    ),
    _json_scalars,
)
_fields = st.sampled_from(
    [
        "summary",
        "trajectory_summary",
        "root_cause",
        "root_cause_analysis",
        "outcome",
        "suggestion",
        "improvement_suggestion",
        "retry_from_step",
        "pivot",
        "pivot_turn",
        "extra",
    ]
)


@st.composite
def report_objects(draw):
    keys = draw(st.lists(_fields, unique=True, max_size=8))
    d = {}
    for k in keys:
        if k in ("retry_from_step", "pivot", "pivot_turn"):
            d[k] = draw(_pivots)
        elif k == "outcome":
            d[k] = draw(_outcomes)
        else:
            d[k] = draw(st.one_of(st.text(max_size=30), _json_scalars, st.lists(st.text(max_size=5), max_size=3)))
    return d


@FUZZ
@given(report_objects(), st.text(max_size=40), st.text(max_size=40), st.booleans(), st.integers(-1, 12))
def test_text_around_json_never_raises(obj, prefix, suffix, fenced, k):
    body = json.dumps(obj)
    if fenced:
        body = f"```json\n{body}\n```"
    check_invariants(parse_report(prefix + body + suffix, k), k)


_prose = st.text(alphabet=st.characters(blacklist_characters="{}<\"'", blacklist_categories=("Cs",)), max_size=40)


def expected_status(d, k):
    """Oracle for a complete-field report with canonical names."""
    outcome = Outcome.parse(d.get("outcome")) if isinstance(d.get("outcome"), str) else None
    if outcome is None:
        return ParseStatus.BAD_OUTCOME
    if outcome is Outcome.SUCCESS:
        return ParseStatus.PERFECT
    if not (isinstance(d.get("suggestion"), str) and d["suggestion"].strip()):
        return ParseStatus.MISSING_SUGGESTION
    p = d.get("retry_from_step")
    if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < k:
        return ParseStatus.BAD_PIVOT
    return ParseStatus.VALID


@FUZZ
@given(
    st.sampled_from(["success", "failure", "success_but_inefficient", "bogus", "Failure "]),
    st.one_of(st.none(), st.just(""), st.just("do X")),
    st.one_of(st.none(), st.integers(-3, 15), st.booleans()),
    st.integers(0, 12),
    _prose,
    _prose,
    st.sampled_from(["plain", "fenced", "indented"]),
)
def test_wrapped_report_matches_oracle(outcome, suggestion, pivot, k, prefix, suffix, style):
    d = report(outcome=outcome, suggestion=suggestion, retry_from_step=pivot)
    body = json.dumps(d, indent=2 if style == "indented" else None)
    if style == "fenced":
        body = f"```json\n{body}\n```"
    res = parse_report(prefix + body + suffix, k)
    check_invariants(res, k)
    assert res.status is expected_status(d, k), res.error


@FUZZ
@given(st.integers(1, 40), st.integers(-50, 80), st.sampled_from([int, float, str, lambda p: f" {p} "]))
def test_pivot_range_property(k, p, form):
    res = parse_report(json.dumps(report(retry_from_step=form(p))), k)
    check_invariants(res, k)
    if 0 <= p < k:
        assert res.status is ParseStatus.VALID and res.report.pivot == p
    else:
        assert res.status is ParseStatus.BAD_PIVOT and "out of range" in res.error


@FUZZ
@given(st.data())
def test_mutated_valid_json_never_raises(data):
    text = json.dumps(report())
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(text)))
        op = data.draw(st.sampled_from(["delete", "insert", "dup"]))
        if op == "delete":
            text = text[:i] + text[i + 1 :]
        elif op == "insert":
            text = text[:i] + data.draw(st.sampled_from(list('{}[]",:\'\\ \nx0'))) + text[i:]
        else:
            text = text[:i] + text[i : i + 5] + text[i:]
    check_invariants(parse_report(text, 3), 3)


_nonnull = st.text(min_size=1, max_size=50).filter(
    lambda s: s.strip() and s.strip().lower() not in {"null", "none", "n/a", "na", "nil"}
)


@FUZZ
@given(
    _nonnull, _nonnull, _nonnull, st.sampled_from([Outcome.FAILURE, Outcome.SUCCESS_BUT_INEFFICIENT]), st.integers(0, 9)
)
def test_report_to_json_round_trips(summary, root, sugg, outcome, pivot):
    r = ReflectionReport(summary.strip(), root.strip(), outcome, sugg.strip(), pivot, raw="x")
    res = parse_report("Report:\n" + r.to_json() + "\nthanks", 10)
    assert res.status is ParseStatus.VALID, res.error
    got = res.report
    assert (got.summary, got.root_cause, got.outcome, got.suggestion, got.pivot) == (
        r.summary,
        r.root_cause,
        r.outcome,
        r.suggestion,
        r.pivot,
    )


def test_adversarial_inputs_are_fast_and_classified():
    texts = [
        "{" * 20000,
        "}" * 20000 + "{" * 20000,
        "{" * 5000 + "}" * 5000,
        "{" * 20000 + "}",
        '{"a":' * 3000,
        "[" * 10000 + "{}" + "]" * 10000,
        "(" * 5000 + "{}",
        "{'a': " + "(" * 300 + "1" + ")" * 300 + "}",
        "{\x00}",
        '{"summary": "' + "x" * 200000,
    ]
    for text in texts:
        check_invariants(parse_report(text, 5), 5)


@pytest.mark.parametrize("value", [None, b'{"summary": 1}', 3, ["{}"], {"summary": "s"}, object()])
def test_non_str_input_is_classified(value):
    res = parse_report(value, 3)
    check_invariants(res, 3)
    assert res.status in (ParseStatus.EMPTY, ParseStatus.NO_JSON)


# ==================================================================================================
# Hand-written cases, one or more per status
# ==================================================================================================
def test_valid():
    res = parse_report(json.dumps(report()), 4)
    assert res.status is ParseStatus.VALID and res.ok and res.triggers_retry
    r = res.report
    assert r.outcome is Outcome.FAILURE and r.pivot == 1 and r.suggestion.startswith("Take")
    assert json.loads(r.raw) == report()


def test_success_but_inefficient_is_valid_and_retries():
    res = parse_report(json.dumps(report(outcome="success_but_inefficient")), 4)
    assert res.status is ParseStatus.VALID and res.triggers_retry


def test_perfect_drops_suggestion_and_pivot():
    res = parse_report(json.dumps(report(outcome="success", suggestion="x", retry_from_step=99)), 4)
    assert res.status is ParseStatus.PERFECT and res.ok and not res.triggers_retry
    assert res.report.suggestion is None and res.report.pivot is None
    # success needs neither field
    d = report(outcome="success", suggestion=_DROP, retry_from_step=_DROP)
    res = parse_report(json.dumps(d), 4)
    assert res.status is ParseStatus.PERFECT


@pytest.mark.parametrize("text", ["", "   \n\t "])
def test_empty(text):
    assert parse_report(text, 3).status is ParseStatus.EMPTY


@pytest.mark.parametrize("text", ["no json here", "} backwards {", "[1, 2]", "```json\n```"])
def test_no_json(text):
    res = parse_report(text, 3)
    assert res.status is ParseStatus.NO_JSON and res.error


@pytest.mark.parametrize(
    "text", ["{not json}", '{"summary": "unterminated}', '{"a": }', '{"summary": "x" "root_cause": "y"}']
)
def test_bad_json(text):
    res = parse_report(text, 3)
    assert res.status is ParseStatus.BAD_JSON and "JSON" in res.error


def test_not_an_object():
    res = parse_report("{'summary', 'root_cause'}", 3)  # a Python set literal
    assert res.status is ParseStatus.NOT_AN_OBJECT and "object" in res.error
    res = parse_report('"just a string with {braces}"', 3)
    assert not res.ok


@pytest.mark.parametrize("field", ["summary", "root_cause", "outcome"])
def test_missing_fields(field):
    res = parse_report(json.dumps(report(**{field: _DROP})), 3)
    assert res.status is ParseStatus.MISSING_FIELDS and field in res.error
    for empty in (None, "", "   "):
        res = parse_report(json.dumps(report(**{field: empty})), 3)
        assert res.status is ParseStatus.MISSING_FIELDS, (field, empty)


def test_missing_fields_on_unrelated_object():
    assert parse_report('{"foo": 1}', 3).status is ParseStatus.MISSING_FIELDS


@pytest.mark.parametrize("outcome", ["partial_success", "succeeded", "", 1, ["failure"]])
def test_bad_outcome(outcome):
    res = parse_report(json.dumps(report(outcome=outcome)), 3)
    expected = ParseStatus.MISSING_FIELDS if outcome == "" else ParseStatus.BAD_OUTCOME
    assert res.status is expected


@pytest.mark.parametrize(
    "outcome",
    [
        "Failure",
        "  FAILURE ",
        "success but inefficient",
        "Success-But-Inefficient",
        "success_but_inefficient.",
        "SUCCESS",
    ],
)
def test_outcome_normalised(outcome):
    res = parse_report(json.dumps(report(outcome=outcome)), 3)
    assert res.ok
    assert res.report.outcome is Outcome.parse(outcome)


@pytest.mark.parametrize("suggestion", [_DROP, None, "", "  ", "null", "None", "N/A"])
def test_missing_suggestion(suggestion):
    res = parse_report(json.dumps(report(suggestion=suggestion)), 3)
    assert res.status is ParseStatus.MISSING_SUGGESTION and "suggestion" in res.error


@pytest.mark.parametrize("pivot", [_DROP, None, "step 2", 1.5, True, [1], "", "nan", float("inf")])
def test_bad_pivot_not_an_int(pivot):
    res = parse_report(json.dumps(report(retry_from_step=pivot)), 3)
    assert res.status is ParseStatus.BAD_PIVOT and "retry_from_step" in res.error


@pytest.mark.parametrize("k", [1, 2, 7])
def test_pivot_boundaries(k):
    for p, ok in ((0, True), (k - 1, True), (k, False), (-1, False)):
        res = parse_report(json.dumps(report(retry_from_step=p)), k)
        assert (res.status is ParseStatus.VALID) == ok, (k, p)
        if ok:
            assert res.report.pivot == p
        else:
            assert res.status is ParseStatus.BAD_PIVOT and str(k) in res.error


@pytest.mark.parametrize("pivot", [2, "2", 2.0, "2.0", " 2 ", "+2"])
def test_pivot_lenient_forms(pivot):
    res = parse_report(json.dumps(report(retry_from_step=pivot)), 3)
    assert res.status is ParseStatus.VALID
    assert res.report.pivot == 2 and type(res.report.pivot) is int


@pytest.mark.parametrize("k", [0, -1, None, "3", 2.5])
def test_bad_num_turns_never_raises(k):
    res = parse_report(json.dumps(report(retry_from_step=0)), k)
    assert res.status is ParseStatus.BAD_PIVOT
    assert parse_report(json.dumps(report(outcome="success")), k).status is ParseStatus.PERFECT


# ==================================================================================================
# Robustness: embedding, fences, repairs, aliases
# ==================================================================================================
def test_embedded_in_prose():
    text = "Let me think. The agent {clearly} failed.\n" + json.dumps(report()) + "\nThat's it."
    res = parse_report(text, 3)
    assert res.status is ParseStatus.VALID and json.loads(res.report.raw) == report()


def test_fenced():
    text = "Here is the report:\n```json\n" + json.dumps(report(), indent=2) + "\n```\n"
    assert parse_report(text, 3).status is ParseStatus.VALID


def test_later_of_two_valid_reports_wins():
    first, second = json.dumps(report(retry_from_step=0)), json.dumps(report(retry_from_step=2))
    text = first + "\nWait, revised:\n" + second
    res = parse_report(text, 3)
    assert res.status is ParseStatus.VALID and res.report.pivot == 2


def test_valid_report_beats_broken_one():
    text = '{"summary": "draft", "outcome": \n' + "Final:\n" + json.dumps(report())
    assert parse_report(text, 3).status is ParseStatus.VALID
    text = json.dumps(report()) + "\nAlso {this is junk}"
    assert parse_report(text, 3).status is ParseStatus.VALID


def test_best_failure_is_reported():
    text = "{junk} " + json.dumps(report(retry_from_step=9))
    res = parse_report(text, 3)
    assert res.status is ParseStatus.BAD_PIVOT and "candidate" in res.error


def test_think_block_is_skipped():
    draft, final = json.dumps(report(retry_from_step=0)), json.dumps(report(retry_from_step=2))
    text = "<think>maybe " + draft + "</think>\n" + final
    assert parse_report(text, 3).report.pivot == 2
    # a think block with no object after it: its content is still searched
    text = "<think>" + json.dumps(report(retry_from_step=1)) + "</think> done"
    assert parse_report(text, 3).report.pivot == 1


def test_braces_inside_strings():
    d = report(summary="It typed {open} and } then {")
    res = parse_report("x " + json.dumps(d) + " y", 3)
    assert res.status is ParseStatus.VALID and res.report.summary == d["summary"]


def test_trailing_commas_and_raw_newlines():
    text = (
        '{"summary": "line one\nline two", "root_cause": "r", "outcome": "failure",\n'
        '"suggestion": "s", "retry_from_step": 0,}'
    )
    res = parse_report(text, 1)
    assert res.status is ParseStatus.VALID and "line two" in res.report.summary


def test_single_quotes_and_python_literals():
    text = "{'summary': 's', 'root_cause': 'r', 'outcome': 'success', 'retry_from_step': None}"
    assert parse_report(text, 3).status is ParseStatus.PERFECT
    text = "{'summary': 's', 'root_cause': 'r', 'outcome': 'failure', "
    text += "'suggestion': 'x', 'pivot': 1,}"
    assert parse_report(text, 3).status is ParseStatus.VALID


@pytest.mark.parametrize(
    "names",
    [
        {
            "summary": "trajectory_summary",
            "root_cause": "root_cause_analysis",
            "suggestion": "improvement_suggestion",
            "retry_from_step": "pivot",
        },
        {"retry_from_step": "pivot_turn"},
        {"summary": "Summary", "root_cause": "Root Cause", "retry_from_step": "Retry-From-Step"},
    ],
)
def test_aliases(names):
    d = {names.get(k, k): v for k, v in report(retry_from_step=2).items()}
    res = parse_report(json.dumps(d), 3)
    assert res.status is ParseStatus.VALID and res.report.pivot == 2
    assert res.report.summary == report()["summary"]


def test_wrapper_object_and_list_root_cause():
    d = report(root_cause=["Why? Because A.", "Why A? Because B."])
    res = parse_report(json.dumps({"reflection": d}), 3)
    assert res.status is ParseStatus.VALID
    assert res.report.root_cause == "Why? Because A.\nWhy A? Because B."


def test_double_encoded_json_string():
    res = parse_report(json.dumps(json.dumps(report())), 3)
    assert res.status is ParseStatus.VALID


# ==================================================================================================
# Statistics
# ==================================================================================================
def test_stats():
    stats = ReflectionStats()
    assert stats.as_metrics()["reflection_valid_rate"] == 0.0
    for text in [
        json.dumps(report()),
        json.dumps(report(outcome="success")),
        "",
        "nope",
        json.dumps(report(retry_from_step=7)),
    ]:
        stats.add(parse_report(text, 3))
    m = stats.as_metrics()
    for s in ParseStatus:
        assert f"reflection_{s.value}" in m
    assert m["reflection_valid"] == 1 and m["reflection_perfect"] == 1
    assert m["reflection_empty"] == m["reflection_no_json"] == m["reflection_bad_pivot"] == 1
    assert m["reflection_total"] == 5 and m["reflection_retries"] == 1
    assert m["reflection_valid_rate"] == pytest.approx(2 / 5)
    other = ReflectionStats()
    other.add(ParseStatus.BAD_JSON)
    stats.merge(other)
    assert stats.total == 6 and stats.as_metrics()["reflection_bad_json"] == 1


# ==================================================================================================
# Prompt construction and templates
# ==================================================================================================
FIELDS = {
    "task": "Put a clean mug in the coffee machine.",
    "rules": "Only admissible actions are allowed.",
    "observations": ["You are in a kitchen.", "You see a mug.", "Nothing happens.", "Game over."],
    "actions": ["go to counter", "take mug", "use mug"],
    "reward": 0.0,
    "success": False,
}


def test_messages_structure_and_numbering():
    msgs = build_reflection_messages(FIELDS)
    assert [m["role"] for m in msgs] == ["system", "user"]
    user = msgs[1]["content"]
    for k, (obs, act) in enumerate(zip(FIELDS["observations"], FIELDS["actions"])):
        assert f"Step {k}" in user and obs in user and act in user
        assert user.index(f"Step {k}") < user.index(act)
    assert "Step 3" not in user and "Game over." in user
    # rules and task come before the steps
    assert user.index(FIELDS["rules"]) < user.index("Step 0")
    assert user.index(FIELDS["task"]) < user.index("Step 0")
    assert user.index("Step 0") < user.index("Step 1") < user.index("Step 2")
    assert "0 to 2" in user and "Final reward: 0.0" in user and "not completed" in user
    for name in (
        "summary",
        "root_cause",
        "outcome",
        "suggestion",
        "retry_from_step",
        "success_but_inefficient",
        "Why",
        "Because",
    ):
        assert name in user
    assert "{" in user and "{{" not in user


def test_messages_from_trajectory():
    from rllib_r3l.trajectory import Status, Trajectory

    traj = Trajectory(
        segments=[],
        reward=1.0,
        group_id="g",
        success=True,
        num_turns=2,
        status=Status.TRUNCATED,
        actions=["a0", "a1"],
        observations=["o0", "o1"],
        task="the goal",
        info={"rules": "the rules"},
    )
    user = build_reflection_messages(traj)[1]["content"]
    assert "the rules" in user and "the goal" in user and "Step 1" in user
    assert "truncated" in user and "Final reward: 1.0 (the task was completed)" in user
    assert "the override" in build_reflection_messages(traj, rules="the override")[1]["content"]


def test_messages_without_rules_or_actions():
    user = build_reflection_messages({**FIELDS, "rules": None})[1]["content"]
    assert "no separate rules" in user
    user = build_reflection_messages({**FIELDS, "actions": [], "observations": ["o"]})[1]["content"]
    assert "took no steps" in user and "o" in user and "Step 0" not in user


def test_default_template_is_valid():
    assert load_template(DEFAULT_REFLECTION_TEMPLATE) == DEFAULT_REFLECTION_TEMPLATE


@pytest.mark.parametrize("missing", REQUIRED_PLACEHOLDERS)
def test_template_missing_placeholder(missing):
    tmpl = " ".join("{" + p + "}" for p in REQUIRED_PLACEHOLDERS if p != missing)
    with pytest.raises(ValueError, match=r"\{" + missing + r"\}"):
        load_template(tmpl)
    with pytest.raises(ValueError, match=missing):
        build_reflection_messages(FIELDS, template=tmpl)


def test_template_unknown_and_malformed():
    with pytest.raises(ValueError, match="unknown placeholder {goal}"):
        load_template("{rules} {task} {trajectory} {goal}")
    with pytest.raises(ValueError, match="malformed"):
        load_template("{rules} {task} {trajectory} {")
    with pytest.raises(ValueError, match="unknown placeholder"):
        load_template("{rules} {task} {trajectory} {}")


def test_custom_template_text_and_file(tmp_path):
    tmpl = "R={rules}\nT={task}\n{trajectory}\nK={num_steps} M={max_step} W={reward} {{json}}"
    user = build_reflection_messages(FIELDS, template=tmpl, system="sys")
    assert user[0]["content"] == "sys"
    assert "K=3 M=2" in user[1]["content"] and "{json}" in user[1]["content"]
    path = tmp_path / "reflection.txt"
    path.write_text(tmpl, encoding="utf-8")
    assert load_template(str(path)) == tmpl
    assert load_template(pathlib.Path(path)) == tmpl
    assert build_reflection_messages(FIELDS, template=str(path))[1]["content"] == user[1]["content"]
    with pytest.raises(FileNotFoundError):
        load_template(str(tmp_path / "missing.txt"))
    bad = tmp_path / "bad.txt"
    bad.write_text("{task} {trajectory}", encoding="utf-8")
    with pytest.raises(ValueError, match="rules"):
        load_template(str(bad))


# ==================================================================================================
# Schema and guidance
# ==================================================================================================
def test_schema():
    jsonschema = pytest.importorskip("jsonschema")
    json.dumps(REPORT_JSON_SCHEMA)
    jsonschema.validate(report(), REPORT_JSON_SCHEMA)
    perfect = report(outcome="success", suggestion=None, retry_from_step=None)
    jsonschema.validate(perfect, REPORT_JSON_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report(outcome="meh"), REPORT_JSON_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report(retry_from_step=-1), REPORT_JSON_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report(retry_from_step=3), report_json_schema(3))
    jsonschema.validate(report(retry_from_step=2), report_json_schema(3))


def test_format_guidance():
    res = parse_report(json.dumps(report()), 3)
    text = format_guidance(res)
    assert text == format_guidance(res.report)
    for v in report().values():
        assert json.dumps(v)[1:-1] in text or str(v) in text
    assert "retry_from_step" in text and "do not mention" in text.lower()
    assert format_guidance(res, template="G: {report}").startswith('G: {\n  "summary"')
    with pytest.raises(ValueError, match="report"):
        format_guidance(res, template="no placeholder")
    with pytest.raises(ValueError, match="no_json"):
        format_guidance(parse_report("nothing", 3))


def test_guidance_template_with_the_suggestion_alone_and_bad_templates_named():
    res = parse_report(json.dumps(report()), 3)
    got = format_guidance(res, template="Advice for step {pivot}: {suggestion} ({root_cause})")
    assert got == f"Advice for step 1: {report()['suggestion']} ({report()['root_cause']})"
    with pytest.raises(ValueError, match=r"unknown placeholder\(s\) \['advice'\]"):
        format_guidance(res, template="{advice} {suggestion}")
    with pytest.raises(ValueError, match=r"\{report\} or \{suggestion\}"):
        format_guidance(res, template="only {summary}")
