"""Speed of every R3L environment that runs on this machine, with random admissible actions.

    python benchmarks/env_benchmark.py [--steps 200] [--only r3l/CoinCollector ...]
                                       [--alfworld-data PATH] [--webshop-path PATH]

Prints a markdown table: env id (and config), first start (construction + first reset, JVM
start and game generation included), mean reset time afterwards, environment steps per second
(reset time excluded), and notes. Environments without an action list (math, countdown) get random
answers. Environments that cannot run here (no data, not installed) get a row saying why.
Run on demand; not part of the tests.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
from benchmarks import harness  # noqa: E402
from environments import make  # noqa: E402

TWX_GAMES = ["coin", "cookingworld", "twc", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder"]


def _action(info: Dict[str, Any], rng: random.Random, env_id: str) -> str:
    acts = info.get("admissible_actions")
    if acts:
        return rng.choice(acts)
    if env_id == "r3l/Countdown":
        n = info.get("numbers") or [1, 2]
        return f"<answer>{n[0]} + {n[1]}</answer>"
    return f"The answer is \\boxed{{{rng.randint(0, 200)}}}."


def bench(env_id: str, config: Dict[str, Any], steps: int, seed0: int = 0) -> Tuple[float, float, float, str]:
    """(first start s, mean reset ms, steps per s, notes)."""
    rng = random.Random(0)
    t0 = time.perf_counter()
    env = make(env_id, config)
    try:
        _obs, info = env.reset(seed=seed0)
        first = time.perf_counter() - t0
        resets: List[float] = []
        step_time, done_steps, episodes, wins, invalid = 0.0, 0, 0, 0, 0
        seed = seed0
        while done_steps < steps:
            a = _action(info, rng, env_id)
            t = time.perf_counter()
            _obs, _r, term, trunc, info = env.step(a)
            step_time += time.perf_counter() - t
            done_steps += 1
            invalid += bool(info.get("invalid_action"))
            if term or trunc:
                episodes += 1
                wins += bool(info.get("won"))
                seed += 1
                t = time.perf_counter()
                _obs, info = env.reset(seed=seed)
                resets.append(time.perf_counter() - t)
        if not resets:
            t = time.perf_counter()
            env.reset(seed=seed + 1)
            resets.append(time.perf_counter() - t)
        notes = f"{episodes} episodes, {wins} won"
        if invalid:
            notes += f", {invalid} invalid"
        n_acts = info.get("admissible_actions")
        if n_acts is not None:
            notes += f", ~{len(n_acts)} valid actions"
        return first, 1000 * sum(resets) / len(resets), done_steps / step_time, notes
    finally:
        env.close()


def cases(args) -> List[Tuple[str, Dict[str, Any], str]]:
    out: List[Tuple[str, Dict[str, Any], str]] = [("r3l/CoinCollector", {}, "")]
    out += [("r3l/TextWorldExpress", {"game": g}, f"game={g}") for g in TWX_GAMES]
    out += [("r3l/ScienceWorld", {}, "all 30 tasks")]
    # a pool of 2 games, so that resets measure the engine; generating a game takes seconds (first start)
    out += [("r3l/TextWorld", {"num_games": 2}, "tw-coin_collector level 2, 2 games")]
    out += [("r3l/TextWorld", {"challenge": "tw-cooking", "num_games": 2}, "tw-cooking, 2 games")]
    alf = args.alfworld_data or os.environ.get("ALFWORLD_DATA")
    out += [("r3l/ALFWorld", {"data_path": alf} if alf else {}, f"data={alf}" if alf else "")]
    web = args.webshop_path or os.environ.get("WEBSHOP_PATH")
    out += [("r3l/WebShop", {"webshop_path": web} if web else {}, "")]
    out += [("r3l/Math", {}, "built-in generator, random answers"), ("r3l/Countdown", {}, "random answers")]
    return out


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200, help="environment steps per environment")
    p.add_argument("--only", nargs="*", default=None, help="env ids to run (default: all)")
    p.add_argument("--alfworld-data", default=None, help="ALFWorld data folder (default: $ALFWORLD_DATA)")
    p.add_argument("--webshop-path", default=None, help="WebShop checkout (default: $WEBSHOP_PATH)")
    args = p.parse_args(argv)
    rows = []
    for env_id, config, label in cases(args):
        if args.only and env_id not in args.only:
            continue
        name = env_id + (f" ({label})" if label else "")
        try:
            first, reset_ms, sps, notes = bench(env_id, config, args.steps)
            rows.append((name, f"{first:.2f}", f"{reset_ms:.1f}", f"{sps:.0f}", notes))
        except Exception as e:  # an environment that cannot run here: say why
            msg = str(e).split(". ")[0].replace("|", "/")
            rows.append((name, "-", "-", "-", f"not run: {type(e).__name__}: {msg[:150]}"))
        print(f"done: {name}", file=sys.stderr, flush=True)
    print(harness.markdown_table(("env id", "first start s", "reset ms", "steps/s", "notes"), rows))


if __name__ == "__main__":
    main()
