"""Finding and loading a JSON-ish object in free model text (the reflection parser's lenient layer).

A small model's report may sit among prose, be cut short, carry trailing commas or be written as a
Python literal (single quotes, ``None``/``True``). :func:`candidates` lists the substrings that may
hold the object; :func:`load_lenient` parses one without ever raising. What the object must contain
is :mod:`rllib_r3l.runner.reflection.report`'s business.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, List, Tuple

__all__ = ["candidates", "load_lenient", "NotAnObject", "MAX_CANDIDATES", "MAX_AST_CHARS"]

MAX_CANDIDATES = 64  # balanced-brace candidates examined per text (bounds adversarial inputs)
MAX_AST_CHARS = 100_000  # the Python-literal fallback is only tried on candidates up to this size


def _scan_object_end(text: str, start: int, string_aware: bool) -> int:
    """Index of the ``}`` closing the ``{`` at ``start``, or -1 when it never closes."""
    depth = 0
    in_str = False
    escaped = False
    for i in range(start, len(text)):
        c = text[i]
        if in_str:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_str = False
            continue
        if c == '"' and string_aware:
            in_str = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def candidates(text: str) -> List[str]:
    """Substrings of ``text`` that may hold the report, deduplicated, in document order.

    1. the span from the first ``{`` to the last ``}`` (the authors' rule);
    2. every top-level balanced ``{...}`` (string-aware; a naive brace count as fallback when a
       stray quote keeps an object from closing), scanning left to right.
    """
    out: List[str] = []
    seen = set()

    def add(s: str) -> None:
        if s not in seen:
            seen.add(s)
            out.append(s)

    first = text.find("{")
    last = text.rfind("}")
    if first < 0 or last < first:
        return out
    add(text[first : last + 1])
    i = first
    examined = 0
    while i >= 0 and examined < MAX_CANDIDATES:
        examined += 1
        end = _scan_object_end(text, i, string_aware=True)
        if end < 0:
            end = _scan_object_end(text, i, string_aware=False)
        if end >= 0:
            add(text[i : end + 1])
            i = text.find("{", end + 1)
        else:
            i = text.find("{", i + 1)
    return out


_TRAILING_COMMA = re.compile(r",(\s*[}\]])")
_PY_NAMES = {"null": None, "None": None, "true": True, "True": True, "false": False, "False": False}


def _literal(node: ast.AST) -> Any:
    """Convert a Python-literal AST (dicts, lists, strings, numbers, None/True/False and their JSON
    spellings null/true/false) to a value; raise ValueError on anything else."""
    if isinstance(node, ast.Expression):
        return _literal(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in _PY_NAMES:
            return _PY_NAMES[node.id]
        raise ValueError(f"unknown name {node.id!r}")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _literal(node.operand)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return -v if isinstance(node.op, ast.USub) else v
        raise ValueError("unary sign on a non-number")
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("dict unpacking is not a literal")
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Set):
        for e in node.elts:
            _literal(e)  # only a set of literals counts as "parsed, but not an object"
        return NotAnObject()
    raise ValueError(f"not a literal: {type(node).__name__}")


class NotAnObject:
    """Marker: the candidate parsed to something that is not a mapping (e.g. a Python set)."""


def load_lenient(candidate: str) -> Tuple[Any, str]:
    """Parse one candidate leniently: JSON, then JSON without trailing commas, then a Python/JSON
    literal (single quotes, None/True/False). Returns ``(value, "")`` or ``(None, error)``."""
    try:
        return json.loads(candidate, strict=False), ""
    except Exception as e:  # noqa: BLE001 - never raise (RecursionError, ValueError, ...)
        first_error = f"{type(e).__name__}: {e}"
    repaired = _TRAILING_COMMA.sub(r"\1", candidate)
    if repaired != candidate:
        try:
            return json.loads(repaired, strict=False), ""
        except Exception:  # noqa: BLE001
            pass
    if len(candidate) <= MAX_AST_CHARS:
        try:
            return _literal(ast.parse(repaired.strip(), mode="eval")), ""
        except Exception:  # noqa: BLE001 - SyntaxError, ValueError, RecursionError, MemoryError
            pass
    return None, first_error
