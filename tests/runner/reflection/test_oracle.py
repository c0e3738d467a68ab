"""Oracle reflection (a diagnostic, issue 11 item 3) and pivot-quality metrics (item 2)."""

import json

import pytest

import environments
from rllib_r3l import R3LConfig
from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.runner.explore import Explorer
from rllib_r3l.runner.reflection.oracle import oracle_report
from rllib_r3l.runner.reflection.pivot_metrics import pivot_quality, summarize_pivot_quality
from rllib_r3l.runner.reflection.reflect import Outcome, ParseStatus
from rllib_r3l.runner.rollout import EpisodeRunner, EpisodeSpec, RolloutOptions
from rllib_r3l.trajectory import Kind
from tests.scripted import ScriptedBackend, explore_options

SEED = 11  # ToyCorridor(4 rooms): start in room 2, coin in room 4; the oracle pivot of "move left ..." is 0


# ------------------------------------------------------------------------------------------- pure metrics
def _q(exact, in_time, error, early, within_one):
    return {
        "pivot_exact": exact,
        "pivot_in_time": in_time,
        "pivot_error": error,
        "pivot_early": early,
        "pivot_accuracy": within_one,
    }


def test_pivot_quality_hand_values():
    assert pivot_quality(3, 3) == _q(1.0, 1.0, 0.0, 0.0, 1.0)
    assert pivot_quality(2, 3) == _q(0.0, 1.0, -1.0, 1.0, 1.0)
    assert pivot_quality(5, 3) == _q(0.0, 0.0, 2.0, 0.0, 0.0)
    assert pivot_quality(0, 4) == _q(0.0, 1.0, -4.0, 1.0, 0.0)
    assert pivot_quality(None, 3) is None and pivot_quality(3, None) is None and pivot_quality(True, 1) is None
    assert summarize_pivot_quality([(3, 3), (2, 3), (5, 3), (0, 4), (None, 1), (1, None)]) == {
        "pivot_exact_rate": 0.25,
        "pivot_in_time_rate": 0.75,
        "pivot_accuracy": 0.5,
        "pivot_error_mean": -0.75,
        "pivot_early_rate": 0.5,
        "pivot_scored": 4.0,
    }


def test_a_planted_late_pivot_is_scored_late_not_accurate():
    """A pivot one turn after the first mistake replays the mistake: "within one turn" called it accurate.
    A constant pivot of 1 over episodes whose mistake is at turn 0 scores 1.0 within one turn, 0 in time."""
    late = summarize_pivot_quality([(1, 0)] * 32)
    assert late["pivot_accuracy"] == 1.0  # the old headline number
    assert late["pivot_in_time_rate"] == 0.0 and late["pivot_exact_rate"] == 0.0 and late["pivot_error_mean"] == 1.0
    assert summarize_pivot_quality([(None, 2)]) == {}


def test_oracle_report_is_valid_and_names_the_gold_action():
    r = oracle_report(["move left", "take coin"], False, 0, "move right")
    assert r.status is ParseStatus.VALID and r.triggers_retry
    assert r.report.pivot == 0 and r.report.outcome is Outcome.FAILURE
    assert "'move right'" in r.report.suggestion and "'move left'" in r.report.suggestion
    r = oracle_report(["look", "move right", "take coin"], True, 0, "move right")
    assert r.report.outcome is Outcome.SUCCESS_BUT_INEFFICIENT and r.report.pivot == 0
    assert oracle_report(["move right", "take coin"], True, None, None).status is ParseStatus.PERFECT
    assert oracle_report(["move right"], False, None, None) is None  # nothing to retry


# ------------------------------------------------------------------------------------------- explorer
def follows_oracle(prompt_text, choices):
    """Moves left unguided; with the oracle's guidance in context, does what it says at each room."""
    last_user = prompt_text.rsplit("user\n", 1)[-1]
    if "coin here" in last_user:
        return "take coin"
    if "do 'move right'" in prompt_text:
        return "move right"
    return "move left" if "move left" in last_user else "take coin"


