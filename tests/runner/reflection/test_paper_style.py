"""``reflection_style="paper"`` (issue 39 item 1): the authors' reflection, end to end with a scripted
policy on ToyCorridor (tests/scripted.py: every base fails, every guided retry from turn 1 succeeds).

The paper's reflector is the policy under a Reflector system prompt over the episode's log, sampled
freely at ``reflection_temperature`` and parsed leniently; its reflection-SFT item trains on exactly
the sampled ids with the sampler's log-probs. Invalid reports are counted and never trained on.
"""

from __future__ import annotations

import pytest

import environments
from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.runner.explore import ExploreOptions, Explorer
from rllib_r3l.runner.reflection import reflect as reflect_lib
from rllib_r3l.runner.reflection.paper_prompt import PAPER_REFLECTION_SYSTEM, PAPER_REFLECTION_TEMPLATE
from rllib_r3l.runner.reflection.report import ParseStatus
from rllib_r3l.runner.rollout import EpisodeRunner, RolloutOptions
from rllib_r3l.trajectory import Kind
from tests.scripted import SEED, ScriptedBackend, explore_options, is_reflection_request, walk_policy

PAPER = dict(
    reflection_style="paper",
    reflection_structured=False,
    reflection_context="log",
    reflection_temperature=0.7,
    temperature=1.0,
)


class SpelledApart(ScriptedBackend):
    """Free reports sampled in tokens the tokenizer would not choose (one character a token): a
    sample the paper's style must train on as sampled, not re-encode."""

    def _result(self, text):
        res = super()._result(text)
        if "```json" in text:
            ids = [t for ch in text for t in self.tok.encode(ch, add_special_tokens=False)] + [self.tok.eos_token_id]
            lps = [-0.25 - 0.001 * i for i in range(len(ids))]  # distinct, to see them carried over
            res = type(res)(token_ids=ids, logprobs=lps, text=text, finish_reason="stop")
        return res


class Rambling(ScriptedBackend):
    """A policy whose free reflections never hold a report."""

    def generate(self, requests, *, temperature, top_p=1.0, seed=None, on_done=None):
        outs = super().generate(requests, temperature=temperature, top_p=top_p, seed=seed, on_done=on_done)
        for i, r in enumerate(requests):
            if is_reflection_request(self.tok.decode(r.prompt_token_ids)):
                outs[i] = self._result("I think the agent should have tried harder somehow.")
        return outs


def make(tokenizer, backend_cls=ScriptedBackend, **options):
    chat = ChatFormat(tokenizer)
    backend = backend_cls(tokenizer, policy=walk_policy("left", "right"), pivot=1)
    ro = RolloutOptions(max_turns=6, max_response_tokens=16, max_context_tokens=4096, temperature=1.0)
    runner = EpisodeRunner(backend, chat, lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}), ro)
    return Explorer(runner, chat, explore_options(**{"group_size": 4, **PAPER, **options})), chat, backend


def reflection_calls(backend):
    return [
        (reqs, t)
        for reqs, t in zip(backend.calls, backend.temperatures)
        if any(is_reflection_request(backend.tok.decode(r.prompt_token_ids)) for r in reqs)
    ]


def test_the_paper_reflector_reads_the_log_under_its_system_prompt_sampled_freely_at_its_temperature(tiny_tokenizer):
    ex, chat, backend = make(tiny_tokenizer)
    [group] = ex.explore([SEED], ["g0"])
    bases = [t for t in group.trajectories if t.kind == Kind.BASE]
    [(reqs, temperature)] = reflection_calls(backend)
    assert temperature == 0.7 and set(backend.temperatures) == {1.0, 0.7}  # rollouts at 1.0
    assert all(r.json_schema is None for r in reqs)  # no grammar
    assert [r.max_tokens for r in reqs] == [512, 512]  # up to max_reflection_tokens
    expected = [
        chat.prompt(
            reflect_lib.build_reflection_messages(b, template=PAPER_REFLECTION_TEMPLATE, system=PAPER_REFLECTION_SYSTEM)
        )
        for b in bases
    ]
    assert [r.prompt_token_ids for r in reqs] == expected
    text = tiny_tokenizer.decode(reqs[0].prompt_token_ids)
    assert "You are a Reflector" in text and "### Step 0" in text and "from 0 to" in text
    # the free report (prose, then a fenced object with the authors' field names) parsed leniently
    assert ex.reflection_stats.counts[ParseStatus.VALID] == 2
    assert len([t for t in group.trajectories if t.kind == Kind.RETRY]) == 2


