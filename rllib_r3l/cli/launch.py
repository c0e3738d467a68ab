"""Running prepared experiments with Ray Tune (what ``rllib-r3l train`` does after validation).

Experiments run one after another (with several in one Tune run, Ray 2.60 syncs only the first
one's results to its storage path). Each is started or resumed as ``rllib_r3l.cli.resume.plan_runs``
decided; an interrupted experiment ends the sequence. The progress table is Tune's CLIReporter
with R3L's columns (iteration, time, reward, success rate, episodes lost) instead of the first
four keys Tune's default output happens to find; :class:`ConsoleCallback` draws R3L's own console
(``rllib_r3l.cli.console``: header, live progress, a line per iteration, summary table and run.png per
trial), the same as the main job's.
"""

from __future__ import annotations

import copy
import os
import signal
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ray.tune import Callback

from rllib_r3l import ray_internals
from rllib_r3l.cli import console, driver_mark, live_progress, outcome, result_rows, run_info, signals, state_backup
from rllib_r3l.cli.extend import new_stop_callback
from rllib_r3l.cli.resume import RESUME, tune_resume_config
from rllib_r3l.cli.resume_from import point_tune_at
from rllib_r3l.cli.time_budget import TimeBudget
from rllib_r3l.errors import UsageError

PROGRESS_COLUMNS = {
    "training_iteration": "iter",
    "time_total_s": "total time (s)",
    "env_runners/episode_return_mean": "reward",
    "env_runners/success_rate": "success",
    "r3l/trained_tokens": "trained tokens",
    "env_runners/r3l/faults/episodes_lost": "episodes lost",
}


def checkpoint_config(spec: Dict[str, Any], freq: Optional[int], where: str = "checkpoint_config"):
    from ray.tune import CheckpointConfig

    from rllib_r3l.stopping import check_checkpoint_score

    raw = dict(spec.get("checkpoint_config") or {})
    raw.setdefault("checkpoint_at_end", True)
    if freq is not None:
        raw["checkpoint_frequency"] = freq
    # checkpoint_at_end: 'false' (a string, true to Python) would write the final checkpoint anyway
    for key, ok, want in (
        ("checkpoint_at_end", lambda v: isinstance(v, bool), "true or false"),
        ("num_to_keep", lambda v: v is None or (type(v) is int and v >= 1), "an integer >= 1 or null"),
    ):
        if key in raw and not ok(raw[key]):
            raise UsageError(f"{where}.{key}: must be {want}, got {raw[key]!r}")
    try:
        config = CheckpointConfig(**raw)
    except (TypeError, ValueError) as e:
        raise UsageError(
            f"{where} / --checkpoint-freq: {e}; keys: checkpoint_frequency (>= 0), "
            "checkpoint_at_end, num_to_keep, checkpoint_score_attribute, checkpoint_score_order"
        ) from None
    check_checkpoint_score(config.checkpoint_score_attribute, f"{where}.checkpoint_score_attribute")
    return config


def local_cpus(num_cpus: Optional[int]) -> int:
    """The CPUs of the local Ray runtime ``rllib-r3l train`` starts: --num-cpus, else max(cores, 4)
    (the driver, the learner and the env runner each want one)."""
    return num_cpus or max(os.cpu_count() or 1, 4)


def check_cluster_fits(
    experiments: Dict[str, Dict[str, Any]], path: str, num_cpus: Optional[int], address: Optional[str]
) -> None:
    """Every variant's CPUs and GPUs fit the Ray runtime the run will use; a :class:`UsageError`
    naming the option otherwise (Tune would wait for them forever on a blank console)."""
    from rllib_r3l import preflight
    from rllib_r3l.cli.experiments import expand_variants
    from rllib_r3l.config import R3LConfig

    if address:  # a cluster of its own, possibly with an autoscaler: its business, once it answers
        check_address(address)
        return
    cpus, gpus = preflight.ray_capacity()  # Ray already running in this process: its cluster
    source = "the running Ray cluster"
    if cpus is None:
        cpus = local_cpus(num_cpus)
        source = f"--num-cpus {num_cpus}" if num_cpus else f"the local Ray runtime (max(cores, 4) = {cpus} CPUs)"
    for name, spec in experiments.items():
        for variant in expand_variants(spec["config"], f"{path}: {name}"):
            try:
                preflight.check_resources(
                    R3LConfig().update_from_dict(copy.deepcopy(variant)), cpus=cpus, gpus=gpus, source=source
                )
            except ValueError as e:
                raise UsageError(f"{path}: {name}: {e}") from None


