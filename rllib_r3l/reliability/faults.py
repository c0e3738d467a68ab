"""Fault injection: testing aids that make R3L's failure handling observable. OFF by default.

``inject(config, {...})`` on an ``R3LConfig`` (a testing aid, deliberately not a config option: no
YAML file or ``--set`` reaches it) makes environments crash, JVMs die, env-runner actors get killed mid-sample, or
learner updates turn
NaN, at chosen points or with a given probability. Every injected fault is counted, so a test can
check that each one was survived and that what it cost (lost episodes, skipped updates) was counted
too (``scripts/soak.py``, ``tests/reliability/test_reliability.py``, ``docs/reliability.md``).

Never set this in a real training run: it exists to test the recovery paths.

Options (``FAULT_OPTIONS``; ``*_prob`` draws once per event from a seeded RNG, ``*_at_*`` lists fixed
event indices, both may be combined):

==============================  ==========================================================================
``seed``                        seed of the injection RNG (default: the config ``seed``, else 0)
``env_raise_prob`` / ``_at_steps``   ``env.step`` raises ``InjectedFault`` (an environment crash)
``env_kill_jvm_prob`` / ``_at_steps`` SIGKILL the environment's JVM (``env.jvm_pid``: TextWorldExpress,
                                ScienceWorld), then step: the real call fails as after a JVM crash
``env_bad_observation_prob`` / ``_at_steps``  the step returns a non-string observation
``nan_loss_prob`` / ``_at_updates``   the first micro-batch loss of a learner update becomes NaN
``nan_grad_prob`` / ``_at_updates``   a gradient becomes +inf after backward
``engine_death_prob`` / ``_at_calls``  the policy's generation engine dies at a generate call: that call
                                and every later one raise until the runner rebuilds the engine
``kill_runner_at_iterations``   ``ray.kill`` (Ray restarts it) a remote env runner while it samples,
                                in these training iterations (1-based ``training_iteration``)
``kill_runner_delay_s``         seconds after sampling starts before the kill (default 0.3)
==============================  ==========================================================================

Step indices count ``env.step`` calls per env-runner process (0-based, across all its environments);
update indices count learner updates per learner process (0-based); call indices count the policy
engine's generate calls per runner process (0-based, across rebuilt engines).
"""

from __future__ import annotations

import difflib
import logging
import os
import signal
import threading
import time
from collections import Counter
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from rllib_r3l import ray_internals

logger = logging.getLogger(__name__)

_PROB, _INDICES, _SECONDS, _SEED = "probability in [0, 1]", "list of integers >= 0", "number >= 0", "integer"

# name -> (kind, default, help)
FAULT_OPTIONS: Dict[str, tuple] = {
    "seed": (_SEED, None, "seed of the injection RNG (default: config seed, else 0)"),
    "env_raise_prob": (_PROB, 0.0, "probability that an env.step raises (environment crash)"),
    "env_raise_at_steps": (_INDICES, [], "env.step indices (per runner process) that raise"),
    "env_kill_jvm_prob": (_PROB, 0.0, "probability that the env's JVM is SIGKILLed before a step"),
    "env_kill_jvm_at_steps": (_INDICES, [], "env.step indices before which the env's JVM is SIGKILLed"),
    "env_bad_observation_prob": (_PROB, 0.0, "probability that a step returns a non-string observation"),
    "env_bad_observation_at_steps": (_INDICES, [], "env.step indices that return a non-string observation"),
    "nan_loss_prob": (_PROB, 0.0, "probability that a learner update's loss becomes NaN"),
    "nan_loss_at_updates": (_INDICES, [], "learner update indices whose loss becomes NaN"),
    "nan_grad_prob": (_PROB, 0.0, "probability that a learner update's gradient becomes inf"),
    "nan_grad_at_updates": (_INDICES, [], "learner update indices whose gradient becomes inf"),
    "engine_death_prob": (
        _PROB,
        0.0,
        "probability that a generate call finds the policy's engine dead (it and every "
        "later call of that engine raise, until the runner rebuilds it)",
    ),
    "engine_death_at_calls": (_INDICES, [], "generate-call indices (per runner process) at which the engine dies"),
    "kill_runner_at_iterations": (
        _INDICES,
        [],
        "training iterations in which a remote env runner is killed mid-sample",
    ),
    "kill_runner_delay_s": (_SECONDS, 0.3, "seconds after sampling starts before the runner is killed"),
}

ENV_FAULTS = ("env_kill_jvm", "env_raise", "env_bad_observation")  # checked in this order per step
LEARNER_FAULTS = ("nan_loss", "nan_grad")
ENGINE_FAULTS = ("engine_death",)


class InjectedFault(RuntimeError):
    """An exception raised on purpose by fault injection."""