def test_the_reflection_item_trains_on_exactly_the_sampled_ids_with_the_samplers_log_probs(tiny_tokenizer):
    ex, chat, _ = make(tiny_tokenizer, backend_cls=SpelledApart)
    [group] = ex.explore([SEED], ["g0"])
    bases = [t for t in group.trajectories if t.kind == Kind.BASE]
    items = [t for t in group.trajectories if t.kind == Kind.REFLECTION_SFT]
    assert len(items) == 2
    for b, item in zip(bases, items):
        _parsed, prompt_ids, out = b.info["reflection"]
        assert out.token_ids[:-1] != chat.encode(out.text)  # not the tokenizer's own spelling
        prompt, response = item.segments
        assert prompt.token_ids == prompt_ids  # the prompt the policy reflected under
        assert response.token_ids == list(out.token_ids)  # as sampled, EOS included
        assert response.logprobs == list(out.logprobs)  # the sampler's, kept like a base turn's
        assert (item.fixed_advantage, item.success) == (1.0, True)
    assert ex.counters["reflection_items_as_sampled"] == 2
    assert ex.counters["reflection_items_retokenized"] == 0


def test_the_structured_style_still_re_encodes_a_sample_spelled_apart(tiny_tokenizer):
    ex, chat, _ = make(tiny_tokenizer, backend_cls=SpelledApart, reflection_style="structured")
    [group] = ex.explore([SEED], ["g0"])
    items = [t for t in group.trajectories if t.kind == Kind.REFLECTION_SFT]
    assert len(items) == 2 and ex.counters["reflection_items_retokenized"] == 2
    assert all(i.segments[1].logprobs is None for i in items)


def test_invalid_free_reports_are_counted_and_never_trained_on(tiny_tokenizer):
    ex, _, _ = make(tiny_tokenizer, backend_cls=Rambling)
    [group] = ex.explore([SEED], ["g0"])
    kinds = {t.kind for t in group.trajectories}
    assert kinds == {Kind.BASE}  # no retry, no reflection or retry item
    assert ex.reflection_stats.counts[ParseStatus.NO_JSON] == 2 and ex.reflection_stats.total == 2
    m = ex.pop_metrics()
    assert (m["reflection_valid_rate"], m["reflection_no_json"], m["reflection_total"]) == (0.0, 2, 2)


def test_reflection_temperature_none_samples_at_the_training_temperature(tiny_tokenizer):
    ex, _, backend = make(tiny_tokenizer, reflection_temperature=None, temperature=0.9)
    ex.explore([SEED], ["g0"])
    [(_reqs, temperature)] = reflection_calls(backend)
    assert temperature == 0.9


def test_the_config_resolves_the_papers_style_and_refuses_a_grammar_with_it():
    from rllib_r3l import R3LConfig

    c = R3LConfig().training(reflection_style="paper", reflection_temperature=0.7)
    opts = ExploreOptions.from_config(c)
    assert (
        opts.reflection_style,
        opts.reflection_structured,
        opts.reflection_context,
        opts.reflection_temperature,
    ) == ("paper", False, "log", 0.7)
    d = ExploreOptions.from_config(R3LConfig())  # the default: structured, in the transcript
    assert (d.reflection_style, d.reflection_structured, d.reflection_context, d.reflection_temperature) == (
        "structured",
        True,
        "transcript",
        None,
    )
    c.validate_r3l()
    with pytest.raises(ValueError, match=r"R3LConfig.reflection_structured: True holds the report to a JSON grammar"):
        R3LConfig().training(reflection_style="paper", reflection_structured=True).validate_r3l()
    with pytest.raises(ValueError, match=r"R3LConfig.reflection_style: must be one of"):
        R3LConfig().training(reflection_style="free").validate_r3l()
    with pytest.raises(ValueError, match=r"reflection_temperature"):
        R3LConfig().training(reflection_temperature=-0.5).validate_r3l()
    # explicit choices win over the style: a transcript context, an unconstrained structured prompt
    e = ExploreOptions.from_config(R3LConfig().training(reflection_style="paper", reflection_context="transcript"))
    assert e.reflection_context == "transcript"
    assert ExploreOptions.from_config(R3LConfig().training(reflection_structured=False)).reflection_structured is False


def test_the_reflector_prompt_has_no_answer_to_copy():
    """The 135M policy copied the prompt's JSON example into its reports (17/32 first pivots were the example's
    "1", 13/32 named its subject). The example is prose now: copying any part of the prompt is no valid report,
    and it names no step number."""
    from rllib_r3l.runner.reflection.parse import parse_report

    example = PAPER_REFLECTION_SYSTEM.split("Example of the reasoning", 1)[1]
    assert "{" not in example and not any(ch.isdigit() for ch in example)
    assert not parse_report(PAPER_REFLECTION_SYSTEM, 5).ok  # the field list is a schema with placeholders
    for env_word in ("apple", "fridge", "coin", "room", "wash"):  # no subject of an environment here
        assert env_word not in PAPER_REFLECTION_SYSTEM.lower(), env_word
