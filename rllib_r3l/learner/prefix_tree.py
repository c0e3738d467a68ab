"""Shared prefixes of a training batch as a token trie, so the learner runs each shared prefix once.

The items of an R3L group share the task prompt, and a retry shares its base's tokens up to the
pivot (paper §4: the retry replays the prefix verbatim). Under causal attention a token's hidden
state depends only on the tokens before it, so a prefix computed once, with its KV cache handed to
every continuation, gives exactly the hidden states (and, through autograd, the gradient) of
running each sequence on its own. This module holds the pure part: the trie and the planning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np


@dataclass(frozen=True)
class Node:
    """Tokens ``[start, end)`` of row ``row`` (every row through this node has the same ones there)."""

    parent: int  # -1 for a root
    row: int
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


def _lcp(a: np.ndarray, b: np.ndarray, start: int) -> int:
    """Length of the common prefix of ``a`` and ``b``, both known to agree before ``start``."""
    m = min(len(a), len(b))
    if m <= start:
        return m
    diff = np.flatnonzero(a[start:m] != b[start:m])
    return start + int(diff[0]) if len(diff) else m


def build_prefix_tree(seqs: Sequence[Sequence[int]]) -> Tuple[List[Node], List[List[int]]]:
    """The token trie of ``seqs``, compressed (one node per run without branching).

    Returns ``(nodes, paths)``: nodes in an order where a parent precedes its children, and for
    each sequence the node indices from its root down; concatenating ``seqs[n.row][n.start:n.end]``
    along ``paths[i]`` gives back ``seqs[i]``. Identical sequences share one path. The total node
    length is the number of distinct (position, prefix) tokens: what one forward pass must compute.
    """
    arrs = [np.asarray(s, dtype=np.int64) for s in seqs]
    nodes: List[Node] = []
    paths: List[List[int]] = [[] for _ in arrs]
    stack: List[Tuple[int, int, List[int]]] = [(-1, 0, [i for i in range(len(arrs)) if len(arrs[i])])]
    while stack:
        parent, depth, rows = stack.pop()
        if not rows:
            continue
        ref = arrs[rows[0]]
        end = min(_lcp(ref, arrs[r], depth) for r in rows) if len(rows) > 1 else len(ref)
        if end > depth:
            nodes.append(Node(parent=parent, row=rows[0], start=depth, end=end))
            parent = len(nodes) - 1
            for r in rows:
                paths[r].append(parent)
        branches: Dict[int, List[int]] = {}
        for r in rows:
            if len(arrs[r]) > end:
                branches.setdefault(int(arrs[r][end]), []).append(r)
        for group in reversed(list(branches.values())):
            stack.append((parent, end, group))
    return nodes, paths


def trie_tokens(seqs: Sequence[Sequence[int]]) -> int:
    """Tokens the trie of ``seqs`` holds (each shared prefix counted once)."""
    nodes, _ = build_prefix_tree(seqs)
    return sum(n.length for n in nodes)


# What one more forward call costs, in padded positions: a call of one row computes fewer tokens a
# second than a batch of several, about this many positions of a ~600-token row on CPU
# (docs/benchmarks.md, 'What do prefix sharing and cascade attention save?').
CALL_TOKENS = 64


def leaf_batches(lengths: Sequence[int], call_tokens: int = CALL_TOKENS) -> List[List[int]]:
    """Leaves (by their token lengths) cut into right-padded batches: by length, consecutive, so
    that padded positions plus ``call_tokens`` per batch are fewest (exact, by dynamic programming
    over the sorted lengths). Returns index lists into ``lengths``."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    n = len(order)
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):  # batch order[i:j], padded to its longest, lengths[order[j - 1]]
            cost = best[i] + (j - i) * lengths[order[j - 1]] + call_tokens
            if cost < best[j]:
                best[j], cut[j] = cost, i
    batches: List[List[int]] = []
    j = n
    while j > 0:
        batches.append(order[cut[j] : j])
        j = cut[j]
    return batches[::-1]


def children_of(nodes: Sequence[Node]) -> Dict[int, Tuple[List[List[int]], List[int]]]:
    """For each parent (-1: the roots), its children as ``(leaf batches, inner)``: a batch of
    leaves runs right-padded on the parent's cache (``leaf_batches``), inner nodes run one by one
    (their caches must end exactly where their own children start)."""
    parents = {n.parent for n in nodes}
    split: Dict[int, Tuple[List[int], List[int]]] = {}
    for j, n in enumerate(nodes):
        leaves, inner = split.setdefault(n.parent, ([], []))
        (inner if j in parents else leaves).append(j)
    return {
        p: ([[leaves[i] for i in b] for b in leaf_batches([nodes[j].length for j in leaves])], inner)
        for p, (leaves, inner) in split.items()
    }


def computed_tokens(seqs: Sequence[Sequence[int]]) -> int:
    """Positions a shared-prefix forward pass of ``seqs`` computes: every inner node once, and
    each batch of leaves padded to its longest (``children_of``)."""
    nodes, _ = build_prefix_tree(seqs)
    total = 0
    for batches, inner in children_of(nodes).values():
        total += sum(nodes[j].length for j in inner)
        total += sum(len(b) * max(nodes[j].length for j in b) for b in batches)
    return total


def tokens_split_by_cuts(seqs: Sequence[Sequence[int]], plan: Sequence[Sequence[int]]) -> int:
    """Prefix tokens computed again because a micro-batch cut separates rows that share them: the
    common prefix of the last row before each cut and the first row after it. In token order the
    trie of two neighbouring micro-batches together is theirs apart minus that prefix, so this is
    what a larger ``micro_batch_tokens`` / ``micro_batch_size`` would still save (0: nothing left)."""
    arrs = [np.asarray(s, dtype=np.int64) for s in seqs]
    return sum(_lcp(arrs[prev[-1]], arrs[nxt[0]], 0) for prev, nxt in zip(plan, plan[1:]) if prev and nxt)


def plan_shared_micro_batches(
    seqs: Sequence[Sequence[int]], *, max_sequences: int, max_tokens: Optional[int] = None
) -> List[List[int]]:
    """Micro-batches for shared-prefix training: rows in lexicographic token order (so a retry sits
    next to its base and a task's items next to each other), packed while the micro-batch's trie
    holds at most ``max_tokens`` tokens (what its activations cost) and ``max_sequences`` rows.

    In lexicographic order the trie of consecutive rows grows by ``len(row) - lcp(row, previous)``.
    A row longer than ``max_tokens`` gets a micro-batch of its own.
    """
    if max_sequences < 1:
        raise ValueError(f"max_sequences must be >= 1, got {max_sequences}")
    arrs = [np.asarray(s, dtype=np.int64) for s in seqs]
    order = sorted(range(len(arrs)), key=lambda i: (tuple(arrs[i].tolist()), i))
    plan: List[List[int]] = []
    tokens = 0
    for i in order:
        if plan:
            prev = arrs[plan[-1][-1]]
            grow = len(arrs[i]) - _lcp(prev, arrs[i], 0)
            if len(plan[-1]) < max_sequences and (max_tokens is None or tokens + grow <= max_tokens):
                plan[-1].append(i)
                tokens += grow
                continue
        plan.append([i])
        tokens = len(arrs[i])
    return plan
