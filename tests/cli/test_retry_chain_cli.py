"""A real tiny run through ``rllib-r3l train`` says when the reflect-then-retry chain never closed: with
the toy example's reflection budget cut to 16 tokens every report is cut, and the iteration line, the
summary table's note and the train summary say so and why; with the example's own budget the same run
retries and says nothing of the kind."""

from __future__ import annotations

import os
import re

import pytest

from rllib_r3l.cli import commands as cli
from tests import REPO_ROOT

pytestmark = pytest.mark.integration

TOY = os.path.join(str(REPO_ROOT), "tuned_examples", "cpu", "toy_corridor_tiny.yaml")
ONE = [
    "--experiment",
    "toy-corridor-tiny-r3l",
    "--set",
    "group_size=4",
    "--set",
    "tasks_per_iteration=2",
    "--stop",
    "training_iteration=1",
    "--verbose",
    "0",
    "--quiet-workers",
    "--set",
    "sampling_seed=1",
    "--set",
    "seed=1",
]


def train(capsys, tmp_path, *extra):
    code = cli.main(["train", TOY, "--storage-path", str(tmp_path), *ONE, *extra])
    out, err = capsys.readouterr()
    return code, out + err


def test_a_run_whose_reports_are_all_cut_says_it_never_retried_and_why(ray_session, tmp_path, capsys):
    code, shown = train(capsys, tmp_path / "cut", "--set", "max_reflection_tokens=16")
    assert code in (0, 1), shown[-3000:]  # 1: trained on nothing, which this test is not about
    line = re.search(r"iter 1/1 \|.*", shown).group(0)
    assert re.search(
        r"\| retries 0 \(0/(\d+) reports valid: \1 cut at max_reflection_tokens; raise "
        r"max_reflection_tokens \(or lower reflection_max_chars\)\) \|",
        line,
    ), line
    assert re.search(r"note: no retry in 1 iteration\(s\), so R3L trained as GRPO: 0/\d+ reports valid", shown)
    assert re.search(r"  note:       no retry in 1 iteration\(s\), so R3L trained as GRPO", shown)  # train summary


def test_the_examples_own_budget_retries_and_says_nothing_of_the_kind(ray_session, tmp_path, capsys):
    code, shown = train(capsys, tmp_path / "own")
    assert code in (0, 1), shown[-3000:]
    line = re.search(r"iter 1/1 \|.*", shown).group(0)
    assert re.search(r"\| retries [1-9]\d*, \d+ succeeded \|", line), line
    assert "trained as GRPO" not in shown
