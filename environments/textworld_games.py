"""TextWorld games (Inform7 ``.z8`` or PDDL ``.tw-pddl`` files) as R3L text environments.

``TextWorldGameEnv`` is the shared adapter: it plays one game file per episode through
``textworld.start`` with admissible commands, normalises the score to 1.0, gives feedback on
invalid commands, and can end an episode on an invalid or thrice-repeated action (the ALFWorld
protocol of the reference). Its subclasses only say where the game files of a split come from:

- ``TextWorldEnv`` (``r3l/TextWorld``): explicit ``game_files``, or games generated offline with
  TextWorld's own challenges (``tw-coin_collector``, ``tw-treasure_hunter``, ``tw-simple``,
  ``tw-cooking``) into a cache folder, one game per seed, with disjoint generation seeds per split.
- ``environments.alfworld_env.ALFWorldEnv`` (``r3l/ALFWorld``): ALFWorld's PDDL games.

Oracle (``oracle_pivot`` / ``oracle_action``; optimal = the fewest turns to ``won``): the game's own
solution (``gold_actions``: TextWorld's walkthrough / ALFWorld's PDDL plan) with every needless step
left out (cut at its win, then each action whose removal still wins by replay is removed), taken as
the optimal plan. An action equal to the plan's next one stays optimal; any other action stays
optimal only if the plan without it (a later step done early) or without its first step still wins
by replay under the episode's rules (``end_on_invalid``, ``max_repeats``). The first action for which
neither does is the pivot; the gold action is the plan's next step there. Equal-length alternatives
the plan cannot express count as pivots: a conservative oracle.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from environments._common import check_positive_int, check_split, invalid_feedback, normalize_action
from environments.base import GoldPlanOracle, TextEnv, check_action
from environments.textworld_generate import _DEFAULT_SETTINGS, CHALLENGES, default_cache_dir, generate_game

GAME_EXTENSIONS = (".z8", ".z5", ".z3", ".tw-pddl")


def _import_textworld():
    try:
        import textworld  # noqa: F401
        import textworld.core  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "TextWorld environments need `pip install textworld` (ALFWorld: `pip install alfworld`, which brings it)"
        ) from e
    return textworld


class TextWorldGameEnv(GoldPlanOracle, TextEnv):
    """Shared adapter over TextWorld game files. Subclasses implement ``_games(split)``."""

    rules = (
        "You play a text adventure by typing one command per turn. Each turn you get an observation "
        "and the list of admissible commands; answer with exactly one of them."
    )

    def __init__(
        self,
        split: str = "train",
        max_turns: int = 30,
        end_on_invalid: bool = False,
        max_repeats: Optional[int] = None,
        max_listed_actions: int = 60,
    ) -> None:
        super().__init__()
        self.split = check_split(split)
        self.max_turns = check_positive_int("max_turns", max_turns)
        self.end_on_invalid = bool(end_on_invalid)
        if max_repeats is not None:
            check_positive_int("max_repeats", max_repeats)
        self.max_repeats = max_repeats
        self.max_listed_actions = max_listed_actions
        self._env = None
        self._file: Optional[str] = None
        self._valid: List[str] = []
        self._task = ""
        self._score = 0.0
        self._turn = 0
        self._done = True
        self._last_actions: List[str] = []

    # -------------------------------------------------------------- to override
    def _games(self, split: str) -> List[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _wrappers(self) -> list:
        return []

    def _request_infos(self):
        textworld = _import_textworld()
        return textworld.EnvInfos(
            admissible_commands=True,
            won=True,
            lost=True,
            score=True,
            max_score=True,
            objective=True,
            policy_commands=False,
        )

    def _clean_observation(self, text: str) -> str:
        return text.strip()

    def _task_text(self, state: Any, obs: str) -> str:
        objective = state.get("objective") if hasattr(state, "get") else None
        return (objective or "").strip()

    # -------------------------------------------------------------- helpers
    def games(self, split: Optional[str] = None) -> List[str]:
        """The game files of ``split`` (default: this env's split)."""
        return list(self._games(check_split(split or self.split)))

    def game_for_seed(self, seed: int) -> str:
        return self._game_for_seed(self.split, int(seed))

    def _game_for_seed(self, split: str, seed: int) -> str:
        games = self._games(split)
        return games[seed % len(games)]

    def _start(self, path: str, policy: bool = False):
        textworld = _import_textworld()
        infos = self._request_infos()
        infos.policy_commands = policy
        with warnings.catch_warnings():
            # jericho warns that TextWorld's own .z8 games are "not fully supported" (its score
            # detection); TextWorld's wrapper supplies score, won and admissible commands itself.
            warnings.filterwarnings("ignore", message=".*is not fully supported.*")
            return textworld.start(path, request_infos=infos, wrappers=self._wrappers())

    def _admissible(self, state: Any) -> List[str]:
        cmds = state.get("admissible_commands") or []
        return sorted({normalize_action(c) for c in cmds})

    def _norm_score(self, state: Any) -> float:
        score = state.get("score")
        max_score = state.get("max_score")
        if score is None:
            return 1.0 if state.get("won") else 0.0
        if not max_score:
            return float(score)
        return float(score) / float(max_score)

    def _info(self, **kw: Any) -> Dict[str, Any]:
        info = {
            "task": self._task,
            "admissible_actions": list(self._valid),
            "won": False,
            "invalid_action": False,
            "score": self._score,
            "game_file": self._file,
            "split": self.split,
        }
        info.update(kw)
        return info

    # -------------------------------------------------------------- gym API
    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> Tuple[str, Dict[str, Any]]:
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(0, 2**31 - 1))
        path = self._game_for_seed(self.split, int(seed))
        if self._env is None or path != self._file:
            self._close_engine()
            self._env = self._start(path)
            self._file = path
        state = self._env.reset()
        obs = self._clean_observation(state.get("feedback") or "")
        self._task = self._task_text(state, obs)
        self._valid = self._admissible(state)
        self._score, self._turn, self._done = 0.0, 0, False
        self._last_actions = []
        return obs, self._info(seed=seed)

    def gold_actions(self, seed: int) -> List[str]:
        """A solution path for ``seed`` (the game's planner / walkthrough commands)."""
        path = self._game_for_seed(self.split, int(seed))
        env = self._start(path, policy=True)
        try:
            state = env.reset()
            return [normalize_action(c) for c in (state.get("policy_commands") or [])]
        finally:
            env.close()

    def step(self, action: str):
        action = check_action(action)
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        a = normalize_action(action)
        before = self._valid
        invalid = a not in before
        self._turn += 1
        self._last_actions.append(a)
        repeated = (
            self.max_repeats is not None
            and len(self._last_actions) >= self.max_repeats
            and len(set(self._last_actions[-self.max_repeats :])) == 1
        )
        if invalid and self.end_on_invalid:
            self._done = True
            obs = invalid_feedback(action, "it is not an admissible command. The episode ends.", None)
            return obs, 0.0, True, False, self._info(invalid_action=True, admissible_actions=[])
        state, _score, _done = self._env.step(a)
        obs = self._clean_observation(state.get("feedback") or "")
        won = bool(state.get("won"))
        lost = bool(state.get("lost"))
        score = self._norm_score(state)
        reward = score - self._score
        self._score = score
        self._valid = self._admissible(state)
        terminated = won or lost
        if repeated and not terminated:
            terminated = True
            obs = (f"{obs}\nYou chose '{a}' {self.max_repeats} times in a row; the episode ends.").strip()
        truncated = not terminated and self._turn >= self.max_turns
        self._done = terminated or truncated
        if invalid:
            obs = invalid_feedback(
                action, f"{obs} It is not an admissible command.", self._valid, self.max_listed_actions
            )
        elif lost:
            obs = f"{obs}\nThe game is lost."
        return (
            obs,
            reward,
            terminated,
            truncated,
            self._info(won=won, invalid_action=invalid, lost=lost, repeated=repeated),
        )

    def _close_engine(self) -> None:
        env, self._env = self._env, None
        self._file = None
        if env is not None:
            env.close()

    def close(self) -> None:
        self._done = True
        self._close_engine()


