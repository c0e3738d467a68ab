"""``benchmarks/main_job_ab.py``: the variant syntax and the table's counts, on hand-made summaries."""

from __future__ import annotations

import json

import pytest

from benchmarks import main_job_ab as ab


def test_parse_variant_keeps_bracketed_values_whole():
    assert ab.parse_variant("both=aux_items=[reflection_sft, retry_sft] lr=1e-5") == (
        "both",
        ["aux_items=[reflection_sft, retry_sft]", "lr=1e-5"],
    )
    assert ab.parse_variant("default=") == ("default", [])
    assert ab.parse_variant("t3=backend_options={choice_tokenization: any}") == (
        "t3",
        ["backend_options={choice_tokenization: any}"],
    )


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("noequals", "NAME=OVERRIDES"),
        ("=lr=1", "NAME=OVERRIDES"),
        ("bad name=lr=1", "NAME=OVERRIDES"),
        ("x=lr", "key=value"),
        ("x=aux_items=[a, b", "balanced brackets"),
    ],
)
def test_parse_variant_names_the_fix(spec, needle):
    with pytest.raises(SystemExit, match=needle.replace("[", r"\[")):
        ab.parse_variant(spec)


def _summary(d, iterations, seconds, base=None):
    d.mkdir(parents=True)
    s = {
        "seconds_total": seconds,
        "per_iteration": [
            {"success_rate": sr, "r3l": {"num_retries": n, "retry_success_rate": rr}, "credit": {"trained_tokens": tok}}
            for sr, n, rr, tok in iterations
        ],
    }
    if base is not None:
        s["base_episodes_per_iteration"] = base
    (d / "summary.json").write_text(json.dumps(s))


def test_summarize_counts_updates_successes_and_retries_by_hand(tmp_path):
    # run 1 (old summary, 8 base episodes an iteration): updates 2 of 3
    _summary(tmp_path / "a_1", [(0.125, 7, 0.0, 100), (0.25, 6, 0.5, 300), (0.0, 8, 0.0, 0)], 200.0)
    # run 2 (12 base episodes an iteration): updates 3 of 3
    _summary(tmp_path / "a_2", [(0.25, 9, 1 / 9, 50), (0.5, 6, 0.0, 70), (1 / 12, 11, 2 / 11, 80)], 250.0, base=12)
    _summary(tmp_path / "a_b_1", [(1.0, 0, 0.0, 10)], 1.0)  # another variant's folder ("a_b"): not counted
    (tmp_path / "a_3").mkdir()  # a run that did not finish: no summary.json, not counted
    [row] = ab.summarize(tmp_path, ["a"])
    assert row["runs"] == 2 and row["seconds"] == [200.0, 250.0]
    text = ab.table([row])
    cells = text.splitlines()[2].strip("| ").split(" | ")
    assert cells[:2] == ["a", "2"]
    assert cells[2].startswith("5/6 ")  # iterations with an update
    assert cells[3].startswith("4/20 ")  # base ok, iteration 1: 1 of 8 + 3 of 12
    assert cells[4].startswith("9/40 ")  # base ok, iterations 2-3: 2 + 0 of 16, 6 + 1 of 24
    assert cells[5].startswith("1/16 ")  # retries ok, iteration 1: 0 of 7 + 1 of 9
    assert cells[6].startswith("5/31 ")  # retries ok, iterations 2-3: 3 + 0 + 0 + 2 of 6 + 8 + 6 + 11
    assert cells[7] == "0.0"  # no dynamic sampling: no extra rounds
    assert cells[8] == "300"  # trained tokens per run: (400 + 200) / 2
    assert cells[9] == "200 / 250"


def test_summarize_counts_the_episodes_of_extra_rounds(tmp_path):
    """With dynamic sampling an iteration's base episodes are what it ran (summary 'episodes'), not
    the planned number: 8 planned, iteration 1 ran 2 extra rounds (24 episodes, 3 won), iteration
    2 none (8 episodes, 2 won), iteration 3 one (16 episodes, 1 won)."""
    d = tmp_path / "ds_1"
    d.mkdir()
    its = [(0.125, 24, 2.0, 90), (0.25, 8, 0.0, 40), (0.0625, 16, 1.0, 30)]
    (d / "summary.json").write_text(
        json.dumps(
            {
                "seconds_total": 300.0,
                "base_episodes_per_iteration": 8,
                "per_iteration": [
                    {
                        "success_rate": sr,
                        "episodes": n,
                        "dynamic_sampling": {"extra_rounds": x},
                        "r3l": {"num_retries": 0},
                        "credit": {"trained_tokens": t},
                    }
                    for sr, n, x, t in its
                ],
            }
        )
    )
    cells = ab.table(ab.summarize(tmp_path, ["ds"])).splitlines()[2].strip("| ").split(" | ")
    assert cells[3].startswith("3/24 ") and cells[4].startswith("3/24 ")  # 2 of 8 + 1 of 16
    assert cells[7] == "3.0" and cells[8] == "160"


def test_table_pairs_run_k_with_run_k_of_the_first_variant(tmp_path):
    """Base success in iterations 2-3 per run (8 base episodes an iteration: of 16): ref 4, 2, 6 and
    other 8, 4, 6 -> differences 0.25, 0.125, 0: mean 0.125, t interval over the 3 pairs."""
    for name, wins in (("ref", (4, 2, 6)), ("other", (8, 4, 6))):
        for k, w in enumerate(wins, start=1):
            _summary(tmp_path / f"{name}_{k}", [(0.0, 0, 0.0, 0), (w / 16, 0, 0.0, 10), (w / 16, 0, 0.0, 10)], 100.0)
    rows = ab.summarize(tmp_path, ["ref", "other"])
    assert rows[0]["later_success"] == {1: 0.25, 2: 0.125, 3: 0.375}
    lines = ab.table(rows).splitlines()
    assert "vs ref: paired diff 2-3 [95 % t]" in lines[0]
    ref, other = (line.strip("| ").split(" | ") for line in lines[2:4])
    assert ref[10:] == ["0.25, 0.12, 0.38", "-"]
    h = 4.3026527 * 0.125 / 3**0.5  # sd of (0.25, 0.125, 0) is 0.125
    assert other[10:] == ["0.50, 0.25, 0.38", f"+0.12 [{0.125 - h:+.2f}, {0.125 + h:+.2f}]"]


@pytest.mark.parametrize("preset", sorted(ab.PRESETS))
def test_presets_set_options_that_exist(preset):
    """Each preset compares at least two settings, each a list of ``key=value`` overrides of
    ``R3LConfig`` options (as ``--variant`` spells them)."""
    from rllib_r3l import R3LConfig

    variants = ab.PRESETS[preset]
    assert len(variants) >= 2
    for name, sets in variants.items():
        assert ab.parse_variant(f"{name}={' '.join(sets)}") == (name, sets)
        for s in sets:
            assert hasattr(R3LConfig(), s.split("=", 1)[0]), (preset, s)
