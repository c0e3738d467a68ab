"""Held-out evaluation: base episodes (no reflection, no retry), one per task seed, at the evaluation
temperature (paper K.1: 0.4), summarised the same way wherever they run: ``R3L.evaluate()`` (the weights
of a run in progress, on its env runners) and ``rllib-r3l evaluate`` (a checkpoint or an exported model).

Pure functions: an episode's row, the summary of rows, the seeds' split over runners; and ``play_heldout``,
the rows of an env runner group's episodes (what ``R3L.evaluate()`` summarises, benchmarks keep per game).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Sequence, Tuple

from rllib_r3l import core_algos

LOST_STATUSES = ("env_error", "generation_error")


def episode_row(seed: int, traj: Any, success_reward: float) -> Dict[str, Any]:
    """One evaluated episode: its task seed, return, success, turns, status and last action."""
    status = traj.status.value if hasattr(traj.status, "value") else str(traj.status)
    return {
        "seed": int(seed),
        "return": float(traj.reward),
        "success": bool(core_algos.is_success(traj.reward, traj.success, success_reward=success_reward)),
        "turns": int(traj.num_turns),
        "status": status,
        "last_action": traj.actions[-1] if traj.actions else "",
    }


def summarize(rows: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """``episodes``, ``success_rate``, ``mean_return``, ``mean_turns`` over the rows and ``errors``: the
    episodes an environment or the engine lost (they count as failures in the rates, never dropped)."""
    n = len(rows)

    def mean(key: str) -> float:
        return float(sum(float(r[key]) for r in rows) / n) if n else math.nan

    return {
        "episodes": n,
        "success_rate": mean("success"),
        "mean_return": mean("return"),
        "mean_turns": mean("turns"),
        "errors": sum(1 for r in rows if r["status"] in LOST_STATUSES),
    }


def split_seeds(seeds: Sequence[int], parts: int) -> List[List[int]]:
    """``seeds`` in ``parts`` contiguous shares, sizes differing by at most one (the first ones larger)."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    q, r = divmod(len(seeds), parts)
    out, start = [], 0
    for i in range(parts):
        size = q + (1 if i < r else 0)
        out.append([int(s) for s in seeds[start : start + size]])
        start += size
    return out


def play_heldout(group: Any, seeds: Sequence[int]) -> Tuple[List[Dict[str, Any]], int]:
    """Each seed's evaluated episode (``episode_row``) played on ``group``'s runners: the local one without
    remote runners, else the seeds split over the healthy remote ones (their own engines). Returns the rows
    in seed order of the runners that answered, and how many seeds a runner that failed (or no runner) lost."""
    seeds = [int(s) for s in seeds]
    if group.num_remote_workers() <= 0:
        return group.local_env_runner.evaluate_episodes(seeds), 0
    ids = list(group.healthy_worker_ids())
    shares = dict(zip(ids, split_seeds(seeds, len(ids)))) if ids else {}
    out = group.foreach_env_runner(
        [(lambda r, _s=shares[i]: (r.worker_index, r.evaluate_episodes(_s))) for i in ids],
        remote_worker_ids=ids,
        local_env_runner=False,
    )
    done = dict(out)
    rows = [row for i in ids if i in done for row in done[i]]
    return rows, sum(len(s) for i, s in shares.items() if i not in done) + (len(seeds) if not ids else 0)
