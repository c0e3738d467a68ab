"""A character-level automaton for the JSON-schema subset of the reflection report (pure Python).

The transformers backend holds a structured reflection to ``report_json_schema`` with it
(:mod:`rllib_r3l.generation.json_logits` turns its states into token masks). The subset is exactly
what that schema uses, so that anything else is refused by name instead of being left unenforced:

* the top level: ``{"type": "object", "properties": {...}, "required": [every property],
  "additionalProperties": false}`` (an absent or true ``additionalProperties`` only permits keys the
  output never writes, so it is accepted); the keys are written in the order of ``properties``;
* a value: ``{"type": "string"}`` with ``minLength`` / ``maxLength``; ``{"type": "string", "enum":
  [...]}`` of plain strings; ``{"type": "integer"}`` with ``minimum`` / ``maximum``; ``{"type":
  "null"}``; ``anyOf`` of such values whose first characters differ (``"..."``, a digit, ``null``);
  a list ``"type"`` is read as that ``anyOf``. ``title``, ``description``, ``default``,
  ``examples`` and ``$comment`` are annotations and constrain nothing.

Whitespace: at most :data:`MAX_WS` characters of space or newline after ``{``, ``,`` and ``:`` and
after a value (room for one pretty-printed indentation), none elsewhere: a small model cannot spend
its budget on blank lines. Strings: any character but ``"``, ``\\`` and controls, and the escapes
``\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX``; an escape counts as one character towards the length
bounds (a surrogate pair as two, so a bound is never exceeded). Integers are written as JSON writes
them (no ``-0``, no leading zeros, no fraction or exponent), and a prefix is only kept while some
completion of it lies within the bounds.

A state is ``(item, sub)``: the index of the item of the flattened object (a literal, a whitespace
slot, a value) and where inside it; states are hashable, so masks can be cached per state.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

MAX_WS = 6
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment"})
_HEX = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset('"\\/bfnrt')
_WS = frozenset(" \n")
_DIGITS = frozenset("0123456789")
BIG = 1 << 30  # the remaining length of an unbounded string
CLOSED = ("closed",)  # the sub-state of a closed string or enum (not a str: an enum value may be any word)

State = Tuple[int, Any]


class SchemaNotSupported(ValueError):
    """A JSON-schema feature the transformers backend's grammar does not enforce (named in the message)."""


def _unsupported(what: str, where: str) -> SchemaNotSupported:
    return SchemaNotSupported(
        f"JSON schema {what} at {where} is not enforced by the transformers backend's grammar "
        "(rllib_r3l.generation.json_grammar: objects with fixed required keys, strings with min/maxLength, "
        "string enums, integers with minimum/maximum, null, anyOf of those); use backend='vllm' for the full "
        "JSON schema, or reflection_structured=False to sample the report freely"
    )


# ==================================================================================================
# Compiling a schema into items
# ==================================================================================================
def _check_keys(schema: Mapping[str, Any], allowed: FrozenSet[str], where: str) -> None:
    for key in schema:
        if key not in allowed and key not in ANNOTATIONS:
            raise _unsupported(f"keyword {key!r}", where)


def _bound(value: Any, key: str, where: str, up: bool) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _unsupported(f"{key}={value!r} (not a finite number)", where)
    return int(math.floor(value)) if up else int(math.ceil(value))


def _length(schema: Mapping[str, Any], key: str, where: str) -> Optional[int]:
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _unsupported(f"{key}={value!r} (not a non-negative integer)", where)
    return value


def compile_value(schema: Any, where: str) -> tuple:
    """The item of one value's schema (raises :class:`SchemaNotSupported` naming what it cannot hold)."""
    if schema is True or schema == {}:
        raise _unsupported("'any value' (an empty or true schema)", where)
    if not isinstance(schema, Mapping):
        raise _unsupported(f"{schema!r} (not an object)", where)
    if "anyOf" in schema:
        _check_keys(schema, frozenset({"anyOf"}), where)
        alts = tuple(compile_value(a, f"{where}/anyOf/{k}") for k, a in enumerate(schema["anyOf"]))
        return _alternatives(alts, where)
    kind = schema.get("type")
    if isinstance(kind, list):
        rest = {k: v for k, v in schema.items() if k != "type"}
        return _alternatives(
            tuple(
                compile_value({**rest, "type": t} if t != "null" else {"type": "null"}, f"{where}/type/{t}")
                for t in kind
            ),
            where,
        )
    if "enum" in schema:
        _check_keys(schema, frozenset({"type", "enum"}), where)
        values = schema["enum"]
        if kind not in (None, "string") or not values or not all(isinstance(v, str) for v in values):
            raise _unsupported(f"enum {values!r} (only a non-empty enum of strings)", where)
        for v in values:
            if json.dumps(v, ensure_ascii=False) != f'"{v}"':
                raise _unsupported(f"enum value {v!r} (a value written with escapes)", where)
        return ("enum", tuple(values))
    if kind == "string":
        _check_keys(schema, frozenset({"type", "minLength", "maxLength"}), where)
        lo, hi = _length(schema, "minLength", where) or 0, _length(schema, "maxLength", where)
        if hi is not None and hi < lo:
            raise _unsupported(f"maxLength {hi} < minLength {lo}", where)
        return ("str", lo, hi)
    if kind == "integer":
        _check_keys(schema, frozenset({"type", "minimum", "maximum"}), where)
        lo = _bound(schema.get("minimum"), "minimum", where, up=False)
        hi = _bound(schema.get("maximum"), "maximum", where, up=True)
        if lo is not None and hi is not None and hi < lo:
            raise _unsupported(f"maximum {hi} < minimum {lo}", where)
        return ("int", lo, hi)
    if kind == "null":
        _check_keys(schema, frozenset({"type"}), where)
        return ("lit", "null")
    if kind == "object":
        raise _unsupported("a nested object", where)
    raise _unsupported(f"type {kind!r}", where)


