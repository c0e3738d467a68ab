"""``benchmarks/cascade_attention.py``: its shapes parse and bad ones are refused; the rows of a shape
share their prefix (the attention itself is tested in ``tests/learner/test_cascade_attention.py``)."""

from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks import cascade_attention as bench


def test_benchmark_shapes_parse_and_refuse_bad_input():
    assert bench.parse_shape("1004x2646x2") == (1004, 2646, 2)
    for bad in ("1004x2646", "ax1x2", "0x5x2"):
        with pytest.raises(argparse.ArgumentTypeError, match="PxLxN|must be >= 1"):
            bench.parse_shape(bad)
    rows = bench.rows_for(5, 3, 2, vocab=1000)
    assert rows.shape == (2, 8)
    assert torch.equal(rows[0, :5], rows[1, :5]) and not torch.equal(rows[0, 5:], rows[1, 5:])
