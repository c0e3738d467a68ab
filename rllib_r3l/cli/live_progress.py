"""The live progress line while an iteration runs: the runners publish their counters into a folder
(``rllib_r3l.runner.progress``), :class:`LiveProgress` sums them and redraws
:func:`rllib_r3l.cli.console.progress_line` on the console (``rllib_r3l.cli.output_routing.Console``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from typing import Dict, Iterator, Mapping, Optional

from rllib_r3l.cli.console import progress_line
from rllib_r3l.cli.output_routing import Console
from rllib_r3l.runner import progress

PREFIX = "r3l-progress-"


def _sweep_orphans(tmp: str) -> None:
    """Remove the progress folders of processes that are gone (a driver killed with ``kill -9`` cannot)."""
    for name in os.listdir(tmp):
        pid = name[len(PREFIX) :].split("-", 1)[0] if name.startswith(PREFIX) else ""
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
        except OSError:  # alive, another user's
            pass


@contextlib.contextmanager
def progress_folder(enabled: bool = True) -> Iterator[Optional[str]]:
    """A temporary folder the runners publish their progress into (``$R3L_PROGRESS_DIR`` while open).

    Set it before Ray starts: runner processes inherit the variable."""
    if not enabled:
        yield None
        return
    _sweep_orphans(tempfile.gettempdir())
    folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
    old = os.environ.get(progress.ENV_VAR)
    os.environ[progress.ENV_VAR] = folder
    try:
        yield folder
    finally:
        if old is None:
            os.environ.pop(progress.ENV_VAR, None)
        else:
            os.environ[progress.ENV_VAR] = old
        shutil.rmtree(folder, ignore_errors=True)


class LiveProgress:
    """Draws :func:`progress_line` from the runners' published counters while an iteration runs."""

    def __init__(
        self, console: Console, folder: Optional[str], expected: Optional[int] = None, reflect: bool = True
    ) -> None:
        self.console, self.folder, self.expected, self.reflect = console, folder, expected, reflect
        self._baseline: Dict[str, Dict[str, int]] = {}
        self._t0 = self._last = time.time()
        self._active = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def counts(self) -> Dict[str, int]:
        """This iteration's counts, summed over runners."""
        now = progress.read(self.folder)
        return {
            k: sum(c.get(k, 0) - self._baseline.get(f, {}).get(k, 0) for f, c in now.items()) for k in progress.KEYS
        }

    def line(self) -> str:
        c = self.counts()
        runners = progress.read(self.folder)
        return progress_line(
            c, time.time() - self._t0, self.expected_now(c, len(runners)), phase=self.phase(c, len(runners))
        )

    def expected_now(self, c: Mapping[str, int], n_runners: int) -> Optional[int]:
        """The base episodes expected so far: each extra round of dynamic sampling adds a runner's share."""
        if not self.expected:
            return self.expected
        return self.expected + round(c.get(progress.ROUNDS, 0) * self.expected / max(n_runners, 1))

    def phase(self, c: Mapping[str, int], n_runners: int) -> str:
        """What the runners are at, as far as their counts tell (the sums over runners)."""
        if self.folder and not n_runners:
            return "starting"  # no runner has its engine up yet
        if c.get(progress.SAMPLES, 0) >= max(n_runners, 1):
            return "learning"  # every runner returned its sample
        episodes = c.get(progress.EPISODES, 0)
        expected = self.expected_now(c, n_runners)
        if not expected or episodes < expected or not self.reflect:
            return "exploring"
        dealt_with = c.get(progress.REFLECTIONS, 0) + c.get(progress.SKIPPED, 0)  # reflected or passed over
        return "reflecting" if dealt_with < episodes else "retrying"

    def begin(self) -> None:
        """A new iteration starts now."""
        self._baseline = progress.read(self.folder)
        self._t0 = self._last = time.time()  # the first line one interval in, not an empty one at 0:00
        self._active = True
        if self._thread is None:
            thread = threading.Thread(target=self._loop, name="r3l-console", daemon=True)
            thread.start()  # a signal landing inside start() leaves no half-started thread for stop() to join
            self._thread = thread

    def pause(self) -> None:
        self._active = False

    def stop(self) -> None:
        self._active = False
        self._stop.set()
        if self._thread is not None and self._thread.ident is not None:  # started (a signal can cut start short)
            self._thread.join(timeout=2)
        self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            if self._active and time.time() - self._last >= self.console.live_interval:
                self._last = time.time()
                with contextlib.suppress(Exception):  # a display glitch never stops training
                    if self._active:
                        self.console.live(self.line())
