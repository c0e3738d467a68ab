"""TextWorldExpress games (coin, cookingworld, twc, mapreader, arithmetic, sorting, simonsays,
peckingorder) as R3L text environments.

One JVM per environment instance (started lazily on the first reset), stopped by ``close()``.
The episode seed picks a game from the package's own seed list of the split (TWX keeps train,
dev and test seeds, and their generated worlds, disjoint): ``game_seed = fold_seeds[seed % len]``.
Rewards are increments of the game's normalised score (1.0 = solved); a failed game's negative
score is clipped to 0 unless ``clip_negative_score=False``.

Oracle (``oracle_pivot`` / ``oracle_action``; optimal = the fewest turns to ``tasksuccess``):

- ``coin`` and ``mapreader`` (navigation; TWX's coin gold path is a random walk, not a shortest
  one): exact breadth-first search over the admissible actions, by replay, with states told apart by
  the text of ``look around`` and ``inventory``, the score, and the doors opened or closed on the
  way (actions that cannot change the state, and closing doors, are not searched). The pivot is
  the first turn after which the shortest finish is not one turn shorter than
  before it; the gold action is the first step of a shortest finish from the state before it.
- the other games: TWX's gold path with every needless step left out (cut at its win, then each
  action whose removal still wins is removed), taken as optimal. An action equal to the plan's next one stays
  optimal; any other action stays optimal only if the plan without it (a later step done early) or
  without its first step (a step that was not needed) still wins by replay. The first action for
  which neither does is the pivot; the gold action is the plan's next step there. (Equal-length
  detours the plan cannot express count as pivots: a conservative oracle.)
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

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
from environments.base import GoldPlanOracle, TextEnv, check_action, follow_plan

GAMES = ("coin", "cookingworld", "twc", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder")

SEARCH_GAMES = ("coin", "mapreader")  # oracle by exact search; the others follow TWX's gold path
_NO_OP = frozenset({"look around", "inventory", "task", "help", "read map"})
_MAX_SEARCH_NODES = 20_000

COIN_DEFAULT_PARAMS = {"numLocations": 4, "numDistractorItems": 0, "includeDoors": 0, "limitInventorySize": 0}


def params_to_string(game_params: Union[None, str, Mapping[str, Any]]) -> str:
    """TWX takes its game parameters as ``"k=v,k=v"``; accept that or a dict."""
    if game_params is None:
        return ""
    if isinstance(game_params, str):
        return game_params.replace(" ", "")
    if isinstance(game_params, Mapping):
        parts = []
        for k, v in game_params.items():
            if isinstance(v, bool):
                v = int(v)
            if not isinstance(v, int):
                raise ValueError(f"game_params[{k!r}] must be an int; got {v!r}")
            parts.append(f"{k}={v}")
        return ",".join(parts)
    raise ValueError(f"game_params must be a dict or a 'key=value,...' string; got {game_params!r}")


class TextWorldExpressEnv(GoldPlanOracle, TextEnv):
    """Any TextWorldExpress game; ``game`` and ``game_params`` choose it, ``split`` the seed fold."""

    rules = (
        "You act in a text world by typing one command per turn. Each turn you get an observation "
        "and the list of valid actions; answer with exactly one of them. 'look around' describes the "
        "room, 'inventory' lists what you carry."
    )

    def __init__(
        self,
        game: str = "coin",
        game_params: Union[None, str, Mapping[str, Any]] = None,
        split: str = "train",
        max_turns: int = 30,
        clip_negative_score: bool = True,
        java_max_heap: Optional[str] = "512m",
        max_listed_actions: int = 40,
    ) -> None:
        super().__init__()
        if game not in GAMES:
            raise ValueError(f"game must be one of {', '.join(GAMES)}; got {game!r}")
        self.game = game
        self.game_params = params_to_string(game_params)
        self.split = check_split(split)
        self.max_turns = check_positive_int("max_turns", max_turns)
        self.clip_negative_score = bool(clip_negative_score)
        self.java_max_heap = check_heap("java_max_heap", java_max_heap)
        self.max_listed_actions = max_listed_actions
        self._env = None
        self._fold_seeds: List[int] = []
        self._valid: List[str] = []
        self._task = ""
        self._score = 0.0
        self._turn = 0
        self._done = True
        self._game_seed: Optional[int] = None

    # ------------------------------------------------------------------ engine
    def _engine(self):
        if self._env is None:
            try:
                from textworld_express import TextWorldExpressEnv as _TWX
            except ImportError as e:  # pragma: no cover - the package is a project requirement
                raise ImportError("r3l TextWorldExpress environments need `pip install textworld-express`") from e
            with java_heap(self.java_max_heap, quick_start=True):
                env = disarm_close(_TWX(envStepLimit=10**6))
            try:
                env.load(self.game, self.game_params)  # raises ValueError naming bad parameters
                getter = {"train": env.getValidSeedsTrain, "dev": env.getValidSeedsDev, "test": env.getValidSeedsTest}[
                    self.split
                ]
                self._fold_seeds = sorted(getter())
            except Exception as e:
                stop_py4j_wrapper(env)
                raise ValueError(f"bad game_params for TextWorldExpress game {self.game!r}: {e}") from e
            self._env = env
        return self._env

    @property
    def jvm_pid(self) -> Optional[int]:
        """The pid of this environment's JVM (None before the first reset or after close)."""
        if self._env is None:
            return None
        return self._env._gateway.java_process.pid

    def fold_seeds(self, split: Optional[str] = None) -> List[int]:
        """The TWX game seeds of ``split`` (default: this environment's split)."""
        env = self._engine()
        split = check_split(split or self.split)
        if split == self.split:
            return list(self._fold_seeds)
        getter = {"train": env.getValidSeedsTrain, "dev": env.getValidSeedsDev, "test": env.getValidSeedsTest}
        return sorted(getter[split]())

    def game_seed(self, seed: Optional[int]) -> int:
        self._engine()
        return self._fold_seeds[int(seed or 0) % len(self._fold_seeds)]

    # ------------------------------------------------------------------ gym API
    def _info(self, **kw: Any) -> Dict[str, Any]:
        info = {
            "task": self._task,
            "admissible_actions": list(self._valid),
            "won": False,
            "invalid_action": False,
            "score": self._score,
            "game": self.game,
            "game_seed": self._game_seed,
            "split": self.split,
        }
        info.update(kw)
        return info

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> Tuple[str, Dict[str, Any]]:
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(0, 2**31 - 1))
        env = self._engine()
        self._game_seed = self._fold_seeds[int(seed) % len(self._fold_seeds)]
        obs, raw = env.reset(seed=self._game_seed, gameFold=self.split, generateGoldPath=False)
        self._task = raw.get("taskDescription", "")
        self._valid = sorted_unique(raw["validActions"])
        self._score, self._turn, self._done = 0.0, 0, False
        return obs, self._info(seed=seed)

    def gold_actions(self, seed: Optional[int]) -> List[str]:
        """A solution path for ``seed`` (TWX's gold path). Resets the environment to that game.

        TWX builds some gold paths by random exploration (coin): two calls may differ in length.
        """
        self.reset(seed=seed)
        env = self._engine()
        env.reset(seed=self._game_seed, gameFold=self.split, generateGoldPath=True)
        gold = list(env.getGoldActionSequence())
        self.reset(seed=seed)
        return gold

    def step(self, action: str):
        action = check_action(action)
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        env = self._engine()
        a = normalize_action(action)
        before = self._valid
        obs, _r, _d, raw = env.step(a)
        self._turn += 1
        score = float(raw.get("score", self._score))
        if self.clip_negative_score:
            score = max(score, 0.0)
        reward = score - self._score
        self._score = score
        self._valid = sorted_unique(raw.get("validActions", before))
        won = bool(raw.get("tasksuccess", False))
        failed = bool(raw.get("taskfailure", False))
        terminated = won or failed
        truncated = not terminated and self._turn >= self.max_turns
        self._done = terminated or truncated
        invalid = a not in before and a != "help"
        if invalid:
            obs = invalid_feedback(
                action, f"{obs.strip()} It is not one of the valid actions.", self._valid, self.max_listed_actions
            )
        elif failed:
            obs = f"{obs.strip()}\nThe task failed."
        return obs, reward, terminated, truncated, self._info(won=won, invalid_action=invalid, task_failed=failed)

    # ------------------------------------------------------------------ oracle
    def _play(self, seed: Optional[int], actions: List[str], probe: bool = False):
        """Replay ``actions`` from ``seed`` on the engine: ``(status, valid actions, state key)``;
        status "won" / "failed" (the game ended, possibly before the last action) or "open"."""
        env = self._engine()
        self._done = True  # the adapter's episode is gone: reset() before stepping again
        game_seed = self._fold_seeds[int(seed or 0) % len(self._fold_seeds)]
        _obs, raw = env.reset(seed=game_seed, gameFold=self.split, generateGoldPath=False)
        for a in actions:
            _obs, _r, _d, raw = env.step(a)
            if raw.get("tasksuccess"):
                return "won", [], None
            if raw.get("taskfailure"):
                return "failed", [], None
        valid = sorted_unique(raw.get("validActions", []))
        key = None
        if probe:
            score = raw.get("score")
            key = (env.step("look around")[0], env.step("inventory")[0], score)
        return "open", valid, key

    def _wins(self, seed: Optional[int], actions: List[str]) -> Optional[int]:
        """How many of ``actions`` were played when the game was won (None: not won)."""
        env = self._engine()
        self._done = True
        game_seed = self._fold_seeds[int(seed or 0) % len(self._fold_seeds)]
        env.reset(seed=game_seed, gameFold=self.split, generateGoldPath=False)
        for i, a in enumerate(actions):
            _obs, _r, _d, raw = env.step(a)
            if raw.get("tasksuccess"):
                return i + 1
            if raw.get("taskfailure"):
                return None
        return None

    def _search(self, seed: Optional[int], prefix: List[str], max_len: int) -> Optional[List[str]]:
        """A shortest action list (at most ``max_len``) that wins from the state after ``prefix``."""
        status, valid, key = self._play(seed, prefix, probe=True)
        if status != "open":
            return [] if status == "won" else None
        room = key[0].split(".")[0]
        seen = {(key, ())}
        frontier = [([], valid, room, ())]
        for _depth in range(max_len):
            nxt = []
            for path, acts, where, doors in frontier:
                for a in acts:
                    if a in _NO_OP or a.startswith("close "):  # closing a door never shortens a way
                        continue
                    new_doors = doors
                    if a.startswith(("open ", "close ")):  # door states are not all visible from one room
                        verb, target = a.split(" ", 1)
                        d = dict(doors)
                        d[(where, target)] = verb
                        new_doors = tuple(sorted(d.items()))
                    status, valid2, key2 = self._play(seed, prefix + path + [a], probe=True)
                    if status == "won":
                        return path + [a]
                    if status == "failed" or (key2, new_doors) in seen:
                        continue
                    seen.add((key2, new_doors))
                    if len(seen) > _MAX_SEARCH_NODES:
                        raise RuntimeError(
                            f"oracle search for {self.game} seed {seed} exceeded {_MAX_SEARCH_NODES} states"
                        )
                    nxt.append((path + [a], valid2, key2[0].split(".")[0], new_doors))
            frontier = nxt
            if not frontier:
                break
        return None

    def _gold_plan(self, seed: Optional[int]) -> List[str]:
        if self.game not in SEARCH_GAMES:  # TWX's gold path, minimised (GoldPlanOracle)
            return super()._gold_plan(seed)
        cache = self.__dict__.setdefault("_oracle_plans", {})
        key = int(seed or 0)
        if key not in cache:
            plan = self._search(seed, [], 10**6)
            if plan is None:
                raise RuntimeError(f"no solution found for TextWorldExpress {self.game} seed {seed}")
            cache[key] = plan
        return list(cache[key])

    def _oracle_walk(self, seed, actions):
        if self.game not in SEARCH_GAMES:
            return super()._oracle_walk(seed, actions)
        acts = [normalize_action(a) for a in actions]

        def replan(n: int, plan: List[str], a: str) -> Optional[List[str]]:
            found = self._search(seed, acts[:n], len(plan) - 1)
            return found if found is not None and len(found) <= len(plan) - 1 else None

        return follow_plan(acts, self._gold_plan(seed), replan)

    def close(self) -> None:
        env, self._env = self._env, None
        self._done = True
        if env is not None:
            stop_py4j_wrapper(env)

    def __del__(self):  # a forgotten env must not leave its JVM behind
        try:
            self.close()
        except Exception:
            pass