# ------------------------------------------------------------------------------------------------------
# configuration
def validate_fault_injection(value: Any) -> Dict[str, Any]:
    """Check a ``fault_injection`` dict; return it with defaults filled in. Errors name the key."""
    field = "faults.inject"
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ValueError(f"{field}: must be a dict (empty = no fault injection), got {type(value).__name__}")
    out = {k: (list(d) if isinstance(d, list) else d) for k, (_kind, d, _h) in FAULT_OPTIONS.items()}
    for key, v in value.items():
        if key not in FAULT_OPTIONS:
            close = difflib.get_close_matches(str(key), list(FAULT_OPTIONS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{field}: unknown key {key!r}{hint}; known keys: {', '.join(FAULT_OPTIONS)}")
        kind = FAULT_OPTIONS[key][0]
        bad = ValueError(f"{field}[{key!r}]: must be a {kind}, got {v!r}")
        if kind == _PROB:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= float(v) <= 1.0:
                raise bad
            v = float(v)
        elif kind == _INDICES:
            if isinstance(v, int) and not isinstance(v, bool):
                v = [v]
            if not isinstance(v, (list, tuple)) or any(
                isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in v
            ):
                raise bad
            v = sorted(set(int(i) for i in v))
        elif kind == _SECONDS:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise bad
            v = float(v)
        elif kind == _SEED:
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise bad
        out[key] = v
    return out


def inject(config: Any, plan: Dict[str, Any]) -> Any:
    """Make ``config`` (an ``R3LConfig``) inject the faults of ``plan`` (keys: ``FAULT_OPTIONS``); returns
    ``config``. Errors name the key. ``{}`` injects nothing."""
    validate_fault_injection(plan)
    config._fault_injection = dict(plan)
    return config


def validate_reliability_options(config: Any) -> None:
    """Validate the reliability options of ``R3LConfig`` (called by ``validate_r3l``)."""
    seed = config.sampling_seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"R3LConfig.sampling_seed: must be None (unseeded) or an integer >= 0, got {seed!r}")
    retries = config.runner_failure_retries
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(
            f"R3LConfig.runner_failure_retries: must be an integer >= 0 (0 = no re-sampling), got {retries!r}"
        )
    wait = config.runner_restart_wait_s
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0:
        raise ValueError(f"R3LConfig.runner_restart_wait_s: must be a number of seconds >= 0, got {wait!r}")
    plan = validate_fault_injection(config._fault_injection)
    if has_learner_faults(plan) and config.deepspeed:
        raise ValueError(
            "faults.inject: nan_loss_*/nan_grad_* are injected into R3L's torch learner; with "
            "deepspeed=True they would not be: inject them with deepspeed=False"
        )


def fault_plan(config: Any) -> Optional[Dict[str, Any]]:
    """The validated fault-injection plan of ``config``, or None when nothing is injected."""
    raw = config._fault_injection
    if not raw:
        return None
    plan = validate_fault_injection(raw)
    if plan["seed"] is None:
        plan["seed"] = int(config.seed or 0)
    return plan


def _any(plan: Optional[Dict[str, Any]], names) -> bool:
    return bool(plan) and any(plan[f"{n}_prob"] > 0 or plan[f"{n}_at_{_unit(n)}"] for n in names)


def has_learner_faults(plan: Optional[Dict[str, Any]]) -> bool:
    """Whether ``plan`` injects a learner fault (``reliability/learner_faults.py`` then trains)."""
    return _any(plan, LEARNER_FAULTS)


def _unit(name: str) -> str:
    return "updates" if name in LEARNER_FAULTS else "calls" if name in ENGINE_FAULTS else "steps"


class Trigger:
    """Decides, per event index, which faults fire (a fixed index or a seeded coin flip)."""

    def __init__(self, plan: Dict[str, Any], names, seed_parts: List[int]) -> None:
        self.plan = plan
        self.names = [n for n in names if plan[f"{n}_prob"] > 0 or plan[f"{n}_at_{_unit(n)}"]]
        self.rng = np.random.default_rng([int(plan["seed"])] + [int(p) for p in seed_parts])
        self.index = 0

    def next(self) -> List[str]:
        i, self.index = self.index, self.index + 1
        fired = []
        for n in self.names:  # one draw per fault kind per event, whatever fires: decisions stay reproducible
            coin = self.rng.random() < self.plan[f"{n}_prob"]
            if coin or i in self.plan[f"{n}_at_{_unit(n)}"]:
                fired.append(n)
        return fired


# ------------------------------------------------------------------------------------------------------
# environments
class FaultyEnv:
    """Wraps a text environment and injects crashes, JVM kills and bad observations into ``step``."""

    def __init__(self, env: Any, trigger: Trigger, counters: Counter) -> None:
        self.env = env
        self._trigger = trigger
        self._counters = counters

    def __getattr__(self, name: str) -> Any:  # rules, max_turns, jvm_pid, restore, ...
        return getattr(self.env, name)

    def reset(self, *args, **kwargs):
        return self.env.reset(*args, **kwargs)

    def step(self, action):
        fired = self._trigger.next()
        if not fired:
            return self.env.step(action)
        kind = fired[0]  # one fault per step
        self._counters[f"injected_{kind}"] += 1
        if kind == "env_kill_jvm":
            kill_jvm(self.env)
            return self.env.step(action)  # fails like a step after a real JVM crash
        if kind == "env_raise":
            raise InjectedFault(f"injected environment crash at step {self._trigger.index - 1}")
        _obs, reward, term, trunc, info = self.env.step(action)
        return {"not": "a string"}, reward, term, trunc, info

    def close(self) -> None:
        self.env.close()


def kill_jvm(env: Any, timeout: float = 10.0) -> int:
    """SIGKILL the JVM behind ``env`` (``env.jvm_pid``) and wait until it is gone; returns the pid."""
    pid = getattr(env, "jvm_pid", None)
    if pid is None:
        raise InjectedFault(f"fault_injection env_kill_jvm: {type(env).__name__} has no running JVM (jvm_pid)")
    os.kill(pid, signal.SIGKILL)
    proc = getattr(getattr(getattr(env, "_env", None), "_gateway", None), "java_process", None)
    if proc is not None:
        proc.wait(timeout=timeout)
    else:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
            time.sleep(0.02)
    return pid


def wrap_env_factory(
    factory: Callable[[], Any], config: Any, counters: Counter, worker_index: int
) -> Callable[[], Any]:
    """``factory`` itself, or (with env faults configured) one whose environments inject faults.

    All environments of one runner share one trigger: step indices count across them.
    """
    plan = fault_plan(config)
    if not _any(plan, ENV_FAULTS):
        return factory
    trigger = Trigger(plan, ENV_FAULTS, [1, worker_index])
    return lambda: FaultyEnv(factory(), trigger, counters)


# ------------------------------------------------------------------------------------------------------
# generation engine
class FaultyBackend:
    """Wraps a generation backend; at an injected ``engine_death`` the engine dies: that call and every
    later one raise, as calls into a crashed vLLM engine do, until the runner builds a new engine."""

    def __init__(self, backend: Any, trigger: Trigger, counters: Counter) -> None:
        self.backend = backend
        self._trigger = trigger
        self._counters = counters
        self.dead = False

    def __getattr__(self, name: str) -> Any:  # tokenizer, update_weights, close, sleep, ...
        return getattr(self.backend, name)

    def generate(self, requests, **kwargs):
        if not self.dead and self._trigger.next():
            self.dead = True
            self._counters["injected_engine_death"] += 1
        if self.dead:
            raise InjectedFault("injected engine death: the engine is gone")
        return self.backend.generate(requests, **kwargs)


def wrap_backend(
    backend: Any, config: Any, counters: Counter, worker_index: int, trigger: Optional[Trigger] = None
) -> Tuple[Any, Optional[Trigger]]:
    """``(backend, None)``, or with engine faults configured a ``FaultyBackend`` and its trigger (pass
    the trigger back for a rebuilt engine, so that call indices count across engines)."""
    plan = fault_plan(config)
    if not _any(plan, ENGINE_FAULTS):
        return backend, None
    trigger = trigger or Trigger(plan, ENGINE_FAULTS, [3, worker_index])
    return FaultyBackend(backend, trigger, counters), trigger


# ------------------------------------------------------------------------------------------------------
# env-runner actors
class RunnerKill:
    """A timer that ``ray.kill``s (with restart) one remote env runner while the driver waits on sampling."""

    def __init__(self, actor: Any, runner_id: int, delay_s: float) -> None:
        self.runner_id = runner_id
        self.fired = False
        self._actor = actor
        self._lock = threading.Lock()
        self._finished = False
        self._timer = threading.Timer(delay_s, self._kill)
        self._timer.daemon = True
        self._timer.start()

    def _kill(self) -> None:
        import ray

        with self._lock:  # never after the driver has the sample: that would be a kill between samples
            if self._finished:
                return
            try:
                ray.kill(self._actor, no_restart=False)
                self.fired = True
                logger.warning("fault injection: killed env runner %d mid-sample", self.runner_id)
            except Exception:  # already dead: nothing injected
                logger.exception("fault injection: could not kill env runner %d", self.runner_id)

    def finish(self) -> bool:
        """Call as soon as sampling returned: cancel a kill that has not happened; True when it happened."""
        with self._lock:
            self._finished = True
        self._timer.cancel()
        self._timer.join(timeout=30)
        return self.fired


def maybe_kill_runner(algo: Any, runner_ids: List[int]) -> Optional[RunnerKill]:
    """Arm a mid-sample kill of one of ``runner_ids`` when this iteration is listed in the plan."""
    plan = fault_plan(algo.config)
    if not plan or not runner_ids:
        return None
    iteration = int(algo.iteration) + 1  # the iteration being run (training_iteration of its result)
    if iteration not in plan["kill_runner_at_iterations"]:
        return None
    rid = runner_ids[iteration % len(runner_ids)]
    actor = ray_internals.actor(algo.env_runner_group, rid)
    if actor is None:
        return None
    return RunnerKill(actor, rid, plan["kill_runner_delay_s"])
