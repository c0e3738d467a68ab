"""r3l/Math (math-verify answer checking, local files, built-in generator) and r3l/Countdown."""

import json
import sys
import threading

import pandas as pd
import pytest

import environments.math_env as math_env
from environments import make
from environments.countdown import CountdownEnv, ExpressionError, evaluate, extract_expression
from environments.math_env import MathEnv, check_math_answer, last_boxed


# ------------------------------------------------------------------------------ r3l/Math
def test_default_generator_episode_and_attempts():
    env = make("r3l/Math")
    assert env.source == "generator" and env.max_attempts == 3 and env.max_turns == 3
    obs, info = env.reset(seed=0)
    assert "\\boxed{}" in obs and info["admissible_actions"] is None and info["task"] in obs
    gold = env.reference_answer()
    assert gold not in json.dumps({k: v for k, v in info.items() if k != "task"})  # no answer leak
    obs, r, term, _t, info = env.step("I am not sure.")
    assert info["invalid_action"] and r == 0 and not term and "\\boxed{}" in obs and "2 attempts left" in obs
    obs, r, term, _t, info = env.step(f"It is \\boxed{{{int(gold) + 1}}}")
    assert not info["invalid_action"] and r == 0 and not term and "incorrect" in obs and "Try again" in obs
    obs, r, term, _t, info = env.step(f"Step by step ... so the answer is \\boxed{{{gold}}}.")
    assert r == 1.0 and term and info["won"] and obs == "Correct!"
    with pytest.raises(RuntimeError):
        env.step("\\boxed{1}")


def test_attempts_run_out_and_answer_reveal_is_optional():
    env = MathEnv(max_attempts=2, reveal_answer=True)
    env.reset(seed=4)
    gold = env.reference_answer()
    env.step("\\boxed{-1}")
    obs, r, term, _t, info = env.step("\\boxed{-2}")
    assert term and r == 0 and not info["won"] and "No attempts left" in obs and gold in obs


def test_generator_is_deterministic_and_splits_are_disjoint():
    a, b = MathEnv(), MathEnv()
    assert [a.reset(seed=s)[0] for s in range(5)] == [b.reset(seed=s)[0] for s in range(5)]
    folds = {s: {MathEnv(split=s).reset(seed=i)[0] for i in range(150)} for s in ("train", "dev", "test")}
    assert len(folds["train"]) > 100
    assert not (folds["train"] & folds["dev"]) and not (folds["train"] & folds["test"])
    assert not (folds["dev"] & folds["test"])
    env = MathEnv(difficulty=3)
    env.reset(seed=1)
    assert env.step(f"\\boxed{{{env.reference_answer()}}}")[1] == 1.0


def test_bare_arithmetic_at_difficulty_zero_has_correct_answers_and_disjoint_folds():
    """difficulty=0: one operation on two-digit numbers; the gold answer is that operation's value,
    recomputed here from the question text (not from the generator)."""
    import re

    env = MathEnv(difficulty=0, max_attempts=1)
    ops = set()
    for seed in range(60):
        q, _ = env.reset(seed=seed)
        m = re.search(r"What is (\d+) ([+*-]) (\d+)\?", q)
        assert m, q
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        ops.add(op)
        want = {"+": a + b, "-": a - b, "*": a * b}[op]
        assert want >= 0 and env.reference_answer() == str(want)
    assert ops == {"+", "-", "*"}
    env.reset(seed=3)
    obs, r, term, _, _ = env.step(f"The answer is {int(env.reference_answer()) + 1}.")
    assert r == 0.0 and term
    env.reset(seed=3)
    assert env.step(f"so it is \\boxed{{{env.reference_answer()}}}")[1] == 1.0
    folds = {s: {MathEnv(difficulty=0, split=s).reset(seed=i)[0] for i in range(100)} for s in ("train", "test")}
    assert len(folds["train"]) > 90 and not (folds["train"] & folds["test"])
    with pytest.raises(ValueError, match="difficulty must be 0"):
        MathEnv(difficulty=-1)


