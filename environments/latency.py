"""A fixed wait added to every environment step: a stand-in for the latency of a tool call, a web page or a
remote simulator, so that a rollout loop's cost of slow environments can be measured on any environment.

``env_config={"step_delay_s": 1.0}`` (an env runner's key, any environment) makes every ``step`` return
``step_delay_s`` seconds later than it would, the observation unchanged; ``reset`` is not delayed (a
retry's replay steps, so it pays the delay per replayed action, as a real slow environment would).
The wait is a ``time.sleep``: it releases the GIL, as waiting on a socket or a subprocess does.
"""

from __future__ import annotations

import time
from typing import Any


class StepDelay:
    """``env`` whose ``step`` takes ``delay_s`` seconds longer; every other attribute is ``env``'s."""

    def __init__(self, env: Any, delay_s: float) -> None:
        if not isinstance(delay_s, (int, float)) or isinstance(delay_s, bool) or not delay_s >= 0:
            raise ValueError(f"env_config.step_delay_s must be a number >= 0 (seconds), got {delay_s!r}")
        self.env = env
        self.delay_s = float(delay_s)

    def __getattr__(self, name: str) -> Any:  # rules, max_turns, restore, oracle_pivot, ...
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    @property
    def env_name(self) -> str:
        """The wrapped environment's class name (what a trajectory records as its ``env_id``)."""
        return getattr(self.env, "env_name", type(self.env).__name__)

    def reset(self, *args: Any, **kwargs: Any):
        return self.env.reset(*args, **kwargs)

    def step(self, action: str):
        out = self.env.step(action)
        time.sleep(self.delay_s)
        return out

    def close(self) -> None:
        self.env.close()


def with_step_delay(env: Any, delay_s: float) -> Any:
    """``env`` itself for no delay, else wrapped in :class:`StepDelay`."""
    return StepDelay(env, delay_s) if delay_s else env


__all__ = ["StepDelay", "with_step_delay"]
