"""Where the reflect-then-retry chain broke, said on the iteration line, under the summary table and in
the train summary (rllib_r3l.cli.retry_chain; pure: hand-made results and rows)."""

from __future__ import annotations

import io
from contextlib import redirect_stdout

from rllib_r3l.cli import console, retry_chain
from rllib_r3l.cli.outcome import TrainingTracker, print_train_summary, trial_rows


def result(retries=0, truncated=0, skipped=0, errors=0, **statuses):
    """An RLlib result (nested) with the runners' reflection metrics: ``statuses`` are reflection_<status> counts."""
    r3l = {
        "num_retries": retries,
        "reflections_truncated": truncated,
        "reflections_skipped_successes": skipped,
        "faults": {"reflection_generation_errors": errors},
        "rollout_seconds": 10.0,
    }
    if statuses:
        r3l.update({f"reflection_{s}": n for s, n in statuses.items()})
        r3l["reflection_total"] = sum(statuses.values())
    return {"time_this_iter_s": 12.0, "env_runners": {"num_episodes": 8, "success_rate": 0.0, "r3l": r3l}}


CUT = result(truncated=5, no_json=3, bad_json=2)  # 5 reports, none valid, all cut at the token budget


def test_counts_from_a_nested_and_a_flattened_result():
    c = retry_chain.reflection_counts(
        result(retries=1, truncated=2, skipped=3, errors=0, valid=1, perfect=1, bad_json=2)
    )
    assert (c["reflections"], c["valid"], c["truncated"], c["skipped_successes"], c["retries"]) == (4, 2, 2, 3, 1)
    assert c["invalid"] == {"bad_json": 2}
    flat = {
        "env_runners/r3l/reflection_total": 6,
        "env_runners/r3l/reflection_valid": 1,
        "env_runners/r3l/reflection_retries": 1,
        "env_runners/r3l/num_retries": float("nan"),
    }
    c = retry_chain.reflection_counts(flat)
    assert (c["reflections"], c["valid"], c["asked"], c["retries"], c["invalid"]) == (6, 1, 1, 0, {})


def test_why_no_retry_ran_names_the_likely_cause():
    note = lambda r: retry_chain.broken_link(retry_chain.reflection_counts(r))  # noqa: E731
    assert note(CUT) == (
        "0/5 reports valid: 5 cut at max_reflection_tokens; raise max_reflection_tokens (or lower reflection_max_chars)"
    )
    assert note(result(truncated=1, no_json=3, bad_json=1, missing_fields=1)) == (
        "0/5 reports valid: invalid JSON (no_json 3, bad_json 1, missing_fields 1); reflection_structured=True "
        "holds the report to its schema"
    )
    assert note(result(bad_outcome=3, bad_pivot=1)) == "0/4 reports valid (bad_outcome 3, bad_pivot 1)"
    assert note(result(skipped=8)) == "no failure to reflect on (8 successful episode(s) passed over)"
    assert note(result(errors=4)) == "the reflector's generation failed 4 time(s); see the log"
    assert (
        note(result(perfect=3)) == "3/3 reports valid, none asked for a retry (every one judged the episode a success)"
    )
    asked = result(valid=2, bad_json=1)
    asked["env_runners"]["r3l"]["reflection_retries"] = 2
    assert note(asked).startswith("2 report(s) asked for a retry, none ran")
    assert note(result(retries=2, valid=2)) is None  # the chain closed
    assert note(result()) is None  # reflection off: none of these metrics
    assert retry_chain.iteration_note(None) == ""


def test_the_iteration_line_says_why_retries_is_0():
    line = console.iteration_line(console.iteration_row(1, CUT), 3)
    assert "| retries 0 (0/5 reports valid: 5 cut at max_reflection_tokens; raise max_reflection_tokens" in line
    closed = result(retries=2, valid=2)
    closed["env_runners"]["r3l"]["retry_success_rate"] = 0.5
    assert "| retries 2, 1 succeeded |" in console.iteration_line(console.iteration_row(1, closed))
    assert "| retries 0 | update no" in console.iteration_line(console.iteration_row(1, result()))


def test_the_summary_table_ends_with_the_runs_verdict_only_when_no_retry_ever_ran():
    never = [console.iteration_row(i, CUT) for i in (1, 2)]
    table = console.summary_table(never)
    assert table[-1] == (
        "note: no retry in 2 iteration(s), so R3L trained as GRPO: 0/10 reports valid: 10 cut at "
        "max_reflection_tokens; raise max_reflection_tokens (or lower reflection_max_chars)"
    )
    once = never + [console.iteration_row(3, result(retries=1, valid=1))]
    assert not any(line.startswith("note:") for line in console.summary_table(once))
    assert not any(line.startswith("note:") for line in console.summary_table([console.iteration_row(1, result())]))


class _Trial:
    trial_id, status, experiment_dir_name, remote_experiment_path = "t1", "TERMINATED", "exp", "/s/exp"
    path, checkpoint, error_file = "/s/exp/t", None, None
    last_result = {"done": True, "training_iteration": 2}

    def __str__(self):
        return "t1"


def test_the_train_summary_says_a_trial_never_retried():
    tracker, trial = TrainingTracker(), _Trial()
    for r in (CUT, result(skipped=2, no_json=1)):
        tracker.on_trial_result(0, [], trial, {**r, "r3l": {"batch": {"items": 4}}})
    rows = trial_rows([trial], tracker)
    assert rows[0]["status"] == "TERMINATED"  # trained: not a failure, but not R3L either
    assert rows[0]["retry_note"] == (
        "no retry in 2 iteration(s), so R3L trained as GRPO: 0/6 reports valid: 5 cut "
        "at max_reflection_tokens; raise max_reflection_tokens (or lower "
        "reflection_max_chars)"
    )
    out = io.StringIO()
    with redirect_stdout(out):
        print_train_summary(rows)
    assert "  note:       no retry in 2 iteration(s), so R3L trained as GRPO: 0/6 reports valid" in out.getvalue()
    closed = TrainingTracker()
    closed.on_trial_result(0, [], trial, result(retries=1, valid=1))
    assert trial_rows([trial], closed)[0]["retry_note"] is None
