"""Pure-Python text environments for fast tests (no JVM, deterministic from the seed)."""

from __future__ import annotations

import random
from typing import Any, Dict, List, Optional, Tuple

from environments._common import check_split
from environments.base import TextEnv, check_action


class ToyCorridorEnv(TextEnv):
    """A corridor of ``num_rooms`` rooms; a coin lies in one of them (chosen by the seed).

    Actions: ``move left``, ``move right``, ``take coin``. Taking the coin where it lies wins
    (reward 1); taking it elsewhere is an invalid action with feedback. Multi-turn, with language
    feedback, restorable by replay: the smallest environment that exercises reflect-then-retry.

    Oracle: the optimal finish walks straight to the coin and takes it. The oracle pivot is the
    first turn whose action is not that walk's next step (a move away from the coin, an invalid
    move, or taking the coin where it is not); the gold action there is the step towards the coin
    (``take coin`` in its room).
    """

    has_oracle = True

    rules = (
        "You are in a corridor of rooms. Move left or right to find the coin, then take it. "
        "Answer with exactly one of the listed actions."
    )

    option_bounds = {"num_rooms": (1, None)}

    def __init__(self, num_rooms: int = 4, max_turns: int = 8, split: str = "train") -> None:
        super().__init__()
        if num_rooms < 1:
            raise ValueError(f"num_rooms must be >= 1, got {num_rooms}")
        self.num_rooms = num_rooms
        self.max_turns = max_turns
        self.split = check_split(split)  # one random task family: every split is the same, but a typo is a typo
        self._pos = 0
        self._coin = 0
        self._done = True

    def _actions(self) -> List[str]:
        acts = []
        if self._pos > 0:
            acts.append("move left")
        if self._pos < self.num_rooms - 1:
            acts.append("move right")
        acts.append("take coin")
        return acts

    def _describe(self) -> str:
        here = "You see a coin here." if self._pos == self._coin else "The room is empty."
        return f"You are in room {self._pos + 1} of {self.num_rooms}. {here}"

    def _info(self, **kw: Any) -> Dict[str, Any]:
        info = {
            "task": "Find the coin and take it.",
            "admissible_actions": self._actions(),
            "won": False,
            "invalid_action": False,
        }
        info.update(kw)
        return info

    def _layout(self, seed: Optional[int]) -> Tuple[int, int]:
        """(start room, coin room) of ``seed``."""
        rng = random.Random(seed)
        coin = rng.randrange(self.num_rooms)
        pos = rng.randrange(self.num_rooms)
        if self.num_rooms > 1:
            while pos == coin:
                pos = rng.randrange(self.num_rooms)
        return pos, coin

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> Tuple[str, Dict[str, Any]]:
        super().reset(seed=seed)
        self._pos, self._coin = self._layout(seed)
        self._done = False
        return self._describe(), self._info()

    def step(self, action: str):
        action = check_action(action).strip().lower()
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        if action == "take coin":
            if self._pos == self._coin:
                self._done = True
                return "You take the coin. You win!", 1.0, True, False, self._info(won=True)
            return "There is no coin here to take.", 0.0, False, False, self._info(invalid_action=True)
        if action == "move left" and self._pos > 0:
            self._pos -= 1
        elif action == "move right" and self._pos < self.num_rooms - 1:
            self._pos += 1
        else:
            valid = ", ".join(self._actions())
            return (
                f"'{action}' is not a valid action here. Valid actions: {valid}.",
                0.0,
                False,
                False,
                self._info(invalid_action=True),
            )
        return self._describe(), 0.0, False, False, self._info()

    def _oracle_walk(self, seed, actions):
        pos, coin = self._layout(seed)

        def plan_from(p: int) -> List[str]:
            step = "move left" if coin < p else "move right"
            return [step] * abs(coin - p) + ["take coin"]

        for k, a in enumerate(actions):
            plan = plan_from(pos)
            if a.strip().lower() != plan[0]:
                return k, plan
            if plan[0] == "take coin":
                return None, []
            pos += -1 if plan[0] == "move left" else 1
        return None, plan_from(pos)

    def close(self) -> None:
        self._done = True


class ToyWordEnv(TextEnv):
    """One turn: say the target word (chosen by the seed from ``vocabulary``). Reward 1 if exact.

    The trivial one-turn task of the learning-signal test: a policy that learns raises its success.
    Oracle: a wrong word is the pivot (turn 0); the gold action is the target word.
    """

    has_oracle = True

    rules = "Answer with exactly the word you are asked for."

    def __init__(
        self,
        vocabulary: Optional[List[str]] = None,
        max_turns: int = 1,
        split: str = "train",
        fixed_target: Optional[str] = None,
    ) -> None:
        super().__init__()
        if vocabulary is not None and (
            isinstance(vocabulary, str)
            or not list(vocabulary)
            or not all(isinstance(w, str) and w.strip() for w in vocabulary)
        ):
            # else [] falls back to the default words without a word
            raise ValueError(
                f"vocabulary must be a non-empty list of words (None = the default four), got {vocabulary!r}"
            )
        self.vocabulary = list(vocabulary or ["apple", "river", "stone", "cloud"])
        self.split = check_split(split)
        self.max_turns = max_turns
        self.fixed_target = fixed_target
        self._target = self.vocabulary[0]

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        self._target = self.fixed_target or random.Random(seed).choice(self.vocabulary)
        info = {
            "task": f"Say the word '{self._target}'.",
            "admissible_actions": list(self.vocabulary),
            "won": False,
            "invalid_action": False,
        }
        return f"Say the word '{self._target}'.", info

    def step(self, action: str):
        action = check_action(action).strip().strip(".").lower()
        won = action == self._target
        obs = "Correct." if won else f"Wrong: you said '{action}', the word was '{self._target}'."
        info = {
            "task": "",
            "admissible_actions": list(self.vocabulary),
            "won": won,
            "invalid_action": action not in self.vocabulary,
        }
        return obs, float(won), True, False, info

    def _oracle_walk(self, seed, actions):
        target = self.fixed_target or random.Random(seed).choice(self.vocabulary)
        if actions and actions[0].strip().strip(".").lower() == target:
            return None, []
        return (0, [target]) if actions else (None, [target])

    def close(self) -> None:
        pass
