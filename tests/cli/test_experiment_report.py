"""``rllib-r3l report``: each trial's status is a column, and a trial that failed is flagged, not
averaged in silently (issue 37, 10)."""

from __future__ import annotations

import json
import os

import pytest

from rllib_r3l.cli import commands as cli
from rllib_r3l.cli.experiment_report import make_report, notes
from rllib_r3l.cli.report_warnings import warnings


def _trial(root, name, results, error=None):
    d = root / name
    d.mkdir(parents=True)
    (d / "result.json").write_text("".join(json.dumps(r) + "\n" for r in results))
    if error is not None:
        (d / "error.txt").write_text(error)
    return d


def _result(i, done=False, **extra):
    return {"training_iteration": i, "done": done, "env_runners": {"episode_return_mean": 0.5}, **extra}


def _tune_state(root, statuses):
    """Tune's experiment_state-*.json: [trial JSON, run metadata JSON] per trial."""
    trials = [[json.dumps({"trial_id": n, "status": s, "relative_logdir": n}), "{}"] for n, s in statuses.items()]
    (root / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps({"trial_data": trials}))


def test_each_trial_has_its_status_and_an_error_is_flagged(tmp_path, capsys):
    root = tmp_path / "exp"
    _trial(root, "R3L_x_00000_0_2026-01-01", [_result(1), _result(2, done=True)])
    _trial(
        root, "R3L_x_00001_1_2026-01-01", [_result(1)], error="Failure # 1\nTraceback ...\nValueError: grad_clip: abc\n"
    )
    _trial(root, "R3L_x_00002_2_2026-01-01", [_result(1)])  # stopped before its stop criterion (Ctrl-C)
    table, _pngs, _out = make_report(str(root))
    assert list(table["status"]) == ["TERMINATED", "ERROR", "INTERRUPTED"]
    assert list(table.columns)[:2] == ["trial", "status"]
    lines = warnings(table)
    assert any(
        "R3L_x_00001 ended in ERROR" in w and "ValueError: grad_clip: abc" in w and "error.txt" in w for w in lines
    ), lines
    code = cli.main(["report", str(root)])
    out, err = capsys.readouterr()
    assert code == 0 and "status" in out and "ERROR" in out
    assert "ended in ERROR" in err


def test_the_status_comes_from_tunes_experiment_state_when_there_is_one(tmp_path):
    root = tmp_path / "exp"
    _trial(root, "R3L_x_00000_0_2026-01-01", [_result(1)])
    _trial(root, "R3L_x_00001_1_2026-01-01", [_result(1)])
    _tune_state(
        root, {"R3L_x_00000_0_2026-01-01": "RUNNING", "R3L_x_00001_1_2026-01-01": "ERROR"}
    )  # no error.txt synced yet
    table, _pngs, _out = make_report(str(root))
    assert list(table["status"]) == ["RUNNING", "ERROR"]


def test_a_finished_trial_that_never_trained_is_marked(tmp_path):
    root = tmp_path / "exp"
    empty = {"r3l": {"batch": {"empty_batches": 1}}}
    _trial(root, "R3L_x_00000_0_2026-01-01", [_result(1, **empty), _result(2, done=True, **empty)])
    table, _pngs, _out = make_report(str(root))
    assert list(table["status"]) == ["TRAINED ON NOTHING"]


def test_a_trial_trained_before_a_resume_is_not_marked(tmp_path):
    root = tmp_path / "exp"
    empty = {
        "r3l": {"batch": {"empty_batches": 1}},
        "learners": {"__all_modules__": {"num_env_steps_trained_lifetime": 8.0}},
    }
    _trial(root, "R3L_x_00000_0_2026-01-01", [_result(3, **empty), _result(4, done=True, **empty)])
    table, _pngs, _out = make_report(str(root))
    assert list(table["status"]) == ["TERMINATED"]