def make_explorer(tokenizer, pivot=1, **kw):
    chat = ChatFormat(tokenizer)
    backend = ScriptedBackend(tokenizer, policy=follows_oracle, pivot=pivot)
    opts = RolloutOptions(max_turns=6, max_response_tokens=16, max_context_tokens=4096, temperature=1.0)
    runner = EpisodeRunner(backend, chat, lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}), opts)
    return Explorer(runner, chat, explore_options(group_size=4, **kw)), backend


def test_oracle_reflector_retries_from_the_oracle_pivot_and_is_never_trained_on(tokenizer):
    ex, backend = make_explorer(tokenizer, reflector="oracle")
    [group] = ex.explore([SEED], ["g0"])
    kinds = [t.kind for t in group.trajectories]
    assert kinds.count(Kind.BASE) == 2 and kinds.count(Kind.RETRY) == 2
    assert Kind.REFLECTION_SFT not in kinds  # the policy did not write the report
    assert all(r.json_schema is None for call in backend.calls for r in call)  # no reflection generated
    retries = [t for t in group.trajectories if t.kind == Kind.RETRY]
    assert all(r.pivot == 0 and r.success and r.actions == ["move right", "move right", "take coin"] for r in retries)
    parsed, prompt_ids, out = [t for t in group.trajectories if t.kind == Kind.BASE][0].info["reflection"]
    assert parsed.report.pivot == 0 and "'move right'" in parsed.report.suggestion and out is None
    m = ex.pop_metrics()
    assert m["retry_success_rate"] == 1.0 and m["reflection_valid_rate"] == 1.0
    # the link from report to retry: at the pivot the retry left its base's action for the named gold one
    assert m["retry_changed_pivot_action"] == 1.0 and m["retry_took_oracle_action"] == 1.0
    assert "pivot_accuracy" not in m  # scored only for the policy's own reflections


@pytest.mark.parametrize("pivot, accuracy, error, early", [(1, 1.0, 1.0, 0.0), (3, 0.0, 3.0, 0.0), (0, 1.0, 0.0, 0.0)])
def test_policy_reflections_are_scored_against_the_oracle_pivot(tokenizer, pivot, accuracy, error, early):
    ex, _backend = make_explorer(tokenizer, pivot=pivot)
    ex.explore([SEED], ["g0"])
    m = ex.pop_metrics()
    assert m["pivot_accuracy"] == accuracy and m["pivot_error_mean"] == error and m["pivot_early_rate"] == early
    assert "retry_took_oracle_action" not in m  # the policy's reports name no gold action


def test_a_retry_that_ignores_the_oracle_report_is_counted_as_such(tokenizer):
    """The guidance is in context but the policy keeps its own move: the retry repeats its base at
    the pivot (changed 0) and does not take the named action (took 0): the failing link is visible."""
    chat = ChatFormat(tokenizer)
    backend = ScriptedBackend(tokenizer, policy=lambda prompt, choices: "move left")
    opts = RolloutOptions(max_turns=4, max_response_tokens=16, max_context_tokens=4096, temperature=1.0)
    runner = EpisodeRunner(backend, chat, lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}), opts)
    ex = Explorer(runner, chat, explore_options(group_size=4, reflector="oracle"))
    [group] = ex.explore([SEED], ["g0"])
    assert sum(t.kind == Kind.RETRY for t in group.trajectories) == 2
    m = ex.pop_metrics()
    assert m["retry_success_rate"] == 0.0
    assert m["retry_changed_pivot_action"] == 0.0 and m["retry_took_oracle_action"] == 0.0


def test_no_pivot_metrics_without_an_oracle(tokenizer):
    class NoOracle(environments.toy.ToyCorridorEnv):
        has_oracle = False

    ex, _backend = make_explorer(tokenizer, pivot=1)
    ex.episodes.env_factory = lambda: NoOracle(num_rooms=4)
    ex.explore([SEED], ["g0"])
    assert not any(k.startswith("pivot_") for k in ex.pop_metrics())


