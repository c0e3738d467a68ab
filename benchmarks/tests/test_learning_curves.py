"""``benchmarks/learning_curves.py`` (issue 11, item 5): its budget rule and curves on hand values, its
reading of run folders, and a real cut-short run that resumes from its checkpoint (tiny model, toy
corridor). Its intervals are ``benchmarks/harness.py``'s (``test_harness.py``)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from benchmarks import learning_curves as lc


def test_a_run_stops_at_the_budget_or_when_the_next_iteration_would_overshoot_it_more():
    assert lc.keep_training(0, 64, 0) and lc.keep_training(48, 64, 16)
    assert not lc.keep_training(64, 64, 16) and not lc.keep_training(70, 64, 16)
    assert not lc.keep_training(63, 64, 15)  # 1 short: one more iteration would end 14 over
    assert lc.keep_training(56, 64, 15)  # 8 short: nearer the budget with it (71) than without (56)


def test_interpolate_curve_is_linear_inside_and_nan_outside():
    got = lc.interpolate_curve([8, 16, 32], [0.0, 0.5, 0.25], [4, 8, 12, 24, 32, 40])
    assert math.isnan(got[0]) and math.isnan(got[-1])
    assert got[1:5] == pytest.approx([0.0, 0.25, 0.375, 0.25])


def _run(out: Path, variant: str, seed: int, its, k: int, n: int = 32) -> None:
    d = lc.run_dir(out, variant, seed)
    d.mkdir(parents=True)
    lines = [{"header": {"variant": variant}}] + its
    (d / "curve.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (d / "final.json").write_text(json.dumps({"eval_successes": k, "eval_episodes": n}))


def _it(i, samples, cpu, retries=0.0, retry_ok=None, valid=0.0, pivot=None, tokens=100.0):
    return {"iteration": i, "samples_cumulative": samples, "cpu_s": cpu, "wall_s": cpu, "success_rate": 0.25,
            "num_retries": retries, "retry_success_rate": retry_ok, "reflection_valid": valid,
            "pivot_accuracy": pivot, "trained_tokens": tokens, "generated_tokens": 10.0, "forward_tokens": 1000.0}


def test_summarize_pools_seeds_pairs_against_grpo_and_weights_reflection_numbers(tmp_path):
    _run(tmp_path, "grpo", 0, [_it(1, 16, 100), _it(2, 32, 100, tokens=0.0)], k=4)
    _run(tmp_path, "grpo", 1, [_it(1, 16, 100), _it(2, 32, 140)], k=2)
    # r3l: retry success pooled by retries (1 of 4, then 3 of 4 -> 4/8), pivot accuracy by valid reports
    _run(tmp_path, "r3l", 0, [_it(1, 14, 200, 4, 0.25, 2, 1.0), _it(2, 28, 200, 4, 0.75, 6, 0.5)], k=8)
    _run(tmp_path, "r3l", 1, [_it(1, 14, 200, 4, 0.25, 0, None)], k=6)
    s = lc.summarize(tmp_path, ["grpo", "r3l", "r3l_oracle"], [0, 1, 2])
    assert set(s["variants"]) == {"grpo", "r3l"}  # nothing of r3l_oracle or seed 2 yet
    g, r = s["variants"]["grpo"], s["variants"]["r3l"]
    assert g["pooled"]["k"] == 6 and g["pooled"]["n"] == 64 and g["updates"]["mean"] == 1.5
    assert g["eval_success"]["mean"] == pytest.approx((4 / 32 + 2 / 32) / 2)
    r0 = s["per_seed"]["r3l"]["0"]
    assert r0["retry_success"] == pytest.approx(4 / 8) and r0["pivot_accuracy"] == pytest.approx((2 * 1.0 + 6 * 0.5) / 8)
    assert math.isnan(s["per_seed"]["r3l"]["1"]["pivot_accuracy"])  # no valid report: unknown, not 0
    assert math.isnan(r0["retry_took_oracle_action"])  # never logged (the policy reflected): unknown
    assert r0["cpu_s_per_sample"] == pytest.approx(400 / 28)
    vs = r["vs_grpo"]
    assert vs["seeds"] == [0, 1]
    assert vs["diff"]["mean"] == pytest.approx(((8 - 4) / 32 + (6 - 2) / 32) / 2)
    assert vs["risk_ratio"]["ratio"] == pytest.approx((14 / 64) / (6 / 64))
    assert vs["cpu_s_per_sample_ratio"]["mean"] == pytest.approx(((400 / 28) / (200 / 32) + (200 / 14) / (240 / 32)) / 2)
    text = lc.report(tmp_path, ["grpo", "r3l"], [0, 1])
    assert "| r3l | 2 |" in text and (tmp_path / "learning_curves.png").exists() and (tmp_path / "runs.csv").exists()


def test_next_runs_resume_cut_runs_then_headline_for_all_seeds_then_ablations(tmp_path):
    _run(tmp_path, "base", 0, [], k=1)
    _run(tmp_path, "grpo", 0, [_it(1, 16, 1)], k=1)
    cut = lc.run_dir(tmp_path, "r3l_no_amp", 1)  # started, not finished: resumes first
    cut.mkdir(parents=True)
    (cut / "curve.jsonl").write_text(json.dumps({"header": {"variant": "r3l_no_amp"}}) + "\n")
    lc.run_dir(tmp_path, "r3l", 0).mkdir(parents=True)  # a folder without a curve: not started yet
    assert lc.next_runs(tmp_path, ["grpo", "r3l", "r3l_no_amp"], [0, 1]) == [
        ("r3l_no_amp", 1), ("r3l", 0), ("base", 1), ("grpo", 1), ("r3l", 1), ("r3l_no_amp", 0)]
    # diagnostic probes (the plain-guidance oracle) come after the ablations
    assert lc.next_runs(tmp_path, ["r3l_oracle_plain", "r3l_no_amp"], [0]) == [("r3l_no_amp", 0), ("r3l_oracle_plain", 0)]


def _holder(seconds: float, then_write: str = ""):
    """A real process that looks like a sweep child (``learning_curves.py --child``) and optionally
    writes a file when it ends."""
    import subprocess

    import time
    from pathlib import Path

    code = ("import sys, time, pathlib; time.sleep(float(sys.argv[1]));"
            "sys.argv[2] and pathlib.Path(sys.argv[2]).write_text('{\"eval_successes\": 3, \"eval_episodes\": 32}')")
    p = subprocess.Popen([sys.executable, "-c", code, str(seconds), then_write, lc.__file__, "--child", "grpo:0"])
    # Between fork and exec the child's /proc cmdline is still pytest's, which held_by rightly refuses
    # (a real child writes its lock itself, after exec); on a busy machine that window is long.
    deadline = time.monotonic() + 30
    while b"--child" not in Path(f"/proc/{p.pid}/cmdline").read_bytes().split(b"\0"):
        if time.monotonic() > deadline:
            raise TimeoutError("the holder process did not start")
        time.sleep(0.01)
    return p


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


def test_sweep_waits_for_a_run_another_process_holds_and_never_starts_it_twice(tmp_path, capsys):
    _run(tmp_path, "base", 0, [], k=1)
    d = lc.run_dir(tmp_path, "grpo", 0)
    d.mkdir(parents=True)
    (d / "curve.jsonl").write_text(json.dumps({"header": {"variant": "grpo"}}) + "\n" + json.dumps(_it(1, 16, 1)) + "\n")
    p = _holder(6, str(d / "final.json"))  # an orphaned child of a killed sweep, finishing its run
    (d / lc.LOCK).write_text(f"{p.pid}\n")
    try:
        assert lc.next_runs(tmp_path, ["grpo"], [0]) == [("grpo", 0)]
        lc.sweep(tmp_path, dict(lc.DEFAULT_SETTING), ["grpo"], [0], parallel=2)
    finally:
        p.kill()
    out = capsys.readouterr().out
    assert f"grpo/seed0 is running in process {p.pid}; waiting for it" in out
    assert "started" not in out and "grpo/seed0 done" in out
    assert "| grpo | 1 |" in out and lc.next_runs(tmp_path, ["grpo"], [0]) == []


def test_every_variant_builds_a_valid_config_that_differs_only_in_its_switches():
    base = lc.build_config(dict(lc.DEFAULT_SETTING), "grpo", 0)
    for v, switches in lc.VARIANTS.items():
        c = lc.build_config(dict(lc.DEFAULT_SETTING), v, 0)
        c.validate_r3l()
        for k, want in switches.items():
            assert getattr(c, k) == want, (v, k)
        same = ("group_size", "tasks_per_iteration", "lr", "seed", "sampling_seed", "env", "env_config", "model")
        assert {k: getattr(c, k) for k in same} == {k: getattr(base, k) for k in same}, v
    # every variant acts in the tokenizer's own tokens; a v2 setting.json (no key) used vLLM's grammar
    # and computes in fp32 whatever the CPU, so runs from sessions on different CPUs compare
    assert base.backend_options == {"choice_tokenization": "canonical", "dtype": "float32"} and base.share_prefixes
    assert base.mixed_precision == "none"
    v2 = {k: v for k, v in lc.DEFAULT_SETTING.items()
          if k not in ("choice_tokenization", "share_prefixes", "engine_dtype", "mixed_precision")}
    v2_cfg = lc.build_config(v2, "r3l", 0)
    assert v2_cfg.backend_options == {"choice_tokenization": "any"} and not v2_cfg.share_prefixes
    plain = lc.build_config(dict(lc.DEFAULT_SETTING), "r3l_oracle_plain", 0)
    assert plain.guidance_template == "Advice for this step: {suggestion}" and plain.reflector == "oracle"
    no_aux = lc.build_config(dict(lc.DEFAULT_SETTING), "r3l_no_aux", 0)
    assert no_aux.aux_items == [] and no_aux.reflect and no_aux.reflector == "policy"
    assert lc.build_config(dict(lc.DEFAULT_SETTING), "r3l_no_reflection_sft", 0).aux_items == ["retry_sft"]
    assert base.aux_items == ["reflection_sft", "retry_sft"]
    seq = lc.build_config(dict(lc.DEFAULT_SETTING), "r3l_seq_mean", 0)
    assert seq.loss_aggregation == "sequence_mean" and seq.aux_items
    assert base.loss_aggregation == "token_mean"


def test_a_sweep_folder_refuses_another_setting_and_names_the_field(tmp_path):
    lc.check_setting(tmp_path, dict(lc.DEFAULT_SETTING))
    lc.check_setting(tmp_path, dict(lc.DEFAULT_SETTING))  # the same setting resumes
    with pytest.raises(SystemExit, match=r"budget: 64 there, 96 now.*--out"):
        lc.check_setting(tmp_path, dict(lc.DEFAULT_SETTING, budget=96))


@pytest.mark.integration
def test_a_run_cut_short_resumes_from_its_checkpoint_and_finishes(tmp_path, tiny_model_dir, monkeypatch):
    """Real R3L (oracle reflector) on the tiny model: the held-out evaluation is cut short after
    iteration 1 (as a kill would), the checkpoint survives, and the rerun continues at iteration 2."""
    setting = dict(lc.DEFAULT_SETTING, env="r3l/ToyCorridor", env_config={"num_rooms": 3}, model="tiny",
                   backend="transformers", group_size=4, lr=1e-4, micro_batch_tokens=None, budget=1000,
                   max_iterations=1, eval_episodes=2, num_threads=None,
                   training={"max_response_tokens": 8, "max_reflection_tokens": 24})
    real_eval = lc.evaluate_heldout

    def killed(algo, episodes):
        raise KeyboardInterrupt("cut short")

    monkeypatch.setattr(lc, "evaluate_heldout", killed)
    with pytest.raises(KeyboardInterrupt):
        lc.run_one(tmp_path, setting, "r3l_oracle", 0)
    d = lc.run_dir(tmp_path, "r3l_oracle", 0)
    header, recs = lc.read_curve(d)
    assert header["switches"]["reflector"] == "oracle" and [r["iteration"] for r in recs] == [1]
    assert (d / "checkpoint").exists() and not (d / "final.json").exists()
    first = recs[0]
    assert first["samples_cumulative"] == first["num_episodes"] + first["num_retries"] >= 4

    monkeypatch.setattr(lc, "evaluate_heldout", real_eval)
    final = lc.run_one(tmp_path, dict(setting, max_iterations=2), "r3l_oracle", 0)
    _, recs = lc.read_curve(d)
    assert [r["iteration"] for r in recs] == [1, 2] and recs[0] == first  # iteration 1 kept, not rerun
    assert recs[1]["samples_cumulative"] > first["samples_cumulative"]
    assert final["iterations"] == 2 and final["eval_episodes"] == 2 and 0 <= final["eval_successes"] <= 2
    assert not (d / "checkpoint").exists() and (d / "final.json").exists()
    assert lc.run_numbers(tmp_path, "r3l_oracle", 0)["iterations"] == 2
