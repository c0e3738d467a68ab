"""The main job never overwrites a finished run (issue 37, item 2): a second run into the same --out is
refused before Ray starts unless --overwrite says so, and the README's --no-reflect comparison gets
an --out of its own by default, so both runs survive."""

from __future__ import annotations

import os

import pytest

from rllib_r3l.cli import main


def test_rerun_into_a_finished_out_is_refused_before_anything_starts(tmp_path, capsys):
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "checkpoint").mkdir()
    rc = main.main(["--out", str(tmp_path), "--set", "model=tiny"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"--out {tmp_path}" in err and "--overwrite" in err and "Traceback" not in err
    assert (tmp_path / "summary.json").read_text() == "{}"  # untouched


def test_an_interrupted_out_is_called_interrupted_and_resume_is_offered(tmp_path):
    # re-probe 3 (M2): an interrupted run was called "a finished run", with --overwrite or another --out only
    import json

    (tmp_path / "summary.json").write_text(json.dumps({"interrupted": True, "iterations_completed": 1}))
    (tmp_path / "checkpoint").mkdir()
    with pytest.raises(Exception, match=r"already holds an interrupted run .*pass --resume to continue it"):
        main.check_out(str(tmp_path), overwrite=False)


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


@pytest.mark.parametrize(
    "flags,needle",
    [(["--num-cpus", "0"], "--num-cpus 0: must be >= 1"), (["--out", "FILE"], "is a file, not a folder")],
)
def test_main_job_refuses_cpus_below_one_and_an_out_that_is_a_file(tmp_path, capsys, flags, needle):
    """Re-probe 2 (issue 37): both were raw tracebacks (ValueError from ray.init, FileExistsError)."""
    f = tmp_path / "results.txt"
    f.write_text("not a folder")
    flags = [str(f) if a == "FILE" else a for a in flags]
    out = [] if "--out" in flags else ["--out", str(tmp_path / "run")]
    code = main.main([*flags, *out, "--set", "model=tiny", "--iterations", "1"])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_reflect_is_set_by_the_flag_only(tmp_path, capsys):
    """Re-probe 5 (P49): `--no-reflect --set reflect=true` trained with reflection into main-no-reflect."""
    code = main.main(["--no-reflect", "--out", str(tmp_path / "run"), "--set", "model=tiny", "reflect=true"])
    err = capsys.readouterr().err
    assert code == 2 and "--set reflect=True: the main job sets it with --reflect / --no-reflect" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "run" / "summary.json").exists()


def test_a_dotted_set_key_sets_one_key_of_a_mapping_option():
    """Re-probe 5 (M4): `--set env_config.num_room=3` answered "did you mean 'env_config'" (dotted keys work in
    `rllib-r3l train`)."""
    assert main._parse_set(["env_config.num_rooms=3", "env_config.max_turns=4", "lr=1e-6"]) == {
        "env_config": {"num_rooms": 3, "max_turns": 4},
        "lr": 1e-6,
    }


def test_every_set_flag_counts():
    """Re-probe 6 (P13): `--set group_size=6 --set model=tiny` applied only the last --set."""
    args = main.build_parser().parse_args(["--set", "group_size=6", "--set", "model=tiny", "lr=5e-6"])
    assert args.set == ["group_size=6", "model=tiny", "lr=5e-6"]
    assert main._parse_set(args.set) == {"group_size": 6, "model": "tiny", "lr": 5e-6}