@pytest.mark.subprocess
def test_a_running_trial_whose_driver_died_is_interrupted(tmp_path):
    """Re-probe (issue 37): after kill -9 or a second Ctrl-C, Tune's saved state keeps saying RUNNING, and
    `report` showed RUNNING for good. `rllib-r3l train` marks the experiment folder with its process;
    a mark whose process is gone (pid not running, or reused by a process started at another time) makes
    the trial INTERRUPTED; a live driver's trial stays RUNNING."""
    import subprocess
    import sys

    from rllib_r3l.cli import driver_mark

    root = tmp_path / "exp"
    _trial(root, "R3L_x_00000_0_2026-01-01", [_result(1)])
    _tune_state(root, {"R3L_x_00000_0_2026-01-01": "RUNNING"})
    with driver_mark.marked(str(root)):  # this process is the (live) driver
        assert driver_mark.driver_alive(str(root)) is True
        table, _pngs, _out = make_report(str(root))
        assert list(table["status"]) == ["RUNNING"]
    assert driver_mark.driver_alive(str(root)) is False  # marked ended when the run returns (a Ctrl-C ...)
    table, _pngs, _out = make_report(str(root))
    assert list(table["status"]) == ["INTERRUPTED"]  # Tune's state still says RUNNING
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (root / driver_mark.MARK).write_text(
        json.dumps({"host": __import__("socket").gethostname(), "pid": dead.pid, "started": 0.0})
    )
    assert driver_mark.driver_alive(str(root)) is False
    table, _pngs, _out = make_report(str(root))
    assert list(table["status"]) == ["INTERRUPTED"]
    import os

    (root / driver_mark.MARK).write_text(
        json.dumps({"host": __import__("socket").gethostname(), "pid": os.getpid(), "started": 1.0})
    )  # this pid, but another process's start
    assert driver_mark.driver_alive(str(root)) is False


def test_a_trial_that_failed_before_its_first_result_is_listed(tmp_path, capsys):
    """Re-probe (issue 37): a trial whose actor died before its first result (only error.txt in its
    folder) was missing from `report`, so an experiment of one such trial was "no Tune trials found"."""
    root = tmp_path / "exp"
    d = root / "R3L_x_00000_0_2026-01-01"
    d.mkdir(parents=True)
    (d / "error.txt").write_text("Failure # 1\n1 worker(s) were killed due to the node running low on memory.\n")
    code = cli.main(["report", str(root)])
    out, err = capsys.readouterr()
    assert code == 0 and "ERROR" in out
    assert "R3L_x_00000 ended in ERROR: 1 worker(s) were killed due to the node running low on memory." in err, err


def test_a_trial_resumed_past_its_error_is_terminated_not_error(tmp_path):
    # re-probe 4 (SW-2): a full disk left an empty error.txt; after --resume finished the trial, report still
    # said ERROR ("(empty error.txt) ... its metrics stop where it failed") while Tune's state said TERMINATED
    root = tmp_path / "exp"
    trial = _trial(root, "R3L_a", [_result(1), _result(2, done=True)], error="")
    _tune_state(root, {trial.name: "TERMINATED"})
    table, _pngs, _out = make_report(str(root))
    assert list(table["status"]) == ["TERMINATED"]
    assert not [w for w in warnings(table) if "ERROR" in w]


def _staged_trial(tmp_path, monkeypatch):
    """A trial with iteration 1 in the experiment and 1-3 in Ray's staging folder (Ray's temp dir under tmp_path)."""
    import ray._common.utils as ray_utils

    root = tmp_path / "exp"
    name = "R3L_x_00000_0_2026-01-01"
    _trial(root, name, [_result(1)])
    staged = tmp_path / "ray" / "session_1" / "artifacts" / "2026" / "exp" / "driver_artifacts" / name
    _trial(staged.parent, name, [_result(1), _result(2), _result(3)])
    monkeypatch.setattr(ray_utils, "get_default_ray_temp_dir", lambda: str(tmp_path / "ray"))
    return root


