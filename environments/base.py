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

Optional oracle (``has_oracle = True``; used by the oracle reflector and the pivot-quality metrics
of ``rllib_r3l.runner.reflection.pivot_metrics``): ``oracle_pivot(seed, actions)`` is the first turn from which the
episode could no longer be finished optimally (in the fewest turns), or None when it still could
(nothing to fix); ``oracle_action(seed, actions)`` is the first action of an optimal finish from the
state after ``actions`` (None when ``actions`` already left every optimal path); ``oracle(seed,
actions)`` gives the pivot and the gold action at it. Each environment's docstring says how its
truth is computed.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

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

    # -------------------------------------------------------------------------------------- oracle
    has_oracle: bool = False

    def _oracle_walk(self, seed: Optional[int], actions: Sequence[str]) -> Tuple[Optional[int], List[str]]:
        """``(pivot, plan)``: the oracle pivot of ``actions`` (None: no pivot) and an optimal plan from
        the state at the pivot (after all of ``actions`` when there is none). Oracle environments
        implement this."""
        raise NotImplementedError(f"{type(self).__name__} has no oracle (has_oracle is False)")

    def oracle(self, seed: Optional[int], actions: Sequence[str]) -> Tuple[Optional[int], Optional[str]]:
        """``(oracle pivot, gold action at the pivot)``; ``(None, None)`` when there is no pivot."""
        pivot, plan = self._oracle_walk(seed, [check_action(a) for a in actions])
        if pivot is None:
            return None, None
        return pivot, (plan[0] if plan else None)

    def oracle_pivot(self, seed: Optional[int], actions: Sequence[str]) -> Optional[int]:
        """The first turn from which the episode could no longer be finished optimally (None: it can)."""
        return self.oracle(seed, actions)[0]

    def oracle_action(self, seed: Optional[int], actions: Sequence[str]) -> Optional[str]:
        """The gold action after ``actions``: the first action of an optimal finish from that state.
        None when ``actions`` already left every optimal path (or the task is finished)."""
        pivot, plan = self._oracle_walk(seed, [check_action(a) for a in actions])
        if pivot is not None or not plan:
            return None
        return plan[0]


def follow_plan(
    actions: Sequence[str],
    plan: Sequence[str],
    replan: Callable[[int, List[str], str], Optional[List[str]]],
    same: Callable[[str, str], bool] = lambda a, b: a == b,
) -> Tuple[Optional[int], List[str]]:
    """Walk ``actions`` along an optimal ``plan`` (from the start state); returns ``(pivot, plan)``.

    An action equal to the plan's next one keeps the episode optimal. Any other action at turn ``k``
    asks ``replan(k + 1, plan, action)`` for a plan of ``len(plan) - 1`` actions that still finishes
    from the state after ``actions[:k + 1]`` (None: there is none, so turn ``k`` is the pivot; the
    returned plan is then the one at the pivot, whose first action is the gold action there).
    """
    plan = list(plan)
    for k, a in enumerate(actions):
        if plan and same(a, plan[0]):
            plan = plan[1:]
            continue
        new = replan(k + 1, plan, a) if plan else None
        if new is None:
            return k, plan
        plan = list(new)
    return None, plan


def repair_candidates(plan: Sequence[str], action: str) -> List[List[str]]:
    """Plans one action shorter than ``plan`` that may still finish after ``action`` was taken instead
    of ``plan[0]``: ``plan`` without ``action`` (the agent did a later step of the plan early) and
    ``plan[1:]`` (the plan's first step was not needed)."""
    out: List[List[str]] = []
    if action in plan:
        i = list(plan).index(action)
        out.append(list(plan[:i]) + list(plan[i + 1 :]))
    if plan and list(plan[1:]) not in out:
        out.append(list(plan[1:]))
    return out