_SPLIT_SEED_OFFSET = {"train": 0, "dev": 1_000_000, "test": 2_000_000}


_BANNER_CHARS = set("$|\\/_<>-=")


def _is_banner(line: str) -> bool:
    chars = line.replace(" ", "")
    return len(chars) >= 3 and set(chars) <= _BANNER_CHARS


_BLANKS = re.compile(r"\n\s*\n(\s*\n)+")


def _expand_files(spec: Union[str, Sequence[str]], field: str) -> List[str]:
    items = [spec] if isinstance(spec, str) else list(spec)
    out: List[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"{field} must hold paths or glob patterns; got {item!r}")
        item = os.path.expanduser(item)
        if os.path.isdir(item):
            for ext in GAME_EXTENSIONS:
                out += glob.glob(os.path.join(item, "**", "*" + ext), recursive=True)
        elif any(ch in item for ch in "*?["):
            out += glob.glob(item, recursive=True)
        elif os.path.isfile(item):
            out.append(item)
        else:
            raise ValueError(f"{field}: no such game file or folder: {item!r}")
    out = sorted({os.path.abspath(p) for p in out if p.endswith(GAME_EXTENSIONS)})
    return out


def _hash_split(path: str) -> str:
    h = (
        int(
            hashlib.sha1(
                os.path.basename(os.path.dirname(path)).encode() + os.path.basename(path).encode()
            ).hexdigest(),
            16,
        )
        % 10
    )
    return "train" if h < 8 else ("dev" if h == 8 else "test")


