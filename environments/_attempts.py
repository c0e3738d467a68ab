"""Multi-attempt single-question episodes (math, countdown): answer, get "incorrect, try again"."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from environments._common import check_positive_int, check_split
from environments.base import TextEnv, check_action


class MultiAttemptEnv(TextEnv):
    """One problem per episode, up to ``max_attempts`` answers; reward 1.0 on the first correct one.

    Subclasses implement ``_problem(seed) -> (prompt, gold, meta)`` and
    ``_check(response, gold) -> (correct, extracted, reason)``; ``extracted`` None means no answer
    could be read (an invalid action, which still uses up an attempt).

    Oracle: the optimal episode answers correctly at once, so the oracle pivot is the first incorrect
    attempt (the failed attempt: turn 0 of any episode that did not start with a correct answer),
    and the gold action is the reference answer (``_oracle_answer``; a correct answer by
    construction, checked by the environment's own verifier).
    """

    has_oracle = True

    instruction = ""

    def __init__(self, split: str = "train", max_attempts: int = 3, reveal_answer: bool = False) -> None:
        super().__init__()
        self.split = check_split(split)
        self.max_attempts = check_positive_int("max_attempts", max_attempts)
        self.max_turns = self.max_attempts
        self.reveal_answer = bool(reveal_answer)
        self._gold: Any = None
        self._task = ""
        self._meta: Dict[str, Any] = {}
        self._attempt = 0
        self._done = True

    # ------------------------------------------------------------------ to override
    def _problem(self, seed: int) -> Tuple[str, Any, Dict[str, Any]]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _check(self, response: str, gold: Any) -> Tuple[bool, Optional[str], str]:  # pragma: no cover
        raise NotImplementedError

    def _gold_text(self, gold: Any) -> str:
        return str(gold)

    def _oracle_answer(self, seed: int) -> Tuple[Any, str]:
        """(gold, an answer the verifier accepts) for ``seed``, without touching the current episode."""
        _prompt, gold, _meta = self._problem(int(seed))
        return gold, f"\\boxed{{{self._gold_text(gold)}}}"

    def _oracle_walk(self, seed, actions):
        gold, answer = self._oracle_answer(int(seed or 0))
        if not actions:
            return None, [answer]
        if self._check(actions[0], gold)[0]:
            return None, []
        return 0, [answer]  # every later attempt comes after the first failed one

    # ------------------------------------------------------------------ gym API
    def _info(self, **kw: Any) -> Dict[str, Any]:
        info = {
            "task": self._task,
            "admissible_actions": None,
            "won": False,
            "invalid_action": False,
            "attempt": self._attempt,
            "split": self.split,
        }
        info.update(self._meta)
        info.update(kw)
        return info

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> Tuple[str, Dict[str, Any]]:
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(0, 2**31 - 1))
        prompt, gold, meta = self._problem(int(seed))
        self._task, self._gold, self._meta = prompt, gold, dict(meta)
        self._attempt, self._done = 0, False
        obs = prompt if not self.instruction else f"{prompt}\n\n{self.instruction}"
        return obs, self._info(seed=seed)

    def step(self, action: str):
        action = check_action(action)
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        self._attempt += 1
        correct, extracted, reason = self._check(action, self._gold)
        left = self.max_attempts - self._attempt
        if correct:
            self._done = True
            return "Correct!", 1.0, True, False, self._info(won=True, extracted_answer=extracted)
        invalid = extracted is None
        if invalid:
            msg = f"No answer found: {reason}"
        else:
            msg = f"Your answer {extracted} is incorrect" + (f": {reason}" if reason else "") + "."
        if left == 0:
            self._done = True
            msg += " No attempts left."
            if self.reveal_answer:
                msg += f" The correct answer was {self._gold_text(self._gold)}."
            return msg, 0.0, True, False, self._info(invalid_action=invalid, extracted_answer=extracted)
        msg += f" Try again ({left} attempt{'' if left == 1 else 's'} left)."
        return msg, 0.0, False, False, self._info(invalid_action=invalid, extracted_answer=extracted)

    def close(self) -> None:
        self._done = True


__all__ = ["MultiAttemptEnv"]