def test_rows_only_in_rays_staging_folder_are_named(tmp_path, monkeypatch):
    """Re-probe 4 leftover: after a full disk (or a killed driver) `report` showed the storage's rows only
    (0 iterations) with no word about the rows --resume would copy back from Ray's staging folder."""
    root = _staged_trial(tmp_path, monkeypatch)
    table, _pngs, _out = make_report(str(root))
    assert list(table["iterations"]) == [1]
    assert [w for w in warnings(table) if "staging" in w] == [
        "warning: R3L_x_00000: 2 more iteration(s) are only in Ray's staging folder on this machine (the driver "
        "ended, or the disk filled, before Tune copied them); `rllib-r3l train ... --resume` copies them back"
    ]


def test_rows_staged_by_a_live_run_are_said_to_come_not_to_need_a_resume(tmp_path, monkeypatch):
    """Issue 49, item 7: `report` on a run whose driver still runs advised `rllib-r3l train ... --resume`
    for the rows Tune had not copied yet, and that --resume is refused while the driver lives."""
    from rllib_r3l.cli import driver_mark

    root = _staged_trial(tmp_path, monkeypatch)
    with driver_mark.marked(str(root)):  # this process is the (live) driver
        table, _pngs, _out = make_report(str(root))
        said = [w for w in warnings(table) if "staging" in w]
    assert said == [
        f"note: R3L_x_00000: the run is still going (its driver, process {os.getpid()}, runs on this "
        "host); 2 more iteration(s) are in Ray's staging folder until Tune copies them into the "
        "experiment: run report again later, or once the run has ended"
    ], said
    assert "--resume" not in said[0]


def _staging_state(driver_artifacts, storage_path, stamp="2026-01-01_00-00-00"):
    """Tune's experiment_state in a staging folder: each trial's StorageContext pickled, hex, in a JSON string."""
    import pickle

    storage = {
        "_type": "CLOUDPICKLE_FALLBACK",
        "value": pickle.dumps({"storage_fs_path": str(storage_path)}, protocol=5).hex(),
    }
    trial = json.dumps({"trial_id": "x_00000", "storage": storage}, indent=2)
    (driver_artifacts / f"experiment_state-{stamp}.json").write_text(json.dumps({"trial_data": [[trial, "{}"]]}))


@pytest.mark.parametrize(
    "owner",
    [
        "a copy elsewhere",
        "a copy elsewhere, with this one's state beside",
        "this experiment",
        "this experiment, moved since",
    ],
)
def test_a_staging_folder_of_a_copy_resumed_elsewhere_is_not_this_experiments(tmp_path, monkeypatch, owner):
    """Re-probe 11: after a copy of the experiment was resumed under another storage path, `report` of the
    original said "3 more iteration(s) are only in Ray's staging folder" (the copy's: same names), and a
    --resume of the original "recovered" them. Tune's state in the staging folder names its storage path; an
    experiment moved away from that path keeps its staged rows."""
    import ray._common.utils as ray_utils

    root = tmp_path / "exp"
    name = "R3L_x_00000_0_2026-01-01"
    _trial(root, name, [_result(1)])
    staged = tmp_path / "ray" / "session_1" / "artifacts" / "2026" / "exp" / "driver_artifacts" / name
    _trial(staged.parent, name, [_result(1), _result(2), _result(3)])
    copy = owner.startswith("a copy elsewhere")
    recorded = tmp_path / "copy" if copy else tmp_path if owner == "this experiment" else tmp_path / "old"
    if copy:
        _trial(recorded / "exp", name, [_result(1), _result(2), _result(3)])
    if owner.endswith("beside"):  # re-probe 12: a resume copies the experiment's older states into its staging
        _staging_state(staged.parent, tmp_path, stamp="2026-01-01_00-00-00")
    _staging_state(staged.parent, recorded, stamp="2026-01-01_00-05-00")
    monkeypatch.setattr(ray_utils, "get_default_ray_temp_dir", lambda: str(tmp_path / "ray"))
    table, _pngs, _out = make_report(str(root))
    named = [w for w in warnings(table) if "staging" in w]
    assert list(table["iterations"]) == [1]
    if copy:
        assert named == []
    else:
        assert len(named) == 1 and "2 more iteration(s) are only in Ray's staging folder" in named[0], named


