"""``benchmarks/harness.py``: the intervals on hand values, the Markdown table, child results, and
the main-job sweep's order, resume and records (with a stand-in for the main job)."""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks import harness


def test_t_interval_and_wilson_and_katz_on_hand_values():
    # exact quantiles: 11 and 40 degrees of freedom were a table's 2.228 (df 10) and the normal 1.96
    assert harness.t_quantile(2) == pytest.approx(4.3027, abs=1e-4)
    assert harness.t_quantile(11) == pytest.approx(2.2010, abs=1e-4)
    assert harness.t_quantile(40) == pytest.approx(2.0211, abs=1e-4)
    e = harness.mean_interval([0.1, 0.2, 0.3])
    assert e["mean"] == pytest.approx(0.2) and e["std"] == pytest.approx(0.1)
    assert e["hi"] - e["mean"] == pytest.approx(4.3026527 * 0.1 / math.sqrt(3))
    one = harness.mean_interval([0.5, float("nan"), None])
    assert one["n"] == 1 and one["mean"] == 0.5 and math.isnan(one["lo"])
    lo, hi = harness.wilson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    rr = harness.risk_ratio(6, 32, 3, 32)
    se = math.sqrt(1 / 6 - 1 / 32 + 1 / 3 - 1 / 32)
    assert rr["ratio"] == pytest.approx(2.0) and not rr["corrected"]
    assert rr["lo"] == pytest.approx(2 * math.exp(-1.96 * se)) and rr["hi"] == pytest.approx(2 * math.exp(1.96 * se))
    z = harness.risk_ratio(4, 32, 0, 32)  # a zero count: Haldane-corrected, flagged
    assert z["corrected"] and z["ratio"] == pytest.approx((4.5 / 32.5) / (0.5 / 32.5))
    with pytest.raises(ValueError, match="df must be >= 1"):
        harness.t_quantile(0)


def test_paired_difference_pairs_units_both_sides_have_and_uses_a_t_interval():
    # units 0-2 on both sides; 3 is NaN on one side and 4 on one side only: both left out
    d = harness.paired_difference({0: 0.5, 1: 0.25, 2: 0.75, 3: float("nan")}, {0: 0.25, 1: 0.25, 2: 0.25, 4: 0.1})
    assert d["units"] == [0, 1, 2] and d["n"] == 3
    # differences 0.25, 0, 0.5: mean 0.25, sd 0.25, half-width t(0.975, 2) 4.3026527 * 0.25 / sqrt(3) = 0.621034
    assert d["mean"] == pytest.approx(0.25) and d["std"] == pytest.approx(0.25)
    assert d["lo"] == pytest.approx(-0.371034, abs=1e-6) and d["hi"] == pytest.approx(0.871034, abs=1e-6)


def test_paired_difference_reproduces_the_learning_curve_table():
    """R3L (aux_items=["retry_sft"]) against GRPO, held-out successes of 32 per seed: 4, 8, 22 vs
    14, 20, 25; docs/benchmarks.md gives -0.26 +- 0.15 [-0.63, 0.11]. The 96 games are not pooled:
    the same 32 test games repeat at every seed."""
    r3l = {0: 4 / 32, 1: 8 / 32, 2: 22 / 32}
    grpo = {0: 14 / 32, 1: 20 / 32, 2: 25 / 32}
    d = harness.paired_difference(r3l, grpo)
    assert d["mean"] == pytest.approx(-25 / 96)
    assert d["std"] == pytest.approx(0.147682, abs=1e-6)
    assert (round(d["lo"], 2), round(d["hi"], 2)) == (-0.63, 0.11)
    assert harness.fmt_interval(d, signed=True) == "-0.26 [-0.63, +0.11]"


def test_paired_difference_without_pairs_is_nan_and_one_pair_has_no_interval():
    none = harness.paired_difference({0: 0.5}, {1: 0.5})
    assert none["n"] == 0 and none["units"] == [] and math.isnan(none["mean"]) and harness.fmt_interval(none) == "-"
    one = harness.paired_difference({0: 0.5, 1: 0.25}, {1: 0.5})
    assert one["n"] == 1 and one["mean"] == -0.25 and math.isnan(one["lo"])
    assert harness.fmt_interval(one) == "-0.25 (1 unit)"


def test_mean_std_gives_zero_spread_for_one_value():
    assert harness.mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert harness.mean_std([5.0]) == (5.0, 0.0)
    assert all(math.isnan(x) for x in harness.mean_std([]))


def test_markdown_table():
    assert harness.markdown_table(("a", "b"), [(1, "x"), ("2", 3.5)]) == "| a | b |\n|---|---|\n| 1 | x |\n| 2 | 3.5 |"


def test_jsonl_round_trip(tmp_path):
    p = tmp_path / "r.jsonl"
    assert harness.read_jsonl(p) == []
    harness.append_jsonl(p, [{"a": 1}])
    harness.append_jsonl(p, [{"b": [2]}, {"c": None}])
    assert harness.read_jsonl(p) == [{"a": 1}, {"b": [2]}, {"c": None}]


