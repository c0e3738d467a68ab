"""The training console (rllib_r3l.cli.console): pure formatting with hand values, the live progress
files, and the routing of library output to the log file (in a subprocess: it redirects fds)."""

import io
import math
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest

from rllib_r3l.cli import console, live_progress
from rllib_r3l.runner import progress
from tests import REPO_ROOT
from tests.hang_guard import HANG_GUARD_S

INFO = {
    "title": "R3L main job: 3 iteration(s), results in /tmp/out",
    "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "env": "r3l/CoinCollector",
    "env_config": {"num_rooms": 4},
    "backend": "vllm",
    "engine_dtype": "float32",
    "cpu": "AMD EPYC 7B13",
    "cores": 2,
    "native_bf16": False,
    "learner_precision": "fp32, mixed_precision=auto",
    "tasks": 4,
    "base_per_task": 4,
    "max_retries_per_task": 4,
    "reflect": True,
    "log": "/tmp/out/main.log",
    "verbose": False,
}

# an RLlib result as algo.train() returns it (nested), iteration with an update
RESULT = {
    "time_this_iter_s": 110.0,
    "env_runners": {
        "num_episodes": 16,
        "success_rate": 0.125,
        "r3l": {
            "rollout_seconds": 70.0,
            "num_retries": 6,
            "retry_success_rate": 2 / 6,
            "generated_tokens": 2310,
            "reflection_total": 16,
            "timers": {"reflect_s": 20.0, "engine_start_s": 12.0},
        },
    },
    "learners": {"r3l": {"learner": {"update_seconds": 25.0, "trained_tokens": 408}}, "default_policy": {}},
    "r3l": {"timers": {"weight_sync_s": 2.0}},
}
# the same kind of result as a Tune callback may see it (flattened), iteration without an update
FLAT_NO_UPDATE = {
    "time_this_iter_s": 80.0,
    "env_runners/num_episodes": 16,
    "env_runners/success_rate": 0.0,
    "env_runners/r3l/rollout_seconds": 75.0,
    "env_runners/r3l/timers/reflect_s": 15.0,
    "env_runners/r3l/num_retries": 0,
    "learners/r3l/learner/update_seconds": float("nan"),
}


def test_header_lines_show_model_env_backend_cpu_precision_and_log():
    lines = console.header_lines(INFO)
    text = "\n".join(lines)
    assert lines[0] == INFO["title"]
    assert "model          HuggingFaceTB/SmolLM2-135M-Instruct" in text
    assert "environment    r3l/CoinCollector {'num_rooms': 4}" in text
    assert "backend        vllm (engine dtype float32)" in text
    assert "CPU            AMD EPYC 7B13, 2 cores, no native bf16" in text
    assert "precision      learner fp32, mixed_precision=auto" in text
    assert "4 tasks, each 4 base episodes + reflections + up to 4 retries" in text
    assert "logs           /tmp/out/main.log  (--verbose: on the console)" in text
    no_reflect = "\n".join(console.header_lines({**INFO, "reflect": False, "max_retries_per_task": 0}))
    assert "4 tasks, each 4 base episodes (no reflection)" in no_reflect
    failures = "\n".join(console.header_lines({**INFO, "reflect_on": "failures"}))
    assert "4 tasks, each 4 base episodes + reflections on the failed ones + up to 4 retries" in failures
    assert "resampling" not in text  # dynamic sampling off: no line
    ds = console.header_lines({**INFO, "dynamic_sampling_rounds": 1})
    assert (
        "  resampling     up to 1 more round of 4 new tasks while no task has a learning signal"
        " (dynamic_sampling_rounds=1)"
    ) in ds


