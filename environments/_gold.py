"""Does an environment's own solution solve it through our adapter, also after ``restore()``?

:func:`check_solution` plays a solution (e.g. ``env.gold_actions(seed)``) from ``reset(seed)``, then,
for every prefix (or every ``stride``-th), restores the environment to that prefix (the retry path of
reflect-then-retry) and plays the rest. It passes when the episode ends ``won`` with return 1.0 every
time, and each restore gives the recorded observation. Used by the tests (a sample) and by
``scripts/gold_paths.py`` (everything).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

__all__ = ["SolutionCheck", "check_solution"]


@dataclass
class SolutionCheck:
    length: int = 0  # actions in the solution
    steps: int = 0  # actions played until the episode ended
    ret: float = 0.0  # return of the plain play
    won: bool = False
    fits_max_turns: bool = True  # the solution ends within the environment's own max_turns
    prefixes_checked: int = 0
    prefixes_failed: List[int] = field(default_factory=list)
    error: str = ""

    @property
    def passed(self) -> bool:
        return self.won and math.isclose(self.ret, 1.0, abs_tol=1e-6) and not self.error

    @property
    def restore_passed(self) -> bool:
        return self.passed and not self.prefixes_failed


def _play(env: Any, actions: Sequence[str]):
    rewards, observations, info, ended = [], [], {}, False
    for a in actions:
        obs, r, term, trunc, info = env.step(a)
        rewards.append(float(r))
        observations.append(obs)
        if term or trunc:
            ended = True
            break
    return rewards, observations, info, ended


def check_solution(env: Any, seed: int, solution: Sequence[str], stride: Optional[int] = 1) -> SolutionCheck:
    """Play ``solution`` on ``env`` from ``seed``; with ``stride`` (None: no restore checks), restore
    at prefixes 0, stride, 2*stride, ... and play the rest from there.

    ``env.max_turns`` is raised to the solution's length for the check (``fits_max_turns`` says
    whether the solution fits the environment's own limit) and put back afterwards.
    """
    res = SolutionCheck(length=len(solution))
    keep = env.max_turns
    env.max_turns = max(int(keep), len(solution))
    try:
        obs0, _info = env.reset(seed=seed)
        rewards, observations, info, _ended = _play(env, solution)
        observations = [obs0] + observations
        res.steps, res.ret, res.won = len(rewards), sum(rewards), bool(info.get("won"))
        res.fits_max_turns = res.steps <= keep
        if not res.passed or stride is None:
            return res
        for k in range(0, res.steps, max(1, int(stride))):
            res.prefixes_checked += 1
            try:
                obs, info = env.restore(seed, solution[:k])
                # the return so far is the restored episode's own (``score``): an engine may score the
                # same actions at other times (ScienceWorld's mendelian-genetics), and may finish a
                # step earlier or later (power-component wins after 8 or 9 gold actions), so the rest
                # of the solution is played to its end
                before = float(info["score"]) if "score" in info else sum(rewards[:k])
                cont, _obs, info, _ended = _play(env, solution[k:])
                ok = (
                    obs == observations[k]
                    and bool(info.get("won"))
                    and math.isclose(before + sum(cont), 1.0, abs_tol=1e-6)
                )
            except Exception:  # a restore that raises is a failed prefix
                ok = False
            if not ok:
                res.prefixes_failed.append(k)
    except Exception as e:  # noqa: BLE001 - reported in the result
        res.error = f"{type(e).__name__}: {e}"
    finally:
        env.max_turns = keep
    return res
