"""Every environment's own solution must solve it through our adapter, also after ``restore()``.

    python scripts/gold_paths.py [--only scienceworld twx textworld alfworld] [--stride 1]
                                 [--twx-seeds 3] [--tw-seeds 2] [--sw-split train] [--json PATH]

- ScienceWorld: all 30 tasks (one variation each), ScienceWorld's own gold action sequence;
- TextWorldExpress: every game with its default parameters (coin: the project's default), TWX's gold
  path, ``--twx-seeds`` seeds each;
- TextWorld: games generated with TextWorld's challenges (as in the tests), their walkthroughs;
- ALFWorld: the handwritten miniature games of the tests, their PDDL plans.

Each solution is played from ``reset(seed)`` and must end ``won`` with return 1.0; then the environment
is restored to every prefix (every ``--stride``-th) and the rest is played from there: the restored
observation must equal the recorded one and the episode must again end ``won`` with return 1.0.
Prints a table of pass counts per environment and the failures, and exits non-zero on a failure. A
correctness check, on demand (minutes to an hour); a sample runs in the tests
(``tests/environments/test_gold_paths.py``); the recorded full run is
``benchmarks/results/gold_paths.md`` with ``gold_paths_*.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "environments"))

from environments import make  # noqa: E402
from environments._gold import check_solution  # noqa: E402

TWX_GAMES = ["coin", "cookingworld", "twc", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder"]
TW_CHALLENGES = ["tw-coin_collector", "tw-treasure_hunter", "tw-simple", "tw-cooking"]


def _cases(args) -> List[Tuple[str, str, Any, List[int]]]:
    """(group, label, env factory, seeds)."""
    out = []
    if "scienceworld" in args.only:
        from environments.sciworld import resolve_task, task_names

        for i, t in enumerate(task_names()):
            if args.sw_tasks and t not in {resolve_task(x) for x in args.sw_tasks}:
                continue
            out.append(
                (
                    "ScienceWorld",
                    t,
                    lambda i=i: make("r3l/ScienceWorld", {"tasks": task_names()[i], "split": args.sw_split}),
                    [0],
                )
            )
    if "twx" in args.only:
        for g in TWX_GAMES:
            out.append(
                (
                    "TextWorldExpress",
                    g,
                    lambda g=g: make(
                        "r3l/TextWorldExpress", {"game": g} if g != "coin" else {"game": "coin", "game_params": _coin()}
                    ),
                    list(range(args.twx_seeds)),
                )
            )
    if "textworld" in args.only:
        cache = tempfile.mkdtemp(prefix="gold_tw_")
        for c in TW_CHALLENGES:
            out.append(
                (
                    "TextWorld",
                    c,
                    lambda c=c: make("r3l/TextWorld", {"challenge": c, "cache_dir": cache}),
                    list(range(args.tw_seeds)),
                )
            )
    if "alfworld" in args.only:
        from alfworld_mini import write_mini_alfworld

        data = write_mini_alfworld(tempfile.mkdtemp(prefix="gold_alf_"))
        for split in ("train", "dev", "test"):
            out.append(
                (
                    "ALFWorld (mini)",
                    split,
                    lambda s=split: make("r3l/ALFWorld", {"data_path": data, "split": s}),
                    [0, 1] if split == "train" else [0],
                )
            )
    return out


def _coin():
    from environments.twx import COIN_DEFAULT_PARAMS

    return dict(COIN_DEFAULT_PARAMS)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", nargs="+", default=["scienceworld", "twx", "textworld", "alfworld"])
    p.add_argument("--stride", type=int, default=1, help="restore at every STRIDE-th prefix (0: no restore checks)")
    p.add_argument(
        "--sw-stride",
        type=int,
        default=None,
        help="ScienceWorld's own stride (default: --stride); every prefix of all 30 tasks replays ~84k "
        "steps, about an hour on a busy 2-core machine",
    )
    p.add_argument("--twx-seeds", type=int, default=3)
    p.add_argument("--tw-seeds", type=int, default=2)
    p.add_argument("--sw-split", default="train")
    p.add_argument(
        "--sw-prefixes",
        type=int,
        default=None,
        help="ScienceWorld: restore at about N evenly spaced prefixes per task instead of --sw-stride",
    )
    p.add_argument("--sw-tasks", nargs="+", default=None, help="ScienceWorld: only these tasks (names or ids)")
    p.add_argument("--json", default=None, help="write every case's result here")
    args = p.parse_args(argv)
    rows: Dict[str, Dict[str, Any]] = {}
    records = []
    t_all = time.perf_counter()
    for group, label, factory, seeds in _cases(args):
        stride = args.sw_stride if (group == "ScienceWorld" and args.sw_stride is not None) else args.stride
        env = factory()
        try:
            for seed in seeds:
                t0 = time.perf_counter()
                try:
                    gold = env.gold_actions(seed)
                    if group == "ScienceWorld" and args.sw_prefixes:
                        stride = max(1, -(-len(gold) // args.sw_prefixes))
                    r = check_solution(env, seed, gold, stride=stride or None)
                except Exception as e:  # noqa: BLE001
                    from environments._gold import SolutionCheck

                    r = SolutionCheck(error=f"{type(e).__name__}: {e}")
                row = rows.setdefault(
                    group,
                    {
                        "stride": stride
                        if not (group == "ScienceWorld" and args.sw_prefixes)
                        else f"~{args.sw_prefixes} per task",
                        "cases": 0,
                        "pass": 0,
                        "restore_pass": 0,
                        "prefixes": 0,
                        "fits": 0,
                        "failures": [],
                    },
                )
                row["cases"] += 1
                row["pass"] += r.passed
                row["restore_pass"] += r.restore_passed
                row["prefixes"] += r.prefixes_checked
                row["fits"] += r.fits_max_turns and r.passed
                if not r.restore_passed:
                    why = r.error or (
                        f"return {r.ret:.3f}, won={r.won}"
                        if not r.passed
                        else f"restore failed at prefixes {r.prefixes_failed[:8]}"
                    )
                    row["failures"].append(f"{label} seed {seed}: {why}")
                records.append(
                    {
                        "env": group,
                        "case": label,
                        "seed": seed,
                        "length": r.length,
                        "steps": r.steps,
                        "return": r.ret,
                        "won": r.won,
                        "passed": r.passed,
                        "restore_passed": r.restore_passed,
                        "prefixes_checked": r.prefixes_checked,
                        "prefixes_failed": r.prefixes_failed,
                        "fits_max_turns": r.fits_max_turns,
                        "error": r.error,
                        "seconds": round(time.perf_counter() - t0, 2),
                    }
                )
                print(
                    f"  {group:18s} {label:45s} seed {seed}: steps {r.steps:3d}/{r.length:3d} return {r.ret:.3f} "
                    f"won {r.won!s:5s} restore {r.prefixes_checked - len(r.prefixes_failed)}/{r.prefixes_checked} "
                    f"({time.perf_counter() - t0:.1f}s){'  ' + r.error if r.error else ''}",
                    flush=True,
                )
        finally:
            env.close()
    print()
    print(
        "| environment | solutions | solved (return 1.0, won) | solved after restore at every prefix "
        "(stride) | prefixes restored | within the env's max_turns |"
    )
    print("|---|---|---|---|---|---|")
    for group, row in rows.items():
        st = row["stride"]
        every = "" if st == 1 else f" (every {st}th)" if isinstance(st, int) else f" ({st})"
        print(
            f"| {group} | {row['cases']} | {row['pass']} | "
            f"{(str(row['restore_pass']) + every) if st else '-'} "
            f"| "
            f"{row['prefixes']} | {row['fits']} |"
        )
    for group, row in rows.items():
        for f in row["failures"]:
            print(f"FAIL {group}: {f}")
    print(f"\n{time.perf_counter() - t_all:.0f} s in all")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {"rows": {g: {k: v for k, v in r.items()} for g, r in rows.items()}, "cases": records}, fh, indent=1
            )
    return 0 if all(r["restore_pass"] == r["cases"] or not r["stride"] for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