def test_math_verify_equivalences():
    assert check_math_answer("so x = \\boxed{\\frac{1}{2}}", "0.5")[0]
    assert check_math_answer("The answer is \\boxed{0.5}", "\\frac12")[0]
    assert check_math_answer("\\boxed{\\dfrac{\\sqrt{3}}{2}}", "\\frac{\\sqrt 3}{2}")[0]
    assert not check_math_answer("\\boxed{3}", "4")[0]
    assert check_math_answer("the total is 42", "42")[0]  # without \boxed{}, the last number counts
    ok, extracted, reason = check_math_answer("the total is 42", "42", require_boxed=True)
    assert not ok and extracted is None and "boxed" in reason
    assert last_boxed("a \\boxed{x^{2}} and \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"


def test_answer_checking_works_off_the_main_thread():
    # math-verify's timeouts use signal.alarm, which raises off the main thread unless disabled
    out = []
    t = threading.Thread(target=lambda: out.append(check_math_answer("\\boxed{7}", "7")[0]))
    t.start()
    t.join()
    assert out == [True]


def _write(df, path):
    if str(path).endswith(".parquet"):
        df.to_parquet(path)
    else:
        df.to_json(path, orient="records", lines=True)
    return str(path)


def test_gsm8k_preset_from_local_jsonl(tmp_path):
    rows = [
        {
            "question": f"Tom has {i} apples and buys 2 more. How many apples?",
            "answer": f"He has {i} + 2 = {i + 2} apples.\n#### {i + 2}",
        }
        for i in range(60)
    ]
    path = _write(pd.DataFrame(rows), tmp_path / "gsm8k.jsonl")
    env = make("r3l/Math", {"data_files": {"test": path}, "preset": "gsm8k", "split": "test"})
    assert env.source == "files" and env.num_problems() == 60
    obs, _ = env.reset(seed=7)
    assert obs.startswith("Tom has 7 apples")
    assert env.reference_answer() == "9"
    assert env.step("so \\boxed{9}")[1] == 1.0
    # one file, partitioned into disjoint folds by a hash of the question
    sizes = {s: MathEnv(data_files=path, preset="gsm8k", split=s).num_problems() for s in ("train", "dev", "test")}
    assert sum(sizes.values()) == 60 and sizes["train"] > sizes["dev"]
    assert MathEnv(data_files=path, preset="gsm8k", split="test", partition=False).num_problems() == 60


def test_competition_presets_from_local_parquet(tmp_path):
    math500 = _write(
        pd.DataFrame(
            [{"problem": "What is $1/2 + 1/4$?", "solution": "... $\\boxed{\\frac34}$", "answer": "\\frac{3}{4}"}]
        ),
        tmp_path / "math500.parquet",
    )
    env = MathEnv(data_files={"test": math500}, preset="MATH500", split="test")
    env.reset(seed=0)
    assert env.step("\\boxed{0.75}")[1] == 1.0
    # MATH train files have only a solution column: the reference is its last \boxed{}
    hendrycks = _write(
        pd.DataFrame([{"problem": "Compute $2^5$.", "solution": "We get $\\boxed{32}$."}]), tmp_path / "math.parquet"
    )
    env = MathEnv(data_files={"train": hendrycks}, preset="math")
    env.reset(seed=0)
    assert env.reference_answer() == "32"
    dapo = _write(
        pd.DataFrame(
            [
                {
                    "prompt": [{"role": "user", "content": "Find 6*7."}],
                    "reward_model": {"ground_truth": "42", "style": "rule"},
                }
            ]
        ),
        tmp_path / "dapo.parquet",
    )
    env = MathEnv(data_files={"train": dapo}, preset="dapo")
    assert env.reset(seed=0)[0].startswith("Find 6*7.")
    assert env.step("\\boxed{42}")[1] == 1.0
    olymp = _write(
        pd.DataFrame([{"question": "Find x if 2x = 10.", "final_answer": ["$5$"]}]), tmp_path / "olympiad.parquet"
    )
    env = MathEnv(data_files={"test": olymp}, preset="OlympiadBench", split="test")
    env.reset(seed=0)
    assert env.step("x = \\boxed{5}")[1] == 1.0
    aime = _write(pd.DataFrame([{"Problem": "AIME problem", "Answer": 204}]), tmp_path / "aime.jsonl")
    env = MathEnv(data_files={"test": aime}, preset="aime24", split="test")
    env.reset(seed=0)
    assert env.step("\\boxed{204}")[1] == 1.0
    custom = _write(pd.DataFrame([{"q": "1+1?", "a": "2"}]), tmp_path / "custom.jsonl")
    env = MathEnv(data_files={"train": custom}, question_key="q", answer_key="a")
    env.reset(seed=0)
    assert env.step("\\boxed{2}")[1] == 1.0


def test_bad_env_config_names_the_field(tmp_path):
    path = _write(pd.DataFrame([{"q": "1+1?", "a": "2"}]), tmp_path / "x.jsonl")
    with pytest.raises(ValueError, match="question_key"):
        make("r3l/Math", {"data_files": {"train": path}})
    with pytest.raises(ValueError, match="answer_key"):
        make("r3l/Math", {"data_files": {"train": path}, "question_key": "q", "answer_key": "nope"})
    with pytest.raises(ValueError, match="data_files"):
        make("r3l/Math", {"data_files": str(tmp_path / "missing.parquet")})
    with pytest.raises(ValueError, match="data_files"):
        make("r3l/Math", {"data_files": {"train": path, "validation": path}})
    with pytest.raises(ValueError, match="preset"):
        make("r3l/Math", {"preset": "imo2030"})
    with pytest.raises(ValueError, match="max_attempts"):
        make("r3l/Math", {"max_attempts": 0})
    with pytest.raises(ValueError, match="difficulty"):
        make("r3l/Math", {"difficulty": 7})
    with pytest.raises(ValueError, match="split"):
        make("r3l/Math", {"split": "final"})


def test_hf_dataset_needs_the_optional_datasets_package(monkeypatch):
    # `datasets` is optional and not installed here; simulate its absence if it ever is
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match="datasets"):
        MathEnv(hf_dataset="openai/gsm8k", hf_config="main")