def _progress_csv(d, results):
    rows = [
        {
            "training_iteration": r["training_iteration"],
            "done": r["done"],
            "env_runners/episode_return_mean": r["env_runners"]["episode_return_mean"],
        }
        for r in results
    ]
    lines = [",".join(rows[0])] + [",".join(str(v) for v in r.values()) for r in rows]
    (d / "progress.csv").write_text("\n".join(lines) + "\n")


def test_a_cut_or_missing_result_json_is_said_and_progress_csv_fills_in(tmp_path):
    """Re-probe 9 (silently wrong, twice): result.json cut in row 2 of 2 (progress.csv whole, Tune's state
    TERMINATED) was reported as 1 iteration, INTERRUPTED, no warning; deleted, as 0 iterations."""
    root = tmp_path / "exp"
    results = [_result(1), _result(2, done=True)]
    cut = _trial(root, "R3L_x_00000_0_2026-01-01", results)
    text = (cut / "result.json").read_text()
    (cut / "result.json").write_text(text[: len(text) - 40])  # the full disk cut the last row
    gone = _trial(root, "R3L_x_00001_1_2026-01-01", results)
    (gone / "result.json").unlink()
    bare = _trial(root, "R3L_x_00002_2_2026-01-01", results)
    (bare / "result.json").write_text("")
    for d in (cut, gone):
        _progress_csv(d, results)
    _tune_state(root, {d.name: "TERMINATED" for d in (cut, gone, bare)})
    table, _pngs, _out = make_report(str(root))
    assert list(table["iterations"]) == [2, 2, 0]
    assert list(table["status"])[:2] == ["TERMINATED", "TERMINATED"]
    lines = warnings(table)
    assert any(
        "R3L_x_00000" in w
        and "result.json has 1 unreadable line" in w
        and "iteration(s) 2 taken from progress.csv" in w
        for w in lines
    ), lines
    assert any(
        "R3L_x_00001" in w and "result.json is missing" in w and "1, 2 taken from progress.csv" in w for w in lines
    ), lines
    assert any("R3L_x_00002" in w and "result.json is empty" in w and "no metrics" in w for w in lines), lines


def test_whole_row_files_give_no_row_warning(tmp_path):
    root = tmp_path / "exp"
    d = _trial(root, "R3L_x_00000_0_2026-01-01", [_result(1), _result(2, done=True)])
    _progress_csv(d, [_result(1), _result(2, done=True)])
    table, _pngs, _out = make_report(str(root))
    assert list(table["status"]) == ["TERMINATED"] and not warnings(table)


def test_non_utf8_bytes_in_the_row_files_are_unreadable_lines_not_a_traceback(tmp_path, capsys):
    """Re-probe 10: a 0xff byte in result.json was a UnicodeDecodeError (exit 1); in progress.csv, with
    result.json gone, the trial had "no rows" though progress.csv's rows were whole."""
    root = tmp_path / "exp"
    results = [_result(1), _result(2, done=True)]
    a = _trial(root, "R3L_x_00000_0_2026-01-01", results)
    with open(a / "result.json", "ab") as f:
        f.write(b"\xff\xfe garbage\n")
    b = _trial(root, "R3L_x_00001_1_2026-01-01", results)
    (b / "result.json").unlink()
    _progress_csv(b, results)
    with open(b / "progress.csv", "ab") as f:
        f.write(b"\xff,\xfe,\xfd\n")
    _tune_state(root, {a.name: "TERMINATED", b.name: "TERMINATED"})
    code = cli.main(["report", str(root)])
    out, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in err, err
    table, _pngs, _out = make_report(str(root))
    assert list(table["iterations"]) == [2, 2] and list(table["status"]) == ["TERMINATED", "TERMINATED"]
    assert any("R3L_x_00000" in w and "1 unreadable line" in w for w in warnings(table)), warnings(table)


