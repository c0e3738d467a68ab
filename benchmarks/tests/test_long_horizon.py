"""``benchmarks/long_horizon.py`` (issue 39, item 5): the setting, which runs are done and the
console lines, the report (table, paired differences at the last common evaluation, plot) on
hand-made curves; and a real probe end to end on the tiny model (toy corridor): the sweep's child
processes, a resume whose evaluation was cut, an extension, and the refusal of a changed setting."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import learning_curves as lc
from benchmarks import learning_curves_report as lcr
from benchmarks import long_horizon as lh


def test_the_setting_is_learning_curves_on_8_rooms_and_25_turns_with_an_evaluation_schedule():
    s = lh.setting_for(eval_every=5, eval_episodes=24)
    assert s["env_config"] == {"compact_observations": True, "num_locations": 8, "max_turns": 25}
    assert "budget" not in s and "max_iterations" not in s
    assert (s["eval_every"], s["eval_episodes"], s["eval_batch"]) == (5, 24, 16)
    same = (
        "env",
        "model",
        "backend",
        "group_size",
        "tasks_per_iteration",
        "lr",
        "engine_dtype",
        "mixed_precision",
        "num_threads",
        "choice_tokenization",
        "share_prefixes",
    )
    assert {k: s[k] for k in same} == {k: lc.DEFAULT_SETTING[k] for k in same}
    config = lc.build_config(s, "r3l_paper", 0)
    config.validate()  # the environment takes 8 rooms (TWX: up to 11)
    assert config.env_config["num_locations"] == 8 and lc.option_diff(config)["reflection_style"] == "paper"


def _write(out: Path, variant: str, seed: int, recs) -> None:
    d = lcr.run_dir(out, variant, seed)
    d.mkdir(parents=True, exist_ok=True)
    (d / "curve.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [{"header": {"variant": variant}}, *recs]))


def _it(i, samples, k=None, n=8, cpu=10.0, refl=0.0, tokens=50.0):
    rec = {
        "iteration": i,
        "samples_cumulative": samples,
        "success_rate": 0.1,
        "cpu_s": cpu,
        "wall_s": cpu,
        "reflection_generated_tokens": refl,
        "trained_tokens": tokens,
    }
    if k is not None:
        rec.update(eval_successes=k, eval_episodes=n, eval_cpu_s=2.0)
    return rec


def test_a_run_is_done_at_its_target_with_its_last_iteration_evaluated(tmp_path):
    _write(tmp_path, "base", 0, [{"iteration": 0, "samples_cumulative": 0.0, "eval_successes": 1, "eval_episodes": 8}])
    _write(tmp_path, "grpo_paper", 0, [_it(1, 16), _it(2, 32, k=2)])
    _write(tmp_path, "r3l_paper", 0, [_it(1, 9), _it(2, 18)])  # cut during its last evaluation
    assert lh.is_done(lcr.run_dir(tmp_path, "base", 0), 40)  # the untrained model: iteration 0 whatever the target
    assert lh.is_done(lcr.run_dir(tmp_path, "grpo_paper", 0), 2)
    assert not lh.is_done(lcr.run_dir(tmp_path, "grpo_paper", 0), 3)  # a larger target extends it
    assert not lh.is_done(lcr.run_dir(tmp_path, "r3l_paper", 0), 2)
    # started runs first (they resume), then seed by seed the untrained model and the variants
    assert lh.next_runs(tmp_path, ["grpo_paper", "r3l_paper"], [0, 1], 2) == [
        ("r3l_paper", 0),
        ("base", 1),
        ("grpo_paper", 1),
        ("r3l_paper", 1),
    ]


def test_the_console_prints_an_iteration_once_its_record_is_complete(tmp_path):
    _write(tmp_path, "base", 0, [{"iteration": 0, "samples_cumulative": 0.0, "eval_successes": 1, "eval_episodes": 8}])
    _write(tmp_path, "grpo_paper", 0, [_it(1, 16), _it(2, 32)])  # iteration 2's evaluation (every 2) still runs
    seen: dict = {}
    runs = [("base", 0), ("grpo_paper", 0)]
    lines = lh.progress_lines(tmp_path, runs, seen, every=2, iterations=4)
    assert lines == [
        "base/seed0 iteration 0 (untrained): held-out 1/8",
        "grpo_paper/seed0 iteration 1/4: 16 trajectories, success 0.10, 10 s",
    ]
    assert lh.progress_lines(tmp_path, runs, seen, every=2, iterations=4) == []
    _write(tmp_path, "grpo_paper", 0, [_it(1, 16), _it(2, 32, k=3)])
    assert lh.progress_lines(tmp_path, runs, seen, every=2, iterations=4) == [
        "grpo_paper/seed0 iteration 2/4: 32 trajectories, success 0.10, 10 s held-out 3/8"
    ]


def _folder(out: Path) -> None:
    """Two seeds of the default pair; seed 1's R3L stopped before its iteration-4 evaluation."""
    lc.check_setting(out, lh.setting_for(2, 8), {"grpo_paper": {}, "r3l_paper": {}})
    for s, base_k in ((0, 1), (1, 0)):
        _write(
            out, "base", s, [{"iteration": 0, "samples_cumulative": 0.0, "eval_successes": base_k, "eval_episodes": 8}]
        )
    _write(out, "grpo_paper", 0, [_it(1, 16), _it(2, 32, k=2), _it(3, 48), _it(4, 64, k=4)])
    _write(out, "grpo_paper", 1, [_it(1, 16), _it(2, 32, k=1), _it(3, 48), _it(4, 64, k=2)])
    _write(out, "r3l_paper", 0, [_it(1, 9, refl=100), _it(2, 20, k=3, refl=50), _it(3, 29), _it(4, 38, k=6)])
    _write(out, "r3l_paper", 1, [_it(1, 8, refl=10), _it(2, 17, k=2), _it(3, 25, tokens=0.0)])


