"""The arithmetic of ``benchmarks/step_cost_ratios.py`` (issue 12's ratios) on hand-made summaries."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import step_cost_ratios as scr


def _write(out: Path, name: str, its, cpu_s: float) -> None:
    (out / name).mkdir(parents=True)
    (out / name / "summary.json").write_text(json.dumps({"per_iteration": its}))
    (out / f"{name}.run.json").write_text(json.dumps({"cpu_s": cpu_s, "wall_s": 1.0}))


def _it(seconds, computed, generated, fwd, cred, split=None):
    learner = (
        {"forward_tokens": fwd, "trained_tokens": cred}
        if cred is not None
        else {"forward_tokens": float("nan"), "trained_tokens": float("nan")}
    )
    return {
        "seconds": seconds,
        "success_rate": 0.25,
        "learner": learner,
        "time_split": split or {"learn": 1.0},
        "r3l": {
            "prompt_tokens_computed_per_sample": computed,
            "generated_tokens_per_sample": generated,
            "num_retries": 2,
            "reflection_valid_rate": 1.0,
            "pivot_accuracy": 0.5,
        },
    }


def test_ratios_pool_tokens_over_iterations_and_skip_iterations_without_update(tmp_path):
    _write(tmp_path, "before", [_it(300, 2000, 100, 20000, 500), _it(100, 1000, 120, 10000, 250)], cpu_s=900)
    # the second "after" iteration has no update: it counts for time, not for forward/credited
    _write(tmp_path, "after", [_it(100, 600, 50, 6000, 300), _it(50, 400, 70, float("nan"), None)], cpu_s=300)
    _write(tmp_path, "grpo", [_it(80, 500, 40, 4000, 400), _it(70, 500, 40, 4000, 400)], cpu_s=200)
    b = scr.variant_numbers(tmp_path, "before")
    a = scr.variant_numbers(tmp_path, "after")
    assert b["s_per_iter"] == 200 and b["cpu_s_per_iter"] == 450 and b["prompt_computed_per_sample"] == 1500
    assert b["forward_per_credited"] == pytest.approx(30000 / 750) and b["updates"] == 2
    assert a["updates"] == 1 and a["forward_per_credited"] == pytest.approx(20.0) and a["generated_per_sample"] == 60
    r = scr.ratios({"before": b, "after": a, "grpo": scr.variant_numbers(tmp_path, "grpo")})
    assert r["after/before"]["s_per_iter"] == pytest.approx(75 / 200)
    assert r["after/before"]["prompt_computed_per_sample"] == pytest.approx(500 / 1500)
    assert r["after/before"]["forward_per_credited"] == pytest.approx(20 / 40)
    assert r["r3l/grpo"]["cpu_s_per_iter"] == pytest.approx(150 / 100)
    assert r["r3l/grpo"]["generated_per_sample"] == pytest.approx(60 / 40)
    assert "r3l/grpo_kl" not in r  # the paper's GRPO baseline (with its reference model) did not run
    split = {"rollout": 30.0, "reflect": 0.0, "learn": 60.0}
    _write(tmp_path, "grpo_kl", [_it(90, 500, 40, 4000, 400, split), _it(90, 500, 40, 4000, 400, split)], cpu_s=300)
    a["time_split"] = {"rollout": 30.0, "reflect": 12.0, "learn": 45.0}
    r = scr.ratios({"after": a, "grpo_kl": scr.variant_numbers(tmp_path, "grpo_kl")})
    assert r["r3l/grpo_kl"]["cpu_s_per_iter"] == pytest.approx(150 / 150)
    # where the difference is: exploring (rollout + reflection) 42 / 30 s, learning 45 / 60 s
    assert r["r3l/grpo_kl"]["explore_s"] == pytest.approx(42 / 30) and r["r3l/grpo_kl"]["learn_s"] == pytest.approx(
        0.75
    )
    assert "kl_coef=0.001" in scr.VARIANTS["grpo_kl"] and set(scr.VARIANTS["grpo"]) < set(scr.VARIANTS["grpo_kl"])


def test_a_variant_that_has_not_run_has_no_numbers_and_no_ratio(tmp_path):
    _write(tmp_path, "after", [_it(100, 600, 50, 6000, 300)], cpu_s=100)
    nums = {v: scr.variant_numbers(tmp_path, v) for v in scr.VARIANTS}
    assert nums["before"] is None and nums["grpo"] is None
    assert scr.ratios(nums) == {}
    assert math.isnan(scr._mean([None, float("nan")]))


def test_variants_run_in_an_order_rotated_by_the_seed():
    names = ["after", "grpo", "after_failures"]
    orders = [scr.run_order(names, seed) for seed in range(3)]
    assert orders == [
        ["after", "grpo", "after_failures"],
        ["grpo", "after_failures", "after"],
        ["after_failures", "after", "grpo"],
    ]
    assert {o[0] for o in orders} == set(names)  # each variant runs first once over three seeds
    assert scr.run_order(names, 4) == orders[1]
    assert scr.run_order(names, 1, rotate=False) == names


def test_ratios_over_seeds_are_the_mean_of_the_per_seed_ratios_with_a_t_interval(tmp_path):
    """Seed as the unit: R3L/GRPO CPU per iteration 1.5, 1.0 and 0.5 at seeds 0-2 (both variants of
    a seed ran the same tasks): mean 1.0, sd 0.5, 95 % t interval 1.0 +- 4.3026527 * 0.5 / sqrt(3)."""
    outs = {}
    for seed, cpu in enumerate((150.0, 100.0, 50.0)):
        out = tmp_path / f"seed{seed}"
        _write(out, "after", [_it(100, 600, 60, 6000, 300)], cpu_s=cpu)
        _write(out, "grpo", [_it(80, 500, 40, 4000, 400)], cpu_s=100.0)
        outs[seed] = out
    (outs[2] / "grpo" / "summary.json").unlink()  # a seed whose GRPO run did not finish: not a pair
    res = scr.across_seeds(outs)
    cpu = res["r3l/grpo"]["cpu_s_per_iter"]
    assert cpu["per_seed"] == {0: 1.5, 1: 1.0} and cpu["n"] == 2 and cpu["mean"] == pytest.approx(1.25)
    assert cpu["hi"] - cpu["mean"] == pytest.approx(12.7062047 * math.sqrt(0.125) / math.sqrt(2))
    assert res["r3l/grpo"]["generated_per_sample"]["mean"] == pytest.approx(1.5)
    text = scr.across_table(res)
    assert "| r3l/grpo | 0, 1 | 1.25 (0.35) [" in text
    with pytest.raises(SystemExit, match=r"\{seed\}"):
        scr.main(["--seeds", "0,1", "--label", "fixed", "--report-only"])
