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
    parser.addoption(
        "--fast",
        action="store_true",
        help=f"the fast tier: deselect {', '.join(HEAVY)} tests and fail one that starts Ray, vLLM "
        "or a child process without its marker",
    )


def pytest_configure(config):
    if config.getoption("--fast"):
        given = config.option.markexpr
        config.option.markexpr = f"({given}) and {FAST_EXPRESSION}" if given else FAST_EXPRESSION


# imported before the first test under --fast: their import runs a child process (cpuinfo: `file`, through
# platform.architecture) or takes seconds (vLLM), so a test that merely imports them is fast wherever it runs
_IMPORTED_UP_FRONT = ("cpuinfo", "vllm")


def pytest_sessionstart(session):
    if session.config.getoption("--fast"):
        import importlib

        for name in _IMPORTED_UP_FRONT:
            try:
                importlib.import_module(name)
            except ImportError:  # a machine without it: its tests skip
                pass


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
        # a JVM environment's first engine call starts a JVM: counted here, since the simulators' packages
        # share one gateway per process (whichever test came first would start it); their import starts none
        from environments import sciworld, twx

        subprocess.Popen.__init__ = self._counting_init
        self.vllm_engines = 0
        self.jvms = 0
        self._engines = []

        for cls in (twx.TextWorldExpressEnv, sciworld.ScienceWorldEnv):
            original = cls.__dict__["_engine"]
            self._engines.append((cls, "_engine", original))

            def engine(env, _original=original):
                self.jvms += env._env is None
                return _original(env)

            cls._engine = engine
        # a vLLM engine (vllm.LLM), not vLLM's import: the session imports vLLM up front (pytest_sessionstart),
        # so which test imported it first does not matter
        vllm = sys.modules.get("vllm")
        if vllm is not None:
            original = vllm.LLM.__dict__["__init__"]
            self._engines.append((vllm.LLM, "__init__", original))

            def llm_init(llm, *args, _original=original, **kwargs):
                self.vllm_engines += 1
                return _original(llm, *args, **kwargs)

            vllm.LLM.__init__ = llm_init
        return self

    def __exit__(self, *exc):
        subprocess.Popen.__init__ = self._init
        for cls, name, original in self._engines:
            setattr(cls, name, original)

    def heavy(self):
        found = []
        if _ray_up():
            found.append(("a Ray runtime", "integration"))
        if self.vllm_engines:
            found.append((f"{self.vllm_engines} vLLM engine(s)", "slow"))
        if self.children or self.jvms:
            found.append((f"{self.children} child process(es), {self.jvms} JVM environment(s)", "subprocess"))
        return found


# fixtures whose setup started something heavy: (the fixture's node id prefix, its name) -> what it started.
# Every test that uses one counts as starting it, so the check does not depend on which test set it up.
_HEAVY_FIXTURES: dict = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if not request.config.getoption("--fast"):
        yield
        return
    ray_before = _ray_up()
    with _Started() as started:
        yield
    heavy = [h for h in started.heavy() if h[1] != "integration" or not ray_before]
    if heavy:
        _HEAVY_FIXTURES[(fixturedef.baseid, fixturedef.argname)] = heavy


def _ray_up() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and getattr(ray, "is_initialized", lambda: False)())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if not item.config.getoption("--fast"):
        yield
        return
    with _Started() as started:
        outcome = yield
    heavy = started.heavy()
    for (baseid, name), what in _HEAVY_FIXTURES.items():
        if name in item.fixturenames and item.nodeid.startswith(baseid):
            heavy += [(f"{w} (fixture {name})", m) for w, m in what]
    if heavy and outcome.excinfo is None:
        what = ", ".join(w for w, _ in heavy)
        marks = ", ".join(sorted({f"@pytest.mark.{m}" for _, m in heavy}))
        pytest.fail(f"{item.nodeid} started {what} in the fast tier: mark it {marks}", pytrace=False)
