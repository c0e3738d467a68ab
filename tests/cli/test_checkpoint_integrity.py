"""Atomic checkpoints (issue 37): a crash or a full disk mid-write never leaves a corrupt latest checkpoint.

The main job writes ``checkpoint.partial``, marks it complete (``r3l_checkpoint.json``, written last) and
renames it into place; ``--resume`` picks the newest complete checkpoint, names the incomplete ones it
skips and says which one it resumes from. Unit tests on RLlib's layout (no Ray), then the real main job
on the tiny model (a crash mid-save simulated on a real checkpoint's files).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from rllib_r3l import checkpoint_integrity as ci
from tests.cli.fake_checkpoints import fake_checkpoint


def _snapshot(path: Path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


# ==================================================================================================
# No Ray: RLlib's layout by hand
# ==================================================================================================
@pytest.mark.parametrize(
    "damage, needle",
    [
        (lambda c: _truncate(c / "algorithm_state.pkl", 0.9), "algorithm_state.pkl: truncated"),
        (lambda c: (c / "learner_group" / "state.pkl").write_bytes(b""), "learner_group/state.pkl: empty file"),
        (lambda c: (c / "rllib_checkpoint.json").unlink(), "rllib_checkpoint.json: missing"),
        (lambda c: (c / "learner_group" / "metadata.json").unlink(), "learner_group/metadata.json: missing"),
        (lambda c: (c / "learner_group" / "metadata.json").write_text("{\"state_fi"), "metadata.json: not valid JSON"),
        (lambda c: (c / "learner_group" / "state.pkl").unlink(), "learner_group/state.pkl: missing"),
        (lambda c: shutil.rmtree(c / "learner_group"), "learner_group/: missing"),
    ],
)
def test_an_incomplete_checkpoint_is_named_with_the_file(tmp_path, damage, needle):
    ckpt = fake_checkpoint(tmp_path / "checkpoint_000001")
    assert ci.problem(str(ckpt)) is None
    damage(ckpt)
    assert needle in ci.problem(str(ckpt))
    assert ci.problem(str(tmp_path / "nothing")) == "missing"


def test_the_marker_holds_every_file_and_its_size(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "checkpoint")
    ci.write_marker(str(ckpt), iteration=3)
    assert ci.marker(str(ckpt))["iteration"] == 3 and ci.problem(str(ckpt)) is None
    with open(ckpt / "learner_group" / "state.pkl", "ab") as f:  # same file, another size (written over)
        f.write(b"x")
    assert "learner_group/state.pkl: " in ci.problem(str(ckpt)) and "were written" in ci.problem(str(ckpt))


def _save(path):
    fake_checkpoint(Path(path))


def test_a_full_disk_mid_save_keeps_the_previous_checkpoint_and_frees_the_partial_one(tmp_path):
    path = tmp_path / "checkpoint"
    ci.save_atomically(_save, str(path), iteration=1)
    before = _snapshot(path)

    def disk_full(p):  # part of the files written, then ENOSPC
        fake_checkpoint(Path(p))
        _truncate(Path(p) / "learner_group" / "state.pkl")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        ci.save_atomically(disk_full, str(path), iteration=2)
    assert _snapshot(path) == before and ci.marker(str(path))["iteration"] == 1
    assert not os.path.exists(str(path) + ci.PARTIAL)
    assert ci.newest_complete(ci.candidates(str(path))) == (str(path), [])


@pytest.mark.parametrize("crash_at_rename", [1, 2])
def test_a_crash_between_the_renames_leaves_a_complete_checkpoint_resume_finds(tmp_path, monkeypatch, crash_at_rename):
    path = tmp_path / "checkpoint"
    ci.save_atomically(_save, str(path), iteration=1)
    calls = []
    real_rename = os.rename

    def crashing_rename(src, dst):
        calls.append(src)
        if len(calls) == crash_at_rename:
            raise KeyboardInterrupt  # the process dies here
        real_rename(src, dst)

    monkeypatch.setattr(ci.os, "rename", crashing_rename)
    with pytest.raises(KeyboardInterrupt):
        ci.save_atomically(_save, str(path), iteration=2)
    monkeypatch.setattr(ci.os, "rename", real_rename)
    chosen, skipped = ci.newest_complete(ci.candidates(str(path)))
    assert chosen == str(path) + ci.PARTIAL and not skipped  # the new one, complete, not yet in place
    assert ci.marker(chosen)["iteration"] == 2
    ci.adopt(str(path), chosen)
    assert ci.marker(str(path))["iteration"] == 2 and ci.problem(str(path)) is None


def test_evaluate_on_a_trial_dir_skips_an_incomplete_latest_checkpoint(tmp_path, capsys):
    from rllib_r3l.cli.export import find_checkpoint

    trial = tmp_path / "R3L_x_00000"
    fake_checkpoint(trial / "checkpoint_000000")
    fake_checkpoint(trial / "checkpoint_000001")
    _truncate(trial / "checkpoint_000001" / "algorithm_state.pkl")  # a copy cut short
    assert find_checkpoint(str(trial)) == str(trial / "checkpoint_000000")
    assert "skipping incomplete checkpoint " + str(trial / "checkpoint_000001") in capsys.readouterr().err


# ==================================================================================================
# The real main job (tiny model, ToyWord, transformers): saved atomically, resumed from the newest complete
# ==================================================================================================
ARGS = [
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
    "seed=0",
    "sampling_seed=0",
]


@pytest.fixture(scope="module")
def main_run(tmp_path_factory):
    """One iteration of the main job; its checkpoint at OUT/checkpoint."""
    from rllib_r3l.cli import main

    out = tmp_path_factory.mktemp("main") / "run"
    assert main.main(["--iterations", "1", "--out", str(out), *ARGS]) == 0
    return out


@pytest.mark.integration
def test_the_main_jobs_checkpoint_is_complete_and_damage_to_a_real_one_is_named(main_run, tmp_path):
    ckpt = main_run / "checkpoint"
    assert ci.problem(str(ckpt)) is None and ci.marker(str(ckpt))["iteration"] == 1
    assert ci.candidates(str(ckpt)) == [str(ckpt)]  # no partial or previous folder left
    state = Path("learner_group/learner/rl_module/default_policy/module_state.pkl")
    for marked in (True, False):  # the main job's (marker) and a Tune-style one (RLlib's structure only)
        copy = tmp_path / f"copy-{marked}"
        shutil.copytree(ckpt, copy)
        if not marked:
            (copy / ci.MARKER).unlink()
        assert ci.problem(str(copy)) is None
        _truncate(copy / state)
        assert ci.problem(str(copy)).startswith(str(state) + ": ")
    # re-probe 7 (S2, M6): whole files with the wrong content, a pickled {} over the algorithm's state (restored
    # as iteration 0) or over the module's weights (chosen by --resume, then the trial failed)
    import pickle

    for name, needle in (
        ("algorithm_state.pkl", "algorithm_state.pkl: holds no training_iteration (not the state R3L saved)"),
        (str(state), f"{state}: holds no weights (5 bytes)"),
    ):
        copy = tmp_path / f"content-{Path(name).name}"
        shutil.copytree(ckpt, copy)
        (copy / ci.MARKER).unlink()  # a Tune-style checkpoint: no marker whose sizes would catch it first
        with open(copy / name, "wb") as f:
            pickle.dump({}, f)
        assert ci.problem(str(copy)) == needle


@pytest.mark.integration
def test_resume_skips_what_a_crash_mid_save_left_and_continues_from_the_complete_checkpoint(main_run, capfd):
    from rllib_r3l.cli import main

    ckpt = main_run / "checkpoint"
    intact = _snapshot(ckpt)
    # a crash (kill -9, power) while saving a later iteration: checkpoint.partial holds part of the files
    partial = Path(str(ckpt) + ci.PARTIAL)
    shutil.copytree(ckpt, partial)
    (partial / ci.MARKER).unlink()
    _truncate(partial / "learner_group" / "learner" / "state.pkl")
    assert _snapshot(ckpt) == intact  # the latest complete checkpoint is untouched

    rc = main.main(["--out", str(main_run), "--iterations", "2", "--num-cpus", "2", "--resume"])
    shown = "".join(capfd.readouterr())
    assert rc == 0, shown[-3000:]
    assert f"skipping incomplete checkpoint {partial} (learner_group/learner/state.pkl: truncated" in shown
    assert f"resuming from {ckpt} (iteration 1)" in shown and "iter 2/2 | success " in shown
    assert "iter 1/2" not in shown  # iteration 1 is not run again
    summary = json.loads((main_run / "summary.json").read_text())
    assert summary["iterations_completed"] == 2 and [r["iteration"] for r in summary["per_iteration"]] == [1, 2]
    assert summary["resumed_from"] == str(ckpt)
    assert ci.marker(str(ckpt))["iteration"] == 2 and ci.candidates(str(ckpt)) == [str(ckpt)]

    # nothing left to do: one line, before Ray starts
    rc = main.main(["--out", str(main_run), "--iterations", "2", "--resume"])
    err = capfd.readouterr().err
    assert rc == 2 and "is at iteration 2 already, --iterations 2" in err
    rc = main.main(["--out", str(main_run), "--resume", "--set", "lr=0.1"])
    assert rc == 2 and "--resume with --set lr=0.1" in capfd.readouterr().err


def test_resume_without_a_complete_checkpoint_is_one_line(tmp_path, capsys):
    from rllib_r3l.cli import main

    out = tmp_path / "run"
    fake_checkpoint(out / "checkpoint")
    (out / "checkpoint" / "algorithm_state.pkl").write_bytes(b"")
    assert main.main(["--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "--resume: no complete checkpoint in" in err and "algorithm_state.pkl: empty file" in err
    assert main.main(["--out", str(out), "--resume", "--overwrite"]) == 2
    assert "--resume and --overwrite exclude each other" in capsys.readouterr().err


@pytest.mark.integration
def test_from_checkpoint_and_restore_of_a_cut_checkpoint_name_the_file(ray_session, tmp_path):
    """Re-probe 3 leftover: ``R3L.from_checkpoint`` of a checkpoint whose module_state.pkl a full disk cut
    raised the unpickler's error, naming no file. Both doors now check the folder first."""
    from rllib_r3l import R3L
    from tests.scripted_rllib import tiny_config

    algo = tiny_config().build_algo()
    try:
        path = algo.save_to_path(str(tmp_path / "ckpt"))
        cut = os.path.join(path, "learner_group", "learner", "rl_module", "default_policy", "module_state.pkl")
        with open(cut, "r+b") as f:
            f.truncate(os.path.getsize(cut) // 2)
        needle = "learner_group/learner/rl_module/default_policy/module_state.pkl: truncated"
        with pytest.raises(ValueError, match=f"not a complete R3L checkpoint \\({needle}"):
            R3L.from_checkpoint(path)
        with pytest.raises(ValueError, match=f"not a complete R3L checkpoint \\({needle}"):
            algo.restore_from_path(path)
    finally:
        algo.stop()


@pytest.mark.integration
def test_from_checkpoint_of_a_file_says_it_wants_a_checkpoint_folder(tmp_path):
    """Re-probe 11: ``R3L.from_checkpoint("exp.yaml")`` got RLlib's "Cannot restore a v0 checkpoint"."""
    from rllib_r3l import R3L

    f = tmp_path / "exp.yaml"
    f.write_text("t: {run: R3L}\n")
    with pytest.raises(ValueError, match=r"exp.yaml: a file, not a checkpoint folder; pass a checkpoint_\* folder"):
        R3L.from_checkpoint(str(f))


@pytest.mark.integration
def test_a_module_state_without_weights_is_refused_not_loaded_as_the_base_model(ray_session, tmp_path):
    """Re-probe 6 (P17): module_state.pkl replaced by a valid pickle of {} restored "fine", with the base
    model's weights in place of the trained ones."""
    import pickle

    from rllib_r3l import R3L
    from tests.scripted_rllib import tiny_config

    algo = tiny_config().build_algo()
    try:
        path = algo.save_to_path(str(tmp_path / "ckpt"))
    finally:
        algo.stop()
    with open(
        os.path.join(path, "learner_group", "learner", "rl_module", "default_policy", "module_state.pkl"), "wb"
    ) as f:
        pickle.dump({}, f)
    # the folder check names the file first (re-probe 7: --resume --dry-run chose it, then the trial failed);
    # past it, set_state refuses the state itself
    with pytest.raises(ValueError, match=r"default_policy/module_state.pkl: holds no weights \(5 bytes\)"):
        R3L.from_checkpoint(path)
    algo = tiny_config().build_algo()
    try:
        with pytest.raises(Exception, match=r"the module state to restore holds none of the model's \d+ weights"):
            algo.learner_group.set_state({"learner": {"rl_module": {"default_policy": {}}}})
    finally:
        algo.stop()
