"""Grid search over R3L's amplification factor alpha and group size N with ``tune.Tuner`` (paper C.1).

The Python counterpart of alpha_group_size.yaml. ``--preset cpu`` (default) runs the grid on this
machine with the tiny test model in a 3-room corridor, one iteration per trial (a few minutes for
the 9 trials on 2 cores): it shows the mechanics, not the paper's numbers. ``--preset paper`` takes
the K.1 configuration of tuned_examples/paper/alfworld/qwen2.5-1.5b-instruct.yaml (GPUs needed).
At the end the trials are summarised with ``rllib-r3l report`` (a table and learning curves).

    python tuned_examples/search/alpha_search.py
    python tuned_examples/search/alpha_search.py --alphas 1 3 --group-sizes 4 --iterations 2
    python tuned_examples/search/alpha_search.py --preset paper --iterations 200 --max-concurrent 1
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PAPER_FILE = os.path.join(HERE, "..", "paper", "alfworld", "qwen2.5-1.5b-instruct.yaml")

CPU_CONFIG = {
    "model": "tiny",
    "env": "r3l/ToyCorridor",
    "env_config": {"num_rooms": 3, "max_turns": 6},
    "tasks_per_iteration": 1,
    "max_response_tokens": 8,
    "max_context_tokens": 2048,
    "max_reflection_tokens": 16,
    "backend": "transformers",
    "num_env_runners": 0,
    "num_learners": 0,
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=("cpu", "paper"), default="cpu")
    p.add_argument("--alphas", type=float, nargs="+", default=[1.0, 3.0, 5.0], help="C.1: 1 3 5")
    p.add_argument("--group-sizes", type=int, nargs="+", default=[4, 8, 16], help="C.1: 4 8 16")
    p.add_argument("--iterations", type=int, default=None, help="iterations per trial (cpu 1, paper 200)")
    p.add_argument("--storage-path", default=os.path.expanduser("~/ray_results"))
    p.add_argument("--name", default=None, help="experiment name (default search-alpha-group-size-<preset>)")
    p.add_argument("--max-concurrent", type=int, default=1, help="trials at once (default 1)")
    p.add_argument("--num-cpus", type=int, default=max(os.cpu_count() or 1, 4))
    args = p.parse_args(argv)

    from rllib_r3l.cli import commands as cli
    from rllib_r3l.cli import experiment_report as report

    if args.preset == "cpu":
        base = dict(CPU_CONFIG)
        iterations = args.iterations or 1
    else:
        (spec,) = cli.load_yaml_file(PAPER_FILE).values()
        base = dict(spec["config"])
        iterations = args.iterations or 200
    param_space = dict(base)
    param_space["amplification_alpha"] = {"grid_search": list(args.alphas)}
    param_space["group_size"] = {"grid_search": list(args.group_sizes)}
    name = args.name or f"search-alpha-group-size-{args.preset}"
    try:  # every combination is checked before Ray starts
        cli.validate_config(param_space, where=name)
    except cli.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    import ray
    from ray import tune

    import rllib_r3l  # registers "R3L" with Tune

    rllib_r3l.register()
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, ignore_reinit_error=True)
    # Tune's {"grid_search": [...]} dicts in the param space: the same spelling as in YAML.
    tuner = tune.Tuner(
        "R3L",
        param_space=param_space,
        tune_config=tune.TuneConfig(max_concurrent_trials=args.max_concurrent),
        run_config=tune.RunConfig(
            name=name,
            storage_path=os.path.abspath(args.storage_path),
            stop={"training_iteration": iterations},
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True, num_to_keep=1),
        ),
    )
    results = tuner.fit()
    ray.shutdown()
    errors = [r for r in results if r.error is not None]
    exp_dir = os.path.join(os.path.abspath(args.storage_path), name)
    table, pngs, out_dir = report.make_report(exp_dir)
    cols = [
        c
        for c in (
            "amplification_alpha",
            "group_size",
            "iterations",
            "reward",
            "success_rate",
            "retry_trigger_rate",
            "retry_success_rate",
            "trained_tokens_per_sample",
            "time_total_s",
        )
        if c in table
    ]
    print(table[cols].sort_values(cols[:2]).to_string(index=False))
    print(f"\nreport: {out_dir} ({len(pngs)} plots); again with `rllib-r3l report {exp_dir}`")
    if errors:
        print(f"{len(errors)} trial(s) failed: {[str(r.error)[:200] for r in errors]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