def test_curve_points_start_at_the_seeds_untrained_model_and_runs_sum_their_costs(tmp_path):
    _folder(tmp_path)
    pts = lh.curve_points(tmp_path, "r3l_paper", 0)
    assert [(p["iteration"], p["samples"], p["k"], p["n"]) for p in pts] == [
        (0, 0.0, 1, 8),
        (2, 20, 3, 8),
        (4, 38, 6, 8),
    ]
    r = lh.run_summary(tmp_path, "r3l_paper", 1)
    assert (r["iterations"], r["samples"], r["updates"], r["cpu_s"], r["eval_cpu_s"], r["reflection_tokens"]) == (
        3,
        25,
        2,
        30.0,
        2.0,
        10.0,
    )
    assert r["samples_per_iteration"] == pytest.approx(25 / 3)
    assert lh.run_summary(tmp_path, "r3l_paper", 2) is None


def test_the_report_tables_each_run_and_pairs_the_seeds_at_the_last_common_evaluation(tmp_path):
    _folder(tmp_path)
    rows = lh.summaries(tmp_path, ["grpo_paper", "r3l_paper"], [0, 1])
    pairs = lh.paired_at_last_common(rows)
    assert len(pairs) == 1
    p = pairs[0]
    # seed 1's R3L has no evaluation at 4: the last iteration all four runs evaluated is 2
    assert (p["variant"], p["reference"], p["iteration"], p["seeds"]) == ("r3l_paper", "grpo_paper", 2, [0, 1])
    assert p["diff"]["mean"] == pytest.approx(((3 - 2) / 8 + (2 - 1) / 8) / 2)
    assert p["ratio"]["ratios"] == {0: 1.5, 1: 2.0} and p["ratio"]["ratio"] == pytest.approx(math.sqrt(3))
    text = lh.report(tmp_path, ["grpo_paper", "r3l_paper"], [0, 1])
    assert "| variant | seed | iterations | held-out @0 | held-out @2 | held-out @4 | trajectories |" in text
    assert "| grpo_paper | 0 | 4 | 1/8 | 2/8 | 4/8 | 64 | 16.0 | 4 | 40 | 4 | 0 |" in text
    assert "| r3l_paper | 1 | 3 | 0/8 | 2/8 | - | 25 | 8.3 | 2 | 30 | 2 | 10 |" in text
    assert "| r3l_paper | grpo_paper | 2 | 0, 1 | +0.125, +0.125 |" in text and "1.50, 2.00" in text
    assert "8 test-fold games every 2 iterations" in text and "'num_locations': 8" in text
    assert (tmp_path / "summary.md").read_text().strip() == text and (tmp_path / "long_horizon.png").stat().st_size > 0


def test_one_seed_reports_without_a_paired_interval(tmp_path):
    _folder(tmp_path)
    text = lh.report(tmp_path, ["grpo_paper", "r3l_paper"], [0])
    assert "need two seeds" in text and "| r3l_paper | 0 | 4 | 1/8 | 3/8 | 6/8 | 38 |" in text


