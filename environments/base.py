"""One text-environment interface for R3L (gymnasium API, text in / text out).

Contract every environment in this package follows:

- ``reset(seed=..., options=None) -> (observation: str, info: dict)``. ``info["task"]`` is the goal as
  text; ``info["admissible_actions"]`` is a list of valid action strings, or ``None`` where the
  environment has no such list. The same seed always gives the same task and the same episode for
  the same actions (retries replay on this).
- ``step(action: str) -> (observation, reward, terminated, truncated, info)``. ``reward`` is the
  increment of this step; the episode's return is the sum. An invalid action is not an exception:
  the observation says why it was invalid and ``info["invalid_action"]`` is True.
  ``info["won"]`` is True when the task is solved. ``info["admissible_actions"]`` as in reset.
- ``max_turns`` bounds an episode (the runner truncates there).
- ``failure_reward`` (default 0.0) is the return increment of an episode that ends unfinished; an
  environment that penalises failure (WebShop: -0.1) gives it at its own truncation, and the
  runner adds it when it ends an episode itself (context overflow, a lower turn limit).
- ``rules`` is a short text of the environment's rules for the system prompt and the reflector.
- ``restore(seed, actions) -> (observation, info)`` returns the environment to the state after
  ``actions`` were taken from ``reset(seed)``: replay by default, a snapshot where one exists.
- ``close()`` frees every process the environment started (JVMs included).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import gymnasium as gym


class TextEnv(gym.Env):
    """Base class for R3L text environments (see the module docstring for the contract)."""

    metadata = {"render_modes": []}
    rules: str = ""
    max_turns: int = 20
    failure_reward: float = 0.0

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = gym.spaces.Text(max_length=1 << 20)
        self.action_space = gym.spaces.Text(max_length=1 << 16)

    def restore(self, seed: Optional[int], actions: Sequence[str]) -> Tuple[str, Dict[str, Any]]:
        """Replay ``actions`` from ``reset(seed=seed)``; returns the observation and info after them.

        Raises ``RuntimeError`` if the episode ends during the replay (the recorded actions no
        longer fit the environment).
        """
        obs, info = self.reset(seed=seed)
        for i, a in enumerate(actions):
            obs, _r, term, trunc, info = self.step(a)
            if (term or trunc) and i < len(actions) - 1:
                raise RuntimeError(f"episode ended at replayed action {i} of {len(actions)}")
        return obs, info


def check_action(action: Any) -> str:
    """Actions must be strings; anything else is a caller bug with a clear message."""
    if not isinstance(action, str):
        raise TypeError(f"action must be a str, got {type(action).__name__}: {action!r}")
    return action


__all__ = ["TextEnv", "check_action"]
