"""The JSON-schema automaton of the transformers backend (pure: hand-written documents and prefixes)."""

from __future__ import annotations

import json

import pytest

from rllib_r3l.generation.json_grammar import MAX_WS, SchemaNotSupported, compile_schema
from rllib_r3l.runner.reflection.reflect import report_json_schema

REPORT = {
    "summary": "went east",
    "root_cause": "Why? Because \"east\" was a wall.\n",
    "outcome": "failure",
    "suggestion": "go north",
    "retry_from_step": 2,
}


def schema(**props):
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


@pytest.mark.parametrize("indent", [None, 2])
def test_a_report_as_json_writes_it_is_accepted(indent):
    g = compile_schema(report_json_schema(3, failed=True, max_chars=40))
    assert g.accepts(json.dumps(REPORT, indent=indent))
    assert g.accepts(json.dumps(REPORT, indent=indent, ensure_ascii=False).replace("east", "é\u00e8"))


def test_the_report_schemas_constraints_are_enforced():
    g = compile_schema(report_json_schema(3, failed=True, max_chars=40))
    assert not g.accepts(json.dumps({**REPORT, "retry_from_step": 3}))  # maximum = num_steps - 1
    assert not g.accepts(json.dumps({**REPORT, "outcome": "success"}))  # failed: the enum is ["failure"]
    assert not g.accepts(json.dumps({**REPORT, "summary": "x" * 41}))  # maxLength
    assert g.accepts(json.dumps({**REPORT, "summary": "x" * 40}))
    assert not g.accepts(json.dumps({**REPORT, "suggestion": ""}))  # minLength 1: the parser refuses empty fields
    assert not g.accepts(json.dumps({**REPORT, "summary": ""})) and not g.accepts(
        json.dumps({**REPORT, "root_cause": ""})
    )
    assert not g.accepts(json.dumps({**REPORT, "suggestion": None}))
    assert not g.accepts(json.dumps({k: REPORT[k] for k in reversed(REPORT)}))  # keys in schema order
    assert not g.accepts(json.dumps({**REPORT, "extra": 1}))  # additionalProperties false
    assert not g.accepts(json.dumps(REPORT)[:-1])  # not closed
    assert not g.accepts(json.dumps(REPORT) + "\n")  # nothing after the object
    free = compile_schema(report_json_schema(12, failed=False))
    assert free.accepts(json.dumps({**REPORT, "outcome": "success", "suggestion": None, "retry_from_step": None}))
    assert free.accepts(json.dumps({**REPORT, "retry_from_step": 11}))
    assert not free.accepts(json.dumps({**REPORT, "retry_from_step": 12}))


def test_escapes_count_one_character_each():
    g = compile_schema(schema(s={"type": "string", "maxLength": 3}))
    assert g.accepts(r'{"s":"\n\"\u00e9"}')  # three characters, written in 10
    assert not g.accepts(r'{"s":"\n\"\u00e9x"}')
    assert not g.accepts(r'{"s":"\x"}')  # not a JSON escape
    assert not g.accepts(r'{"s":"\u00g1"}')
    assert not g.accepts('{"s":"a\nb"}')  # a raw control character


def test_integers_are_written_as_json_writes_them_and_pruned_to_the_bounds():
    g = compile_schema(schema(n={"type": "integer", "minimum": 3, "maximum": 250}))
    for n in (3, 9, 10, 99, 249, 250):
        assert g.accepts('{"n":%d}' % n), n
    for text in ("2", "251", "300", "03", "-5", "1.0", "1e2", '"5"'):
        assert not g.accepts('{"n":%s}' % text), text
    s = g.step_text(g.start, '{"n":')
    assert g.step_text(s, "2") is not None and g.step_text(s, "25") is not None  # 25 -> 250 lies in range
    assert g.step_text(s, "260") is None and g.step_text(s, "251") is None  # no completion is <= 250
    assert g.step_text(s, "1") is not None  # 1 -> 10..19 in range, though 1 itself is not
    neg = compile_schema(schema(n={"type": "integer", "minimum": -12, "maximum": -3}))
    assert neg.accepts('{"n":-12}') and neg.accepts('{"n":-3}')
    assert not neg.accepts('{"n":-13}') and not neg.accepts('{"n":-2}') and not neg.accepts('{"n":-0}')
    zero = compile_schema(schema(n={"type": "integer", "minimum": 0, "maximum": 0}))
    assert zero.accepts('{"n":0}') and not zero.accepts('{"n":00}') and not zero.accepts('{"n":1}')