def test_each_iteration_is_saved_then_recorded_then_swapped_in(tmp_path):
    class Algo:  # what save_and_record asks of the algorithm
        iteration = 0

        def save_to_path(self, path):
            Path(path).mkdir()
            (Path(path) / "iteration").write_text(str(self.iteration))

    algo, header, recs = Algo(), {"variant": "grpo_paper"}, []
    for i in (1, 2):
        algo.iteration = i
        lc.save_and_record(tmp_path, algo, header, recs, {"iteration": i})
    assert (tmp_path / "checkpoint" / "iteration").read_text() == "2"
    assert not (tmp_path / "checkpoint.tmp").exists() and not (tmp_path / "checkpoint.old").exists()
    assert lcr.read_curve(tmp_path) == (header, [{"iteration": 1}, {"iteration": 2}])


def test_a_curve_without_its_checkpoint_is_refused_not_overwritten(tmp_path):
    d = lcr.run_dir(tmp_path, "grpo_paper", 0)
    _write(tmp_path, "grpo_paper", 0, [_it(1, 16, k=1)])
    with pytest.raises(SystemExit, match="no checkpoint to resume"):
        with lc.opened_run(d, tmp_path, lh.setting_for(), "grpo_paper", 0):
            pass
    assert lcr.read_curve(d)[1] == [_it(1, 16, k=1)]


# ---------------------------------------------------------------------------------------------------
@pytest.mark.integration
def test_the_probe_runs_end_to_end_resumes_a_cut_evaluation_extends_and_refuses_another_setting(
    tmp_path, tiny_model_dir, capsys
):
    """The tiny model on the toy corridor, evaluated every iteration on 2 games, one at a time: the
    sweep's children evaluate the untrained model and train GRPO one iteration; that iteration's
    evaluation is then struck from the curve (a kill during it), and a second call (target 2) redoes
    it first, without training iteration 1 again, then trains and evaluates iteration 2."""
    setting = dict(
        lh.setting_for(eval_every=1, eval_episodes=2),
        env="r3l/ToyCorridor",
        env_config={"num_rooms": 3},
        model="tiny",
        backend="transformers",
        group_size=4,
        lr=1e-4,
        micro_batch_tokens=None,
        num_threads=None,
        eval_batch=1,
        training={"max_response_tokens": 8, "max_reflection_tokens": 24},
    )
    lc.check_setting(tmp_path, setting, lc.variant_diffs(setting, [lc.BASE, "grpo_paper"]))
    lh.sweep(tmp_path, setting, ["grpo_paper"], [0], parallel=1, iterations=1)
    console = capsys.readouterr().out
    assert "base/seed0 iteration 0 (untrained): held-out" in console
    assert "grpo_paper/seed0 iteration 1/1: 8 trajectories" in console and "FAILED" not in console
    d = lcr.run_dir(tmp_path, "grpo_paper", 0)
    assert (d / "checkpoint").exists() and not (d / lc.LOCK).exists()  # kept: a larger target extends the run
    header, recs = lcr.read_curve(d)
    assert [r["iteration"] for r in recs] == [1] and recs[0]["eval_episodes"] == 2 and header["git_commit"]

    first = {k: v for k, v in recs[0].items() if k not in lh.EVAL_KEYS}
    lc._write_curve(d, header, [first])  # killed during iteration 1's evaluation
    assert not lh.is_done(d, 1)
    recs = lh.run_one(tmp_path, setting, "grpo_paper", 0, iterations=2)
    header, on_file = lcr.read_curve(d)
    assert on_file == recs and [r["iteration"] for r in recs] == [1, 2]
    assert {k: v for k, v in recs[0].items() if k not in lh.EVAL_KEYS} == first  # not trained again
    assert all(0 <= r["eval_successes"] <= 2 for r in recs) and [r["iteration"] for r in header["resumed"]] == [1]
    assert recs[1]["samples_cumulative"] == 16 and lh.is_done(d, 2)
    assert [p["iteration"] for p in lh.curve_points(tmp_path, "grpo_paper", 0)] == [0, 1, 2]
    assert "| grpo_paper | 0 | 2 |" in lh.report(tmp_path, ["grpo_paper"], [0])

    with pytest.raises(SystemExit, match=r"eval_every: 1 there, 5 now.*--out"):  # the real setting
        lh.main(["--out", str(tmp_path), "--variants", "grpo_paper"])
    with pytest.raises(SystemExit, match=r"eval_episodes: 2 there, 3 now"):
        lc.check_setting(tmp_path, dict(setting, eval_episodes=3), {})
