"""The main job (``python -m rllib_r3l.cli.main``): trains, checkpoints, writes summary.json, run.png
and main.log, with the quiet console (header, a line per iteration, summary table).

Runs the real entry point on the tiny model and ToyWord with the transformers backend (the README
main job itself, SmolLM2 on coin collector with vLLM, takes minutes: it is not a unit test).
"""

import json
import math
import re

import pytest

pytestmark = pytest.mark.integration


def test_main_job_trains_and_writes_summary(tmp_path, capfd):
    from rllib_r3l.cli import main

    rc = main.main(
        [
            "--iterations",
            "2",
            "--out",
            str(tmp_path),
            "--num-cpus",
            "2",
            "--set",
            "model=tiny",
            "backend=transformers",
            "env=r3l/ToyWord",
            "group_size=4",
            "tasks_per_iteration=2",
            "max_response_tokens=8",
            "max_reflection_tokens=24",
            "lr=1e-3",
            "seed=0",
            "sampling_seed=0",
        ]
    )  # seeded: "an update within 2 iterations" cannot flake
    assert rc == 0
    out = capfd.readouterr()
    shown = out.out + out.err
    # the quiet console: header, one line per iteration, the summary table; library output in main.log
    for text in (
        "R3L main job: 2 iteration(s)",
        "  model ",
        "  backend        transformers (engine dtype float32)",
        "  CPU ",
        "  precision      learner ",
        "iter 1/2 | success ",
        "iter 2/2 | success ",
        "iter  success  retries",
        "\n all  ",
        f"log:        {tmp_path / 'main.log'}",
    ):
        assert text in shown, text
    # (what goes to main.log instead of the console: tests/cli/test_console.py, in a process of its own)
    assert (tmp_path / "main.log").read_text().startswith("==== ")
    assert (tmp_path / "run.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((tmp_path / "summary.json").read_text())
    # the retry ledger beside it: every reflection of both iterations, its funnel in the summary
    from rllib_r3l import retry_ledger

    rows = retry_ledger.read(str(tmp_path / retry_ledger.LEDGER_FILE))
    assert rows and {r["iteration"] for r in rows} <= {1, 2}
    assert summary["retries"]["ledger"] == str(tmp_path / retry_ledger.LEDGER_FILE)
    assert summary["retries"]["funnel"] == retry_ledger.funnel(rows) and "retry chain: " in shown
    for rec in summary["per_iteration"]:
        assert set(rec["time_split"]) == {"start", "rollout", "reflect", "learn", "sync", "other", "total"}
    assert summary["per_iteration"][0]["time_split"]["reflect"] > 0  # reflection is timed (r3l/timers/reflect_s)
    n_updates = sum(not math.isnan(rec["learner"].get("update_seconds", math.nan)) for rec in summary["per_iteration"])
    assert shown.count("| update yes, ") == n_updates and shown.count("| update no |") == 2 - n_updates
    assert summary["iterations"] == 2 and len(summary["per_iteration"]) == 2
    # no retry in the whole run (reports cut at max_reflection_tokens=24, or no failure): said, with the cause
    retried = any(rec["r3l"].get("num_retries") for rec in summary["per_iteration"])
    assert (summary["retry_note"] is None) == retried
    assert retried or ("note: " + summary["retry_note"]) in shown
    assert (tmp_path / "checkpoint").is_dir()
    # the time after the last iteration, by part, and the checkpoint's line says its time and size
    wrap = summary["seconds_wrap_up"]
    assert set(wrap) == {"checkpoint", "plot", "stop_and_shutdown"} and wrap["checkpoint"] > 0
    assert summary["seconds_total"] >= summary["seconds_iterations"] + sum(wrap.values()) - 0.5
    assert re.search(r"checkpoint: \S+  \(saved in \d+ s, \d+\.\d GB\)", shown)
    assert summary["peak_rss_gb_driver"] > 0
    for rec in summary["per_iteration"]:
        assert 0.0 <= rec["success_rate"] <= 1.0
        r3l = rec["r3l"]
        for key in ("rollout_turns_per_sample", "generated_tokens_per_sample", "reflection_total", "num_retries"):
            assert key in r3l, key
        assert r3l["reflection_total"] + r3l["num_retries"] >= 0
    # at least one iteration updated (ToyWord at chance ~25 %: 8 episodes all equal has p < 0.2;
    # seeded, the same run every time)
    updated = [
        rec for rec in summary["per_iteration"] if not math.isnan(rec["learner"].get("forward_tokens", math.nan))
    ]
    assert updated and n_updates == len(updated)
    # the main job's dynamic sampling (MAIN_JOB_SETTINGS): shown in the header; an iteration updates
    # exactly when its runner found a group with a learning signal within the extra rounds
    assert "  resampling     up to 2 more rounds of 2 new tasks while no task has a learning signal" in shown
    for rec in summary["per_iteration"]:
        ds = rec["dynamic_sampling"]
        assert 0 <= ds["extra_rounds"] <= 2 and ds["groups_without_signal"] <= 2 * (1 + ds["extra_rounds"])
        assert rec["episodes"] == 2 * 2 * (1 + ds["extra_rounds"])  # 2 tasks x 2 base episodes a round
        has_update = not math.isnan(rec["learner"].get("forward_tokens", math.nan))
        assert has_update == (not ds["rounds_exhausted"])
    for rec in updated:
        assert rec["learner"]["forward_tokens"] >= rec["learner"]["trained_tokens"] > 0
        assert rec["learner"]["micro_batches"] >= 1
    # re-probe 5 (P50): --no-reflect on --resume of this reflecting run continued WITH reflection, exit 0
    capfd.readouterr()
    rc = main.main(["--out", str(tmp_path), "--iterations", "3", "--resume", "--no-reflect"])
    err = capfd.readouterr().err
    assert rc == 2 and f"--no-reflect: the run in {tmp_path} was trained with reflect=True" in err, err
    assert json.loads((tmp_path / "summary.json").read_text())["iterations"] == 2  # untouched


def test_sigterm_stops_the_main_job_like_ctrl_c_and_keeps_what_ran(tmp_path):
    """Preemption (issue 37): the first SIGTERM stops the loop, the checkpoint and summary of the
    iterations that ran are saved, the exit code is 130 (interrupted), not a traceback."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests import REPO_ROOT

    out = tmp_path / "run"
    argv = [
        "--iterations",
        "200",
        "--out",
        str(out),
        "--num-cpus",
        "2",
        "--set",
        "model=tiny",
        "backend=transformers",
        "env=r3l/ToyWord",
        "group_size=4",
        "tasks_per_iteration=1",
        "max_response_tokens=8",
        "max_reflection_tokens=24",
        "seed=0",
        "sampling_seed=0",
    ]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    log = tmp_path / "console.txt"
    with open(log, "w") as console:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rllib_r3l.cli.main", *argv],
            cwd=str(REPO_ROOT),
            env=env,
            stdout=console,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.time() + 300
        while proc.poll() is None and "iter 2/200" not in log.read_text() and time.time() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=300)
    text = log.read_text()
    assert rc == 130, text[-3000:]
    assert "interrupted after" in text and "Traceback" not in text, text[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and 2 <= summary["iterations_completed"] < 200
    assert (out / "checkpoint").is_dir()


def _start_until(tmp_path, marker):
    """The main job (3 iterations, tiny model) in a process of its own, its console in a file, once
    ``marker`` is on the console: ``(proc, out folder, console file)``."""
    import os
    import subprocess
    import sys
    import time

    from tests import REPO_ROOT
    from tests.hang_guard import HANG_GUARD_S

    out = tmp_path / "run"
    argv = [
        "--iterations",
        "3",
        "--out",
        str(out),
        "--num-cpus",
        "2",
        "--set",
        "model=tiny",
        "backend=transformers",
        "env=r3l/ToyWord",
        "group_size=4",
        "tasks_per_iteration=1",
        "max_response_tokens=8",
        "seed=0",
    ]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    log = tmp_path / "console.txt"
    with open(log, "w") as console:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rllib_r3l.cli.main", *argv],
            cwd=str(REPO_ROOT),
            env=env,
            stdout=console,
            stderr=subprocess.STDOUT,
            text=True,
        )
    started = time.monotonic()
    while proc.poll() is None and marker not in log.read_text():
        assert time.monotonic() - started < HANG_GUARD_S, "hang guard\n" + log.read_text()[-3000:]
        time.sleep(0.05)
    assert proc.poll() is None, log.read_text()[-3000:]
    return proc, out, log


def test_a_signal_before_the_first_iteration_ends_leaves_no_finished_run_behind(tmp_path):
    """Re-probe (issue 37): Ctrl-C during iteration 1 ended in a TypeError from the empty summary table,
    exit 1, and left a checkpoint and summary.json that a rerun called "a finished run". Now: exit 130,
    one line, nothing written that a rerun would refuse."""
    import signal

    from tests.hang_guard import HANG_GUARD_S

    proc, out, log = _start_until(tmp_path, "learner built")
    proc.send_signal(signal.SIGTERM)  # iteration 1 has just begun
    rc = proc.wait(timeout=HANG_GUARD_S)
    text = log.read_text()
    assert rc == 130 and "Traceback" not in text, text[-3000:]
    if "iter 1/3" in text:  # the machine finished iteration 1 before the signal: the other path, tested above
        return
    assert "nothing to save" in text, text[-3000:]
    assert "saving the checkpoint" not in text, text[-3000:]  # re-probe 11: said, then "nothing to save"
    assert not (out / "summary.json").exists() and not (out / "checkpoint").exists()


@pytest.mark.parametrize("signals", [1, 2])
def test_sigterm_while_the_main_job_starts_exits_130_with_one_line(tmp_path, signals):
    """Re-probe 6 (issue 37): a second SIGTERM while the main job loaded exited 143 (killed), and a first
    one inside ray.init exited through Ray's own handler. Preemption at any point of the start: exit 130,
    nothing written, no traceback; a second signal ends it at once."""
    import signal
    import time

    from tests.hang_guard import HANG_GUARD_S

    proc, out, log = _start_until(tmp_path, "R3L main job:")  # the header: Ray starts next
    time.sleep(0.5)
    for _ in range(signals):
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
    rc = proc.wait(timeout=HANG_GUARD_S)
    text = log.read_text()
    assert rc == 130 and "Traceback" not in text, (rc, text[-3000:])
    assert not (out / "summary.json").exists() and not (out / "checkpoint").exists()
    if "learner built" not in text and signals == 1:  # the signal came while Ray started or the learner loaded
        assert "interrupted while starting: no iteration ran, nothing was written" in text, text[-3000:]


def test_a_run_of_no_iteration_is_refused():
    from rllib_r3l.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["--iterations", "0"])
    assert e.value.code == 2


def test_a_second_signal_while_saving_loses_no_iteration_record(tmp_path):
    """Re-probe (issue 37): a second Ctrl-C during the main job's wrap-up (after the checkpoint, before
    summary.json) ended the process; the checkpoint resumed, but summary.json then lacked iteration 1.
    Now the records are written before the checkpoint."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests import REPO_ROOT
    from tests.hang_guard import HANG_GUARD_S

    out = tmp_path / "run"
    argv = ["--num-cpus", "2", "--out", str(out)]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    log = tmp_path / "console.txt"

    def wait_for(cond, proc):
        started = time.monotonic()
        while not cond() and proc.poll() is None:
            assert time.monotonic() - started < HANG_GUARD_S, "hang guard\n" + log.read_text()[-3000:]
            time.sleep(0.02)

    with open(log, "w") as console:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rllib_r3l.cli.main",
                *argv,
                "--iterations",
                "4",
                "--set",
                "model=tiny",
                "backend=transformers",
                "env=r3l/ToyCorridor",
                "group_size=4",
                "tasks_per_iteration=1",
                "max_response_tokens=8",
                "seed=0",
            ],
            cwd=str(REPO_ROOT),
            env=env,
            stdout=console,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wait_for(lambda: "iter 1/4" in log.read_text(), proc)
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: (out / "checkpoint").is_dir(), proc)  # the wrap-up is under way
        proc.send_signal(signal.SIGTERM)  # the second signal ends the process at once
        proc.wait(timeout=HANG_GUARD_S)
    resumed = subprocess.run(
        [sys.executable, "-m", "rllib_r3l.cli.main", *argv, "--iterations", "3", "--resume"],
        cwd=str(REPO_ROOT),
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    done = summary["iterations_completed"]
    assert [r["iteration"] for r in summary["per_iteration"]] == list(range(1, done + 1)) and done == 3, summary