def test_whitespace_only_in_its_slots_and_bounded():
    g = compile_schema(schema(a={"type": "null"}, b={"type": "string", "enum": ["x"]}))
    assert g.accepts('{\n  "a": null,\n  "b": "x"\n}')
    assert g.accepts('{"a":null' + " " * MAX_WS + ',"b":"x"}')
    assert not g.accepts('{"a":null' + " " * (MAX_WS + 1) + ',"b":"x"}')
    assert not g.accepts(' {"a":null,"b":"x"}')  # before the object
    assert not g.accepts('{"a" :null,"b":"x"}')  # before a colon
    assert not g.accepts('{"a":null,"b":"x"}\t')


def test_completion_and_string_room():
    g = compile_schema(schema(s={"type": "string", "maxLength": 5}, t={"type": "string"}))
    s = g.step_text(g.start, '{"s":"ab')
    assert g.free_string_room(s) == 3
    assert g.free_string_room(g.step_text(s, "\\")) is None  # inside an escape: not plain
    assert g.free_string_room(g.step_text(s, '"')) is None
    assert g.free_string_room(g.step_text(g.start, '{"s":"","t":"' + "y" * 999)) > 10**6  # unbounded
    end = g.step_text(g.start, '{"s":"","t":""}')
    assert g.complete(end) and not g.complete(g.step_text(g.start, '{"s":"","t":""'))
    assert g.step(end, " ") is None


@pytest.mark.parametrize(
    "bad, named",
    [
        ({"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}, "required": ["a"]}, "'pattern'"),
        ({"type": "object", "properties": {"a": {"type": "number"}}, "required": ["a"]}, "type 'number'"),
        ({"type": "object", "properties": {"a": {"type": "string"}}, "required": []}, "optional property 'a'"),
        ({"type": "object", "properties": {"a": {"type": "object"}}, "required": ["a"]}, "nested object"),
        (
            {
                "type": "object",
                "properties": {"a": {"anyOf": [{"type": "string"}, {"enum": ["x"]}]}},
                "required": ["a"],
            },
            "both start with '\"'",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "integer", "exclusiveMinimum": 0}}, "required": ["a"]},
            "'exclusiveMinimum'",
        ),
        ({"type": "object", "properties": {}, "patternProperties": {}}, "'patternProperties'"),
        ({"type": "array"}, "not {'type': 'object'"),
    ],
)
def test_a_feature_outside_the_subset_is_refused_by_name(bad, named):
    with pytest.raises(SchemaNotSupported) as err:
        compile_schema(bad)
    assert named in str(err.value) and "backend='vllm'" in str(err.value)
    assert "reflection_structured=False" in str(err.value)


def test_annotations_constrain_nothing_and_type_lists_read_as_any_of():
    g = compile_schema(schema(a={"type": ["integer", "null"], "minimum": 1, "maximum": 2, "description": "d"}))
    assert g.accepts('{"a":null}') and g.accepts('{"a":2}') and not g.accepts('{"a":3}')


@pytest.mark.parametrize("num_steps", [None, 1, 7])
@pytest.mark.parametrize("failed", [None, False, True])
@pytest.mark.parametrize("max_chars", [None, 40])
def test_every_report_schema_compiles(num_steps, failed, max_chars):
    """Every schema the explorer asks for is inside the subset: nothing of it goes unenforced."""
    g = compile_schema(report_json_schema(num_steps, failed=failed, max_chars=max_chars))
    report = {**REPORT, "retry_from_step": 0}
    assert g.accepts(json.dumps(report))
