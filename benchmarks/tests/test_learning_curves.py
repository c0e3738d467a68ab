"""``benchmarks/learning_curves.py`` and its report (issue 39, item 4): the budget rule and curves on
hand values; each variant's options against ``R3LConfig()`` as ``setting.json`` records them, and the
refusals of a changed setting; the paired difference and ratio, and the reflection cost, on hand-made
run folders; the run order and the locks; and a real cut-short run that resumes from its checkpoint
(tiny model, toy corridor). The intervals are ``benchmarks/harness.py``'s (``test_harness.py``)."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest

from benchmarks import harness
from benchmarks import learning_curves as lc
from benchmarks import learning_curves_report as lcr

# What the common setting changes in R3LConfig() (hand-checked against rllib_r3l/options.py and
# R3LConfig.__init__: lr 1e-6, micro_batch_tokens 2048, backend "auto", mixed_precision "auto",
# num_threads None, backend_options {}, env_config {}); group 8, 2 tasks, micro-batch 4 and shared
# prefixes are R3LConfig's own defaults, so they are not differences.
COMMON = {
    "backend": "vllm",
    "backend_options": {"choice_tokenization": "canonical", "dtype": "float32"},
    "env_config": {"compact_observations": True},
    "lr": 1e-5,
    "micro_batch_tokens": 1024,
    "mixed_precision": "none",
    "num_threads": 1,
}


def test_a_run_trains_until_its_budget_exactly():
    assert lc.keep_training(0, 64) and lc.keep_training(63, 64)  # 1 left: one more, capped at 1 episode
    assert not lc.keep_training(64, 64) and not lc.keep_training(70, 64)
    # the samples an iteration spent: every episode started; an older record: bases + retries
    assert lc._samples_of({"episodes_started": 7.0, "num_episodes": 4.0, "num_retries": 2.0}) == 7.0
    assert lc._samples_of({"num_episodes": 4.0, "num_retries": 2.0}) == 6.0


def test_interpolate_curve_is_linear_inside_and_nan_outside():
    got = lcr.interpolate_curve([8, 16, 32], [0.0, 0.5, 0.25], [4, 8, 12, 24, 32, 40])
    assert math.isnan(got[0]) and math.isnan(got[-1])
    assert got[1:5] == pytest.approx([0.0, 0.25, 0.375, 0.25])


# ---------------------------------------------------------------------------------------------------
# the setting: every option that differs from R3LConfig()
def test_each_variant_records_exactly_its_differences_from_r3lconfig_defaults():
    diffs = lc.variant_diffs(dict(lc.DEFAULT_SETTING), [lc.BASE, "grpo_paper", "grpo_ds", "r3l", "r3l_oracle"])
    assert diffs[lc.BASE] == COMMON  # the untrained model: the common setting alone
    # the paper's GRPO (appendix): no R3L component, std-normalised, KL 0.01, the ratio clipped at 0.2
    # (0.2 is R3LConfig's clip default, and dynamic sampling's default is 0: neither is a difference)
    assert diffs["grpo_paper"] == {
        **COMMON,
        "reflect": False,
        "pivotal_credit": False,
        "positive_amplification": False,
        "std_normalize": True,
        "kl_coef": 0.01,
        "use_importance_ratio": True,
    }
    assert diffs["grpo_ds"] == {**diffs["grpo_paper"], "dynamic_sampling_rounds": 2}  # the main job's
    assert diffs["r3l"] == {**COMMON, "dynamic_sampling_rounds": 2}  # today's R3L is the defaults
    assert diffs["r3l_oracle"] == {**diffs["r3l"], "reflector": "oracle"}
    # per seed, not per setting: never recorded, so seeds share one record
    c0, c1 = lc.build_config(dict(lc.DEFAULT_SETTING), "r3l", 0), lc.build_config(dict(lc.DEFAULT_SETTING), "r3l", 1)
    assert c0.sampling_seed == 0 and c1.sampling_seed == 1 and lc.option_diff(c0) == lc.option_diff(c1)
    assert lc.VARIANTS["grpo_ds"]["dynamic_sampling_rounds"] == lc.MAIN_JOB_SETTINGS["dynamic_sampling_rounds"]


def test_the_paper_variants_use_the_papers_settings():
    assert {
        k: lc.VARIANTS["grpo_paper"][k]
        for k in ("kl_coef", "use_importance_ratio", "clip_ratio_low", "clip_ratio_high", "std_normalize", "reflect")
    } == {
        "kl_coef": 0.01,
        "use_importance_ratio": True,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.2,
        "std_normalize": True,
        "reflect": False,
    }
    assert lc.VARIANTS["r3l_paper"] == {
        "reflection_style": "paper",
        "reflection_temperature": 0.7,
        "aux_items": ["reflection_sft", "retry_sft"],
        "loss_aggregation": "paper",
        "max_reflection_tokens": 512,
        "dynamic_sampling_rounds": 0,
    }
    assert lcr.PAIRS == {"r3l": "grpo_ds", "r3l_oracle": "grpo_ds", "r3l_paper": "grpo_paper", "grpo_ds": "grpo_paper"}


def test_a_sweep_folder_refuses_another_common_setting_and_names_the_field(tmp_path):
    diffs = {"r3l": {"lr": 1e-5}}
    lc.check_setting(tmp_path, dict(lc.DEFAULT_SETTING), diffs)
    lc.check_setting(tmp_path, dict(lc.DEFAULT_SETTING), diffs)  # the same setting resumes
    with pytest.raises(SystemExit, match=r"budget: 64 there, 96 now.*--out"):
        lc.check_setting(tmp_path, dict(lc.DEFAULT_SETTING, budget=96), diffs)
    rec = json.loads((tmp_path / "setting.json").read_text())
    assert rec["common"]["budget"] == 64 and rec["variants"] == diffs  # the refused run changed nothing


def test_a_recorded_variant_whose_options_changed_is_refused_naming_each_field(tmp_path):
    lc.check_setting(tmp_path, dict(lc.DEFAULT_SETTING), {"r3l": {"dynamic_sampling_rounds": 2, "lr": 1e-5}})
    # a default changed in the code since: the built config now differs in two fields
    with pytest.raises(SystemExit) as e:
        lc.check_setting(tmp_path, dict(lc.DEFAULT_SETTING), {"r3l": {"lr": 1e-5, "reflect_on": "all"}})
    msg = str(e.value)
    assert "variant r3l: dynamic_sampling_rounds: 2 there, '(R3LConfig default)' now" in msg
    assert "variant r3l: reflect_on: '(R3LConfig default)' there, 'all' now" in msg
    # a run about to start checks its own built options against the record too
    lc.check_recorded(tmp_path, "r3l", {"dynamic_sampling_rounds": 2, "lr": 1e-5})
    lc.check_recorded(tmp_path, "grpo_ds", {"anything": 1})  # not recorded: nothing to hold it to
    with pytest.raises(SystemExit, match=r"variant r3l .*dynamic_sampling_rounds: 2 there, 3 now"):
        lc.check_recorded(tmp_path, "r3l", {"dynamic_sampling_rounds": 3, "lr": 1e-5})


def test_a_new_variant_is_added_to_an_existing_folder_and_recorded_ones_kept(tmp_path):
    lc.check_setting(tmp_path, dict(lc.DEFAULT_SETTING), {"base": {"lr": 1e-5}, "r3l": {"lr": 1e-5, "x": 1}})
    lc.check_setting(tmp_path, dict(lc.DEFAULT_SETTING), {"r3l": {"lr": 1e-5, "x": 1}, "grpo_ds": {"kl_coef": 0.01}})
    rec = json.loads((tmp_path / "setting.json").read_text())
    assert rec["variants"] == {"base": {"lr": 1e-5}, "r3l": {"lr": 1e-5, "x": 1}, "grpo_ds": {"kl_coef": 0.01}}
    assert rec["common"] == json.loads(json.dumps(lc.DEFAULT_SETTING))


def test_a_v3_folder_is_reported_but_takes_no_new_runs(tmp_path):
    (tmp_path / "setting.json").write_text(json.dumps(lc.DEFAULT_SETTING))  # v3: the common setting alone
    with pytest.raises(SystemExit, match="predates per-variant options"):
        lc.check_setting(tmp_path, dict(lc.DEFAULT_SETTING), {"r3l": {}})
    assert lcr.read_setting(tmp_path) == {"common": lc.DEFAULT_SETTING, "variants": {}}


@pytest.mark.subprocess
def test_git_commit_names_head_and_flags_tracked_changes():
    got = lc.git_commit()
    assert got == "unknown" or re.fullmatch(r"[0-9a-f]{40}(-dirty)?", got), got


# ---------------------------------------------------------------------------------------------------
# the statistics and the report
def test_paired_ratio_on_hand_values_and_not_with_a_zero():
    r = harness.paired_ratio({0: 0.5, 1: 0.25, 2: 0.75, 3: None}, {0: 0.25, 1: 0.25, 2: 0.25})
    assert r["units"] == [0, 1, 2] and r["ratios"] == {0: 2.0, 1: 1.0, 2: 3.0} and r["mean"] == pytest.approx(2.0)
    # logs ln 2, 0, ln 3: mean ln 6 / 3 (the geometric mean 6^(1/3)), sd 0.55555, t(2 df) 4.3026527
    assert r["ratio"] == pytest.approx(6 ** (1 / 3)) and r["log_std"] == pytest.approx(0.5555484, rel=1e-6)
    assert (r["lo"], r["hi"]) == pytest.approx((0.457122, 7.223299), rel=1e-5)
    assert lcr.goal_met(r) is False  # 1.82x, but the interval holds 1.0
    tight = harness.paired_ratio({0: 0.5, 1: 0.6, 2: 0.55}, {0: 0.25, 1: 0.3, 2: 0.25})
    assert (tight["ratio"], tight["lo"]) == pytest.approx((2.06456, 1.80078), rel=1e-5) and lcr.goal_met(tight)
    zero = harness.paired_ratio({0: 0.5, 1: 0.25}, {0: 0.25, 1: 0.0})
    assert (
        zero["zero"] == {1: "b"} and math.isnan(zero["ratio"]) and math.isnan(zero["mean"]) and math.isnan(zero["lo"])
    )
    assert zero["ratios"][0] == 2.0 and math.isnan(zero["ratios"][1]) and lcr.goal_met(zero) is None
    assert lcr.ratio_text(zero) == ("2.00, -", "n/a", "n/a (seed 1: 0 successes (the reference))")
    assert harness.paired_ratio({0: 0.0}, {0: 0.5})["zero"] == {0: "a"}
    assert lcr.ratio_text(r) == ("2.00, 1.00, 3.00", "2.00", "1.82 [0.46, 7.22]")


def _run(out: Path, variant: str, seed: int, its, k: int, n: int = 32) -> None:
    d = lcr.run_dir(out, variant, seed)
    d.mkdir(parents=True)
    lines = [{"header": {"variant": variant}}] + its
    (d / "curve.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (d / "final.json").write_text(json.dumps({"eval_successes": k, "eval_episodes": n}))


def _it(i, samples, cpu, retries=0.0, retry_ok=None, valid=0.0, pivot=None, tokens=100.0, **more):
    return {
        "iteration": i,
        "samples_cumulative": samples,
        "cpu_s": cpu,
        "wall_s": cpu,
        "success_rate": 0.25,
        "num_retries": retries,
        "retry_success_rate": retry_ok,
        "reflection_valid": valid,
        "pivot_accuracy": pivot,
        "trained_tokens": tokens,
        "generated_tokens": 10.0,
        "forward_tokens": 1000.0,
        **more,
    }


def test_summarize_pairs_each_variant_with_its_reference_at_the_same_seeds(tmp_path):
    _run(tmp_path, "grpo_paper", 0, [_it(1, 16, 100)], k=4)
    _run(tmp_path, "grpo_paper", 1, [_it(1, 16, 100)], k=2)
    _run(tmp_path, "grpo_ds", 0, [_it(1, 16, 100), _it(2, 32, 100, tokens=0.0)], k=4)
    _run(tmp_path, "grpo_ds", 1, [_it(1, 16, 100), _it(2, 32, 140)], k=2)
    # r3l: retry success pooled by retries (1 of 4, then 3 of 4 -> 4/8), pivot accuracy by valid reports
    _run(tmp_path, "r3l", 0, [_it(1, 14, 200, 4, 0.25, 2, 1.0), _it(2, 28, 200, 4, 0.75, 6, 0.5)], k=8)
    _run(tmp_path, "r3l", 1, [_it(1, 14, 200, 4, 0.25, 0, None)], k=6)
    s = lcr.summarize(tmp_path, ["grpo_paper", "grpo_ds", "r3l", "r3l_oracle"], [0, 1, 2])
    assert set(s["variants"]) == {"grpo_paper", "grpo_ds", "r3l"}  # nothing of r3l_oracle or seed 2 yet
    g = s["variants"]["grpo_ds"]
    assert g["pooled"] == {"k": 6, "n": 64, "rate": 6 / 64} and g["updates"]["mean"] == 1.5
    assert g["eval_success"]["mean"] == pytest.approx((4 / 32 + 2 / 32) / 2)
    r0 = s["per_seed"]["r3l"]["0"]
    assert r0["retry_success"] == pytest.approx(4 / 8) and r0["pivot_accuracy"] == pytest.approx(
        (2 * 1.0 + 6 * 0.5) / 8
    )
    assert math.isnan(s["per_seed"]["r3l"]["1"]["pivot_accuracy"])  # no valid report: unknown, not 0
    assert r0["cpu_s_per_sample"] == pytest.approx(400 / 28)
    pairs = {(p["variant"], p["reference"]): p for p in s["pairs"]}
    assert set(pairs) == {("r3l", "grpo_ds"), ("grpo_ds", "grpo_paper")}
    p = pairs[("r3l", "grpo_ds")]
    assert p["seeds"] == [0, 1] and p["diff"]["mean"] == pytest.approx(((8 - 4) / 32 + (6 - 2) / 32) / 2)
    assert p["ratio"]["ratios"] == {0: 2.0, 1: 3.0} and p["ratio"]["ratio"] == pytest.approx(math.sqrt(6))
    assert p["cpu_s_per_sample_ratio"]["mean"] == pytest.approx(((400 / 28) / (200 / 32) + (200 / 14) / (240 / 32)) / 2)
    assert pairs[("grpo_ds", "grpo_paper")]["ratio"]["ratios"] == {0: 1.0, 1: 1.0}
    text = lcr.report(tmp_path, ["grpo_paper", "grpo_ds", "r3l"], [0, 1])
    assert "| r3l | 2 | 8, 6 of 32 |" in text and "| r3l | grpo_ds | 0, 1 | +0.125, +0.125 |" in text
    assert "Pooled k/n describes the counts only" in text and "Wilson" not in text
    assert (tmp_path / "learning_curves.png").exists() and (tmp_path / "runs.csv").exists()


def test_a_v3_folder_pairs_every_variant_with_its_grpo():
    assert lcr.pairs_for(["grpo", "r3l", "r3l_no_amp", "base"]) == {"r3l": "grpo", "r3l_no_amp": "grpo", "base": "grpo"}
    assert lcr.pairs_for(["grpo_paper", "r3l_paper", "r3l"]) == {"r3l_paper": "grpo_paper"}  # r3l lacks grpo_ds


def test_reflection_cost_is_summed_per_run_and_unknown_for_curves_without_it(tmp_path):
    _run(
        tmp_path,
        "r3l",
        0,
        [
            _it(
                1,
                14,
                10,
                reflect_s=3.5,
                reflection_generated_tokens=700.0,
                prompt_tokens_computed_reflect=900.0,
                reflections_truncated=1.0,
            ),
            _it(
                2,
                28,
                10,
                reflect_s=1.5,
                reflection_generated_tokens=300.0,
                prompt_tokens_computed_reflect=None,
                reflections_truncated=0.0,
            ),
        ],
        k=3,
    )
    _run(tmp_path, "r3l", 1, [_it(1, 14, 10, reflect_s=2.0, reflection_generated_tokens=400.0)], k=1)
    _run(tmp_path, "grpo_ds", 0, [_it(1, 16, 10, reflect_s=0.0, reflection_generated_tokens=0.0)], k=2)
    _run(tmp_path, "grpo_ds", 1, [_it(1, 16, 10)], k=2)  # a curve from before the fields existed
    s = lcr.summarize(tmp_path, ["grpo_ds", "r3l"], [0, 1])
    r0, r1 = s["per_seed"]["r3l"]["0"], s["per_seed"]["r3l"]["1"]
    assert (
        r0["reflection_tokens"],
        r0["reflection_seconds"],
        r0["reflection_prompt_tokens"],
        r0["reflections_truncated"],
    ) == (1000.0, 5.0, 900.0, 1.0)
    assert (r1["reflection_tokens"], r1["reflection_seconds"]) == (400.0, 2.0) and math.isnan(
        r1["reflections_truncated"]
    )
    assert s["variants"]["r3l"]["reflection_tokens"]["mean"] == 700.0
    g0, g1 = s["per_seed"]["grpo_ds"]["0"], s["per_seed"]["grpo_ds"]["1"]
    assert (
        g0["reflection_tokens"] == 0.0 and math.isnan(g1["reflection_tokens"]) and math.isnan(g1["reflection_seconds"])
    )
    text = lcr.report(tmp_path, ["grpo_ds", "r3l"], [0, 1])
    assert "| 1000, 400 | 5, 2 |" in text and "| 0, - | 0, - |" in text
    # the paired ratio: r3l 3/32 and 1/32 against 2/32 and 2/32
    assert "| r3l | grpo_ds | 0, 1 | +0.031, -0.031 |" in text and "1.50, 0.50" in text


def test_the_summary_states_each_variants_setting_from_setting_json(tmp_path):
    diffs = {
        "base": dict(COMMON),
        "r3l": {**COMMON, "dynamic_sampling_rounds": 2},
        "r3l_paper": {**COMMON, "reflection_temperature": 0.7, "loss_aggregation": "paper"},
    }
    lc.check_setting(tmp_path, dict(lc.DEFAULT_SETTING), diffs)
    _run(tmp_path, "r3l", 0, [_it(1, 14, 10)], k=3)
    text = lcr.report(tmp_path, ["r3l", "r3l_paper"], [0])
    assert "lr 1e-05" in text and "a budget of 64 trajectories" in text
    rows = {}
    for line in text.splitlines():  # the setting table comes first
        rows.setdefault(line.split(" | ")[0], line)
    from rllib_r3l.options import R3L_OPTIONS

    assert "| r3l | true | " + R3L_OPTIONS["reflect_on"][0] + " | 2 |" in rows["| r3l"]  # the defaults, stated
    assert "| 0.7 |" in rows["| r3l_paper"] and "| paper |" in rows["| r3l_paper"]
    assert "- r3l: " in text and "`dynamic_sampling_rounds=2`" in text and "`lr=1e-05`" in text


# ---------------------------------------------------------------------------------------------------
# the order of runs and the locks
def test_next_runs_resume_cut_runs_then_the_headline_for_all_seeds_then_the_paper_pair_then_the_oracle(tmp_path):
    _run(tmp_path, "base", 0, [], k=1)
    _run(tmp_path, "grpo_ds", 0, [_it(1, 16, 1)], k=1)
    cut = lcr.run_dir(tmp_path, "r3l_paper", 1)  # started, not finished: resumes first
    cut.mkdir(parents=True)
    (cut / "curve.jsonl").write_text(json.dumps({"header": {"variant": "r3l_paper"}}) + "\n")
    lcr.run_dir(tmp_path, "r3l", 0).mkdir(parents=True)  # a folder without a curve: not started yet
    variants = ["grpo_paper", "grpo_ds", "r3l", "r3l_oracle", "r3l_paper"]
    assert lc.next_runs(tmp_path, variants, [0, 1]) == [
        ("r3l_paper", 1),
        ("r3l", 0),
        ("base", 1),
        ("grpo_ds", 1),
        ("r3l", 1),
        ("grpo_paper", 0),
        ("r3l_paper", 0),
        ("grpo_paper", 1),
        ("r3l_oracle", 0),
        ("r3l_oracle", 1),
    ]


def _holder(seconds: float, then_write: str = ""):
    """A real process that looks like a sweep child (``learning_curves.py --child``) and optionally
    writes a file when it ends."""
    import subprocess
    import time

    code = (
        "import sys, time, pathlib; time.sleep(float(sys.argv[1]));"
        "sys.argv[2] and pathlib.Path(sys.argv[2]).write_text('{\"eval_successes\": 3, \"eval_episodes\": 32}')"
    )
    p = subprocess.Popen([sys.executable, "-c", code, str(seconds), then_write, lc.__file__, "--child", "grpo_ds:0"])
    # Between fork and exec the child's /proc cmdline is still pytest's, which held_by rightly refuses
    # (a real child writes its lock itself, after exec); on a busy machine that window is long.
    deadline = time.monotonic() + 30
    while b"--child" not in Path(f"/proc/{p.pid}/cmdline").read_bytes().split(b"\0"):
        if time.monotonic() > deadline:
            raise TimeoutError("the holder process did not start")
        time.sleep(0.01)
    return p


@pytest.mark.subprocess
def test_held_by_names_a_live_child_only(tmp_path):
    import os
    import subprocess

    d = tmp_path / "run"
    d.mkdir()
    assert lc.held_by(d) is None  # no lock
    p = _holder(30)
    try:
        (d / lc.LOCK).write_text(f"{p.pid}\n")
        assert lc.held_by(d) == p.pid
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # not a sweep child
        try:
            (d / lc.LOCK).write_text(f"{other.pid}\n")
            assert lc.held_by(d) is None
        finally:
            other.kill()
        (d / lc.LOCK).write_text(f"{os.getpid() + 10**7}\n")  # no such process
        assert lc.held_by(d) is None
        (d / lc.LOCK).write_text("garbage")
        assert lc.held_by(d) is None
    finally:
        p.kill()
        p.wait()
    (d / lc.LOCK).write_text(f"{p.pid}\n")  # the holder is gone
    assert lc.held_by(d) is None


@pytest.mark.subprocess
def test_sweep_waits_for_a_run_another_process_holds_and_never_starts_it_twice(tmp_path, capsys):
    _run(tmp_path, "base", 0, [], k=1)
    d = lcr.run_dir(tmp_path, "grpo_ds", 0)
    d.mkdir(parents=True)
    (d / "curve.jsonl").write_text(
        json.dumps({"header": {"variant": "grpo_ds"}}) + "\n" + json.dumps(_it(1, 16, 1)) + "\n"
    )
    p = _holder(6, str(d / "final.json"))  # an orphaned child of a killed sweep, finishing its run
    (d / lc.LOCK).write_text(f"{p.pid}\n")
    try:
        assert lc.next_runs(tmp_path, ["grpo_ds"], [0]) == [("grpo_ds", 0)]
        lc.sweep(tmp_path, dict(lc.DEFAULT_SETTING), ["grpo_ds"], [0], parallel=2)
    finally:
        p.kill()
    out = capsys.readouterr().out
    assert f"grpo_ds/seed0 is running in process {p.pid}; waiting for it" in out
    assert "started" not in out and "grpo_ds/seed0 done" in out
    assert "| grpo_ds | 1 |" in out and lc.next_runs(tmp_path, ["grpo_ds"], [0]) == []


@pytest.mark.integration
def test_a_run_cut_short_resumes_from_its_checkpoint_and_finishes(tmp_path, tiny_model_dir, monkeypatch):
    """Real R3L (oracle reflector) on the tiny model: the held-out evaluation is cut short after
    iteration 1 (as a kill would), the checkpoint survives, and the rerun continues at iteration 2."""
    setting = dict(
        lc.DEFAULT_SETTING,
        env="r3l/ToyCorridor",
        env_config={"num_rooms": 3},
        model="tiny",
        backend="transformers",
        group_size=4,
        lr=1e-4,
        micro_batch_tokens=None,
        budget=1000,
        max_iterations=1,
        eval_episodes=2,
        num_threads=None,
        training={"max_response_tokens": 8, "max_reflection_tokens": 24},
    )
    real_eval = lc.evaluate_heldout

    def killed(algo, episodes):
        raise KeyboardInterrupt("cut short")

    monkeypatch.setattr(lc, "evaluate_heldout", killed)
    with pytest.raises(KeyboardInterrupt):
        lc.run_one(tmp_path, setting, "r3l_oracle", 0)
    d = lcr.run_dir(tmp_path, "r3l_oracle", 0)
    header, recs = lcr.read_curve(d)
    assert header["options"]["reflector"] == "oracle" and header["git_commit"] and [r["iteration"] for r in recs] == [1]
    assert (d / "checkpoint").exists() and not (d / "final.json").exists()
    first = recs[0]
    assert first["samples_cumulative"] == first["num_episodes"] + first["num_retries"] >= 4
    assert first["reflection_generated_tokens"] == 0.0 and first["reflect_s"] is not None  # the oracle writes nothing
    from rllib_r3l import retry_ledger

    ledger = retry_ledger.read(str(d / retry_ledger.LEDGER_FILE))  # the run's own ledger, in its folder
    assert ledger and {r["iteration"] for r in ledger} == {1}

    monkeypatch.setattr(lc, "evaluate_heldout", real_eval)
    final = lc.run_one(tmp_path, dict(setting, max_iterations=2), "r3l_oracle", 0)
    header, recs = lcr.read_curve(d)
    assert [r["iteration"] for r in recs] == [1, 2] and recs[0] == first  # iteration 1 kept, not rerun
    assert [r["iteration"] for r in header["resumed"]] == [1]
    after = retry_ledger.read(str(d / retry_ledger.LEDGER_FILE))
    assert after[: len(ledger)] == ledger and {r["iteration"] for r in after[len(ledger) :]} <= {2}
    assert recs[1]["samples_cumulative"] > first["samples_cumulative"]
    assert final["iterations"] == 2 and final["eval_episodes"] == 2 and 0 <= final["eval_successes"] <= 2
    games = final["eval_games"]  # every held-out game, raw
    assert [g["seed"] for g in games] == [0, 1] and sum(g["success"] for g in games) == final["eval_successes"]
    assert not (d / "checkpoint").exists() and (d / "final.json").exists()
    assert lcr.run_numbers(tmp_path, "r3l_oracle", 0)["iterations"] == 2
