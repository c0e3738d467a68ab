"""ALFWorld (household tasks, TextWorld/PDDL engine) as an R3L text environment.

Game files come from ``data_path`` (env_config) or ``$ALFWORLD_DATA``, laid out as ALFWorld's
``alfworld-download`` leaves them: ``json_2.1.1/{train,valid_seen,valid_unseen}/<task>/<trial>/``
with ``traj_data.json`` and ``game.tw-pddl``. Splits: train -> ``train``, dev -> ``valid_seen``
(in-distribution eval), test -> ``valid_unseen`` (out-of-distribution eval). Games are selected
like ALFWorld's own loader (solvable, no movable/sliced, of the chosen task types) and sorted, so
``seed % n`` picks the same game everywhere. The game is played through the shared
``TextWorldGameEnv`` adapter with ALFWorld's name demangler. Zero games is a clear error here
(ALFWorld's own reset would loop forever).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from environments.textworld_games import TextWorldGameEnv

TASK_TYPES = {
    1: "pick_and_place_simple",
    2: "look_at_obj_in_light",
    3: "pick_clean_then_place_in_recep",
    4: "pick_heat_then_place_in_recep",
    5: "pick_cool_then_place_in_recep",
    6: "pick_two_obj_and_place",
}
SPLIT_DIRS = {"train": "train", "dev": "valid_seen", "test": "valid_unseen"}
_WELCOME = "-= Welcome to TextWorld, ALFRED! =-"

_CACHE: Dict[Tuple[str, Tuple[str, ...]], List[str]] = {}
_CACHE_LOCK = threading.Lock()


def missing_data_message(data_path: Optional[str], detail: str) -> str:
    where = data_path if data_path else "(not set)"
    return (
        f"r3l/ALFWorld found no ALFWorld games: {detail}. Data path: {where}. Set env_config['data_path'] or "
        "the ALFWORLD_DATA environment variable to a folder holding json_2.1.1/{train,valid_seen,valid_unseen}; "
        "fetch the data with `alfworld-download` (pip install alfworld), which puts it under $ALFWORLD_DATA."
    )


def collect_games(split_dir: str, task_types: Sequence[str]) -> List[str]:
    """ALFWorld's game selection (solvable, not movable/sliced, of ``task_types``), sorted."""
    key = (os.path.abspath(split_dir), tuple(sorted(task_types)))
    with _CACHE_LOCK:
        if key in _CACHE:
            return list(_CACHE[key])
    games: List[str] = []
    for root, _dirs, files in os.walk(split_dir):
        if "traj_data.json" not in files or "game.tw-pddl" not in files:
            continue
        if "movable" in root or "Sliced" in root:
            continue
        try:
            with open(os.path.join(root, "traj_data.json")) as f:
                traj = json.load(f)
            if traj.get("task_type") not in task_types:
                continue
            with open(os.path.join(root, "game.tw-pddl")) as f:
                game = json.load(f)
        except (OSError, ValueError):
            continue
        if not game.get("solvable", False):
            continue
        games.append(os.path.abspath(os.path.join(root, "game.tw-pddl")))
    games.sort()
    with _CACHE_LOCK:
        _CACHE[key] = list(games)
    return games


class ALFWorldEnv(TextWorldGameEnv):
    """ALFWorld text games; ``task_types`` (ids 1-6 or names) filter them, ``split`` picks the folder."""

    rules = (
        "You are in a household and must complete the task you are given. Each turn you get an "
        "observation and the list of admissible commands (e.g. 'go to countertop 1', 'take apple 1 from "
        "countertop 1', 'open fridge 1', 'put apple 1 in/on fridge 1', 'heat/cool/clean ... with ...', "
        "'use desklamp 1'); answer with exactly one of them."
    )

    def __init__(
        self,
        data_path: Optional[str] = None,
        split: str = "train",
        max_turns: int = 25,
        task_types: Union[None, Sequence[Union[int, str]]] = None,
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
        if data_path is not None and not isinstance(data_path, str):
            raise ValueError(f"data_path must be a folder path; got {data_path!r}")
        self.data_path = os.path.expanduser(data_path or os.environ.get("ALFWORLD_DATA", "")) or None
        names = []
        for t in task_types if task_types is not None else sorted(TASK_TYPES):
            if t in TASK_TYPES:
                names.append(TASK_TYPES[t])
            elif t in TASK_TYPES.values():
                names.append(t)
            else:
                raise ValueError(f"task_types: unknown task type {t!r}; use ids 1-6 or {sorted(TASK_TYPES.values())}")
        if not names:
            raise ValueError("task_types must not be empty")
        self.task_types = names
        self._split_games: Dict[str, List[str]] = {}
        self._games(self.split)  # fail now, with a clear message, if there are no games

    def _games(self, split: str) -> List[str]:
        if split not in self._split_games:
            if not self.data_path:
                raise FileNotFoundError(missing_data_message(None, "no data path given"))
            split_dir = os.path.join(self.data_path, "json_2.1.1", SPLIT_DIRS[split])
            if not os.path.isdir(split_dir):
                raise FileNotFoundError(missing_data_message(self.data_path, f"missing folder {split_dir}"))
            games = collect_games(split_dir, self.task_types)
            if not games:
                raise FileNotFoundError(
                    missing_data_message(
                        self.data_path, f"zero solvable games of types {self.task_types} under {split_dir}"
                    )
                )
            self._split_games[split] = games
        return self._split_games[split]

    def _wrappers(self) -> list:
        try:
            from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        except ImportError as e:
            raise ImportError("r3l/ALFWorld needs `pip install alfworld`") from e
        return [AlfredDemangler(shuffle=False), AlfredInfos]

    def _request_infos(self):
        import textworld

        return textworld.EnvInfos(admissible_commands=True, won=True, extras=["gamefile"])

    def _clean_observation(self, text: str) -> str:
        return text.replace(_WELCOME, "").strip()

    def _task_text(self, state: Any, obs: str) -> str:
        marker = "Your task is to:"
        i = obs.rfind(marker)
        return obs[i + len(marker) :].strip() if i >= 0 else ""

    def _norm_score(self, state: Any) -> float:
        return 1.0 if state.get("won") else 0.0


__all__ = ["ALFWorldEnv", "collect_games", "missing_data_message", "TASK_TYPES", "SPLIT_DIRS"]
