"""A runner's environments: a pool of instances, opening an episode (a reset, or a retry's verified replay of
its base's actions up to the pivot, paper §4) and stepping one.

``open_env`` and ``step_env`` never raise and touch nothing shared but the pool (under a lock): they return
what happened (an :class:`Outcome`), and the caller counts it. So the episode loops
(:mod:`rllib_r3l.runner.episode_loop`) run them in worker threads while the engine generates, and the
waves (:meth:`rllib_r3l.runner.rollout.EpisodeRunner.run`) call them inline, with the same accounting.
"""

from __future__ import annotations

import math
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, List, Optional


@dataclass
class Outcome:
    """What an environment call gave: ``value`` or ``error`` (a formatted traceback), and its seconds."""

    value: Any = None
    error: Optional[str] = None
    error_short: Optional[str] = None  # its first three frames (what a trajectory keeps)
    mismatch: Optional[str] = None  # a retry's replay no longer matches its base (the retry is skipped)
    created: bool = True  # False: the environment could not even be created
    env: Any = None
    seconds: float = 0.0

    def fail(self) -> None:
        """Record the exception being handled."""
        self.error, self.error_short = traceback.format_exc(), traceback.format_exc(limit=3)


class ReplayMismatch(RuntimeError):
    pass


def check_env_output(obs: Any, info: Any) -> None:
    """An environment must return a str observation and a dict info (else: an environment error)."""
    if not isinstance(obs, str):
        raise TypeError(f"environment returned a {type(obs).__name__} observation, expected str")
    if not isinstance(info, dict):
        raise TypeError(f"environment returned a {type(info).__name__} info, expected dict")


class EnvPool:
    """Environment instances of one runner, reused across episodes; one instance per live episode (an
    environment need not be thread-safe: no two threads ever use one instance at once)."""

    def __init__(self, factory: Callable[[], Any], counters: Counter) -> None:
        self.factory = factory
        self.counters = counters
        self._free: List[Any] = []
        self._lock = threading.Lock()

    def acquire(self) -> Any:
        with self._lock:
            if self._free:
                return self._free.pop()
        return self.factory()

    def release(self, env: Any, healthy: bool) -> None:
        """Back to the pool, or (a crashed environment) closed; a failed close is counted, the instance replaced."""
        if healthy:
            with self._lock:
                self._free.append(env)
            return
        try:
            env.close()
        except Exception:  # a crashed environment may fail to close; it is replaced either way
            self.counters["env_close_errors"] += 1

    def close(self) -> None:
        with self._lock:
            envs, self._free = self._free, []
        for env in envs:
            try:
                env.close()
            except Exception:
                self.counters["env_close_errors"] += 1

    # -- calls that return an Outcome ------------------------------------------------------------------
    def open_env(self, seed: int, base: Any = None, pivot: int = 0, verify: bool = True) -> Outcome:
        """An environment at the start of an episode: ``reset(seed)``, or (``base`` given) the state before
        turn ``pivot`` of ``base``, by replaying its actions (checked against its observations with ``verify``)."""
        t0 = time.perf_counter()
        out = Outcome()
        try:
            out.env = self.acquire()
        except Exception:  # e.g. a JVM that does not start: the episode is lost, counted by the caller
            out.created = False
            out.fail()
            out.seconds = time.perf_counter() - t0
            return out
        try:
            if base is None:
                obs, info = out.env.reset(seed=seed)
                check_env_output(obs, info)
                out.value = (obs, info)
            else:
                out.value = self._replay_prefix(out.env, base, pivot, verify)
        except ReplayMismatch as e:
            out.mismatch = str(e)
        except Exception:
            out.fail()
        out.seconds = time.perf_counter() - t0
        return out

    def _replay_prefix(self, env: Any, base: Any, pivot: int, verify: bool):
        """Restore the state before turn ``pivot`` by replaying the recorded actions (verified)."""
        traj_obs = base.observations
        obs, info = env.reset(seed=base.seed)
        check_env_output(obs, info)
        if verify and str(obs) != traj_obs[0]:
            raise ReplayMismatch(f"observation 0 differs after reset(seed={base.seed})")
        for i in range(pivot):
            obs, _r, term, trunc, info = env.step(base.actions[i])
            check_env_output(obs, info)
            if verify and str(obs) != traj_obs[i + 1]:
                raise ReplayMismatch(f"observation {i + 1} differs on replay")
            if term or trunc:
                raise ReplayMismatch(f"episode ended during replay at action {i}")
        return obs, info

    @staticmethod
    def step_env(env: Any, action: str) -> Outcome:
        """``env.step(action)`` with its output checked (a str observation, a dict info, a finite reward)."""
        t0 = time.perf_counter()
        out = Outcome(env=env)
        try:
            obs, reward, term, trunc, info = env.step(action)
            check_env_output(obs, info)
            reward = float(reward)
            if not math.isfinite(reward):
                raise ValueError(f"environment returned a non-finite reward {reward!r}")
            out.value = (obs, reward, term, trunc, info)
        except Exception:
            out.fail()
        out.seconds = time.perf_counter() - t0
        return out


__all__ = ["EnvPool", "Outcome", "ReplayMismatch", "check_env_output"]