def _alternatives(alts: Tuple[tuple, ...], where: str) -> tuple:
    """``anyOf``: decided by its first character, so each alternative must start differently."""
    if not alts:
        raise _unsupported("an empty anyOf", where)
    seen: Dict[str, int] = {}
    for k, item in enumerate(alts):
        for c in _first_chars(item):
            if c in seen:
                raise _unsupported(f"anyOf whose alternatives {seen[c]} and {k} both start with {c!r}", where)
            seen[c] = k
    return ("alt", alts)


def _first_chars(item: tuple) -> FrozenSet[str]:
    kind = item[0]
    if kind in ("str", "enum"):
        return frozenset('"')
    if kind == "int":
        return frozenset(c for c in "-0123456789" if _item_step(item, _item_start(item), c) is not None)
    if kind == "lit":
        return frozenset(item[1][:1])
    return frozenset(c for alt in item[1] for c in _first_chars(alt))


def compile_schema(schema: Any) -> "Grammar":
    """The automaton of a top-level object schema (raises :class:`SchemaNotSupported` naming what it cannot hold)."""
    where = "the top level"
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        raise _unsupported("a top level that is not {'type': 'object', ...}", where)
    _check_keys(schema, frozenset({"type", "properties", "required", "additionalProperties"}), where)
    props = schema.get("properties") or {}
    if not isinstance(props, Mapping):
        raise _unsupported("properties that is not an object", where)
    required = list(schema.get("required") or [])
    optional = [k for k in props if k not in required]
    if optional:
        raise _unsupported(f"optional property {optional[0]!r} (every property must be required)", where)
    unknown = [k for k in required if k not in props]
    if unknown:
        raise _unsupported(f"required {unknown[0]!r} without a schema in properties", where)
    extra = schema.get("additionalProperties", True)
    if extra not in (True, False):
        raise _unsupported("additionalProperties with a schema", where)
    items: List[tuple] = [("lit", "{"), ("ws",)]
    for k, key in enumerate(props):
        if k:
            items += [("lit", ","), ("ws",)]
        items += [
            ("lit", json.dumps(key, ensure_ascii=False) + ":"),
            ("ws",),
            compile_value(props[key], f"properties/{key}"),
            ("ws",),
        ]
    items.append(("lit", "}"))
    return Grammar(tuple(items))


# ==================================================================================================
# Stepping one item
# ==================================================================================================
def _item_start(item: tuple) -> Any:
    kind = item[0]
    if kind in ("lit", "ws"):
        return 0
    if kind == "int":
        return ""
    return None  # str, enum, alt: before the first character


def _int_viable(s: str, lo: Optional[int], hi: Optional[int]) -> bool:
    """Whether the integer prefix ``s`` ("", "-", "12", "-3", ...) has a completion in [lo, hi]."""
    if s in ("", "-"):
        neg_ok = lo is None or lo <= -1  # some v <= -1 within [lo, hi] (compiling checked lo <= hi)
        return (
            neg_ok
            if s == "-"
            else (neg_ok or _int_viable("0", lo, hi) or any(_int_viable(d, lo, hi) for d in "123456789"))
        )
    neg = s.startswith("-")
    digits = s[1:] if neg else s
    if digits == "0":
        return not neg and (lo is None or lo <= 0) and (hi is None or hi >= 0)
    d = int(digits)
    k = 0
    while True:  # the completions of d are [d*10^k, (d+1)*10^k - 1] for k = 0, 1, ...
        a, b = d * 10**k, (d + 1) * 10**k - 1
        if neg:
            a, b = -b, -a
            if (lo is None or b >= lo) and (hi is None or a <= hi):
                return True
            if lo is not None and b < lo:  # further k only go lower
                return False
        else:
            if (lo is None or b >= lo) and (hi is None or a <= hi):
                return True
            if hi is not None and a > hi:
                return False
        k += 1


def _int_done(s: str, lo: Optional[int], hi: Optional[int]) -> bool:
    if s in ("", "-"):
        return False
    v = int(s)
    return (lo is None or v >= lo) and (hi is None or v <= hi)


