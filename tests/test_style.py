"""The tree is ruff-clean, lint and format (issue 48, item 7); the rules and their reasons are in pyproject.toml.
A failure names the files: ``ruff format . && ruff check --fix .`` fixes most of it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import REPO_ROOT

pytestmark = pytest.mark.subprocess
RUFF = os.path.join(os.path.dirname(sys.executable), "ruff")


@pytest.mark.parametrize("args", [["check", "--no-fix", "."], ["format", "--check", "."]], ids=["lint", "format"])
def test_the_tree_is_ruff_clean(args):
    r = subprocess.run([RUFF, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