def check_address(address: str, timeout_s: float = 5.0) -> None:
    """A :class:`UsageError` when nothing listens at a ``HOST:PORT`` ``--address`` (``ray.init`` would
    retry for minutes on a blank console), or at a ``ray://HOST:PORT`` one; ``auto`` and ``local`` are
    left to Ray."""
    host, sep, port = address.rpartition(":")
    scheme = address.split("://", 1)[0] if "://" in address else None
    if scheme is not None and scheme != "ray":  # http://...: Ray's ValueError traceback after 20 s
        raise UsageError(
            f"--address {address}: not a Ray address; give HOST:PORT of the cluster's GCS (what `ray "
            "status` shows), ray://HOST:PORT for Ray Client, or auto"
        )
    if sep and not port.isdigit() and scheme is None:
        raise UsageError(f"--address {address}: the port {port!r} is not a number; give HOST:PORT, e.g. 127.0.0.1:6379")
    if scheme == "ray":  # Ray Client: a closed port would be a 36 s wait, then a traceback
        host, sep, port = address.split("://", 1)[1].rpartition(":")
        if not sep or not port.isdigit():
            raise UsageError(
                f"--address {address}: give ray://HOST:PORT of the cluster's Ray Client server (port 10001 by default)"
            )
        _listens(
            address,
            host,
            port,
            timeout_s,
            "no Ray Client server answers there",
            "start the cluster with `ray start --head` (its client server listens on 10001), give the address it shows",
        )
        return
    if address in ("auto", "local") or scheme is not None or not sep:
        return
    _listens(
        address,
        host,
        port,
        timeout_s,
        "no Ray cluster answers there",
        "start one there (`ray start --head --port PORT`), give the address `ray status` shows",
    )
    what = _not_a_gcs(f"{host or '127.0.0.1'}:{port}", timeout_s)
    if what:  # something listens, but ray.init would print pages of gRPC errors after 20-40 s
        raise UsageError(
            f"--address {address}: a server listens there, but not a Ray cluster's GCS ({what}); give "
            "the address `ray status` or `ray start --head` shows (port 6379 by default), or drop "
            "--address to run on this machine"
        )


def _listens(address: str, host: str, port: str, timeout_s: float, nobody: str, fix: str) -> None:
    """A :class:`UsageError` naming ``--address`` unless something accepts a TCP connection at ``host:port``."""
    import socket

    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise UsageError(
            f"--address {address}: {nobody} ({e.strerror or e}); {fix}, or drop --address to run on this machine"
        ) from None


def _not_a_gcs(address: str, timeout_s: float) -> Optional[str]:
    """Why the server at ``address`` is not a Ray GCS (it does not speak gRPC, or has no GCS service), or
    None when it answers as one, or when that cannot be told (no grpc, a slow or authenticating GCS):
    then ray.init decides. One ``GetClusterId`` call, the GCS's cheapest."""
    try:
        import grpc
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:
        return None
    channel = grpc.insecure_channel(address)
    try:
        gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
            gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s
        )
        return None
    except grpc.RpcError as e:
        code = e.code()
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return "a gRPC server without Ray's GCS service"
        if code == grpc.StatusCode.UNAVAILABLE:
            return "it does not speak gRPC"
        return None
    finally:
        channel.close()


def _varied_params(config: Dict[str, Any]) -> List[str]:
    """The keys (``/``-joined) that a ``grid_search`` varies: the only dicts left as values."""
    return [
        k for k, v in result_rows.flat(config, leaf=lambda v: set(v) == {"grid_search"}).items() if isinstance(v, dict)
    ]