class TextWorldEnv(TextWorldGameEnv):
    """TextWorld games: given files, or generated offline per seed from a TextWorld challenge.

    ``game_files``: a path, folder or glob, or a list of them (split by a hash of the file name,
    80/10/10), or a dict ``{"train": ..., "dev": ..., "test": ...}``. Without ``game_files``, the
    ``challenge`` (default ``tw-coin_collector``) with ``settings`` (e.g. ``{"level": 2}``) is generated
    for the seed into ``cache_dir`` (default ``$RLLIB_R3L_CACHE/textworld_games`` or
    ``~/.cache/rllib_r3l/textworld_games``); ``num_games`` distinct games per split, generation seeds
    disjoint across splits. Generating a game takes a few seconds; later resets reuse it.
    """

    def __init__(
        self,
        game_files: Union[None, str, Sequence[str], Mapping[str, Any]] = None,
        challenge: str = "tw-coin_collector",
        settings: Optional[Mapping[str, Any]] = None,
        num_games: int = 1000,
        cache_dir: Optional[str] = None,
        split: str = "train",
        max_turns: int = 20,
        end_on_invalid: bool = False,
        max_repeats: Optional[int] = None,
        max_listed_actions: int = 60,
    ) -> None:
        super().__init__(
            split=split,
            max_turns=max_turns,
            end_on_invalid=end_on_invalid,
            max_repeats=max_repeats,
            max_listed_actions=max_listed_actions,
        )
        if challenge not in CHALLENGES:
            raise ValueError(f"challenge must be one of {', '.join(CHALLENGES)}; got {challenge!r}")
        if settings is not None and not isinstance(settings, Mapping):
            raise ValueError(f"settings must be a dict of challenge options; got {settings!r}")
        self.challenge = challenge
        self.settings = dict(_DEFAULT_SETTINGS[challenge] if settings is None else settings)
        self.num_games = check_positive_int("num_games", num_games)
        self.cache_dir = cache_dir or default_cache_dir()
        self._split_files: Optional[Dict[str, List[str]]] = None
        if game_files is not None:
            if isinstance(game_files, Mapping):
                bad = [k for k in game_files if check_split(k) != k]
                if bad:
                    raise ValueError(f"game_files keys must be train/dev/test; got {bad}")
                self._split_files = {
                    s: _expand_files(game_files.get(s, []), f"game_files[{s!r}]") for s in ("train", "dev", "test")
                }
            else:
                files = _expand_files(game_files, "game_files")
                if not files:
                    raise ValueError(f"game_files: no game files ({', '.join(GAME_EXTENSIONS)}) in {game_files!r}")
                self._split_files = {s: [f for f in files if _hash_split(f) == s] for s in ("train", "dev", "test")}
            if not self._split_files[self.split]:
                raise ValueError(
                    f"game_files: no game falls in split {self.split!r}; pass a dict "
                    "{'train': [...], 'dev': [...], 'test': [...]}"
                )

    def _clean_observation(self, text: str) -> str:
        """Drop the ASCII-art title banner, the '>' prompt/status line and runs of blank lines."""
        lines = [ln for ln in text.splitlines() if not _is_banner(ln)]
        while lines and (not lines[-1].strip() or lines[-1].lstrip().startswith(">")):
            lines.pop()
        return _BLANKS.sub("\n\n", "\n".join(ln.rstrip() for ln in lines)).strip()

    def _games(self, split: str) -> List[str]:
        if self._split_files is not None:
            return self._split_files[split]
        raise AssertionError("generated games are resolved per seed")

    def _game_for_seed(self, split: str, seed: int) -> str:
        if self._split_files is not None:
            return super()._game_for_seed(split, seed)
        gen_seed = _SPLIT_SEED_OFFSET[split] + seed % self.num_games
        settings = dict(self.settings)
        if self.challenge == "tw-cooking":
            settings.setdefault("split", {"dev": "valid"}.get(split, split))
        return generate_game(self.challenge, settings, gen_seed, self.cache_dir)

    def games(self, split: Optional[str] = None) -> List[str]:
        if self._split_files is None:
            raise ValueError("games are generated per seed; use game_for_seed(seed)")
        return super().games(split)


__all__ = ["TextWorldGameEnv", "TextWorldEnv", "generate_game", "CHALLENGES", "default_cache_dir"]