def minimize_plan(
    plan: Sequence[str], wins: Callable[[List[str]], Optional[int]], max_checks: Optional[int] = None
) -> List[str]:
    """A solution no single action of which can be left out: ``plan`` cut at its win, then, one
    action at a time (up to ``max_checks`` replays), without each action whose removal still wins.
    ``wins(actions)`` replays from the start and returns how many actions were played when the task
    was won (None: not won)."""
    n = wins(list(plan))
    if n is None:
        raise RuntimeError("the plan does not win")
    plan = list(plan[:n])
    checks, i = 0, len(plan) - 1
    while i >= 0 and (max_checks is None or checks < max_checks):
        cand = plan[:i] + plan[i + 1 :]
        checks += 1
        m = wins(cand)
        if m is not None:
            plan = cand[:m]
            i = min(i, len(plan))
        i -= 1
    return plan


def replay_wins(env: Any, seed: Optional[int], actions: Sequence[str], **overrides: Any) -> Optional[int]:
    """Replay ``actions`` from ``env.reset(seed)`` with the env's attributes ``overrides`` set for the
    replay (e.g. no turn limit): how many were played when the task was won (None: not won). The
    env is left finished (``reset()`` before stepping it again)."""
    keep = {k: getattr(env, k) for k in overrides}
    for k, v in overrides.items():
        setattr(env, k, v)
    try:
        env.reset(seed=seed)
        for i, a in enumerate(actions):
            _o, _r, term, trunc, info = env.step(a)
            if info.get("won"):
                return i + 1
            if term or trunc:
                return None
        return None
    finally:
        for k, v in keep.items():
            setattr(env, k, v)
        env._done = True


def plan_walk(
    actions: Sequence[str], plan: Sequence[str], wins: Callable[[List[str]], Optional[int]]
) -> Tuple[Optional[int], List[str]]:
    """:func:`follow_plan` whose deviations are repaired by :func:`repair_candidates` checked with
    ``wins`` (a replay from the start); actions are compared normalised."""
    from environments._common import normalize_action

    acts = [normalize_action(a) for a in actions]

    def replan(n: int, p: List[str], a: str) -> Optional[List[str]]:
        for cand in repair_candidates(p, a):
            if wins(acts[:n] + cand) is not None:
                return cand
        return None

    return follow_plan(acts, [normalize_action(a) for a in plan], replan)


class GoldPlanOracle:
    """Mixin for a :class:`TextEnv` whose oracle follows the environment's own solution.

    The plan is ``gold_actions(seed)`` cut at its win and, with up to ``oracle_checks`` replays
    (None: all), without each action whose removal still wins (:func:`minimize_plan`), taken as
    optimal; :func:`plan_walk` finds the pivot. ``_wins`` replays through the adapter with
    ``_replay_overrides`` set (by default: no turn limit). Cached per seed in the instance.
    """

    has_oracle = True
    oracle_checks: Optional[int] = None
    _replay_overrides: Dict[str, Any] = {"max_turns": 10**6}

    def _wins(self, seed: Optional[int], actions: Sequence[str]) -> Optional[int]:
        return replay_wins(self, seed, actions, **self._replay_overrides)

    def _gold_plan(self, seed: Optional[int]) -> List[str]:
        from environments._common import normalize_action

        cache = self.__dict__.setdefault("_oracle_plans", {})
        key = int(seed or 0)
        if key not in cache:
            gold = [normalize_action(a) for a in self.gold_actions(seed)]
            try:
                cache[key] = minimize_plan(gold, lambda acts: self._wins(seed, acts), max_checks=self.oracle_checks)
            except RuntimeError:
                raise RuntimeError(
                    f"{type(self).__name__}: the environment's own solution does not solve seed "
                    f"{seed} through this adapter"
                ) from None
        return list(cache[key])

    def _oracle_walk(self, seed, actions):
        return plan_walk(actions, self._gold_plan(seed), lambda acts: self._wins(seed, acts))


def check_action(action: Any) -> str:
    """Actions must be strings; anything else is a caller bug with a clear message."""
    if not isinstance(action, str):
        raise TypeError(f"action must be a str, got {type(action).__name__}: {action!r}")
    return action


__all__ = [
    "TextEnv",
    "check_action",
    "follow_plan",
    "repair_candidates",
    "minimize_plan",
    "replay_wins",
    "plan_walk",
    "GoldPlanOracle",
]
