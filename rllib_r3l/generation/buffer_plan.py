"""How the weights are cut into fixed-size buffers for a transfer: the rule both ends must follow (pure)."""

from __future__ import annotations

from typing import List, Sequence


def chunk_plan(nbytes: Sequence[int], buffer_bytes: int) -> List[int]:
    """How many tensors each packed buffer holds: vLLM's ``pack_tensors`` rule (a buffer is closed
    after the tensor that takes it past ``buffer_bytes``), which both ends must follow."""
    counts, n, size = [], 0, 0
    for b in nbytes:
        n, size = n + 1, size + int(b)
        if size > buffer_bytes:
            counts, n, size = counts + [n], 0, 0
    return counts + [n] if n else counts


def starts(plan: Sequence[int]) -> List[int]:
    out, n = [], 0
    for c in plan:
        out.append(n)
        n += c
    return out