def _item_step(item: tuple, sub: Any, c: str) -> Any:
    """The item's next sub-state after character ``c``; None when ``c`` cannot continue inside it."""
    kind = item[0]
    if kind == "lit":
        text = item[1]
        return sub + 1 if sub < len(text) and text[sub] == c else None
    if kind == "ws":
        return sub + 1 if c in _WS and sub < MAX_WS else None
    if kind == "str":
        lo, hi = item[1], item[2]
        if sub is None:
            return (0, 0) if c == '"' else None
        if sub == CLOSED:
            return None
        count, esc = sub
        if esc == 0:
            if c == '"':
                return CLOSED if count >= lo else None
            if c == "\\":
                return (count, 1) if hi is None or count < hi else None
            if ord(c) < 0x20 or (hi is not None and count >= hi):
                return None
            return (_count(count + 1, lo, hi), 0)
        if esc == 1:
            if c == "u":
                return (count, 2)
            return (_count(count + 1, lo, hi), 0) if c in _SIMPLE_ESCAPES else None
        if c not in _HEX:  # esc 2..5: the 4 hex digits of \uXXXX
            return None
        return (count, esc + 1) if esc < 5 else (_count(count + 1, lo, hi), 0)
    if kind == "enum":
        if sub is None:
            return "" if c == '"' else None
        if sub == CLOSED:
            return None
        if c == '"':
            return CLOSED if sub in item[1] else None
        nxt = sub + c
        return nxt if any(v.startswith(nxt) for v in item[1]) else None
    if kind == "int":
        lo, hi = item[1], item[2]
        if c != "-" and c not in _DIGITS:
            return None
        nxt = sub + c
        if c == "-" and sub != "":
            return None
        if sub in ("0", "-0") or nxt == "-0":
            return None
        return nxt if _int_viable(nxt, lo, hi) else None
    if kind == "alt":
        if sub is None:
            for k, alt in enumerate(item[1]):
                inner = _item_step(alt, _item_start(alt), c)
                if inner is not None:
                    return (k, inner)
            return None
        k, inner = sub
        inner = _item_step(item[1][k], inner, c)
        return None if inner is None else (k, inner)
    raise AssertionError(kind)


def _count(count: int, lo: int, hi: Optional[int]) -> int:
    """An unbounded string only needs to know whether it reached minLength: fewer states to cache."""
    return min(count, lo) if hi is None else count


def _item_done(item: tuple, sub: Any) -> bool:
    kind = item[0]
    if kind == "lit":
        return sub == len(item[1])
    if kind == "ws":
        return True
    if kind in ("str", "enum"):
        return sub == CLOSED
    if kind == "int":
        return _int_done(sub, item[1], item[2])
    if kind == "alt":
        return sub is not None and _item_done(item[1][sub[0]], sub[1])
    raise AssertionError(kind)


# ==================================================================================================
# The automaton
# ==================================================================================================
class Grammar:
    """The flattened object: ``items`` in order; see the module docstring for the states."""

    def __init__(self, items: Tuple[tuple, ...]) -> None:
        self.items = items
        self.start: State = (0, _item_start(items[0]))

    def step(self, state: Optional[State], c: str) -> Optional[State]:
        """The state after character ``c``; None when ``c`` leaves the language. An item that cannot
        take ``c`` but may end hands ``c`` to the next item (the items' first characters never clash
        with what the item before them could take, so the choice is deterministic)."""
        if state is None:
            return None
        i, sub = state
        items = self.items
        while True:
            item = items[i]
            nxt = _item_step(item, sub, c)
            if nxt is not None:
                return (i, nxt)
            if not _item_done(item, sub) or i + 1 == len(items):
                return None
            i += 1
            sub = _item_start(items[i])

    def step_text(self, state: Optional[State], text: str) -> Optional[State]:
        for c in text:
            state = self.step(state, c)
            if state is None:
                return None
        return state

    def complete(self, state: Optional[State]) -> bool:
        """The object is closed (only the end of the text may follow)."""
        return state is not None and state[0] == len(self.items) - 1 and _item_done(self.items[-1], state[1])

    def free_string_room(self, state: State) -> Optional[int]:
        """In a string value, outside an escape: how many more characters it may take (``BIG`` when
        unbounded); None anywhere else. Inside a string a token of plain characters is allowed exactly
        when it fits, which the token masks test for all such tokens at once."""
        item, sub = self.items[state[0]], state[1]
        if item[0] == "alt" and sub is not None:
            item, sub = item[1][sub[0]], sub[1]
        if item[0] != "str" or sub is None or sub == CLOSED or sub[1] != 0:
            return None
        return BIG if item[2] is None else item[2] - sub[0]

    def accepts(self, text: str) -> bool:
        """Whether ``text`` is a complete output (tests and checks)."""
        return self.complete(self.step_text(self.start, text))


def is_plain_string_char(c: str) -> bool:
    """Characters a string takes as they are, in every string state outside an escape."""
    return c not in '"\\' and ord(c) >= 0x20


def schema_key(schema: Mapping[str, Any]) -> str:
    return json.dumps(schema, sort_keys=True, default=str)


__all__: Sequence[str] = (
    "SchemaNotSupported",
    "Grammar",
    "compile_schema",
    "compile_value",
    "MAX_WS",
    "is_plain_string_char",
    "schema_key",
)
