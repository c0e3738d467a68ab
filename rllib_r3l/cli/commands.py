"""``rllib-r3l``: train, evaluate, export and report R3L experiments from the command line.

    rllib-r3l train tuned_examples/cpu/toy_corridor_tiny.yaml --stop training_iteration=1
    rllib-r3l evaluate ~/ray_results/toy-corridor-r3l/R3L_.../checkpoint_000000 --episodes 20
    rllib-r3l export CHECKPOINT --out exported/
    rllib-r3l report ~/ray_results/toy-corridor-r3l
    rllib-r3l options                  # every R3L option with its default and help

``train`` reads Tune-style YAML files (``{name: {run: R3L, stop: {...}, config: {...}}}``, the same
files ``tune.run_experiments(yaml.safe_load(f))`` runs after ``import rllib_r3l``), applies
``--set``/``--stop`` overrides, and checks every config by building an ``R3LConfig`` *before*
Ray starts. A mistake in a file or a flag is reported with the key and the fix, exit code 2,
without a traceback. See docs/cli.md.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import os
import sys
from typing import Optional, Sequence

from rllib_r3l import ray_internals
from rllib_r3l.cli.checkpoint_commands import EXIT_FAILED, EXIT_OK, cmd_evaluate, cmd_export, cmd_options, cmd_report
from rllib_r3l.cli.experiments import (  # noqa: F401 - the CLI's file handling, also used as cli.<name>
    expand_variants,
    known_config_keys,
    load_yaml_file,
    parse_value,
    prepare_experiments,
    validate_config,
    validate_env_only,
)
from rllib_r3l.errors import UsageError

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
# a write that storage refused (full, quota, read-only, no permission): one line, never a traceback
_STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
TRAIN_LOG = "rllib-r3l-train.log"  # in the (first) experiment's directory: Tune's and the libraries' output


# ==================================================================================================
# train
# ==================================================================================================
def _require(module: str, flag: str, pip_name: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise UsageError(
            f"{flag} needs the '{pip_name}' package, which is not installed: `pip install {pip_name}` (or drop {flag})"
        )


def make_callbacks(args) -> list:
    """Extra Tune logger callbacks (CSV, JSON and TensorBoard loggers are Tune's defaults)."""
    callbacks = []
    if args.mlflow_tracking_uri and not args.mlflow:  # else it is ignored without a word
        raise UsageError("--mlflow-tracking-uri is read only with --mlflow EXPERIMENT: add --mlflow, or drop the URI")
    if args.wandb:
        _require("wandb", "--wandb", "wandb")
        from ray.air.integrations.wandb import WandbLoggerCallback

        callbacks.append(WandbLoggerCallback(project=args.wandb, log_config=True))
    if args.mlflow:
        _require("mlflow", "--mlflow", "mlflow")
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        callbacks.append(
            MLflowLoggerCallback(
                experiment_name=args.mlflow, tracking_uri=args.mlflow_tracking_uri, save_artifact=False
            )
        )
    return callbacks


def cmd_train(args) -> int:
    from rllib_r3l.cli import driver_mark, launch, resume, signals
    from rllib_r3l.cli.experiments import check_resources
    from rllib_r3l.cli.extend import parse_stops

    signals.interrupt_on_sigterm()
    ray_internals.check_version()  # its resume and signal handling read Ray's private state: another Ray, said now
    resume.check_resume_flags(args.resume, args.set or [])
    experiments = prepare_experiments(args.file, args.set or [], args.stop or [], args.experiment or [])
    if args.num_cpus is not None and args.num_cpus < 1:
        raise UsageError(f"--num-cpus {args.num_cpus}: must be >= 1")
    if args.max_concurrent is not None and args.max_concurrent < 0:  # Tune takes -1 as no limit
        raise UsageError(f"--max-concurrent {args.max_concurrent}: must be >= 0 (0 or leaving it out: no limit)")
    callbacks = make_callbacks(args)  # a missing logger package is a usage error, before anything runs
    for name, spec in experiments.items():
        launch.checkpoint_config(spec, args.checkpoint_freq, where=f"{args.file}: {name}.checkpoint_config")
    check_resources(experiments, args.file, args.set or [], resume=args.resume)  # the env builds, the model is there
    launch.check_cluster_fits(experiments, args.file, args.num_cpus, args.address)  # CPUs and GPUs exist
    storage = os.path.abspath(os.path.expanduser(args.storage_path)) if args.storage_path else None
    storages = {name: storage or spec.get("storage_path") for name, spec in experiments.items()}
    with driver_mark.claims() as claim:  # held until the run ends: a second driver is refused, not merged
        if not args.dry_run and not args.new:  # before planning: what the plan sees is then ours alone
            for name in experiments:
                claim(resume.experiment_dir(storages.get(name), name), name)
        plan = resume.plan_runs(
            list(experiments),
            storages,
            resume=args.resume,
            new=args.new,
            stop=parse_stops(args.stop or []) if args.resume else None,
        )
        if not args.dry_run:
            for name, p in plan.items():
                claim(p["dir"], name)
        return _train_planned(args, experiments, plan, storage, callbacks)


def _train_planned(args, experiments, plan, storage, callbacks) -> int:
    """``train`` once each experiment's folder is planned (and claimed): the checks that need the plan, then Tune."""
    from rllib_r3l.cli import resume, resume_from, saved_spec
    from rllib_r3l.cli.extend import fresh_run
    from rllib_r3l.cli.storage import check_experiment_storages

    check_experiment_storages(experiments, plan, "--storage-path" if storage else "storage_path")
    resume.check_checkpoint_freq(plan, args.checkpoint_freq)
    as_written = load_yaml_file(args.file)  # before --set/--stop: what a resume of an edited file is held to
    for name, p in plan.items():
        changed = saved_spec.changes(p["dir"], as_written[name]) if p["mode"] == resume.RESUME else []
        if changed:  # Tune would continue the saved config and stop without a word
            raise UsageError(
                f"--resume: experiment {name!r} in {args.file} changed since the run started "
                f"({'; '.join(changed)}); a resumed experiment keeps the config, stop criteria and "
                "checkpoint_config it started with: put the file's values back to continue it, or "
                f"start again with {fresh_run(name)}"
            )
    for line in resume_from.resume_notes(plan):  # which checkpoint each resumed trial continues from
        print(f"# {line}" if args.dry_run else line)
    if args.dry_run:
        import yaml

        print(yaml.safe_dump(experiments, sort_keys=False, default_flow_style=False).rstrip())
        for name, p in plan.items():
            print(f"# {name}: would {p['mode']} {p['dir']}")
        print(f"# {len(experiments)} experiment(s) valid; not started (--dry-run)")
        return EXIT_OK

    from rllib_r3l.cli import console, live_progress

    # quiet by default: R3L's console here, Tune's own output and the library logs in the log file;
    # --verbose N: those on the console too (Tune at verbosity N)
    quiet = args.verbose is None
    for name, p in plan.items():
        if p["mode"] != resume.RESUME:
            saved_spec.save(p["dir"], as_written[name])
    first = next(iter(experiments))
    log_path = os.path.join(plan[first]["dir"], TRAIN_LOG)
    try:
        with (
            console.routed_output(log_path, verbose=not quiet) as con,
            live_progress.progress_folder(enabled=not args.address) as live_dir,
        ):
            rows, interrupted = _run_tune(
                args, experiments, plan, storage, callbacks, con, live_dir, log_path if quiet else None
            )
    except KeyboardInterrupt:  # a second signal: Tune skipped its last state save
        print(f"interrupted; {resume.interrupted_advice(args.argv, plan)}", file=sys.stderr)
        return _exit_now_if_ray_lost(args, EXIT_INTERRUPTED)
    return _exit_now_if_ray_lost(args, _report_train(args, plan, rows, interrupted, log_path if quiet else None))


def _exit_now_if_ray_lost(args, code: int) -> int:
    """After a signal to the whole process group, Ray's runtime is gone: Python's exit would run Ray's
    shutdown, which waits a minute for the dead GCS and then exits 1; this exits with ``code`` now."""
    if getattr(args, "ray_runtime_lost", False):
        print("(the signal reached Ray's own processes too; exiting without Ray's shutdown)", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _report_train(args, plan, rows, interrupted: bool, log_path) -> int:
    from rllib_r3l.cli import outcome, resume

    outcome.print_train_summary(rows)
    if log_path:
        print(f"log: {log_path}")
    if interrupted:
        print(f"\ninterrupted before the stop criterion; {resume.interrupted_advice(args.argv, plan)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    failed = [r for r in rows if r["status"] != "TERMINATED" or r["problem"]]
    for r in failed:
        reason = f": {r['reason']}" if r.get("reason") else ""
        print(f"rllib-r3l train: {r['trial']}: {r['problem'] or r['status'] + reason}", file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


def _run_tune(args, experiments, plan, storage, callbacks, con, live_dir, log_path):
    import ray

    from rllib_r3l.cli import launch, resume, signals

    started = False
    if not ray.is_initialized():
        os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
        signals.init_ray(
            signals.interrupt_on_sigterm,
            address=args.address or "local",
            num_cpus=None if args.address else launch.local_cpus(args.num_cpus),
            include_dashboard=False,
            log_to_driver=not args.quiet_workers,
        )
        started = True
    import rllib_r3l

    rllib_r3l.register()
    display = launch.ConsoleCallback(con, live_dir, log=log_path, verbose=log_path is None)

    # after ray.init, which installs Ray's own SIGTERM handler; over the shutdown too, so that a second
    # signal that arrives once the run has stopped still ends it like a second Ctrl-C
    def runtime_lost():  # a signal to the whole process group stopped Ray's GCS too
        con.line()  # the console: stdout and stderr go to the log file while Tune runs
        con.line(resume.runtime_lost_line(resume.interrupted_advice(args.argv, plan)))

    with signals.sigterm_as_sigint(runtime_lost if started else None) as finished:
        if signals.stop_requested_before_tune():  # a SIGTERM while Ray started, its KeyboardInterrupt swallowed
            raise KeyboardInterrupt
        try:
            return launch.run(
                experiments,
                plan,
                storage=storage,
                checkpoint_freq=args.checkpoint_freq,
                callbacks=[*callbacks, display],
                verbose=1 if args.verbose is None else args.verbose,
                max_concurrent=args.max_concurrent,
                echo=con.line,
            )
        finally:
            finished.set()
            if started and signals.local_gcs_alive() is False:  # stopped by a group signal after the run
                args.ray_runtime_lost = True  # its shutdown would wait a minute, then exit 1: skipped
            elif started:
                ray.shutdown()


# ==================================================================================================
# Parser and entry point
# ==================================================================================================
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rllib-r3l",
        description="R3L (Reflect-then-Retry RL) on Ray RLlib: "
        "train from YAML, evaluate, export to Hugging Face, report.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    t = sub.add_parser(
        "train",
        help="run the experiments of a YAML file with Ray Tune",
        description="Run {name: {run: R3L, stop, config}} experiments with Ray Tune "
        "(checkpoint at the end; TensorBoard/CSV/JSON logs in the trial directories).",
    )
    t.add_argument("file", help="YAML experiments file (e.g. tuned_examples/cpu/coin_collector.yaml)")
    t.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config key (YAML value; dotted keys reach into mappings: env_config.num_rooms=3)",
    )
    t.add_argument(
        "--stop",
        action="append",
        metavar="KEY=VALUE",
        help="override a stop criterion (e.g. training_iteration=10, env_runners/success_rate=0.9); "
        "with --resume, a new stop: every trial, finished ones too, trains on to it",
    )
    t.add_argument("--experiment", action="append", metavar="NAME", help="run only this experiment of the file")
    t.add_argument("--storage-path", metavar="DIR", help="where Tune writes results (default ~/ray_results)")
    t.add_argument("--num-cpus", type=int, metavar="N", help="CPUs of the local Ray runtime (default: max(cores, 4))")
    t.add_argument("--address", help="connect to a running Ray cluster instead of starting one")
    t.add_argument("--checkpoint-freq", type=int, metavar="N", help="also checkpoint every N iterations")
    t.add_argument(
        "--max-concurrent",
        type=int,
        metavar="N",
        help="max trials at once (grid searches); 0 = no limit, as when left out",
    )
    t.add_argument("--wandb", metavar="PROJECT", help="also log to Weights & Biases (needs wandb)")
    t.add_argument("--mlflow", metavar="EXPERIMENT", help="also log to MLflow (needs mlflow)")
    t.add_argument("--mlflow-tracking-uri", metavar="URI", help="MLflow tracking URI (default: ./mlruns)")
    t.add_argument(
        "--verbose",
        type=int,
        nargs="?",
        const=1,
        default=None,
        choices=(0, 1, 2, 3),
        metavar="N",
        help="show Tune's output (at verbosity N, default 1) and the engine/library logs on the console; "
        "without it they go to EXPERIMENT_DIR/" + TRAIN_LOG,
    )
    t.add_argument("--quiet-workers", action="store_true", help="do not forward worker logs to the console")
    t.add_argument(
        "--resume",
        action="store_true",
        help="continue the saved experiment(s) from the last checkpoint (interrupted or errored trials; "
        "with --stop, finished ones too, e.g. --resume --stop training_iteration=20)",
    )
    t.add_argument(
        "--new",
        action="store_true",
        help="the experiment exists already: start a fresh one beside it (NAME_<date>-<time>), from the "
        "base model at iteration 1; the old one stays as it is",
    )
    t.add_argument(
        "--dry-run",
        action="store_true",
        help="validate (the environment is built once, the model looked up) and print the final configs",
    )
    t.set_defaults(func=cmd_train)

    e = sub.add_parser(
        "evaluate",
        help="evaluate a checkpoint (or exported model) on base episodes",
        description="Run base episodes (no reflection) at the evaluation temperature and print "
        "episodes, success rate, mean return and mean turns.",
    )
    e.add_argument(
        "checkpoint",
        help="algorithm checkpoint, Tune trial directory (latest checkpoint), "
        "or an exported Hugging Face model directory",
    )
    e.add_argument("--env", help="environment id (default: the checkpoint's training env)")
    e.add_argument("--episodes", type=int, default=20, help="number of episodes (tasks seed..seed+N-1; default 20)")
    e.add_argument(
        "--env-config",
        metavar="JSON",
        help="environment options as JSON, over the checkpoint's env_config "
        "when --env is the training env (keys it names change)",
    )
    e.add_argument("--split", default=None, help="task split: train, dev or test (default: test)")
    e.add_argument("--temperature", type=float, help="sampling temperature (default: evaluation_temperature, 0.4)")
    e.add_argument("--greedy", action="store_true", help="greedy decoding (temperature 0)")
    e.add_argument(
        "--backend", choices=("auto", "vllm", "transformers"), help="generation backend (default: the training backend)"
    )
    e.add_argument("--backend-options", metavar="JSON", help="backend options as JSON")
    e.add_argument("--max-turns", type=int, help="max turns per episode (default: training setting)")
    e.add_argument("--max-response-tokens", type=int, help="max tokens per response (default: training setting)")
    e.add_argument("--seed", type=int, default=0, help="first task seed (default 0)")
    e.add_argument("--batch-size", type=int, default=32, help="episodes run together (default 32)")
    e.add_argument(
        "--base-model", metavar="ID_OR_DIR", help="the base model if the checkpoint's model path no longer exists"
    )
    e.add_argument("--out", metavar="FILE.csv", help="also write the per-episode results as CSV")
    e.set_defaults(func=cmd_evaluate)

    x = sub.add_parser(
        "export",
        help="write a Hugging Face model directory from a checkpoint",
        description="Write config, safetensors weights, tokenizer and chat template of the trained "
        "policy; AutoModelForCausalLM.from_pretrained and vLLM load it directly.",
    )
    x.add_argument("checkpoint", help="algorithm checkpoint or Tune trial directory (latest checkpoint)")
    x.add_argument("--out", required=True, metavar="DIR", help="output directory")
    x.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="cast the weights (default: as trained)")
    x.add_argument(
        "--base-model", metavar="ID_OR_DIR", help="the base model if the checkpoint's model path no longer exists"
    )
    x.add_argument("--force", action="store_true", help="write into a non-empty --out directory")
    x.set_defaults(func=cmd_export)

    r = sub.add_parser(
        "report",
        help="final metrics table (CSV) and learning curves (PNG) of an experiment",
        description="Summarise the trials under EXPERIMENT_DIR (Tune's result.json / progress.csv).",
    )
    r.add_argument("experiment_dir", help="a Tune experiment directory (or a trial directory, or a parent of several)")
    r.add_argument(
        "--out", metavar="DIR", help="where to write summary.csv and the PNGs (default EXPERIMENT_DIR/report)"
    )
    r.set_defaults(func=cmd_report)

    o = sub.add_parser("options", help="list the R3L options with defaults and help")
    o.set_defaults(func=cmd_options)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a bad flag (2, message already printed)
        return int(e.code or 0) if not isinstance(e.code, str) else EXIT_USAGE
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        print(f"rllib-r3l {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        if e.errno not in _STORAGE_ERRNOS:
            raise
        print(
            f"rllib-r3l {args.command}: error: cannot write {e.filename or 'a file'}: {e.strerror}; "
            "free space or choose a writable folder",
            file=sys.stderr,
        )
        return EXIT_FAILED


if __name__ == "__main__":
    from rllib_r3l.cli.signals import exit_process

    exit_process(main())
