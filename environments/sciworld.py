"""ScienceWorld (30 science-experiment task types in a simulated world) as an R3L text environment.

The episode seed picks a task and one of its variations from the package's own train/dev/test
variation lists: with ``tasks`` = [t0, ..., tn-1], ``task = tasks[seed % n]`` and
``variation = split_variations(task)[(seed // n) % len]``. Reward increments are score/100 (the first
step also carries any score the start state already has), so a solved task returns 1.0; a failed task's negative score
is clipped to 0 unless
``clip_negative_score=False``. One JVM per environment instance (started on the first reset,
heap capped at ``java_max_heap``), stopped by ``close()``.

Disambiguation: where an action could mean several identical objects, the engine answers
"Ambiguous request" with numbered options and waits for a number. The adapter keeps that question
open for one turn: the observation lists the options and the admissible actions are their numbers
("0", "1", ...), as ScienceWorld's own gold sequences answer. An option's number or its full text
picks it; any other action cancels the request and counts as invalid (with feedback).

Oracle (``oracle_pivot`` / ``oracle_action``): ScienceWorld's gold action sequence of the variation,
cut where its score progress reaches the win (replaying it must win; gold sequences often go on
after it), taken as the optimal plan. An action equal to the
plan's next one stays optimal; any other action stays optimal only if the plan without it (a later
step done early) or without its first step (a step that was not needed) still reaches score 100 by
replay. The first action for which neither does is the pivot (a focus on a wrong object, which
fails the task, is one); the gold action is the plan's next step there. Equal-length alternatives
the plan cannot express count as pivots: a conservative oracle.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from environments._common import (
    check_heap,
    check_positive_int,
    check_split,
    disarm_close,
    invalid_feedback,
    java_heap,
    normalize_action,
    sorted_unique,
    stop_py4j_wrapper,
)
from environments.base import GoldPlanOracle, TextEnv, check_action

_INVALID_PREFIXES = ("no known action matches that input", "unknown action")
_AMBIGUOUS_PREFIX = "ambiguous request"
_OPTION_LINE = re.compile(r"^\s*(\d+):\s*(.+?)\s*$")


def _ambiguous_options(obs: str) -> List[str]:
    """The numbered options of the engine's "Ambiguous request" message, in their order."""
    opts = []
    for ln in obs.splitlines():
        m = _OPTION_LINE.match(ln)
        if m and int(m.group(1)) == len(opts):
            opts.append(m.group(2).strip())
    return opts


def _choose(action: str, options: Sequence[str]) -> Optional[int]:
    """The option an answer picks: its number ("0", "1", ...) or its full text; None otherwise."""
    a = action.strip()
    if a.isdigit():
        return int(a) if int(a) < len(options) else None
    for i, o in enumerate(options):
        if a == normalize_action(o):
            return i
    return None


def task_names() -> List[str]:
    """The 30 task names in the package's task-id order (1-1 boil, 1-2 melt, ...)."""
    from scienceworld.constants import ID2TASK

    def key(tid: str):
        major, minor = tid.split("-")
        return int(major), minor

    return [ID2TASK[t] for t in sorted(ID2TASK, key=key)]


def resolve_task(name: str) -> str:
    """A task name, a task id ('4-1') or a paper name ('Matter Changes of State (Boiling)')."""
    from scienceworld.utils import infer_task

    names = task_names()
    t = infer_task(str(name).strip())
    if t not in names:
        raise ValueError(f"tasks: unknown ScienceWorld task {name!r}; known tasks: {', '.join(names)}")
    return t


