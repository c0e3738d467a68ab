"""Hindsight pivots (rllib_r3l.runner.reflection.hindsight): the turn whose action the report makes least likely,
at or before the report's pivot. Hand-made episodes with scripted scores (the choice by hand), the real tiny
model for the token arithmetic, and the explorer's use of it."""

from __future__ import annotations

import pytest

import environments
from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.runner.reflection import hindsight
from rllib_r3l.runner.rollout import EpisodeRunner, EpisodeSpec, RolloutOptions
from rllib_r3l.trajectory import Kind
from tests.scripted import ScriptedBackend, explore_options, make_trajectory

# three turns: responses of 2, 1 and 2 tokens
PARTS = [
    ("prompt", 3, -1),
    ("prompt", 2, 0),
    ("response", 2, 0),
    ("prompt", 2, 1),
    ("response", 1, 1),
    ("prompt", 2, 2),
    ("response", 2, 2),
]


class Scores:
    """score_batch answering designed per-token log-probs: ``plain[turn]`` / ``guided[turn]`` per response token."""

    def __init__(self, plain, guided, insert_len):
        self.plain, self.guided, self.insert_len = plain, guided, insert_len

    def score_batch(self, pairs):
        out = []
        for k, (prompt, cont) in enumerate(pairs):
            values = self.plain if k % 2 == 0 else self.guided
            shift = 0 if k % 2 == 0 else self.insert_len
            scores = [0.0] * (len(prompt) + len(cont) - 1)
            for turn, start, end in hindsight.response_spans(self.t, shift):
                for j in range(start, end):
                    scores[j - 1] = values[turn]
            out.append(scores)
        return out


class FixedChat:
    """Only what guidance_segment needs: an insert of a known length."""

    def _render(self, messages, add_generation_prompt):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages)

    def _diff(self, before, after):
        return after[len(before) :]

    def encode(self, text):
        return [7] * 4


def test_the_turn_the_report_speaks_against_by_hand():
    t = make_trajectory(PARTS, reward=0.0, group_id="g")
    backend = Scores(plain={0: -1.0, 1: -2.0, 2: -1.0}, guided={0: -1.1, 1: -5.0, 2: -0.5}, insert_len=4)
    backend.t = t
    # deltas per turn (summed over tokens): 2 x -0.1 = -0.2; 1 x -3 = -3; 2 x +0.5 = +1
    assert hindsight.hindsight_pivots(backend, FixedChat(), [t], ["report"], [2]) == [1]
    assert hindsight.hindsight_pivots(backend, FixedChat(), [t], ["report"], [0]) == [0]  # bounded by the report
    assert hindsight.choose({0: -1.0, 1: -1.0, 2: -3.0}, 1) == 0  # a tie goes to the earliest turn
    assert hindsight.choose({}, 3) is None
    nan = float("nan")  # a NaN score is no evidence: not turn 0 by default (min() over NaN keys would be)
    assert hindsight.choose({0: nan, 1: -0.5, 2: -0.1}, 2) == 1
    assert hindsight.choose({0: nan, 1: float("-inf")}, 1) is None


def test_the_token_arithmetic_matches_the_model_s_own_scores(tiny_model_dir, tiny_tokenizer):
    from rllib_r3l.generation.hf_backend import HFBackend

    backend = HFBackend(tiny_model_dir, dtype="float32", seed=0)
    chat = ChatFormat(tiny_tokenizer)
    runner = EpisodeRunner(
        backend,
        chat,
        lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}),
        RolloutOptions(max_turns=3, max_response_tokens=6, max_context_tokens=4096, temperature=1.0),
    )
    [t] = runner.run([EpisodeSpec(seed=11, group_id="g")])
    [scores] = backend.score_batch([(t.token_ids[:1], t.token_ids[1:])])
    per_turn = hindsight.turn_logprobs(t.token_ids, scores, hindsight.response_spans(t))
    pos = 0
    for s in t.segments:  # each response scored alone after its own prefix: the same sums
        if s.role == "response":
            alone = backend.score(t.token_ids[:pos], s.token_ids)
            assert per_turn[s.turn] == pytest.approx(sum(alone), abs=1e-3)
        pos += len(s.token_ids)
    insert = hindsight.guidance_segment(chat, t.info["system_text"], "Move right.")
    assert "Move right." in tiny_tokenizer.decode(insert)
    [h] = hindsight.hindsight_pivots(backend, chat, [t], ["Move right."], [t.num_turns - 1])
    assert 0 <= h < t.num_turns


class ScoringScripted(ScriptedBackend):
    """The scripted policy with designed scores: the report lowers every token's log-prob, the earliest
    (``early``) or the latest (``not early``) tokens the most; no two turns tie."""

    early = True

    def score_batch(self, pairs):
        out = []
        for k, (prompt, cont) in enumerate(pairs):
            n = len(prompt) + len(cont) - 1
            loss = [100.0 / (j + 1) ** 2 if self.early else j / 1000.0 for j in range(n)]
            out.append([-1.0] * n if k % 2 == 0 else [-1.0 - x for x in loss])
        return out


@pytest.mark.parametrize("early, pivot", [(True, 0), (False, 1)])
def test_the_explorer_retries_from_the_hindsight_pivot_and_ledgers_it(tiny_tokenizer, early, pivot):
    from rllib_r3l.runner.explore import Explorer

    chat = ChatFormat(tiny_tokenizer)
    backend = ScoringScripted(tiny_tokenizer, pivot=1)
    backend.early = early
    runner = EpisodeRunner(
        backend,
        chat,
        lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}),
        RolloutOptions(max_turns=6, max_response_tokens=16, max_context_tokens=4096, temperature=1.0),
    )
    ex = Explorer(runner, chat, explore_options(group_size=4, reflect_on="failures", pivot_selector="hindsight"))
    [group] = ex.explore([11], ["g0"])
    retries = [t for t in group.trajectories if t.kind == Kind.RETRY]
    assert retries and all(t.pivot == pivot for t in retries)  # the reports said 1
    assert all((r["reported_pivot"], r["hindsight_pivot"], r["pivot"]) == (1, pivot, pivot) for r in group.ledger)
    assert ex.pop_metrics()["hindsight_pivot_shift"] == pivot - 1
