"""The reflection parser's lenient layer (``rllib_r3l.runner.reflection.lenient_json``), on hand-written texts."""

from rllib_r3l.runner.reflection.lenient_json import MAX_CANDIDATES, NotAnObject, candidates, load_lenient


def test_candidates_first_the_outer_span_then_each_balanced_object_in_order():
    text = 'prose {"a": 1} more {"b": "}"} end'
    assert candidates(text) == ['{"a": 1} more {"b": "}"}', '{"a": 1}', '{"b": "}"}']
    assert candidates("no braces here") == [] and candidates("} backwards {") == []


def test_a_stray_quote_falls_back_to_a_plain_brace_count():
    # the string-aware scan never closes (odd quote); the naive count still finds the object
    assert '{"a": "x}' in candidates('{"a": "x} tail')


def test_an_unclosed_brace_restarts_the_scan_at_the_next_one():
    assert candidates('x { y {"a": 1}') == ['{ y {"a": 1}', '{"a": 1}']


def test_candidates_are_capped_for_adversarial_input():
    many = "".join(f'{{"k": {i}}}' for i in range(200))  # 200 distinct balanced objects
    found = candidates(many)
    assert found[0] == many and len(found) == MAX_CANDIDATES + 1  # the outer span + the first 64
    assert found[1:3] == ['{"k": 0}', '{"k": 1}']


def test_load_lenient_repairs_what_small_models_write_and_never_raises():
    assert load_lenient('{"a": 1,}') == ({"a": 1}, "")
    assert load_lenient("{'a': None, 'b': True, 'c': -2}") == ({"a": None, "b": True, "c": -2}, "")
    assert load_lenient('{"a": null, "b": [1, 2,]}') == ({"a": None, "b": [1, 2]}, "")
    value, err = load_lenient('{"a": ')
    assert value is None and err.startswith("JSONDecodeError")
    assert isinstance(load_lenient("{1, 2}")[0], NotAnObject)
    assert load_lenient("{__import__('os')}")[0] is None  # a call is not a literal
    assert load_lenient("[" * 100_000)[0] is None  # recursion is caught, not raised
