"""Which task for evidence v5? A measured pre-check (issue 46, item 6).

    .venv/bin/python benchmarks/task_precheck.py                                  # the base of every candidate
    .venv/bin/python benchmarks/task_precheck.py --candidates twc1 --grpo         # + one grpo_paper seed at the budget
    .venv/bin/python benchmarks/task_precheck.py --report-only                    # the table from what is there

The goal: a task where the untrained policy (``base``: no training, no reflection, the harness's
held-out evaluation: ``eval_episodes`` = 32 games of the test fold at ``evaluation_temperature`` 0.4)
succeeds 5-30 % of the time (``BASE_BAND``), and GRPO as the paper runs it (``grpo_paper``, one seed)
stays below 60 % held-out (``GRPO_CEILING``) after the budget (64 trajectories, v4's): room to learn,
room for R3L to learn faster. The base is cheap (one engine build and 32 games), so it is measured for
every candidate; ``--grpo`` trains ``grpo_paper`` seed 0 only for the candidates named.

Each candidate is a sweep folder of ``benchmarks/learning_curves.py`` (``<out>/<candidate>/``:
``setting.json``, ``<variant>/seed0/{curve.jsonl,final.json,run.log}``) with v4's common setting
(``learning_curves.DEFAULT_SETTING``) and the candidate's environment: the runs are that script's
children (one at a time, one thread), so they are resumable the same way, and ``final.json`` holds
every held-out game (``eval_games``: seed, success, reward, turns, status). ``summary.md`` and
``summary.json`` in ``<out>`` hold the table: per candidate, base and GRPO successes of 32, the
evaluation's and training's CPU seconds (the child's process time: the in-process engine, not Ray's
workers) and the run's wall seconds (its header's start to ``final.json``'s finish).

ScienceWorld is not among the candidates: its games run 30 turns with long observations, so one
base evaluation is most of an hour on this 2-core CPU, and the small policy scores 0 on its easy
tasks in the gold-path runs' logs (``benchmarks/results/gold_paths.md``); TWX twc and cookingworld at
their smallest settings stand in for the "simpler household game" candidates.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402
from benchmarks import learning_curves as lc  # noqa: E402
from benchmarks.learning_curves_report import BASE, read_curve, run_dir  # noqa: E402

OUT = harness.RESULTS / "evidence_v5" / "precheck"
BASE_BAND = (0.05, 0.30)  # the untrained policy's held-out success: some signal, room to learn
GRPO_CEILING = 0.60  # grpo_paper after the budget stays below: room for R3L to do better
GRPO = "grpo_paper"

_COMPACT = {"compact_observations": True}
# candidate -> (environment, env_config); every other setting is v4's (learning_curves.DEFAULT_SETTING)
CANDIDATES: Dict[str, tuple] = {
    "coin4_t10": ("r3l/CoinCollector", dict(_COMPACT)),  # v4's task (continuity): 4 rooms, 10 turns
    "coin4_t20": ("r3l/CoinCollector", {**_COMPACT, "max_turns": 20}),
    "coin8_t15": ("r3l/CoinCollector", {**_COMPACT, "num_locations": 8, "max_turns": 15}),
    "coin8_t25": ("r3l/CoinCollector", {**_COMPACT, "num_locations": 8, "max_turns": 25}),
    # TWX twc: one room, one item to put where it belongs (take it, put it in the right container)
    "twc1": (
        "r3l/TextWorldExpress",
        {
            "game": "twc",
            "max_turns": 15,
            "game_params": {"numLocations": 1, "numItemsToPutAway": 1, "includeDoors": 0, "limitInventorySize": 0},
        },
    ),
    # TWX cookingworld: one room, one ingredient (read the cookbook, take and prepare it, eat the meal)
    "cook1": (
        "r3l/TextWorldExpress",
        {
            "game": "cookingworld",
            "max_turns": 20,
            "game_params": {
                "numLocations": 1,
                "numIngredients": 1,
                "numDistractorItems": 0,
                "includeDoors": 0,
                "limitInventorySize": 0,
            },
        },
    ),
    # TWX arithmetic: solve the problem, take the item with that quantity, put it in the box (TWX's defaults)
    "arith": ("r3l/TextWorldExpress", {"game": "arithmetic", "max_turns": 10}),
    # TWX simon says: do what Simon says, step after step (TWX's defaults)
    "simon": ("r3l/TextWorldExpress", {"game": "simonsays", "max_turns": 15}),
}


def candidate_setting(name: str, base: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """v4's common setting (or ``base``) with the candidate's environment."""
    env, env_config = CANDIDATES[name]
    return dict(base or lc.DEFAULT_SETTING, env=env, env_config=json.loads(json.dumps(env_config)))


def _seconds_between(start: Optional[str], end: Optional[str]) -> Optional[float]:
    try:
        fmt = "%Y-%m-%d %H:%M:%S"
        return time.mktime(time.strptime(end, fmt)) - time.mktime(time.strptime(start, fmt))
    except (TypeError, ValueError):
        return None


def run_result(folder: Path, variant: str, seed: int = 0) -> Optional[Dict[str, Any]]:
    """A finished run's pre-check numbers (None until its ``final.json`` exists)."""
    d = run_dir(folder, variant, seed)
    if not (d / "final.json").exists():
        return None
    final = json.loads((d / "final.json").read_text())
    header, recs = read_curve(d)
    trained = [r for r in recs if r.get("iteration", 0) > 0]
    games = [g for g in final.get("eval_games") or [] if g is not None]
    return {
        "successes": int(final["eval_successes"]),
        "episodes": int(final["eval_episodes"]),
        "rate": final["eval_successes"] / max(final["eval_episodes"], 1),
        "lost": final.get("eval_lost"),
        "mean_turns": sum(g["turns"] for g in games) / len(games) if games else None,
        "eval_cpu_s": final.get("eval_cpu_s"),
        "eval_wall_s": final.get("eval_seconds"),
        "train_cpu_s": round(sum(r.get("cpu_s") or 0.0 for r in trained), 1),
        "train_wall_s": round(sum(r.get("wall_s") or 0.0 for r in trained), 1),
        "samples": trained[-1]["samples_cumulative"] if trained else 0.0,
        "iterations": len(trained),
        "run_wall_s": _seconds_between((header or {}).get("started"), final.get("finished")),
        "cpu_model": (header or {}).get("cpu_model"),
    }