# TWX's sentences that list a room's furniture ("In one part of the room you see a stove.")
_FURNITURE = re.compile(r"^(In (one|another) part of the room you see|There is also|You also see)\b")


def compact_observation(text: str) -> str:
    """A coin-collector observation without the sentences that list furniture (never one that names
    the coin): the room, the coin when it is there, the exits and any feedback stay, word for word.
    With no distractor items the furniture cannot be acted on; it is ~3/4 of a turn's tokens."""
    lines = []
    for line in str(text).split("\n"):
        kept = [
            x for x in re.split(r"(?<=\.)\s+", line.strip()) if x and (not _FURNITURE.match(x) or "coin" in x.lower())
        ]
        if kept:
            lines.append(" ".join(kept))
    return "\n".join(lines)


class CoinCollectorEnv(TextWorldExpressEnv):
    """The project's default environment: TWX coin collector, 4 rooms, no doors or distractors, 10 turns
    (enough for the optimal path; failures, which run to the limit, dominate a step's cost).

    ``compact_observations`` (default): observations without the furniture sentences
    (:func:`compact_observation`); the game, its actions, rewards and oracle are unchanged, and the
    learner and the explorer read about a third of the tokens without a loss in success
    (docs/benchmarks.md, 'Why these main-job settings and defaults?'). ``False``: TWX's text word for word."""

    rules = (
        "You are in a house and must find a coin and take it. Each turn you get an observation and the "
        "list of valid actions; answer with exactly one of them. Move between rooms with 'move <direction>'; "
        "when you see the coin, 'take coin'."
    )

    option_bounds = {"num_locations": (1, None), "num_distractor_items": (0, None)}

    def __init__(
        self,
        num_locations: int = 4,
        num_distractor_items: int = 0,
        include_doors: bool = False,
        limit_inventory_size: bool = False,
        split: str = "train",
        max_turns: int = 10,
        clip_negative_score: bool = True,
        java_max_heap: Optional[str] = "512m",
        max_listed_actions: int = 40,
        compact_observations: bool = True,
    ) -> None:
        if not isinstance(compact_observations, bool):
            raise ValueError(f"compact_observations must be true or false; got {compact_observations!r}")
        self.compact_observations = compact_observations
        for name, v in (("num_locations", num_locations), ("num_distractor_items", num_distractor_items)):
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "num_locations" else 0):
                raise ValueError(f"{name} must be an int >= {1 if name == 'num_locations' else 0}; got {v!r}")
        params = {
            "numLocations": num_locations,
            "numDistractorItems": num_distractor_items,
            "includeDoors": int(bool(include_doors)),
            "limitInventorySize": int(bool(limit_inventory_size)),
        }
        super().__init__(
            game="coin",
            game_params=params,
            split=split,
            max_turns=max_turns,
            clip_negative_score=clip_negative_score,
            java_max_heap=java_max_heap,
            max_listed_actions=max_listed_actions,
        )

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> Tuple[str, Dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        return (compact_observation(obs) if self.compact_observations else obs), info

    def step(self, action: str):
        obs, reward, terminated, truncated, info = super().step(action)
        return (compact_observation(obs) if self.compact_observations else obs), reward, terminated, truncated, info


__all__ = [
    "TextWorldExpressEnv",
    "CoinCollectorEnv",
    "GAMES",
    "COIN_DEFAULT_PARAMS",
    "params_to_string",
    "compact_observation",
]
