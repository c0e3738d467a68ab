"""The test tiers (issue 48, item 6): ``bash scripts/test.sh --fast`` runs what starts nothing heavy.

A test that starts a Ray runtime is marked ``integration``; one that loads the real default model, starts a
vLLM engine or DeepSpeed, or computes for long is ``slow``; one that starts a child process (the CLI, a
JVM, ``mount``) is ``subprocess``. ``--fast`` deselects the three and, so that the tier stays fast, fails a
test it runs that starts one of them anyway, naming the marker to add.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("slow", "integration", "subprocess")
FAST_EXPRESSION = " and ".join(f"not {m}" for m in HEAVY)


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help=f"the fast tier: deselect {', '.join(HEAVY)} tests and fail one that starts Ray, vLLM "
                          "or a child process without its marker")


def pytest_configure(config):
    if config.getoption("--fast"):
        given = config.option.markexpr
        config.option.markexpr = f"({given}) and {FAST_EXPRESSION}" if given else FAST_EXPRESSION


class _Started:
    """What a test started: child processes (counted by ``subprocess.Popen``), Ray, vLLM."""

    def __init__(self):
        self.children = 0
        self._init = subprocess.Popen.__init__
        started = self

        def counting_init(popen, *args, **kwargs):
            started.children += 1
            return started._init(popen, *args, **kwargs)

        self._counting_init = counting_init

    def __enter__(self):
        subprocess.Popen.__init__ = self._counting_init
        self.vllm_before = "vllm" in sys.modules
        return self

    def __exit__(self, *exc):
        subprocess.Popen.__init__ = self._init

    def heavy(self):
        ray = sys.modules.get("ray")
        found = []
        if ray is not None and getattr(ray, "is_initialized", lambda: False)():
            found.append(("a Ray runtime", "integration"))
        if "vllm" in sys.modules and not self.vllm_before:
            found.append(("vLLM", "slow"))
        if self.children:
            found.append((f"{self.children} child process(es)", "subprocess"))
        return found


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if not item.config.getoption("--fast"):
        yield
        return
    with _Started() as started:
        outcome = yield
    heavy = started.heavy()
    if heavy and outcome.excinfo is None:
        what = ", ".join(w for w, _ in heavy)
        marks = ", ".join(sorted({f"@pytest.mark.{m}" for _, m in heavy}))
        pytest.fail(f"{item.nodeid} started {what} in the fast tier: mark it {marks}", pytrace=False)