def test_missing_math_verify_is_a_clear_error_simulated_by_hiding_the_installed_package(monkeypatch):
    monkeypatch.setattr(math_env, "_MV", None)
    monkeypatch.setitem(sys.modules, "math_verify", None)
    with pytest.raises(ImportError, match="pip install math-verify"):
        MathEnv()


# ------------------------------------------------------------------------------ r3l/Countdown
def test_countdown_episode_and_feedback():
    env = make("r3l/Countdown")
    obs, info = env.reset(seed=0)
    numbers, target = info["numbers"], info["target"]
    assert len(numbers) == 4 and str(target) in obs and info["admissible_actions"] is None
    value, used = evaluate(env.solution())
    assert value == target and all(used.count(n) <= numbers.count(n) for n in used)
    obs, r, term, _t, info = env.step("no idea")
    assert info["invalid_action"] and not term and "<answer>" in obs
    obs, r, term, _t, info = env.step(f"<answer>{numbers[0]} + {numbers[0]} + {numbers[0]}</answer>")
    assert not info["invalid_action"] and r == 0 and "more often than given" in obs
    obs, r, term, _t, info = env.step(f"Let me think.\n{env.solution()} = {target}")
    assert r == 1.0 and term and info["won"]


def test_countdown_wrong_value_and_unsafe_expressions():
    env = CountdownEnv()
    _, info = env.reset(seed=1)
    n = info["numbers"]
    obs, r, _term, _t, _info = env.step(f"<answer>{n[0]} * {n[1]}</answer>")
    if n[0] * n[1] != info["target"]:
        assert r == 0 and f"equals {n[0] * n[1]}" in obs
    for bad in ("__import__('os').system('true')", "2 ** 10", "-3 + 4", "1 / 0", "1.5 * 2", "abs(3)"):
        with pytest.raises(ExpressionError):
            evaluate(bad)
    assert extract_expression("\\boxed{(3 + 5) \\times 2}") == "(3 + 5) * 2"
    assert extract_expression("<answer>(1+2)*3 = 9</answer>") == "(1+2)*3"


def test_countdown_deterministic_and_disjoint_splits():
    a, b = CountdownEnv(), CountdownEnv()
    assert [a.reset(seed=s)[1]["target"] for s in range(5)] == [b.reset(seed=s)[1]["target"] for s in range(5)]
    puzzles = {}
    for split in ("train", "dev", "test"):
        env = CountdownEnv(split=split)
        puzzles[split] = set()
        for s in range(100):
            info = env.reset(seed=s)[1]
            puzzles[split].add((tuple(sorted(info["numbers"])), info["target"]))
    assert not (puzzles["train"] & puzzles["dev"]) and not (puzzles["train"] & puzzles["test"])
    assert not (puzzles["dev"] & puzzles["test"])
    with pytest.raises(ValueError, match="num_numbers"):
        make("r3l/Countdown", {"num_numbers": 1})