@pytest.mark.subprocess
def test_run_child_returns_the_last_result_line_or_none():
    code = (
        "from benchmarks import harness; print('noise'); harness.emit_result({'x': 1}); harness.emit_result({'x': 2})"
    )
    got, p = harness.run_child([sys.executable, "-c", code])
    assert got == {"x": 2} and p.returncode == 0
    got, p = harness.run_child([sys.executable, "-c", code + "; raise SystemExit(3)"])
    assert got is None and p.returncode == 3  # a failed child's result is not taken


def test_split_overrides_keeps_bracketed_values_whole_and_refuses_bad_ones():
    assert harness.split_overrides("a=1  b=[x, y] c={k: v}") == ["a=1", "b=[x, y]", "c={k: v}"]
    assert harness.split_overrides("") == []
    for bad in ("a", "a=[1, 2", "a=1 b"):
        with pytest.raises(ValueError):
            harness.split_overrides(bad)


def test_alternating_and_rotated_orders():
    jobs = harness.alternating({"a": ["x=1"], "b": []}, 2, Path("/r"))
    assert [j.out.name for j in jobs] == ["a_1", "b_1", "a_2", "b_2"] and jobs[0].sets == ["x=1"]
    assert [harness.rotated(["a", "b", "c"], s) for s in (0, 1, 5)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
    ]
    assert harness.rotated(["a", "b"], 1, rotate=False) == ["a", "b"]


@pytest.fixture
def fake_main_job(tmp_path, monkeypatch):
    """A stand-in for ``python -m rllib_r3l.cli.main``: logs its arguments, writes summary.json and a
    checkpoint into ``--out``, and fails for an ``--out`` named ``bad_*``."""
    script = tmp_path / "fake_main.py"
    calls = tmp_path / "calls.jsonl"
    script.write_text(
        textwrap.dedent(f"""
        import json, pathlib, sys
        args = sys.argv[1:]
        out = pathlib.Path(args[args.index("--out") + 1])
        with open({str(calls)!r}, "a") as f:
            f.write(json.dumps(args) + "\\n")
        print("console line")
        if out.name.startswith("bad"):
            sys.exit(3)
        (out / "checkpoint").mkdir(parents=True)
        (out / "summary.json").write_text("{{}}")
    """)
    )
    monkeypatch.setattr(harness, "MAIN_JOB_COMMAND", [sys.executable, str(script)])
    return calls


@pytest.mark.subprocess
def test_sweep_runs_what_is_missing_in_order_and_records_each_run(tmp_path, fake_main_job):
    out = tmp_path / "sweep"
    (out / "a_1").mkdir(parents=True)
    (out / "a_1" / "summary.json").write_text("{}")  # done before: kept, not rerun
    (out / "b_1").mkdir()  # started, never finished: rerun
    jobs = harness.alternating({"a": ["x=1", "l=[p, q]"], "b": []}, 2, out)
    lines = []
    assert harness.sweep(jobs, log=lines.append) == 0
    calls = harness.read_jsonl(fake_main_job)
    assert [c[c.index("--out") + 1] for c in calls] == [str(out / n) for n in ("b_1", "a_2", "b_2")]
    assert calls[1][-3:] == ["--set", "x=1", "l=[p, q]"] and "--set" not in calls[0]
    assert lines[0] == "a_1: done (kept)"
    for name in ("b_1", "a_2", "b_2"):
        d = out / name
        assert (d / "summary.json").exists() and not (d / "checkpoint").exists()  # the checkpoint is deleted
        meta = json.loads((out / f"{name}.run.json").read_text())
        assert meta["rc"] == 0 and meta["variant"] == name[0] and meta["wall_s"] >= 0 and meta["cpu_s"] >= 0
        assert (out / f"{name}.console").read_text() == "console line\n"
    assert harness.sweep(jobs, log=lines.append) == 0 and len(harness.read_jsonl(fake_main_job)) == 3  # all done


@pytest.mark.subprocess
def test_sweep_stops_at_a_failed_run_and_a_job_may_need_its_record(tmp_path, fake_main_job):
    jobs = [harness.MainJob("bad", tmp_path / "bad_1", iterations=2), harness.MainJob("ok", tmp_path / "ok_1")]
    assert harness.sweep(jobs, log=lambda line: None) == 3
    assert len(harness.read_jsonl(fake_main_job)) == 1 and not (tmp_path / "bad_1.run.json").exists()
    assert harness.read_jsonl(fake_main_job)[0][-2:] == ["--iterations", "2"]
    job = harness.MainJob("ok", tmp_path / "ok_1", needs_meta=True)
    (job.out / "summary.json").parent.mkdir()
    (job.out / "summary.json").write_text("{}")
    assert not job.done  # no record of its CPU seconds yet
    job.meta.write_text("{}")
    assert job.done
