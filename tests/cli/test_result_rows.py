"""Row files across interruptions (issue 37, re-probe 4): a cut last row is set aside before a resume
appends to the file, and a progress.csv whose resumed rows carry more keys than its header (Tune's CSV
logger keeps the first header: values land under the wrong names) is written again from result.json."""

from __future__ import annotations

import csv
import json

import pytest

from rllib_r3l.cli.result_rows import CUT, drop_cut_rows, rebuild_progress_csv


def test_a_cut_last_row_is_set_aside_so_the_next_row_starts_on_its_own_line(tmp_path):
    whole = json.dumps({"training_iteration": 1}) + "\n"
    (tmp_path / "result.json").write_text(whole + '{"training_iteration": 2, "env_ru')
    (tmp_path / "progress.csv").write_text("training_iteration\n1\n")  # whole: untouched
    assert drop_cut_rows(str(tmp_path)) == ["result.json"]
    assert (tmp_path / "result.json").read_text() == whole
    assert (tmp_path / ("result.json" + CUT)).read_text() == '{"training_iteration": 2, "env_ru\n'
    assert (tmp_path / "progress.csv").read_text() == "training_iteration\n1\n"
    assert drop_cut_rows(str(tmp_path)) == []  # whole files: nothing to do


def test_a_progress_csv_shifted_by_a_resume_is_rebuilt_from_result_json(tmp_path):
    rows = [
        {"training_iteration": 1, "env_runners": {"success_rate": 0.5}, "config": {"lr": 1}},
        {
            "training_iteration": 2,
            "env_runners": {"success_rate": 1.0},
            "config": {"lr": 1},
            "timers": {"synch_env_connectors": 0.01},
        },
    ]  # RLlib's key after a restore
    (tmp_path / "result.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # what Tune's logger wrote: the first run's header, the resumed row with one more field
    (tmp_path / "progress.csv").write_text("training_iteration,env_runners/success_rate\n1,0.5\n2,1.0,0.01\n")
    assert rebuild_progress_csv(str(tmp_path))
    with open(tmp_path / "progress.csv", newline="") as f:
        got = list(csv.DictReader(f))
    assert [r["env_runners/success_rate"] for r in got] == ["0.5", "1.0"]
    assert [r["timers/synch_env_connectors"] for r in got] == ["", "0.01"]
    assert "config/lr" not in got[0]
    assert not rebuild_progress_csv(str(tmp_path))  # consistent now: left alone


def test_columns_in_another_order_with_as_many_fields_are_rebuilt_too(tmp_path):
    """After a second resume Tune's logger wrote rows in its own column order under the old header, with as
    many fields: training_iteration read 1.89..., and rows run again were not set aside."""
    rows = [{"training_iteration": i, "time_total_s": 1.5 * i} for i in (1, 2, 3)]
    (tmp_path / "result.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "progress.csv").write_text("training_iteration,time_total_s\n1,1.5\n2,3.0\n4.5,3\n")
    assert rebuild_progress_csv(str(tmp_path))
    with open(tmp_path / "progress.csv", newline="") as f:
        assert [r["training_iteration"] for r in csv.DictReader(f)] == ["1", "2", "3"]
    assert not rebuild_progress_csv(str(tmp_path))
    (tmp_path / "progress.csv").write_text("training_iteration,time_total_s\n1,1.5\n2,3.0\n2,3.0\n3,4.5\n")
    assert rebuild_progress_csv(str(tmp_path))  # a row run again and kept: not result.json's rows either


@pytest.mark.subprocess
def test_a_full_disk_during_the_rebuild_raises_oserror_and_leaves_no_temporary(tmpfs):
    """Re-probe 5 (P101): the rebuild after tune.run met the full disk that had cut progress.csv; the driver
    died with a traceback, no trial summary and a 0-byte progress.csv.r3l-tmp. The rebuild raises OSError
    (launch.run reports it in one line and goes on) and leaves no temporary behind."""
    import errno
    import os

    import pytest

    disk = tmpfs("full", "size=64k")
    row = {"training_iteration": 1, "env_runners": {"success_rate": 0.5, "pad": "x" * 20000}}
    (disk / "result.json").write_text(json.dumps(row) + "\n" + json.dumps({**row, "training_iteration": 2}) + "\n")
    (disk / "progress.csv").write_text("training_iteration,env_runners/success_rate\n1,0.5\n2")  # cut mid-row
    with open(disk / "filler", "wb") as f:  # what is left of the disk after result.json
        try:
            f.write(b"\0" * (1 << 20))
        except OSError:
            pass
    with pytest.raises(OSError) as e:
        rebuild_progress_csv(str(disk))
    assert e.value.errno == errno.ENOSPC
    assert sorted(os.listdir(disk)) == ["filler", "progress.csv", "result.json"]


def test_a_resume_drops_the_decisions_tune_saved_but_never_carried_out(tmp_path):
    """Re-probe 6 soak (anomaly A): a trial that failed while saving left {trial: STOP} in Tune's saved
    runner_data; the resume applied it after its first checkpoint (TERMINATED at iteration 2 of 4, the CLI
    saying INTERRUPTED) and every later --resume trained nothing."""
    from rllib_r3l.cli.resume_from import drop_pending_decisions, point_tune_at

    state = tmp_path / "experiment_state-2026-12-05_19-00-00.json"
    raw = {
        "trial_data": [],
        "runner_data": {
            "_cached_trial_decisions": {"74a05_00000": "STOP"},
            "_queued_trial_decisions": {"74a05_00000": "STOP"},
            "_iteration": 9,
        },
    }
    state.write_text(json.dumps(raw))
    point_tune_at(str(tmp_path), [])
    got = json.loads(state.read_text())["runner_data"]
    assert got == {"_cached_trial_decisions": {}, "_queued_trial_decisions": {}, "_iteration": 9}
    assert drop_pending_decisions(str(tmp_path)) is False  # nothing left to drop: the file is left alone
