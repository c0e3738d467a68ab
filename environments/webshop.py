"""WebShop (online shopping for an instruction, text mode) as an R3L text environment.

Adapter over the official WebShop text environment (``web_agent_site.envs.WebAgentTextEnv`` of
the WebShop repository, not on PyPI). Its folder comes from ``webshop_path`` (env_config) or
``$WEBSHOP_PATH``; it needs WebShop's product data and search index set up as its README says
(the full product set needs a very large amount of RAM; ``num_products`` limits it). Without it
the constructor raises a clear error naming WEBSHOP_PATH.

Actions are ``search[query]`` and ``click[button]``. On a page with a search bar the action is
free text (``admissible_actions`` None); elsewhere the admissible actions are the page's
``click[...]`` buttons. Goals are split as in WebShop's own experiments: test = goals 0-499,
dev = 500-1499, train = 1500 and above. The final reward is WebShop's purchase score in [0, 1]
(``won`` when it is 1.0); an episode that ends without reward (no purchase within ``max_turns``,
or a purchase scored 0) gets ``failure_reward`` (default -0.1, as in the reference setup).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from environments._common import check_positive_int, check_split, invalid_feedback
from environments.base import TextEnv, check_action

SPLIT_GOALS = {"test": (0, 500), "dev": (500, 1500), "train": (1500, None)}
_ACTION = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.I | re.S)
_CWD_LOCK = threading.Lock()


def parse_action(text: str) -> Tuple[str, str]:
    """``'search[red shoes]'`` -> ``('search', 'red shoes')``; raises ValueError with the reason."""
    m = _ACTION.match(text.strip().splitlines()[-1] if text.strip() else "")
    if not m:
        raise ValueError("actions are search[query] or click[button text]")
    kind, arg = m.group(1).lower(), m.group(2).strip()
    if not arg:
        raise ValueError(f"{kind}[...] needs text inside the brackets")
    return kind, arg


def episode_reward(raw_reward: float, ended: bool, failure_reward: float) -> float:
    """Step reward: WebShop's score at the end of an episode, ``failure_reward`` for an episode that
    ends with nothing (score 0), 0 on every other step."""
    if not ended:
        return 0.0
    return float(raw_reward) if raw_reward > 0 else float(failure_reward)


def goal_range(split: str, num_goals: int) -> range:
    lo, hi = SPLIT_GOALS[check_split(split)]
    hi = num_goals if hi is None else min(hi, num_goals)
    return range(lo, max(lo, hi))


def missing_message(path: Optional[str], detail: str) -> str:
    where = path if path else "(not set)"
    return (
        f"r3l/WebShop needs the official WebShop environment: {detail}. WebShop path: {where}. Set "
        "env_config['webshop_path'] or the WEBSHOP_PATH environment variable to a checkout of the WebShop "
        "repository (princeton-nlp/WebShop) installed with its setup script (its Python requirements, "
        "product data under data/ and the search-engine index), so that `web_agent_site` imports."
    )


@contextlib.contextmanager
def _inside(path: str):
    """Import and build WebShop from its own folder (its data paths are relative to it)."""
    with _CWD_LOCK:
        old_cwd, added = os.getcwd(), False
        if path not in sys.path:
            sys.path.insert(0, path)
            added = True
        os.chdir(path)
        try:
            yield
        finally:
            os.chdir(old_cwd)
            if added:
                with contextlib.suppress(ValueError):
                    sys.path.remove(path)


def default_factory(webshop_path: str, num_products: Optional[int], human_goals: bool) -> Any:
    with _inside(webshop_path):
        try:
            from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv
        except Exception as e:  # ImportError, or its data loading failing at import
            raise ImportError(missing_message(webshop_path, f"importing web_agent_site failed ({e!r})")) from e
        kwargs: Dict[str, Any] = {"observation_mode": "text", "human_goals": human_goals}
        if num_products is not None:
            kwargs["num_products"] = num_products
        return WebAgentTextEnv(**kwargs)


class WebShopEnv(TextEnv):
    """WebShop: find and buy the product that matches the instruction."""

    rules = (
        "You shop on a web site for the product the instruction describes. Actions: search[query] on a page "
        "with a search bar, click[button] to press a button, open a product or choose an option, and "
        "click[buy now] to buy. Answer with exactly one action."
    )

    option_bounds = {"num_products": (1, None)}

    def __init__(
        self,
        webshop_path: Optional[str] = None,
        split: str = "train",
        max_turns: int = 15,
        failure_reward: float = -0.1,
        num_products: Optional[int] = None,
        human_goals: bool = True,
        engine_factory: Optional[Callable[[], Any]] = None,
    ) -> None:
        super().__init__()
        self.split = check_split(split)
        self.max_turns = check_positive_int("max_turns", max_turns)
        if isinstance(failure_reward, bool) or not isinstance(failure_reward, (int, float)):
            raise ValueError(f"failure_reward must be a number; got {failure_reward!r}")
        self.failure_reward = float(failure_reward)
        if num_products is not None:
            check_positive_int("num_products", num_products)
        self.num_products = num_products
        self.human_goals = bool(human_goals)
        if engine_factory is None:
            path = webshop_path or os.environ.get("WEBSHOP_PATH")
            if not path:
                raise FileNotFoundError(missing_message(None, "no path given"))
            path = os.path.abspath(os.path.expanduser(path))
            if not os.path.isdir(os.path.join(path, "web_agent_site")):
                raise FileNotFoundError(missing_message(path, f"no web_agent_site package in {path}"))
            self.webshop_path = path
            self._engine = default_factory(path, num_products, self.human_goals)
        else:
            self.webshop_path = webshop_path
            self._engine = engine_factory()
        self._goals = self._num_goals()
        if len(goal_range(self.split, self._goals)) == 0:
            raise ValueError(f"split: WebShop has only {self._goals} goals, none in split {self.split!r}")
        self._valid: Optional[List[str]] = None
        self._task = ""
        self._turn = 0
        self._done = True

    def _num_goals(self) -> int:
        server = getattr(self._engine, "server", None)
        goals = getattr(server, "goals", None)
        return len(goals) if goals is not None else 12087

    def _admissible(self) -> Optional[List[str]]:
        avail = self._engine.get_available_actions()
        if avail.get("has_search_bar"):
            return None
        return sorted(f"click[{c}]" for c in avail.get("clickables", []) if c != "search")

    def _info(self, **kw: Any) -> Dict[str, Any]:
        info = {
            "task": self._task,
            "admissible_actions": None if self._valid is None else list(self._valid),
            "won": False,
            "invalid_action": False,
            "split": self.split,
        }
        info.update(kw)
        return info

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> Tuple[str, Dict[str, Any]]:
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(0, 2**31 - 1))
        goals = goal_range(self.split, self._goals)
        session = goals[int(seed) % len(goals)]
        obs, _ = self._engine.reset(session=session)
        self._task = str(self._engine.get_instruction_text()).replace("Instruction:", "").strip()
        self._valid = self._admissible()
        self._turn, self._done = 0, False
        return obs, self._info(seed=seed, session=session)

    def step(self, action: str):
        action = check_action(action)
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        self._turn += 1
        invalid, reason = False, ""
        try:
            kind, arg = parse_action(action)
            if kind == "search" and self._valid is not None:
                invalid, reason = True, "there is no search bar on this page; click a button."
            elif kind == "click" and self._valid is not None and f"click[{arg.lower()}]" not in self._valid:
                invalid, reason = True, f"there is no button '{arg}' on this page."
            elif kind == "click" and self._valid is None and arg.lower() != "search":
                invalid, reason = True, "this page has only a search bar; use search[query]."
        except ValueError as e:
            invalid, reason, kind, arg = True, str(e) + ".", "", ""
        raw_reward, raw_done = 0.0, False
        if not invalid:
            obs, raw_reward, raw_done, _ = self._engine.step(f"{kind}[{arg}]")
            raw_reward = float(raw_reward or 0.0)
            self._valid = self._admissible()
        else:
            obs = invalid_feedback(action, reason, self._valid)
        terminated = bool(raw_done)
        truncated = not terminated and self._turn >= self.max_turns
        self._done = terminated or truncated
        reward = episode_reward(raw_reward, self._done, self.failure_reward)
        won = terminated and raw_reward >= 1.0
        return (
            obs,
            reward,
            terminated,
            truncated,
            self._info(won=won, invalid_action=invalid, webshop_reward=raw_reward),
        )

    def close(self) -> None:
        self._done = True
        engine, self._engine = self._engine, None
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.close()


__all__ = ["WebShopEnv", "parse_action", "episode_reward", "goal_range", "missing_message", "SPLIT_GOALS"]
