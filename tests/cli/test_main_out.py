"""The main job never overwrites a finished run (issue 37, item 2): a second run into the same --out is
refused before Ray starts unless --overwrite says so, and the README's --no-reflect comparison gets
an --out of its own by default, so both runs survive."""

from __future__ import annotations

import os

from rllib_r3l.cli import main


def test_rerun_into_a_finished_out_is_refused_before_anything_starts(tmp_path, capsys):
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "checkpoint").mkdir()
    rc = main.main(["--out", str(tmp_path), "--set", "model=tiny"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"--out {tmp_path}" in err and "--overwrite" in err and "Traceback" not in err
    assert (tmp_path / "summary.json").read_text() == "{}"  # untouched


def test_overwrite_flag_and_an_empty_out_pass_the_check(tmp_path):
    (tmp_path / "summary.json").write_text("{}")
    main.check_out(str(tmp_path), overwrite=True)  # no error
    main.check_out(str(tmp_path / "fresh"), overwrite=False)
    (tmp_path / "logs_only").mkdir()
    (tmp_path / "logs_only" / "main.log").write_text("an earlier run that failed before its checkpoint")
    main.check_out(str(tmp_path / "logs_only"), overwrite=False)  # nothing finished to lose


def test_no_reflect_comparison_defaults_to_its_own_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r3l = main.build_parser().parse_args([])
    base = main.build_parser().parse_args(["--no-reflect"])
    assert main.out_dir(r3l) == os.path.join(str(tmp_path), "results", "main")
    assert main.out_dir(base) == os.path.join(str(tmp_path), "results", "main-no-reflect")
    given = main.build_parser().parse_args(["--no-reflect", "--out", "x"])
    assert main.out_dir(given) == os.path.join(str(tmp_path), "x")
