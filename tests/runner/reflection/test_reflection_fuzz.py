"""Reflections fuzzed (issue 37): generated reports through the parser and the retry planner.

Over 10,000 reports — truncated JSON, wrong types, huge numbers, unicode, nested objects, pivots out of
range, empty fields, prose around the object — go through ``parse_report`` and, as the reflector's
answers, through ``Explorer``'s reflect-then-retry on a real environment. Nothing may raise; every
report is counted under exactly one named status (the invalid ones are the faults); and no invalid
report is ever trained on: it triggers no retry and yields no reflection item.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import environments
from rllib_r3l.generation.base import GenerationResult
from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.runner.explore import Explorer
from rllib_r3l.runner.reflection.parse import parse_report
from rllib_r3l.runner.reflection.report import ParseStatus
from rllib_r3l.runner.rollout import EpisodeRunner, RolloutOptions
from rllib_r3l.trajectory import Kind
from tests.scripted import ScriptedBackend, corridor_policy, explore_options

FIELDS = ("summary", "root_cause", "outcome", "suggestion", "retry_from_step", "pivot")
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(
        ["", " ", "null", "N/A", "failure", "success", "Success but inefficient", "bogus", "３", "1e309", "-0", "२"]
    ),
)
_value = st.recursive(
    _scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6,
)
_keys = st.one_of(
    st.sampled_from(FIELDS),
    st.sampled_from(["Root Cause", "OUTCOME", "pivot_turn", "Suggestion "]),
    st.text(max_size=12),
)
_objects = st.dictionaries(_keys, _value, max_size=7)


@st.composite
def report_texts(draw):
    """A reflector's answer: a (possibly broken) report object, with or without prose around it."""
    obj = draw(_objects)
    try:
        body = json.dumps(obj, ensure_ascii=draw(st.booleans()))
    except ValueError:  # NaN/inf are JSON-dumpable in Python; anything else that is not: stringify
        body = str(obj)
    form = draw(st.sampled_from(["plain", "truncated", "fenced", "prose", "text", "empty", "nested", "valid"]))
    if form == "valid":  # a well-formed report (so the planner has retries to plan), any pivot
        body = json.dumps(
            {
                "summary": draw(st.text(min_size=1, max_size=20)) + ".",
                "root_cause": "It went left.",
                "outcome": draw(st.sampled_from(["failure", "success_but_inefficient"])),
                "suggestion": "GO-RIGHT-INSTEAD: move right.",
                "retry_from_step": draw(st.integers(-1, 5)),
            }
        )
    elif form == "truncated":
        body = body[: draw(st.integers(0, max(len(body) - 1, 0)))]
    elif form == "fenced":
        body = f"```json\n{body}\n```"
    elif form == "prose":
        body = draw(st.text(max_size=40)) + body + draw(st.text(max_size=40))
    elif form == "text":
        body = draw(st.text(max_size=200))
    elif form == "empty":
        body = draw(st.sampled_from(["", "   ", "\n", "{}", "[]", "null"]))
    elif form == "nested":
        body = json.dumps({"report": obj, "reflection": [obj]}, default=str)
    return body


FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def _variants(text: str):
    """A drawn report and four cuts of it (a reflection cut by its token budget at any point): drawing is
    what costs (hypothesis), parsing is cheap, so each drawn text is parsed five ways."""
    n = len(text)
    return [text, *(text[: n * k // 4] for k in (1, 2, 3)), text[n // 3 :]]


@pytest.mark.slow
def test_ten_thousand_reports_through_the_parser_never_raise_and_get_one_status():
    seen = Counter()

    @settings(FUZZ, max_examples=40)
    @given(st.lists(report_texts(), min_size=50, max_size=50), st.integers(-2, 30))
    def check(texts, num_turns):
        for text in (v for t in texts for v in _variants(t)):
            r = parse_report(text, num_turns)
            assert isinstance(r.status, ParseStatus)
            seen[r.status] += 1
            if r.ok:  # a valid report holds the rules the retry relies on
                assert r.report.summary and r.report.root_cause
                if r.status is ParseStatus.VALID:
                    assert r.report.suggestion and 0 <= r.report.pivot < max(num_turns, 1)
            else:
                assert r.report is None and not r.triggers_retry

    check()
    assert sum(seen.values()) >= 10_000
    invalid = {s for s in seen if not s.ok}
    assert len(invalid) >= 5, seen  # the generator reaches many kinds of broken report, not one


class FuzzReflector(ScriptedBackend):
    """Acts like the scripted corridor policy; answers each reflection request with the next fuzzed text."""

    def __init__(self, tokenizer, texts):
        super().__init__(tokenizer, policy=corridor_policy)
        self.texts = list(texts)
        self.answered = []

    def generate(self, requests, *, temperature, top_p=1.0, seed=None, on_done=None):
        out = []
        for r in requests:
            if r.json_schema is None and r.choices is None:  # never the case in this test
                raise AssertionError("unexpected free-text request")
            if r.json_schema is not None:
                text = self.texts[len(self.answered) % len(self.texts)]
                self.answered.append(text)
                ids = self.tok.encode(text, add_special_tokens=False)[:64] + [self.tok.eos_token_id]
                out.append(GenerationResult(token_ids=ids, logprobs=[-0.5] * len(ids), text=text, finish_reason="stop"))
            else:
                out.extend(super().generate([r], temperature=temperature))
        return out


class RecordingExplorer(Explorer):
    """The real Explorer; records which base episode every retry and reflection item came from."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.retried, self.reflection_items = [], []

    def _add_retry(self, base, retry, group):
        self.retried.append(base)
        super()._add_retry(base, retry, group)

    def _add_reflection_item(self, base, group):
        self.reflection_items.append(base)
        super()._add_reflection_item(base, group)


@pytest.mark.slow
def test_fuzzed_reflections_through_the_retry_planner_are_counted_and_never_trained_on(tokenizer):
    chat = ChatFormat(tokenizer)
    total, retried = Counter(), [0]

    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(report_texts(), min_size=8, max_size=8), st.sampled_from([1, 2]))
    def check(texts, pivot_hint):
        backend = FuzzReflector(tokenizer, texts)
        runner = EpisodeRunner(
            backend,
            chat,
            lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}),
            RolloutOptions(max_turns=4, max_response_tokens=16, max_context_tokens=4096, temperature=1.0),
        )
        ex = RecordingExplorer(runner, chat, explore_options(group_size=8, reflect_on="all"))
        groups = ex.explore([11, 12], ["a", "b"])
        bases = [t for g in groups for t in g.trajectories if t.kind == Kind.BASE]
        assert len(bases) == 8 and len(backend.answered) == 8  # 2 tasks x 4 base episodes, each reflected once
        # every answer is counted once, under the status the parser gives it on its own
        want = Counter(parse_report(b.info["reflection"][2].text, len(b.actions)).status for b in bases)
        got = Counter({s: n for s, n in ex.reflection_stats.counts.items() if n})
        contradicted = ex.counters["reflection_contradicts_reward"]  # "success" for a failed episode
        assert sum(got.values()) == 8 and (got == want or contradicted > 0)
        for b in bases:
            total[b.info["reflection"][0].status] += 1
        # nothing from an invalid report reaches training: no retry, no reflection item
        retried[0] += len(ex.retried)
        for b in ex.retried:
            assert b.info["reflection"][0].triggers_retry
        for b in ex.reflection_items:
            assert b.info["reflection"][0].ok
        n_retries = sum(1 for g in groups for t in g.trajectories if t.kind == Kind.RETRY)
        assert n_retries <= sum(1 for b in bases if b.info["reflection"][0].triggers_retry)
        metrics = ex.pop_metrics()
        assert metrics["reflection_total"] == 8
        assert sum(metrics[f"reflection_{s.value}"] for s in ParseStatus) == 8

    check()
    assert sum(total.values()) >= 480
    assert sum(n for s, n in total.items() if not s.ok) > 0 and total[ParseStatus.VALID] > 0
    assert retried[0] > 0  # valid reports did start retries: the checks above saw the planner at work
