"""The task pre-check of evidence v5 (issue 46 item 6): each candidate's setting, the band and ceiling's
verdicts, the table from the runs' files."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import learning_curves as lc
from benchmarks import learning_curves_report as lcr
from benchmarks import task_precheck as tp


# ---------------------------------------------------------------------------------------------------
# the pre-check
def _final(out: Path, variant: str, k: int, n: int = 32, its=(), cpu="AMD EPYC") -> None:
    d = lcr.run_dir(out, variant, 0)
    d.mkdir(parents=True)
    header = {"variant": variant, "started": "2026-12-06 10:00:00", "cpu_model": cpu}
    (d / "curve.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [{"header": header}, *its]))
    games = [
        {"seed": i, "success": i < k, "reward": float(i < k), "turns": 3 if i < k else 15, "status": "ok"}
        for i in range(n)
    ]
    (d / "final.json").write_text(
        json.dumps(
            {
                "eval_successes": k,
                "eval_episodes": n,
                "eval_games": games,
                "eval_cpu_s": 40.0,
                "eval_seconds": 90.0,
                "finished": "2026-12-06 10:03:00",
            }
        )
    )


def test_the_precheck_band_and_ceiling_decide_each_candidate(tmp_path):
    _final(tmp_path / "twc1", "base", k=4)
    _final(
        tmp_path / "twc1",
        "grpo_paper",
        k=12,
        its=[{"iteration": 1, "samples_cumulative": 64, "cpu_s": 300.0, "wall_s": 400.0}],
    )
    _final(tmp_path / "coin4_t10", "base", k=1)
    _final(tmp_path / "coin4_t20", "base", k=3)
    _final(tmp_path / "coin4_t20", "grpo_paper", k=20)
    rows = {r["candidate"]: r for r in tp.summarize(tmp_path, ["twc1", "coin4_t10", "coin4_t20", "cook1"])}
    assert rows["twc1"]["verdict"] == "fits"  # 4/32 = 12.5 %, GRPO 12/32 = 37.5 %
    assert rows["coin4_t10"]["verdict"].startswith("out: base 3%")
    assert rows["coin4_t20"]["verdict"].startswith("out: GRPO 62%")
    assert rows["cook1"]["verdict"] == "base not measured"
    b, g = rows["twc1"]["base"], rows["twc1"]["grpo"]
    assert (b["successes"], b["mean_turns"], b["run_wall_s"], b["eval_cpu_s"]) == (
        4,
        (4 * 3 + 28 * 15) / 32,
        180.0,
        40.0,
    )
    assert (g["train_cpu_s"], g["samples"], g["iterations"]) == (300.0, 64, 1)
    assert tp.verdict({"rate": 0.1}, None) == "base in band; GRPO not measured"
    text = tp.report(tmp_path, ["twc1", "cook1"])
    assert "| twc1 | r3l/TextWorldExpress" in text and "| 4/32 |" in text and "| 12/32 |" in text
    assert "CPU: AMD EPYC" in text and (tmp_path / "summary.json").exists()


def test_every_candidate_builds_with_v4_s_setting_and_its_own_environment():
    diffs = lc.variant_diffs(tp.candidate_setting("coin8_t15"), [lc.BASE])
    assert diffs[lc.BASE]["env_config"] == {"compact_observations": True, "num_locations": 8, "max_turns": 15}
    for name in tp.CANDIDATES:
        s = tp.candidate_setting(name)
        assert {k: v for k, v in s.items() if k not in ("env", "env_config")} == {
            k: v for k, v in lc.DEFAULT_SETTING.items() if k not in ("env", "env_config")
        }