def test_progress_line_with_hand_counts():
    counts = {
        progress.EPISODES: 3,
        progress.TURNS: 41,
        progress.REFLECTIONS: 2,
        progress.RETRIES: 1,
        progress.TOKENS: 12345,
    }
    assert console.progress_line(counts, 75.4, expected_episodes=16) == (
        "  exploring  episodes 3/16 | turns 41 | reflections 2 | retries 1 | tokens 12.3k | 1:15"
    )
    assert console.progress_line({}, 3725, phase="learning") == (
        "  learning   episodes 0 | turns 0 | reflections 0 | retries 0 | tokens 0 | 1:02:05"
    )


def test_iteration_row_and_line_with_an_update():
    row = console.iteration_row(1, RESULT)
    assert row["episodes"] == 16 and row["success_rate"] == 0.125
    assert row["retries"] == 6 and math.isclose(row["retry_success_rate"], 1 / 3)
    assert row["updated"] and row["trained_tokens"] == 408 and row["generated_tokens"] == 2310
    # rollout = sampling - reflection; sync = the weight sync; other = the rest of the iteration
    assert row["time"] == {
        "rollout": 50.0,
        "reflect": 20.0,
        "learn": 25.0,
        "start": 12.0,
        "sync": 2.0,
        "other": 1.0,
        "total": 110.0,
    }
    assert console.iteration_line(row, 3) == (
        "iter 1/3 | success 0.125 (2/16) | retries 6, 2 succeeded | update yes, 408 tok"
        " | 110 s: start 12 + rollout 50 + reflect 20 + learn 25 + sync 2 + other 1 s"
    )


def test_iteration_row_and_line_without_an_update_from_a_flat_result():
    row = console.iteration_row(2, FLAT_NO_UPDATE)
    assert not row["updated"] and row["trained_tokens"] == 0 and math.isnan(row["retry_success_rate"])
    assert console.iteration_line(row) == (
        "iter 2 | success 0.000 (0/16) | retries 0 | update no | 80 s: rollout 60 + reflect 15 + learn 0 + sync 0 + "
        "other 5 s"
    )


def test_summary_table_rows_and_totals():
    rows = [console.iteration_row(1, RESULT), console.iteration_row(2, FLAT_NO_UPDATE)]
    table = console.summary_table(rows)
    assert table[0].split() == [
        "iter",
        "success",
        "retries",
        "retry",
        "ok",
        "update",
        "trained",
        "tok",
        "gen",
        "tok",
        "start",
        "s",
        "rollout",
        "s",
        "reflect",
        "s",
        "learn",
        "s",
        "sync",
        "s",
        "other",
        "s",
        "total",
        "s",
    ]
    assert set(table[1].replace(" ", "")) == {"-"}
    assert table[2].split() == ["1", "0.125", "6", "2", "yes", "408", "2,310", "12", "50", "20", "25", "2", "1", "110"]
    assert table[3].split() == ["2", "0.000", "0", "0", "no", "0", "0", "0", "60", "15", "0", "0", "5", "80"]
    assert table[4].split() == [
        "all",
        "0.062",
        "6",
        "2",
        "1/2",
        "408",
        "2,310",
        "12",
        "110",
        "35",
        "25",
        "2",
        "6",
        "190",
    ]
    assert len({len(line) for line in table}) == 1  # aligned
    # no engine start in these iterations: no start column
    assert "start s" not in console.summary_table([console.iteration_row(2, FLAT_NO_UPDATE)])[0]
    # no iteration at all (a run interrupted in its first): the header alone, not a TypeError
    header, rule = console.summary_table([])
    assert header.split()[0] == "iter" and set(rule.replace(" ", "")) == {"-"}