# ------------------------------------------------------------------------------------------- config
def test_config_reflector_option_is_validated():
    R3LConfig().training(reflector="oracle").validate_r3l()  # the default env (coin collector) has one
    R3LConfig().environment("r3l/ToyCorridor").training(reflector="oracle").validate_r3l()
    with pytest.raises(ValueError, match="R3LConfig.reflector.*WebShop.*has none"):
        R3LConfig().environment("r3l/WebShop").training(reflector="oracle").validate_r3l()
    with pytest.raises(ValueError, match="R3LConfig.reflector.*reflect=True"):
        R3LConfig().training(reflector="oracle", reflect=False).validate_r3l()
    with pytest.raises(ValueError, match="R3LConfig.reflector_model: this option was removed.*reflector="):
        R3LConfig().training(reflector="oracle", reflector_model="tiny")
    with pytest.raises(ValueError, match="R3LConfig.reflector: 'oracel' is neither.*did you mean 'oracle'"):
        R3LConfig().training(reflector="oracel").validate_r3l()
    with pytest.raises(ValueError, match="R3LConfig.reflector: must be 'policy', 'oracle' or"):
        R3LConfig().training(reflector="").validate_r3l()
    assert R3LConfig().training(reflector="HuggingFaceTB/SmolLM2-360M").reflector_model == "HuggingFaceTB/SmolLM2-360M"
    assert json.dumps(R3LConfig().training(reflector="oracle").r3l_options["reflector"]) == '"oracle"'


def test_reflection_quality_on_held_out_seeds(tokenizer):
    from rllib_r3l.runner.reflection_quality import reflection_quality

    ex, backend = make_explorer(tokenizer, pivot=1)
    m = reflection_quality(ex.episodes, ex.chat, [SEED, SEED])
    assert m["episodes"] == 2 and m["reflected"] == 2 and m["success_rate"] == 0.0
    assert m["reflection_valid_rate"] == 1.0
    assert m["pivot_accuracy"] == 1.0 and m["pivot_error_mean"] == 1.0 and m["pivot_early_rate"] == 0.0
    assert all(r.json_schema is not None for r in backend.calls[-1])  # the last call: the reflections


@pytest.mark.slow
def test_score_reflections_on_finished_episodes_and_evaluate_reports_reflection_quality(tokenizer, tiny_model_dir):
    from rllib_r3l.cli.evaluate import evaluate
    from rllib_r3l.runner.reflection_quality import reflection_summary, score_reflections

    ex, _backend = make_explorer(tokenizer, pivot=3)
    trajs = ex.episodes.run([EpisodeSpec(seed=SEED, group_id="e")])
    m = score_reflections(ex.episodes, ex.chat, trajs)
    assert m["reflected"] == 1 and m["pivot_accuracy"] == 0.0 and m["pivot_error_mean"] == 3.0
    # through evaluate (a tiny random model: its reflections are scored, whatever they are)
    summary, _df = evaluate(
        tiny_model_dir,
        env="r3l/ToyCorridor",
        episodes=1,
        backend="transformers",
        max_response_tokens=4,
        extra=reflection_summary(max_reflection_tokens=8),
    )
    assert summary["reflected"] == 1 and summary["reflection_valid_rate"] == 0.0  # 8 tokens: no valid report
    assert (
        "pivot_accuracy"
        not in evaluate(
            tiny_model_dir, env="r3l/ToyCorridor", episodes=1, backend="transformers", max_response_tokens=4
        )[0]
    )


def test_a_guidance_template_reaches_the_retry_and_is_stripped_from_training(tokenizer):
    ex, backend = make_explorer(tokenizer, reflector="oracle", guidance_template="Advice now: {suggestion}")
    [group] = ex.explore([SEED], ["g0"])
    retries = [t for t in group.trajectories if t.kind == Kind.RETRY]
    assert retries and all(r.success for r in retries)  # the scripted policy reads "do 'move right'"
    seen = [tokenizer.decode(r.prompt_token_ids) for call in backend.calls for r in call]
    assert any("Advice now: At step 0, instead of 'move left', do 'move right'." in t for t in seen)
    assert not any('"retry_from_step"' in t for t in seen)  # not the JSON report
    assert all("Advice now" not in tokenizer.decode(r.token_ids) for r in retries)  # stripped


def test_a_bad_guidance_template_is_refused_by_the_config_naming_the_field():
    with pytest.raises(ValueError, match=r"R3LConfig.guidance_template: .*\{report\} or \{suggestion\}"):
        R3LConfig().training(guidance_template="just act").validate_r3l()
    R3LConfig().training(guidance_template="Advice: {suggestion}").validate_r3l()
