"""A driver that starts its own Ray (``ray.init(address="local")``, as the main job does) and is
killed with SIGKILL leaves no process of its Ray session behind for good.

What Ray does (docs/reliability.md, "Driver killed: its Ray processes"): ``ray.init`` starts the GCS,
the raylet, the monitors and the dashboard with ``PR_SET_PDEATHSIG=SIGKILL`` (kernel fate-sharing),
so they die with the driver; the workers and actors exit when their raylet is gone; the raylet's
two agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) see their raylet die at once but then
try to report it through the dead GCS (a hard-coded 60 s timeout) and exit after that, about 75 s
after the kill here. The test waits for that, bounded only by the hang guard (never a speed limit).

The scenario (start, train, kill) starts in the background when the suite's collection ends
(``START_EARLY``, called by tests/conftest.py), so those 75 s pass while the tests before this one run;
the test checks the outcome at its turn (run alone, it starts the scenario itself and waits).
"""

import atexit
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tests import REPO_ROOT
from tests.hang_guard import HANG_GUARD_S

pytestmark = pytest.mark.integration

# the main job's own ray.init (rllib_r3l/cli/main.py), then a real run: a remote env runner (an actor
# process), the local learner, one iteration; then the driver waits to be killed
_DRIVER = r"""
import time
import ray
import rllib_r3l  # noqa: F401
from tests.scripted_rllib import tiny_config

ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=True,
         logging_level="WARNING")
algo = tiny_config(num_threads=1).env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5).build_algo()
algo.train()
print("READY", ray._private.worker._global_node.get_session_dir_path(), flush=True)
time.sleep(3600)
"""


def _read_until_ready(driver, deadline):
    """The driver's output up to its READY line; ends early when the driver exits first (it failed)."""
    lines: "queue.Queue[str]" = queue.Queue()

    def pump():
        for line in driver.stdout:
            lines.put(line)
        lines.put("")  # the driver's output ended

    threading.Thread(target=pump, daemon=True).start()
    out = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            continue
        if not line:
            break
        out.append(line)
        if line.startswith("READY "):
            break
    return out


def _alive(procs):
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _describe(procs):
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {p.name()}")
        except psutil.Error:
            out.append(str(p.pid))
    return out


class _KilledDriver(threading.Thread):
    """Starts the driver, waits for READY, records its session's processes and SIGKILLs it."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="killed-driver-scenario")
        self.lines: list = []
        self.session: list = []
        self.names = ""
        self.driver = None

    def run(self) -> None:
        env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONPATH=str(REPO_ROOT))
        self.driver = subprocess.Popen(
            [sys.executable, "-c", _DRIVER],
            cwd=str(REPO_ROOT),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines = _read_until_ready(self.driver, time.monotonic() + HANG_GUARD_S)
        if not (self.lines and self.lines[-1].startswith("READY ")):
            return
        # the session's processes: everything the driver started, its children's children included (the
        # agents and workers are the raylet's); psutil keeps each one's start time, so a reused pid is no match
        self.session = psutil.Process(self.driver.pid).children(recursive=True)
        self.names = " ".join(_describe(self.session))  # read now: the test looks after they have exited
        os.kill(self.driver.pid, signal.SIGKILL)
        self.driver.wait(timeout=HANG_GUARD_S)

    def cleanup(self) -> None:
        if self.driver is not None and self.driver.poll() is None:
            self.driver.kill()
            self.driver.wait()
        for p in _alive(self.session):  # only this scenario's own processes
            try:
                p.kill()
            except psutil.Error:
                pass


_SCENARIO: "_KilledDriver | None" = None


def start_scenario() -> _KilledDriver:
    """The scenario, started once per process (a pytest run that ends first kills what is left of it)."""
    global _SCENARIO
    if _SCENARIO is None:
        _SCENARIO = _KilledDriver()
        _SCENARIO.start()
        atexit.register(_SCENARIO.cleanup)
    return _SCENARIO


START_EARLY = {"test_a_killed_driver_leaves_no_process_of_its_ray_session": start_scenario}


def test_a_killed_driver_leaves_no_process_of_its_ray_session(tiny_model_dir):
    scenario = start_scenario()
    try:
        scenario.join(timeout=2 * HANG_GUARD_S)
        assert not scenario.is_alive(), "the driver neither became ready nor was killed within the hang guard"
        assert scenario.lines and scenario.lines[-1].startswith("READY "), "".join(scenario.lines[-40:])
        names = scenario.names
        assert "raylet" in names and "gcs_server" in names and "DashboardAgent" in names, names
        deadline = time.monotonic() + HANG_GUARD_S
        while _alive(scenario.session) and time.monotonic() < deadline:
            time.sleep(1.0)
        left = _describe(_alive(scenario.session))
        assert left == [], f"still running {HANG_GUARD_S:.0f} s after the kill: {left}"
    finally:
        scenario.cleanup()