def test_a_trial_without_any_row_keeps_tunes_status(tmp_path):
    """Re-probe 10: result.json and progress.csv both deleted: a trial Tune recorded TERMINATED was called
    INTERRUPTED (the warning says its rows are gone)."""
    root = tmp_path / "exp"
    d = _trial(root, "R3L_x_00000_0_2026-01-01", [_result(1), _result(2, done=True)])
    (d / "result.json").unlink()
    (d / "params.json").write_text("{}")
    _tune_state(root, {d.name: "TERMINATED"})
    table, _pngs, _out = make_report(str(root))
    assert list(table["status"]) == ["TERMINATED"]
    assert any("result.json is missing" in w and "no metrics" in w for w in warnings(table)), warnings(table)


def test_trials_of_different_environments_have_one_env_column_and_whole_numbers_stay_whole(tmp_path):
    """Re-probe 12: `report` over a ToyCorridor and a ToyWord experiment wrote two columns named `env`
    (pandas read the second as `env.1`), and num_rooms, absent for ToyWord, was shown as 3.0."""
    root = tmp_path / "storage"
    for exp, env, env_config in (("corridor", "r3l/ToyCorridor", {"num_rooms": 3}), ("word", "r3l/ToyWord", {})):
        d = _trial(root / exp, "R3L_x_00000_0_2026-01-01", [_result(1), _result(2, done=True)])
        (d / "params.json").write_text(json.dumps({"env": env, "env_config": env_config, "model": "tiny"}))
    table, _pngs, out = make_report(str(root))
    assert list(table.columns).count("env") == 1 and list(table["env"]) == ["r3l/ToyCorridor", "r3l/ToyWord"]
    assert str(table["env_config.num_rooms"].dtype) == "Int64" and table["env_config.num_rooms"].iloc[0] == 3
    header, corridor, _word = open(os.path.join(out, "summary.csv")).read().splitlines()[:3]
    assert header.split(",").count("env") == 1
    assert corridor.split(",")[header.split(",").index("env_config.num_rooms")] == "3", corridor


def test_an_asynchronous_pbt_splice_is_found_by_the_rows_config_not_the_files_iterations(tmp_path):
    """Issue 49: PBT restarts a trial from another trial's checkpoint; `report` says whose run the curve
    continues and from which row. Here asynchronous PBT: the trial had reached iteration 3 when it cloned
    the other trial's checkpoint of iteration 2, so it reported iteration 3 again (at the new lr), then 4;
    Tune's file holds stale iterations. No experiment state: the folders are found by Tune's trial index."""
    root = tmp_path / "exp"
    cfg = lambda lr: {"config": {"lr": lr}}  # noqa: E731
    _trial(
        root,
        "R3L_x_00000_0_lr=0.0001_2026-01-01",
        [
            _result(1, **cfg(1e-4)),
            _result(2, **cfg(1e-4)),
            _result(3, **cfg(1e-4)),
            _result(3, **cfg(2.4e-4)),
            _result(4, done=True, **cfg(2.4e-4)),
        ],
    )
    _trial(root, "R3L_x_00001_1_lr=0.0003_2026-01-01", [_result(i, done=i == 4, **cfg(3e-4)) for i in range(1, 5)])
    (root / "pbt_global.txt").write_text(
        json.dumps(["0_lr=0.0001", "1_lr=0.0003", 2, 0, {"lr": 3e-4, "env": "x"}, {"lr": 2.4e-4, "env": "x"}])
        + "\n"
        + json.dumps(["7_lr=0.1", "1_lr=0.0003", 2, 2, {"lr": 3e-4}, {"lr": 3.6e-4}])
        + "\n"  # no such trial here
        + '["0_lr=0.0001", "1_lr=0.0'
    )  # a cut line
    table, _pngs, _out = make_report(str(root))
    assert list(table["spliced_from"].fillna("")) == ["R3L_x_00001@3", ""]
    (line,) = notes(table)
    assert line == (
        "note: R3L_x_00000's curve is spliced from a PBT clone: from iteration 3 on it continues "
        "R3L_x_00001's run (PBT cloned R3L_x_00001's checkpoint of iteration 2 into it); "
        "perturbed lr 0.0003 -> 0.00024"
    )
    # a report on the spliced trial alone still names the clone (a folder beside it)
    alone = make_report(str(root / "R3L_x_00000_0_lr=0.0001_2026-01-01"))[0]
    assert list(alone["spliced_from"]) == ["R3L_x_00001@3"]


