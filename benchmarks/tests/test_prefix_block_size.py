"""``benchmarks/prefix_block_size.py``: its table on hand values and its refusal of bad sizes (the
engine runs themselves are a benchmark, not a test; the CPU engine's block is checked in
``tests/generation/test_prefix_cache.py``)."""

from __future__ import annotations

import pytest

from benchmarks import prefix_block_size as pbs


def _row(size, computed, cpu, wall=10.0, submitted=1000):
    return {
        "block_size": size,
        "prompt_submitted": submitted,
        "prompt_computed": computed,
        "cpu_s": cpu,
        "wall_s": wall,
    }


def test_table_gives_each_size_its_ratio_to_the_first_size():
    rows = [_row(128, 400, 100.0), _row(32, 240, 80.0), _row(128, 600, 120.0), _row(32, 260, 90.0)]
    lines = pbs.table(rows, [128, 32])
    assert lines[2] == "| 128 | 2 | 1,000 | 500 | 1.00 | 100.0, 120.0 | 1.00 | 10.0, 10.0 |"
    # computed 250 / 500, CPU 85 / 110
    assert lines[3] == f"| 32 | 2 | 1,000 | 250 | 0.50 | 80.0, 90.0 | {85 / 110:.2f} | 10.0, 10.0 |"


def test_sizes_that_are_not_multiples_of_16_are_refused_by_name():
    with pytest.raises(SystemExit, match=r"--sizes: \[100\]"):
        pbs.main(["--sizes", "128,100"])
