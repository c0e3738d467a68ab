"""Reflect-then-retry without barriers (issue 47 item 1; ``rollout_loop="episodes"`` with reflection on).

Paper §4's chain per base episode: a failed base is reflected on the moment it ends, and its retries start
the moment its report is parsed, in one :class:`~rllib_r3l.runner.episode_loop.EpisodeLoop` with the other
episodes of the sample, instead of three phases each waiting for its slowest member. Only *when* things run
changes: the reports, pivots (hindsight included), retry specs and every later step of
:class:`~rllib_r3l.runner.explore.Explorer` (ledger rows, credit, auxiliary items, in reflection order)
are the phase path's own code on what this returns.

The exact trajectory budget (``explore(max_episodes=...)``) keeps its rule, retries allowed in reflection
order: retry ``a`` of base ``i`` (of ``R`` per failure) starts at once when ``i * R + a`` is under what the
budget leaves (no earlier base can push it out), else once every earlier base has ended and been reflected
on, when its place in reflection order is known.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from rllib_r3l.runner.episode import EpisodeSpec
from rllib_r3l.runner.episode_loop import EpisodeLoop
from rllib_r3l.runner.reflection import hindsight as hindsight_lib
from rllib_r3l.runner.reflection import oracle as oracle_lib
from rllib_r3l.trajectory import Kind, Status, Trajectory

logger = logging.getLogger(__name__)

LOST = (Status.ENV_ERROR, Status.GENERATION_ERROR)


@dataclass
class Pipelined:
    """What ran: base trajectories (per spec; None where lost before it started), each reflected base's
    ``(ParseResult, prompt_ids, GenerationResult)`` and hindsight pivot (by ``id``), the retries by
    ``(id(base), attempt)`` (None: the replay mismatched), the seconds of engine steps spent reflecting."""

    bases: List[Optional[Trajectory]]
    reflections: Dict[int, tuple] = field(default_factory=dict)
    hindsight: Dict[int, Optional[int]] = field(default_factory=dict)
    retries: Dict[Tuple[int, int], Optional[Trajectory]] = field(default_factory=dict)
    reflect_seconds: float = 0.0


class _Chain:
    def __init__(self, ex: Any, specs: List[EpisodeSpec], allowance: Optional[int]) -> None:
        self.ex, self.specs, self.allowance = ex, specs, allowance
        self.R = max(1, int(ex.opts.retries_per_failure))
        self.loop = EpisodeLoop(ex.episodes)
        self.out = Pipelined(bases=[None] * len(specs))
        self.ended = [False] * len(specs)
        self.planned: Dict[int, List[EpisodeSpec]] = {}  # base index -> its retry specs (known once reflected)
        self.waiting: Dict[int, bool] = {}  # base index -> reflected on, report not yet parsed
        self.decided: set = set()

    def run(self) -> Pipelined:
        try:
            for i, spec in enumerate(self.specs):
                self.loop.episode(i, spec, lambda t, i=i: self.base_ended(i, t))
            self.loop.run()
        finally:
            self.loop.close()
        self.out.reflect_seconds = self.loop.seconds["reflect"]
        return self.out

    # -- the chain, per base -------------------------------------------------------------------------
    def base_ended(self, i: int, traj: Optional[Trajectory]) -> None:
        self.out.bases[i], self.ended[i] = traj, True
        if traj is not None and traj.status not in LOST:
            traj.success = self.ex.is_success(traj)
            if self.ex.opts.reflect_on == "all" or not traj.success:
                self.reflect(i, traj)
        self.start_allowed()

    def reflect(self, i: int, b: Trajectory) -> None:
        ex = self.ex
        self.waiting[i] = True
        if ex.opts.reflector == "oracle":
            self.reflected(i, b, oracle_lib.oracle_reflections(ex, [b])[0])
            return
        req = ex.reflection_request(b)

        def done(o: Any) -> None:
            ex.counters["progress_reflections"] += 1
            self.reflected(i, b, ex.reflection_result(b, req, o))

        def failed() -> None:
            ex.counters["reflection_generation_errors"] += 1
            self.reflected(i, b, (None, req.prompt_token_ids, None))

        self.loop.request(ex.reflector, ("rf", i), req, ex.reflection_temperature, done, failed)

    def reflected(self, i: int, b: Trajectory, result: tuple) -> None:
        self.out.reflections[id(b)] = result
        self.out.hindsight.update(hindsight_lib.explorer_pivots(self.ex, [b], [result]))
        retry = self.ex.retry_of(b, result[0], self.out.hindsight.get(id(b)))
        self.planned[i] = (
            []
            if retry is None
            else [
                EpisodeSpec(
                    seed=b.seed, group_id=b.group_id, kind=Kind.RETRY, base=b, pivot=retry[0], guidance=retry[1]
                )
                for _ in range(self.R)
            ]
        )
        self.waiting[i] = False
        self.start_allowed()

    def start_allowed(self) -> None:
        """Start every planned retry the budget certainly allows (see the module docstring)."""
        before = 0  # retries planned by earlier bases, while all of them are known
        known = True
        for i in range(len(self.specs)):
            specs = self.planned.get(i)
            if specs is not None:
                for a, spec in enumerate(specs):
                    if (i, a) in self.decided:
                        continue
                    cap = self.allowance
                    if cap is None or i * self.R + a < cap or (known and before + a < cap):
                        self.decided.add((i, a))
                        self.start_retry(i, a, spec)
                    elif known:  # its place is known and past the budget: never started
                        self.decided.add((i, a))
                before += len(specs)
            if not self.ended[i] or self.waiting.get(i):
                known = False

    def start_retry(self, i: int, a: int, spec: EpisodeSpec) -> None:
        key = (id(spec.base), a)
        n = len(self.specs) + i * self.R + a  # the retry's own seeds, whatever the timing

        def ended(t: Optional[Trajectory]) -> None:
            self.out.retries[key] = t

        self.loop.episode(n, spec, ended)


def explore_pipelined(ex: Any, specs: List[EpisodeSpec], allowance: Optional[int]) -> Pipelined:
    """Run ``specs`` (base episodes) and, as each ends, its reflection and retries; see the module docstring."""
    return _Chain(ex, specs, allowance).run()


__all__ = ["Pipelined", "explore_pipelined"]