def progress_reporter(spec: Dict[str, Any]):
    from ray.tune import CLIReporter

    return CLIReporter(
        metric_columns=dict(PROGRESS_COLUMNS), parameter_columns=_varied_params(spec["config"]), max_report_frequency=30
    )


class ConsoleCallback(Callback):
    """R3L's console for Tune trials: per trial a header when it starts, a line per result, and a
    summary table plus ``run.png`` (in the trial directory) when it ends; the live progress line
    while it runs (with several trials at once, it counts them all)."""

    def __init__(
        self, con: console.Console, live_dir: Optional[str] = None, log: Optional[str] = None, verbose: bool = False
    ) -> None:
        self.con, self.live_dir, self.log, self.verbose = con, live_dir, log, verbose
        self.rows: Dict[str, List[Dict[str, Any]]] = {}
        self.live: Optional[live_progress.LiveProgress] = None
        self._stop_passed_on = False  # a SIGTERM from before Tune ran, handed to Tune's SIGINT handler

    def _info(self, trial) -> Dict[str, Any]:
        title = f"R3L trial {trial}: stop {trial.stopping_criterion or '(none)'}, results in {trial.path}"
        try:
            from rllib_r3l.config import R3LConfig

            cfg = R3LConfig().update_from_dict(copy.deepcopy(dict(trial.config)))
            return run_info.run_info(cfg, title=title, log=self.log, verbose=self.verbose)
        except Exception:  # a config the console cannot read: the header says less, training goes on
            c = trial.config or {}
            return {
                "title": title,
                "model": c.get("model", "?"),
                "env": str(c.get("env", "?")),
                "backend": c.get("backend", "?"),
                "cpu": run_info.cpu_model(),
                "cores": os.cpu_count(),
                "log": self.log,
                "verbose": self.verbose,
            }

    def on_step_begin(self, iteration, trials, **info) -> None:
        if signals.stop_requested_before_tune() and not self._stop_passed_on:  # its KeyboardInterrupt was lost
            self._stop_passed_on = True
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # Tune's handler: stop at a safe point

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        head = self._info(trial)
        self.con.lines(console.header_lines(head))
        self.rows.setdefault(trial.trial_id, [])
        if self.live is None:
            self.live = live_progress.LiveProgress(
                self.con,
                self.live_dir,
                expected=run_info.expected_episodes(head),
                reflect=bool(head.get("reflect", True)),
            )
        self.live.begin()

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        rows = self.rows.setdefault(trial.trial_id, [])
        rows.append(console.iteration_row(int(result.get("training_iteration", len(rows) + 1)), result))
        prefix = f"{trial}: " if len(trials) > 1 else ""
        self.con.line(prefix + console.iteration_line(rows[-1], trial.stopping_criterion.get("training_iteration")))
        if self.live is not None:
            self.live.begin()

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._finish(trial, trials)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._finish(trial, trials)

    def _finish(self, trial, trials) -> None:
        if self.live is not None and not any(t.status == "RUNNING" and t is not trial for t in trials):
            self.live.pause()
        rows = self.rows.get(trial.trial_id)
        if not rows:
            return
        self.con.line()
        self.con.line(f"{trial}: {len(rows)} iteration(s) in this run")
        self.con.lines(console.summary_table(rows))
        folder = trial.path if trial.path and os.path.isdir(trial.path) else trial.local_path
        if folder and os.path.isdir(folder):
            path = os.path.join(folder, console.PLOT_FILE)
            try:
                png = console.plot_run(rows, path, title=f"R3L {trial}")
            except OSError as e:  # a full disk must not turn the trial's own outcome into Tune's traceback
                self.con.line(f"plot not written ({e.strerror or e}): {path}")
                return
            if png:
                self.con.line(f"plot: {png}")

    def on_experiment_end(self, trials, **info) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def run(
    experiments: Dict[str, Dict[str, Any]],
    plan: Dict[str, Dict[str, Any]],
    *,
    storage: Optional[str],
    checkpoint_freq: Optional[int],
    callbacks: Sequence[Any],
    verbose: int,
    max_concurrent: Optional[int],
    echo: Callable[[str], None] = print,
) -> Tuple[List[Dict[str, Any]], bool]:
    """Run (or resume) each experiment with Tune; returns the per-trial rows and whether it was interrupted."""
    from ray import tune

    # the legacy output engine: it takes a progress reporter with chosen columns (the default engine
    # shows num_env_steps_sampled_lifetime & co, prints 1e-6 as "0." and points TensorBoard at Ray's
    # staging directory)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    rows: List[Dict[str, Any]] = []
    for name, spec in experiments.items():
        p = plan[name]
        kwargs = {
            k: v
            for k, v in spec.items()
            if k not in ("run", "config", "stop", "checkpoint_config", "storage_path", "sync_config")
        }
        if spec.get("sync_config"):
            from ray.tune import SyncConfig

            kwargs["sync_config"] = SyncConfig(**spec["sync_config"])
        exp_storage = storage or (
            os.path.abspath(os.path.expanduser(spec["storage_path"])) if spec.get("storage_path") else None
        )
        budget = TimeBudget(kwargs.pop("time_budget_s")) if kwargs.get("time_budget_s") else None
        exp = tune.Experiment(
            p["name"],
            spec["run"],
            config=spec["config"],
            stop=spec.get("stop"),
            storage_path=exp_storage,
            checkpoint_config=checkpoint_config(spec, checkpoint_freq),
            **kwargs,
        )
        if budget is not None:  # where Tune's time_budget_s puts its TimeoutStopper (no public setter)
            ray_internals.set_experiment_stopper(exp, budget)
        tracker = outcome.TrainingTracker()
        resume = {"resume_config": tune_resume_config(finished=bool(p.get("stop")))} if p["mode"] == RESUME else {}
        if resume:  # every trial continues from its newest complete checkpoint, the rows after it set aside
            point_tune_at(p["dir"], p.get("choices", []))
        # --resume --stop: the new stop into the restored trials' criteria, before the console shows them
        new_stop = [new_stop_callback(p["stop"])] if resume and p.get("stop") else []
        with driver_mark.marked(p["dir"]):  # `report` tells a running experiment from one whose driver died
            analysis = tune.run(
                exp,
                callbacks=[
                    *new_stop,
                    *callbacks,
                    tracker,
                    state_backup.StateBackup(p["dir"]),
                    *([budget] if budget is not None else []),
                ],
                raise_on_failed_trial=False,
                verbose=verbose,
                max_concurrent_trials=max_concurrent,
                progress_reporter=progress_reporter(spec),
                **resume,
            )
        for trial in analysis.trials:  # Tune's CSV logger shifts a resumed run's columns: written again
            if trial.path and os.path.isdir(trial.path):
                try:
                    result_rows.rebuild_progress_csv(trial.path)
                except OSError as e:  # a full disk: result.json keeps the rows, --resume rewrites the CSV
                    echo(
                        f"{trial.path}/progress.csv: not rewritten ({e.strerror or e}); result.json holds the "
                        "rows, and --resume rewrites it"
                    )
        unstarted = sum(1 for t in analysis.trials if not t.last_result) if budget is not None else 0
        if budget is not None and budget.reached() and (budget.stopped or unstarted):
            saved = (
                ", each with a checkpoint"
                if exp.checkpoint_config.checkpoint_at_end
                else (" (checkpoint_at_end is off: no final checkpoint)")
            )
            echo(
                f"time_budget_s {budget.seconds:g} reached: {len(budget.stopped)} trial(s) stopped at the end of "
                f"an iteration{saved}" + (f"; {unstarted} never started" if unstarted else "")
            )
        new_rows = outcome.trial_rows(analysis.trials, tracker)
        rows += new_rows
        echo(f"\nexperiment {name!r}: results in {analysis.experiment_path}")
        if any(r["status"] == outcome.INTERRUPTED for r in new_rows):
            return rows, True
    return rows, False
