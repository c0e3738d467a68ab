"""Live exploration progress: what an env runner has done so far, published for the console.

The episode runner and the explorer count, in the runner's ``counters``, what they finish
(``progress_*`` keys: base episodes, retries, turns, reflections, generated tokens;
``progress_samples``, the finished ``sample()`` calls; and ``progress_rounds``, the extra rounds of
new tasks that dynamic sampling started; and ``reflections_skipped_successes``, the successes
``reflect_on="failures"`` passed over). When the environment variable
``R3L_PROGRESS_DIR`` names a folder (the console of ``python -m rllib_r3l.cli.main`` and ``rllib-r3l
train`` set it before Ray starts, so runner processes inherit it), each runner writes those
counters there about once a second (one small JSON file per runner, replaced atomically), and the
console (``rllib_r3l.cli.live_progress.LiveProgress``) sums them into its live line. Without the variable
nothing is written. Counts are cumulative per runner: the console shows differences from the
start of an iteration.
"""

from __future__ import annotations

import glob
import json
import os
import threading
import time
from typing import Any, Dict, Mapping, Optional

ENV_VAR = "R3L_PROGRESS_DIR"
EPISODES, RETRIES, TURNS, REFLECTIONS, TOKENS, SAMPLES, ROUNDS = (
    "progress_episodes",
    "progress_retries",
    "progress_turns",
    "progress_reflections",
    "progress_tokens",
    "progress_samples",
    "progress_rounds",
)
# base episodes passed over by reflect_on="failures" (the explorer's own counter): with REFLECTIONS,
# they tell the console that every base episode has been dealt with
SKIPPED = "reflections_skipped_successes"
KEYS = (EPISODES, RETRIES, TURNS, REFLECTIONS, TOKENS, SAMPLES, ROUNDS, SKIPPED)


class Publisher:
    """A daemon thread writing ``counters``' progress keys to ``path`` every ``interval`` seconds."""

    def __init__(self, counters: Mapping[str, Any], path: str, interval: float = 1.0) -> None:
        self.counters, self.path, self.interval = counters, path, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="r3l-progress", daemon=True)
        self._thread.start()

    def snapshot(self) -> Dict[str, int]:
        return {k: int(self.counters.get(k, 0)) for k in KEYS}  # dict.get: safe while the sampler counts

    def write(self) -> None:
        tmp = f"{self.path}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump({"time": time.time(), **self.snapshot()}, f)
            os.replace(tmp, self.path)
        except OSError:  # the console's folder is gone (the run ended): nothing to tell anyone
            pass

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()

    def stop(self) -> None:
        self._stop.set()
        self.write()


def start_publisher(counters: Mapping[str, Any], tag: str) -> Optional[Publisher]:
    """A :class:`Publisher` into ``$R3L_PROGRESS_DIR`` (None when the variable is unset)."""
    folder = os.environ.get(ENV_VAR)
    if not folder or not os.path.isdir(folder):
        return None
    return Publisher(counters, os.path.join(folder, f"runner-{os.getpid()}-{tag}.json"))


def read(folder: Optional[str]) -> Dict[str, Dict[str, int]]:
    """Every runner's last published counters: ``{file name: {key: count}}``."""
    out: Dict[str, Dict[str, int]] = {}
    for path in glob.glob(os.path.join(folder, "runner-*.json")) if folder else []:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):  # being replaced right now: next time
            continue
        out[os.path.basename(path)] = {k: int(data.get(k, 0)) for k in KEYS}
    return out