class ScienceWorldEnv(GoldPlanOracle, TextEnv):
    """ScienceWorld tasks; ``tasks`` (a name/id, a list, or None = all 30) and ``split`` choose them."""

    # oracle (GoldPlanOracle): replays list no valid actions (that dominates a step's cost); the gold
    # sequence is only cut at its win (a removal check replays the whole sequence: seconds here)
    oracle_checks = 0
    _replay_overrides = {"list_actions": False, "max_turns": 10**6}
    rules = (
        "You are an agent in a simulated world doing a science experiment. Type one action per turn, "
        "e.g. 'look around', 'open door to kitchen', 'go to kitchen', 'pick up thermometer', "
        "'focus on <object>' (focus only on the object the task names: focusing on a wrong one fails "
        "the task), 'wait'. Answer with exactly one of the valid actions."
    )

    def __init__(
        self,
        tasks: Union[None, str, Sequence[str]] = None,
        split: str = "train",
        max_turns: int = 30,
        simplifications: str = "easy",
        list_actions: bool = True,
        clip_negative_score: bool = True,
        java_max_heap: Optional[str] = "768m",
        max_listed_actions: int = 60,
        task: Union[None, str, Sequence[str]] = None,
    ) -> None:
        super().__init__()
        if task is not None and tasks is not None:
            raise ValueError("give either tasks or task, not both")
        tasks = tasks if tasks is not None else task
        if tasks is None:
            self.tasks = task_names()
        else:
            if isinstance(tasks, str):
                tasks = [tasks]
            if not isinstance(tasks, (list, tuple)) or not tasks:
                raise ValueError(f"tasks must be a task name, an id or a non-empty list of them; got {tasks!r}")
            self.tasks = [resolve_task(t) for t in tasks]
        self.split = check_split(split)
        self.max_turns = check_positive_int("max_turns", max_turns)
        if not isinstance(simplifications, str):
            raise ValueError(f"simplifications must be a comma-separated string; got {simplifications!r}")
        allowed = {
            "easy",
            "teleportAction",
            "selfWateringFlowerPots",
            "openContainers",
            "openDoors",
            "noElectricalAction",
        }
        bad = [s for s in simplifications.split(",") if s and s not in allowed]
        if bad:
            raise ValueError(f"simplifications: unknown {bad}; allowed: {sorted(allowed)}")
        self.simplifications = simplifications
        self.list_actions = bool(list_actions)
        self.clip_negative_score = bool(clip_negative_score)
        self.java_max_heap = check_heap("java_max_heap", java_max_heap)
        self.max_listed_actions = max_listed_actions
        self._env = None
        self._variations: Dict[str, Dict[str, List[int]]] = {}
        self._valid: Optional[List[str]] = None
        self._task_desc = ""
        self._task_name = ""
        self._variation = 0
        self._score = 0.0
        self._turn = 0
        self._done = True
        self._gold: Optional[List[str]] = None
        self._pending: Optional[List[str]] = None  # the options of an "ambiguous request" awaiting a number

    # ------------------------------------------------------------------ engine
    def _engine(self):
        if self._env is None:
            try:
                from scienceworld import ScienceWorldEnv as _SW
            except ImportError as e:  # pragma: no cover - a project requirement
                raise ImportError("r3l/ScienceWorld needs `pip install scienceworld` (and Java)") from e
            with java_heap(self.java_max_heap):
                env = _SW("", envStepLimit=10**6)
            self._env = disarm_close(env)
        return self._env

    @property
    def jvm_pid(self) -> Optional[int]:
        if self._env is None:
            return None
        return self._env._gateway.java_process.pid

    def split_variations(self, task: str, split: Optional[str] = None) -> List[int]:
        """The package's variation list of ``task`` for ``split`` (default: this env's split)."""
        task = resolve_task(task)
        if task not in self._variations:
            server = self._engine().server
            server.load(task, 0, self.simplifications, False)
            self._variations[task] = {
                "train": list(server.getVariationsTrain()),
                "dev": list(server.getVariationsDev()),
                "test": list(server.getVariationsTest()),
            }
        return list(self._variations[task][check_split(split or self.split)])

    def task_for_seed(self, seed: int) -> Tuple[str, int]:
        task = self.tasks[int(seed) % len(self.tasks)]
        vs = self.split_variations(task)
        return task, vs[(int(seed) // len(self.tasks)) % len(vs)]

    def _valid_actions(self) -> Optional[List[str]]:
        if not self.list_actions:
            return None
        data = json.loads(str(self._env.server.getValidActionObjectCombinationsJSON()))
        return sorted_unique([str(v["action"]) for v in data.get("validActions", [])])

    def _info(self, **kw: Any) -> Dict[str, Any]:
        info = {
            "task": self._task_desc,
            "admissible_actions": None if self._valid is None else list(self._valid),
            "won": False,
            "invalid_action": False,
            "score": self._score,
            "task_name": self._task_name,
            "variation": self._variation,
            "split": self.split,
        }
        info.update(kw)
        return info

    # ------------------------------------------------------------------ gym API
    def reset(
        self, *, seed: Optional[int] = None, options: Optional[dict] = None, _gold: bool = False
    ) -> Tuple[str, Dict[str, Any]]:
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(0, 2**31 - 1))
        env = self._engine()
        task, var = self.task_for_seed(seed)
        env.server.load(task, var, self.simplifications, bool(_gold))
        self._gold = list(env.server.getGoldActionSequence()) if _gold else None
        obs = env.server.step("look around")  # a fresh load is the start state (no server.reset needed)
        self._task_name, self._variation = task, var
        self._task_desc = str(env.server.freeActionTaskDesc()).replace("Task Description:", "").strip()
        self._score, self._turn, self._done = 0.0, 0, False
        self._pending = None
        self._valid = self._valid_actions()
        return obs, self._info(seed=seed)

    def restore(self, seed: Optional[int], actions: Sequence[str]) -> Tuple[str, Dict[str, Any]]:
        """Replay ``actions`` from ``reset(seed)``; valid actions are listed only after the last one
        (listing them dominates a step's cost), so the result equals a plain replay's."""
        actions = list(actions)
        if not actions:
            return self.reset(seed=seed)
        keep = self.list_actions
        self.list_actions = False
        try:
            self.reset(seed=seed)
            for i, a in enumerate(actions[:-1]):
                _o, _r, term, trunc, _info = self.step(a)
                if term or trunc:
                    raise RuntimeError(f"episode ended at replayed action {i} of {len(actions)}")
        finally:
            self.list_actions = keep
        obs, _r, _term, _trunc, info = self.step(actions[-1])
        return obs, info

    def gold_actions(self, seed: int) -> List[str]:
        """ScienceWorld's gold action sequence for ``seed``; leaves the env reset to that task."""
        self.reset(seed=seed, _gold=True)
        gold = list(self._gold or [])
        self.reset(seed=seed)
        return gold

    def step(self, action: str):
        action = check_action(action)
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        server = self._env.server
        a = normalize_action(action)
        invalid, reason, options = False, "", None
        if self._pending is not None:
            # The engine asked which of several objects was meant: a number (or an option's text) answers it.
            pending, self._pending = self._pending, None
            choice = _choose(a, pending)
            if choice is None:
                server.step("")  # a blank line cancels the request; the engine acts normally again
                obs = "The request was cancelled."
                invalid = True
                reason = (
                    f"the engine was waiting for the number of one of the options "
                    f"({'; '.join(f'{i}: {o}' for i, o in enumerate(pending))}); the request was cancelled."
                )
            else:
                obs = str(server.step(str(choice)))
        else:
            obs = str(server.step(a)) if a else "No known action matches that input."
        low = obs.strip().lower()
        if not invalid and _AMBIGUOUS_PREFIX in low.split("\n", 1)[0]:
            options = _ambiguous_options(obs)
            if not options:  # nothing to choose from: cancel, as before
                server.step("")
                invalid, reason = True, obs.strip()
        elif not invalid and low.startswith(_INVALID_PREFIXES):
            invalid = True
            reason = obs.strip()
        self._turn += 1
        raw_score = round(100 * float(server.getScore())) / 100.0  # the engine's percent, as score/100
        completed = bool(server.getCompleted())
        raw_failed = raw_score < 0
        score = max(raw_score, 0.0) if self.clip_negative_score else raw_score
        reward = score - self._score
        self._score = score
        won = completed and score >= 1.0 - 1e-9
        terminated = completed or raw_failed
        truncated = not terminated and self._turn >= self.max_turns
        self._done = terminated or truncated
        if options and not self._done:
            self._pending = options
            self._valid = [str(i) for i in range(len(options))] if self.list_actions else None
            obs = (
                f"{obs.strip()}\nAnswer with the number of the one you mean "
                f"(0 to {len(options) - 1}); any other action cancels the request."
            )
        else:
            self._valid = self._valid_actions() if not self._done else []
        if invalid:
            obs = invalid_feedback(action, reason, self._valid, self.max_listed_actions)
        elif terminated and not won:
            obs = f"{obs.strip()}\nThe task failed."
        return (
            obs,
            reward,
            terminated,
            truncated,
            self._info(
                won=won,
                invalid_action=invalid,
                task_failed=terminated and not won,
                ambiguous=bool(options) and not self._done,
            ),
        )

    def close(self) -> None:
        env, self._env = self._env, None
        self._done = True
        if env is not None:
            stop_py4j_wrapper(env)
            tmp = getattr(env, "_obj_tree_tempdir", None)
            if tmp is not None:
                tmp.cleanup()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


__all__ = ["ScienceWorldEnv", "task_names", "resolve_task"]