def test_plot_run_writes_a_png(tmp_path):
    rows = [console.iteration_row(1, RESULT), console.iteration_row(2, FLAT_NO_UPDATE)]
    path = console.plot_run(rows, str(tmp_path / "run.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_live_progress_counts_this_iteration_from_the_runners_files(tmp_path):
    c1, c2 = Counter({progress.EPISODES: 5, progress.TURNS: 50}), Counter()
    waiting = live_progress.LiveProgress(console.Console(io.StringIO()), str(tmp_path), expected=8)
    assert waiting.line().startswith("  starting   episodes 0/8 | turns 0")  # no engine up yet
    p1 = progress.Publisher(c1, str(tmp_path / "runner-1-1.json"), interval=3600)
    p1.write()
    out = io.StringIO()
    live = live_progress.LiveProgress(console.Console(out, live_interval=3600), str(tmp_path), expected=8)
    live.begin()  # baseline: runner 1 had done 5 episodes before this iteration
    c1.update({progress.EPISODES: 2, progress.TURNS: 7, progress.TOKENS: 30})
    p1.write()
    c2.update({progress.EPISODES: 1, progress.RETRIES: 1, progress.SAMPLES: 1})
    progress.Publisher(c2, str(tmp_path / "runner-2-2.json"), interval=3600).stop()  # a runner that joined
    p1.stop()
    counts = live.counts()
    live.stop()
    assert counts[progress.EPISODES] == 3 and counts[progress.TURNS] == 7 and counts[progress.RETRIES] == 1
    assert counts[progress.TOKENS] == 30
    assert live.line().startswith("  exploring  episodes 3/8 | turns 7")  # one of two runners done sampling


@pytest.mark.slow
def test_an_iterations_first_live_line_comes_one_interval_in(tmp_path):
    """Not a line of zeros at 0:00: the interval restarts with each iteration, however long the last
    line is past (here: none yet, 2.5 s of a 2-s interval ago)."""
    out = io.StringIO()
    live = live_progress.LiveProgress(console.Console(out, live_interval=2.0), str(tmp_path), expected=8)
    live.begin()
    live.pause()
    time.sleep(2.5)
    live.begin()  # iteration 2 starts
    time.sleep(1.2)  # the loop looks at least twice
    live.stop()
    assert "episodes" not in out.getvalue()


def test_live_phase_follows_the_counts():
    live = live_progress.LiveProgress(console.Console(io.StringIO()), "/nonexistent", expected=8, reflect=True)
    E, R, S, T = progress.EPISODES, progress.REFLECTIONS, progress.SAMPLES, progress.RETRIES
    assert live.phase({}, 0) == "starting"
    assert live.phase({E: 5}, 1) == "exploring"
    assert live.phase({E: 8, R: 0}, 1) == "reflecting"
    assert live.phase({E: 8, R: 8, T: 2}, 1) == "retrying"
    assert live.phase({E: 8, R: 8, S: 1}, 1) == "learning"
    assert live.phase({E: 8, S: 1}, 2) == "reflecting"  # one of two runners still at it
    # reflect_on="failures": 3 successes passed over, 5 failures reflected on: retrying, not reflecting
    assert live.phase({E: 8, R: 5, progress.SKIPPED: 3}, 1) == "retrying"
    assert live.phase({E: 8, R: 4, progress.SKIPPED: 3}, 1) == "reflecting"
    live.reflect = False
    assert live.phase({E: 8}, 1) == "exploring"


def test_dynamic_sampling_rounds_in_the_live_line_and_the_iteration_line():
    live = live_progress.LiveProgress(console.Console(io.StringIO()), "/nonexistent", expected=8, reflect=True)
    E, R, RD = progress.EPISODES, progress.REFLECTIONS, progress.ROUNDS
    # one runner, one extra round of new tasks: 8 more base episodes expected, exploring again
    assert live.expected_now({RD: 1}, 1) == 16
    assert live.phase({E: 12, R: 8, RD: 1}, 1) == "exploring"
    assert live.phase({E: 16, R: 8, RD: 1}, 1) == "reflecting"
    # two runners (4 episodes each): one runner's extra round adds its share
    assert live.expected_now({RD: 1}, 2) == 12
    row = {**console.iteration_row(2, FLAT_NO_UPDATE), "extra_rounds": 2}
    assert console.iteration_line(row).startswith("iter 2 | success 0.000 (0/16, +2 rounds of tasks) | retries 0")
    assert "+1 round of tasks" in console.iteration_line({**row, "extra_rounds": 1})


def test_console_without_a_terminal_prints_live_lines_as_lines():
    out = io.StringIO()
    con = console.Console(out)
    assert not con.tty and con.live_interval == 30.0
    con.live("  exploring episodes 1/8")
    con.line("iter 1/3 | ...")
    assert out.getvalue() == "  exploring episodes 1/8\niter 1/3 | ...\n"


_ROUTING_SCRIPT = textwrap.dedent("""
    import logging, sys, types, warnings
    # rllib_r3l.cli.console and .progress without the package's __init__ (Ray, torch): a fast subprocess
    pkg = types.ModuleType("rllib_r3l")
    pkg.__path__ = ["rllib_r3l"]
    sys.modules["rllib_r3l"] = pkg
    from rllib_r3l.cli import console
    # a vLLM-style logger: its own handler on stdout, no propagation (as vllm.logger configures it)
    vllm = logging.getLogger("vllm.engine.llm_engine")
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("INFO %(asctime)s [%(name)s] %(message)s"))
    vllm.addHandler(handler)
    vllm.setLevel(logging.INFO)
    vllm.propagate = False
    with console.routed_output(sys.argv[1], verbose=sys.argv[2] == "1") as con:
        vllm.info("Initializing a V1 LLM engine")
        logging.getLogger("transformers.modeling_utils").warning("Some weights were not initialized")
        sys.stderr.write("Loading checkpoint shards: 100%|##########| 1/1\\n")
        warnings.warn("this API is deprecated", DeprecationWarning)
        logging.getLogger("rllib_r3l.runner.env_runner").error("exploration failed:\\nTraceback ...")
        con.line("iter 1/3 | success 0.125")
    print("after the run")
""")


def _route(tmp_path, verbose: bool):
    log = tmp_path / "main.log"
    env = {**os.environ, "PYTHONWARNINGS": "always"}
    proc = subprocess.run(
        [sys.executable, "-c", _ROUTING_SCRIPT, str(log), "1" if verbose else "0"],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env=env,
        cwd=str(REPO_ROOT),
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr, (log.read_text() if log.exists() else "")


LIBRARY_LINES = (
    "Initializing a V1 LLM engine",
    "Some weights were not initialized",
    "Loading checkpoint shards",
    "this API is deprecated",
)


@pytest.mark.subprocess
def test_library_logs_go_to_the_log_file_not_the_console(tmp_path):
    shown, logged = _route(tmp_path, verbose=False)
    for text in LIBRARY_LINES:
        assert text in logged and text not in shown, text
    assert "iter 1/3 | success 0.125" in shown and "iter 1/3" not in logged
    # R3L's own errors: one line on the console, the traceback in the log
    assert f"! rllib_r3l.runner.env_runner: exploration failed: (details: {tmp_path / 'main.log'})" in shown
    assert "Traceback ..." in logged and "Traceback" not in shown
    assert "after the run" in shown  # the console is restored afterwards


@pytest.mark.subprocess
def test_verbose_shows_library_logs_on_the_console(tmp_path):
    shown, logged = _route(tmp_path, verbose=True)
    for text in LIBRARY_LINES:
        assert text in shown, text
    assert "iter 1/3 | success 0.125" in shown and logged == ""


class _FakeTrial:
    """What ConsoleCallback reads of a Tune trial."""

    def __init__(self, path):
        self.trial_id, self.path, self.local_path, self.status = "abc_00000", str(path), str(path), "RUNNING"
        self.stopping_criterion = {"training_iteration": 2}
        self.config = {
            "model": "tiny",
            "env": "r3l/ToyCorridor",
            "backend": "transformers",
            "group_size": 4,
            "tasks_per_iteration": 2,
        }

    def __str__(self):
        return "R3L_r3l_ToyCorridor_abc_00000"


def test_tune_console_callback_prints_header_iteration_lines_table_and_plot(tmp_path):
    from rllib_r3l.cli.launch import ConsoleCallback

    out = io.StringIO()
    cb = ConsoleCallback(console.Console(out), live_dir=None, log=str(tmp_path / "train.log"))
    trial = _FakeTrial(tmp_path)
    cb.on_trial_start(iteration=0, trials=[trial], trial=trial)
    cb.on_trial_result(iteration=1, trials=[trial], trial=trial, result={**RESULT, "training_iteration": 1})
    cb.on_trial_result(iteration=2, trials=[trial], trial=trial, result={**FLAT_NO_UPDATE, "training_iteration": 2})
    trial.status = "TERMINATED"
    cb.on_trial_complete(iteration=3, trials=[trial], trial=trial)
    cb.on_experiment_end(trials=[trial])
    text = out.getvalue()
    assert text.startswith(f"R3L trial {trial}: stop {{'training_iteration': 2}}, results in {tmp_path}\n")
    for part in (
        "  model          tiny",
        "  backend        transformers (engine dtype float32)",
        "  per iteration  2 tasks, each 2 base episodes + reflections on the failed ones + up to 2 retries",
        f"  logs           {tmp_path / 'train.log'}",
        "iter 1/2 | success 0.125 (2/16)",
        "iter 2/2 | success 0.000 (0/16) | retries 0 | update no",
        f"{trial}: 2 iteration(s) in this run",
        "\n all ",
        f"plot: {tmp_path / 'run.png'}",
    ):
        assert part in text, part
    assert (tmp_path / "run.png").exists()


def test_train_verbose_flag_defaults_to_the_quiet_console():
    from rllib_r3l.cli.commands import build_parser

    p = build_parser()
    assert p.parse_args(["train", "f.yaml"]).verbose is None  # quiet: R3L's console, the rest in the log
    assert p.parse_args(["train", "f.yaml", "--verbose"]).verbose == 1
    assert p.parse_args(["train", "f.yaml", "--verbose", "0"]).verbose == 0


@pytest.mark.slow
def test_a_runner_publishes_its_last_counts_before_sample_returns(tmp_path, monkeypatch):
    """The console takes the next iteration's baseline as soon as every sample() has returned; a
    runner whose last counts waited for its publisher's next tick showed them in the next
    iteration's live line (seen: 'retries 3' at 0:04 of an iteration). A real local runner (tiny
    model, toy corridor) whose publisher never ticks on its own."""
    from rllib_r3l import R3LConfig
    from rllib_r3l.runner.env_runner import R3LEnvRunner

    monkeypatch.setattr(
        progress,
        "start_publisher",
        lambda counters, tag: progress.Publisher(counters, str(tmp_path / f"runner-1-{tag}.json"), interval=3600),
    )
    cfg = (
        R3LConfig()
        .environment("r3l/ToyCorridor", env_config={"num_rooms": 3})
        .training(
            model="tiny",
            group_size=4,
            tasks_per_iteration=2,
            backend="transformers",
            max_response_tokens=8,
            max_reflection_tokens=24,
        )
        .debugging(seed=0)
    )
    runner = R3LEnvRunner(config=cfg)
    try:
        groups = runner.sample()
        [counts] = progress.read(str(tmp_path)).values()
        base = sum(1 for g in groups for t in g.trajectories if t.kind.value == "base")
        retries = sum(1 for g in groups for t in g.trajectories if t.kind.value == "retry")
        assert counts[progress.SAMPLES] == 1 and counts[progress.EPISODES] == base == 4
        assert counts[progress.RETRIES] == retries and counts[progress.TURNS] > 0
    finally:
        runner.stop()


def test_a_signal_inside_the_live_threads_start_leaves_stop_working(tmp_path, monkeypatch):
    """CI (stop 41): SIGTERM landed inside ``Thread.start()`` at iteration 1; ``stop()`` then joined a
    thread that never started and the main job died with a RuntimeError (exit 1, not 130)."""
    import threading

    def interrupted_start(self):
        raise KeyboardInterrupt  # the signal arrives before the thread is up

    live = live_progress.LiveProgress(console.Console(io.StringIO(), live_interval=3600), str(tmp_path), expected=8)
    with monkeypatch.context() as m:
        m.setattr(threading.Thread, "start", interrupted_start)
        with pytest.raises(KeyboardInterrupt):
            live.begin()
    assert live._thread is None  # no half-started thread kept
    live.stop()  # raised "cannot join thread before it is started"
    assert live._thread is None


@pytest.mark.subprocess
def test_progress_folders_of_dead_processes_are_swept_live_ones_kept(tmp_path, monkeypatch):
    """A driver killed with kill -9 cannot remove its progress folder; the next run removes it (43 had
    piled up in /tmp on the development machine)."""
    import subprocess
    import sys
    import tempfile

    from rllib_r3l.cli import live_progress

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"r3l-progress-{gone.stdout.strip()}-abc"
    alive = tmp_path / f"r3l-progress-{os.getpid()}-def"
    other = tmp_path / "r3l-progress-notapid"
    for d in (dead, alive, other):
        d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with live_progress.progress_folder() as folder:
        assert os.path.basename(folder).startswith(f"r3l-progress-{os.getpid()}-")
        assert not dead.exists() and alive.exists() and other.exists()
    assert not os.path.exists(folder)


def test_the_iteration_line_shows_held_out_success_when_the_iteration_evaluated():
    """evaluation_interval: R3L.evaluate()'s result under ``evaluation`` joins the iteration's line."""
    result = {**RESULT, "evaluation": {"env_runners": {"success_rate": 0.4, "num_episodes": 10}}}
    row = console.iteration_row(1, result)
    assert row["eval_success_rate"] == 0.4 and row["eval_episodes"] == 10
    assert console.iteration_line(row, 3) == (
        "iter 1/3 | success 0.125 (2/16) | retries 6, 2 succeeded | update yes, 408 tok | held-out 0.400 (4/10)"
        " | 110 s: start 12 + rollout 50 + reflect 20 + learn 25 + sync 2 + other 1 s"
    )
    assert math.isnan(console.iteration_row(1, RESULT)["eval_success_rate"])  # no evaluation: nothing shown
    # re-probe 6 (P4): held-out episodes the environment lost were a silent 0/2
    lost = {**result, "evaluation": {"env_runners": {"success_rate": 0.0, "num_episodes": 2, "lost_episodes": 2}}}
    assert "| held-out 0.000 (0/2, 2 lost) |" in console.iteration_line(console.iteration_row(1, lost))


def test_a_lagged_iteration_says_its_lag_and_the_learners_wait_and_summary_json_its_idle_fractions():
    """max_policy_lag (issue 47 item 7): the phases overlap, so the line says the lag and how long the learner
    waited for samples; summary.json's record keeps the idle fractions of the iteration's wall time."""
    from rllib_r3l.cli.iteration_record import iteration_record

    result = {
        **RESULT,
        "r3l": {
            "policy_lag_max": 1,
            "policy_lag_mean": 1.0,
            "async": {"wait_for_samples_s": 22.0, "requests_in_flight": 1},
        },
    }
    line = console.iteration_line(console.iteration_row(2, result), 3)
    assert " | lag 1, learner waited 22 s | 110 s: " in line
    assert " | lag " not in console.iteration_line(console.iteration_row(1, RESULT), 3)
    rec = iteration_record(2, result)
    assert rec["credit"]["policy_lag_max"] == 1 and rec["async"]["requests_in_flight"] == 1
    assert rec["async"]["learner_idle_fraction"] == pytest.approx(22 / 110)
    assert rec["async"]["runner_idle_fraction"] == pytest.approx(1 - 70 / 110)  # the runners sampled 70 s of 110
    assert "async" not in iteration_record(1, RESULT)