def test_pbt_splices_are_placed_at_their_restarts_even_when_nothing_was_perturbed(tmp_path):
    """Re-probe 14: an exploit whose perturbation drew the values the clone had ("changed nothing") was placed
    "after its last row", and so was every later splice of that trial. A restored trial's row has
    iterations_since_restore 1: that row is where the clone's run begins."""
    root = tmp_path / "exp"

    def row(i, since, lr):
        return _result(i, iterations_since_restore=since, config={"lr": lr})

    _trial(
        root,
        "R3L_x_00000_0_lr=0.0001_2026-01-01",
        [row(1, 1, 1e-4), row(2, 2, 1e-4), row(3, 1, 1e-5), row(4, 1, 1e-5), row(5, 2, 1e-5)],
    )
    _trial(root, "R3L_x_00001_1_lr=1e-05_2026-01-01", [row(i, i, 1e-5) for i in range(1, 6)])
    (root / "pbt_global.txt").write_text(  # two exploits of trial 0; the second drew lr 1e-5 again
        json.dumps(["0_lr=0.0001", "1_lr=1e-05", 0, 0, {"lr": 1e-5}, {"lr": 1e-5}])
        + "\n"
        + json.dumps(["0_lr=0.0001", "1_lr=1e-05", 0, 0, {"lr": 1e-5}, {"lr": 1e-5}])
        + "\n"
    )
    table, _pngs, _out = make_report(str(root))
    assert list(table["spliced_from"].fillna("")) == ["R3L_x_00001@3; R3L_x_00001@4", ""]
    assert all("after its last row" not in line for line in notes(table)), notes(table)


def test_the_retry_chain_of_each_trial_with_a_ledger_is_a_funnel(tmp_path, capsys):
    """``report`` reads each trial's retries.jsonl (the retry ledger) into a funnel: a table, lines, a plot."""
    from rllib_r3l import retry_ledger

    root = tmp_path / "exp"
    a = _trial(root, "R3L_x_00000_0_a=1", [_result(1), _result(2, done=True)])
    _trial(root, "R3L_x_00001_1_a=2", [_result(1, done=True)])  # no ledger (reflect off): no funnel row
    base = {"group_id": "g", "valid": True, "oracle_pivot": 0, "retry_status": "ok", "control_success": False}
    rows = [
        dict(base, reflection=0, pivot=0, reported_pivot=0, action_changed=True, retry_success=True),
        dict(base, reflection=1, pivot=1, reported_pivot=1, action_changed=False, retry_success=False),
        dict(
            base,
            reflection=2,
            valid=False,
            pivot=None,
            reported_pivot=None,
            retry_status="none",
            action_changed=None,
            retry_success=None,
            control_success=None,
        ),
    ]
    retry_ledger.append(str(a / retry_ledger.LEDGER_FILE), 1, rows)
    # an iteration cut short (Ctrl-C) before its result: its rows are not counted, as its result is not
    retry_ledger.append(str(a / retry_ledger.LEDGER_FILE), 3, rows[:1])
    assert cli.main(["report", str(root)]) == 0
    out = capsys.readouterr().out
    assert (
        "retry chain R3L_x_00000: 3 reflections -> 2 valid -> 1/2 in time -> 2 retried -> 1/2 changed the "
        "action -> 1 succeeded; vs a fresh sample of the same task: +0.50 ["
    ) in out
    assert "over 2 retry/control pairs (1 task) (1 row(s) of an iteration cut short before its result left out)" in out
    assert "retry chain R3L_x_00001" not in out
    chain = (root / "report" / "retry_chain.csv").read_text().splitlines()
    assert len(chain) == 2 and chain[1].startswith("R3L_x_00000,3,2,2,1,1,2,2,1,1,2,")
    assert (root / "report" / "retry_chain.png").read_bytes()[:4] == b"\x89PNG"