def verdict(base: Optional[Dict[str, Any]], grpo: Optional[Dict[str, Any]]) -> str:
    """``BASE_BAND`` and ``GRPO_CEILING`` applied to one candidate's runs."""
    if base is None:
        return "base not measured"
    lo, hi = BASE_BAND
    if not lo <= base["rate"] <= hi:
        return f"out: base {base['rate']:.0%} outside {lo:.0%}-{hi:.0%}"
    if grpo is None:
        return "base in band; GRPO not measured"
    if grpo["rate"] >= GRPO_CEILING:
        return f"out: GRPO {grpo['rate']:.0%} >= {GRPO_CEILING:.0%}"
    return "fits"


def summarize(out: Path, names: Sequence[str]) -> List[Dict[str, Any]]:
    rows = []
    for name in names:
        folder = out / name
        base, grpo = run_result(folder, BASE), run_result(folder, GRPO)
        env, env_config = CANDIDATES.get(name, (None, None))
        rows.append(
            {
                "candidate": name,
                "env": env,
                "env_config": env_config,
                "base": base,
                "grpo": grpo,
                "verdict": verdict(base, grpo),
            }
        )
    return rows


def _n(x: Optional[float], digits: int = 0) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def report(out: Path, names: Sequence[str]) -> str:
    rows = summarize(out, names)
    table = []
    for r in rows:
        b, g = r["base"] or {}, r["grpo"] or {}
        table.append(
            [
                r["candidate"],
                f"{r['env']} {json.dumps(r['env_config'])}",
                f"{b['successes']}/{b['episodes']}" if b else "-",
                _n(b.get("mean_turns"), 1),
                _n(b.get("eval_cpu_s")),
                _n(b.get("run_wall_s")),
                f"{g['successes']}/{g['episodes']}" if g else "-",
                _n(g.get("samples")),
                _n(g.get("train_cpu_s")),
                _n(g.get("eval_cpu_s")),
                _n(g.get("run_wall_s")),
                r["verdict"],
            ]
        )
    cpus = sorted({x["cpu_model"] for r in rows for x in (r["base"], r["grpo"]) if x and x.get("cpu_model")})
    text = "\n".join(
        [
            f"Task pre-check (issue 46 item 6): base = untrained, no reflection, held-out test-fold games at "
            f"T=0.4; GRPO = {GRPO} seed 0 after the budget. Band: base {BASE_BAND[0]:.0%}-{BASE_BAND[1]:.0%}, "
            f"GRPO < {GRPO_CEILING:.0%}. CPU: {', '.join(cpus) or 'unknown'} (one thread a run). CPU s: the run "
            f"process's own time; wall s: the run from start to finish (engine build included).",
            "",
            harness.markdown_table(
                [
                    "candidate",
                    "environment",
                    "base successes",
                    "base mean turns",
                    "base eval CPU s",
                    "base run wall s",
                    "GRPO successes",
                    "GRPO trajectories",
                    "GRPO train CPU s",
                    "GRPO eval CPU s",
                    "GRPO run wall s",
                    "verdict",
                ],
                table,
            ),
        ]
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps(rows, indent=1))
    return text


def run_candidates(out: Path, names: Sequence[str], variants: Sequence[str]) -> None:
    """Each candidate's runs (``variants`` and ``base``, seed 0), one at a time, as learning_curves children."""
    for name in names:
        folder = out / name
        setting = candidate_setting(name)
        lc.check_setting(folder, setting, lc.variant_diffs(setting, [BASE, *variants]))
        todo = lc.next_runs(folder, variants, [0])

        def finished(v: str, s: int, took: Optional[float], name=name) -> None:
            print(
                f"{time.strftime('%H:%M:%S')} {name} {v}/seed{s} done" + (f" in {took:.1f} min" if took else ""),
                flush=True,
            )
            print(report(out, names), flush=True)

        lc.run_children(folder, todo, 1, setting["num_threads"], finished)


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", default=",".join(CANDIDATES), help=f"comma list of {list(CANDIDATES)}")
    ap.add_argument("--grpo", action="store_true", help=f"also train {GRPO} seed 0 at the budget")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    names = [n for n in args.candidates.split(",") if n]
    bad = [n for n in names if n not in CANDIDATES]
    if bad:
        raise SystemExit(f"--candidates: unknown {bad}; choose from {list(CANDIDATES)}")
    if not args.report_only:
        run_candidates(out, names, [GRPO] if args.grpo else [])
    print(report(out, [n for n in CANDIDATES if (out / n).exists()] if args.report_only else names))


if __name__ == "__main__":
    main()
