"""What an episode is while it runs: the spec it was started from, its next turn's request and its live state
(shared by the waves, :mod:`rllib_r3l.runner.rollout`, and the episode loops, :mod:`rllib_r3l.runner.episode_loop`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from rllib_r3l.generation.base import GenerationRequest
from rllib_r3l.trajectory import Kind, Trajectory


@dataclass
class EpisodeSpec:
    """What to run: a fresh episode on task ``seed``, or a retry of ``base`` from ``pivot``."""

    seed: int
    group_id: str
    kind: Kind = Kind.BASE
    base: Optional[Trajectory] = None  # retry: the trajectory to restart
    pivot: int = 0
    guidance: Optional[str] = None


@dataclass
class Turn:
    """One turn's request: what to generate, at which temperature, and the action it may not repeat."""

    request: GenerationRequest
    temperature: float
    failed: Optional[str] = None  # a free-text pivot turn's failed action (sampled again when repeated)


@dataclass
class Live:
    """An episode in progress: its environment, trajectory so far, turn and the actions it may take."""

    spec: EpisodeSpec
    env: Any
    traj: Trajectory
    system_text: str
    turn: int = 0
    admissible: Optional[List[str]] = None
    done: bool = False
    close_prev: List[int] = field(default_factory=list)  # stop token owed by a truncated response


__all__ = ["EpisodeSpec", "Live", "Turn"]
