"""Token-exact trajectories (rllib_r3l.trajectory) with hand values: segment checks, the guidance
views of a retry, ``to_arrays`` and ``collate`` column by column (values, dtypes, padding, the
context limit). Pure numpy, no tokenizer: the ids are made up."""

from __future__ import annotations

import numpy as np
import pytest

from rllib_r3l.trajectory import KINDS, Kind, Segment, Trajectory, collate


# ------------------------------------------------------------------------------------ Segment
def test_segment_rejects_an_unknown_role_by_name():
    with pytest.raises(ValueError, match=r"Segment.role must be prompt/response/guidance, got 'answer'"):
        Segment("answer", [1], turn=0)


@pytest.mark.parametrize("name", ["logprobs", "model_logprobs"])
def test_response_log_probs_must_match_its_tokens(name):
    with pytest.raises(ValueError, match=rf"^response segment has 2 tokens but 3 {name}$"):
        Segment("response", [1, 2], turn=0, **{name: [-0.1, -0.2, -0.3]})
    Segment("response", [1, 2], turn=0, **{name: [-0.1, -0.2]})  # equal lengths: fine
    Segment("response", [1, 2], turn=0, **{name: None})  # unknown: fine
    # only responses carry log-probs: a prompt's are not checked (nor used)
    Segment("prompt", [1, 2], turn=0, **{name: [-0.1]})


# ----------------------------------------------------------------------- guidance of a retry
def _retry() -> Trajectory:
    """A retry from turn 1: prompt/response of turn 0, then turn 1 in its guided rendering (the
    guidance the model saw) and its unguided rendering (what is trained on), then response 1."""
    return Trajectory(
        segments=[
            Segment("prompt", [10, 11], turn=0),
            Segment("response", [12, 13], turn=0, logprobs=[-0.5, -0.25]),
            Segment("guidance", [20, 21, 22], turn=1),
            Segment("prompt", [30], turn=1, unguided_only=True),
            Segment("response", [14], turn=1, logprobs=[-1.0]),
        ],
        reward=1.0,
        group_id="g",
        kind=Kind.RETRY,
        credit_from_turn=1,
        pivot=1,
    )


def test_has_guidance_sees_either_rendering():
    only_guidance = Trajectory([Segment("prompt", [1], 0), Segment("guidance", [2], 1)], 0.0, "g")
    only_unguided = Trajectory([Segment("prompt", [1], 0), Segment("prompt", [2], 1, unguided_only=True)], 0.0, "g")
    plain = Trajectory([Segment("prompt", [1], 0), Segment("response", [2], 0)], 0.0, "g")
    assert only_guidance.has_guidance() and only_unguided.has_guidance() and _retry().has_guidance()
    assert not plain.has_guidance()


def test_training_and_guided_views_of_a_retry():
    r = _retry()
    train = r.strip_guidance()
    assert train.token_ids == [10, 11, 12, 13, 30, 14]  # guidance out, the unguided turn in
    assert [s.unguided_only for s in train.segments] == [False] * 4
    assert all(s.unguided_only is False for s in train.segments)  # a bool, as declared
    assert not train.has_guidance() and train.kind is Kind.RETRY and train.credit_from_turn == 1
    seen = r.guided_view()
    assert seen.token_ids == [10, 11, 12, 13, 20, 21, 22, 14]  # what the model saw
    assert [s.role for s in seen.segments] == ["prompt", "response", "prompt", "response"]
    assert r.context_ids() == seen.token_ids
    assert r.num_tokens == 9 and r.num_generated_tokens == 3
    assert [s.token_ids for s in r.prefix_segments(1)] == [[10, 11], [12, 13]]
    assert r.prefix_segments(0) == []
    assert r.segments[2].role == "guidance"  # the views are copies: the retry itself is unchanged


def test_to_arrays_refuses_guidance_with_the_remedy():
    with pytest.raises(
        ValueError,
        match=r"^trajectory still holds guidance: call strip_guidance\(\) \(retry\) or "
        r"guided_view\(\) \(retry-SFT\) before training on it$",
    ):
        _retry().to_arrays()


# -------------------------------------------------------------------------------- to_arrays
def _two_turns(**kw) -> Trajectory:
    """Turn 0: prompt 2 tokens, response 2 (sampler and behaviour log-probs); turn 1: prompt 1,
    response 2 (sampler log-probs only)."""
    return Trajectory(
        segments=[
            Segment("prompt", [1, 2], turn=0),
            Segment("response", [3, 4], turn=0, logprobs=[-0.5, -0.25], model_logprobs=[-0.4, -0.2]),
            Segment("prompt", [5], turn=1),
            Segment("response", [6, 7], turn=1, logprobs=[-1.0, -2.0]),
        ],
        reward=0.0,
        group_id="g",
        **kw,
    )


def test_to_arrays_hand_values():
    a = _two_turns(credit_from_turn=1).to_arrays()
    np.testing.assert_array_equal(a["input_ids"], [1, 2, 3, 4, 5, 6, 7])
    np.testing.assert_array_equal(a["response_mask"], [0, 0, 1, 1, 0, 1, 1])
    np.testing.assert_array_equal(a["loss_mask"], [0, 0, 0, 0, 0, 1, 1])  # turn 0 before the pivot: no credit
    np.testing.assert_array_equal(a["turn_ids"], [0, 0, 0, 0, 1, 1, 1])
    # log-probs at response positions, 0 everywhere else (unknown behaviour log-probs too)
    np.testing.assert_array_equal(a["sampler_logprobs"], np.float32([0, 0, -0.5, -0.25, 0, -1.0, -2.0]))
    np.testing.assert_array_equal(a["behaviour_logprobs"], np.float32([0, 0, -0.4, -0.2, 0, 0, 0]))
    assert a["has_sampler_logprobs"] is True and a["has_behaviour_logprobs"] is False  # turn 1 has none
    assert {
        k: a[k].dtype
        for k in ("input_ids", "response_mask", "loss_mask", "turn_ids", "sampler_logprobs", "behaviour_logprobs")
    } == {
        "input_ids": np.int64,
        "response_mask": np.bool_,
        "loss_mask": np.bool_,
        "turn_ids": np.int64,
        "sampler_logprobs": np.float32,
        "behaviour_logprobs": np.float32,
    }
    # pivotal credit off: every response token carries credit
    np.testing.assert_array_equal(
        _two_turns(credit_from_turn=1).to_arrays(pivotal_credit=False)["loss_mask"], [0, 0, 1, 1, 0, 1, 1]
    )


def test_to_arrays_log_prob_flags():
    t = _two_turns()
    t.segments[3].model_logprobs = [-0.9, -1.9]
    a = t.to_arrays()
    assert a["has_sampler_logprobs"] is True and a["has_behaviour_logprobs"] is True
    np.testing.assert_allclose(a["behaviour_logprobs"], np.float32([0, 0, -0.4, -0.2, 0, -0.9, -1.9]))
    t.segments[1].logprobs = None  # one response without sampler log-probs: the row has none
    a = t.to_arrays()
    assert a["has_sampler_logprobs"] is False and a["has_behaviour_logprobs"] is True
    np.testing.assert_array_equal(a["sampler_logprobs"], np.float32([0, 0, 0, 0, 0, -1.0, -2.0]))
    # no response at all (a prompt-only item): no log-probs to speak of
    a = Trajectory([Segment("prompt", [1, 2], 0)], 0.0, "g").to_arrays()
    assert a["has_sampler_logprobs"] is False and a["has_behaviour_logprobs"] is False
    np.testing.assert_array_equal(a["loss_mask"], [False, False])


def test_to_arrays_of_an_empty_trajectory_keeps_the_dtypes():
    a = Trajectory([], 0.0, "g").to_arrays()
    for k, dt in (
        ("input_ids", np.int64),
        ("response_mask", np.bool_),
        ("turn_ids", np.int64),
        ("loss_mask", np.bool_),
        ("sampler_logprobs", np.float32),
    ):
        assert a[k].shape == (0,) and a[k].dtype == dt, k


# ---------------------------------------------------------------------------------- collate
def _aux() -> Trajectory:
    return Trajectory(
        [Segment("prompt", [8], 0), Segment("response", [9], 0, logprobs=[-0.3])],
        1.0,
        "g/aux",
        kind=Kind.RETRY_SFT,
        weight=0.5,
        fixed_advantage=1.0,
    )


def test_collate_hand_values():
    base = _two_turns(credit_from_turn=1)
    base.segments[3].model_logprobs = [-0.9, -1.9]
    b = collate([base, _aux()], [-0.5, 1.0], pad_token_id=99)
    np.testing.assert_array_equal(b["input_ids"], [[1, 2, 3, 4, 5, 6, 7], [8, 9, 99, 99, 99, 99, 99]])
    np.testing.assert_array_equal(b["attention_mask"], [[1] * 7, [1, 1, 0, 0, 0, 0, 0]])
    # pivotal credit applies by default: the base's turn 0 carries none
    np.testing.assert_array_equal(b["loss_mask"], [[0, 0, 0, 0, 0, 1, 1], [0, 1, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(
        b["sampler_logprobs"], np.float32([[0, 0, -0.5, -0.25, 0, -1, -2], [0, -0.3, 0, 0, 0, 0, 0]])
    )
    np.testing.assert_array_equal(b["behaviour_logprobs"], np.float32([[0, 0, -0.4, -0.2, 0, -0.9, -1.9], [0] * 7]))
    np.testing.assert_array_equal(b["has_sampler_logprobs"], [1, 1])
    np.testing.assert_array_equal(b["has_behaviour_logprobs"], [1, 0])
    np.testing.assert_array_equal(b["advantages"], [-0.5, 1.0])
    np.testing.assert_array_equal(b["weights"], [1.0, 0.5])
    np.testing.assert_array_equal(b["on_policy"], [1, 0])  # base rows only
    np.testing.assert_array_equal(b["kind"], [KINDS.index(Kind.BASE), KINDS.index(Kind.RETRY_SFT)])
    assert KINDS.index(Kind.RETRY_SFT) == 3
    np.testing.assert_array_equal(b["num_loss_tokens"], [2, 1])
    assert {k: v.dtype for k, v in b.items()} == {
        "input_ids": np.int64,
        "attention_mask": np.int64,
        "loss_mask": np.float32,
        "sampler_logprobs": np.float32,
        "behaviour_logprobs": np.float32,
        "has_sampler_logprobs": np.float32,
        "has_behaviour_logprobs": np.float32,
        "advantages": np.float32,
        "weights": np.float32,
        "on_policy": np.float32,
        "kind": np.int64,
        "policy_version": np.int64,
        "num_loss_tokens": np.float32,
    }
    np.testing.assert_array_equal(b["policy_version"], [-1, -1])  # not tagged by a driver: unknown
    off = collate([base, _aux()], [-0.5, 1.0], pad_token_id=99, pivotal_credit=False)
    np.testing.assert_array_equal(off["loss_mask"][0], [0, 0, 1, 1, 0, 1, 1])
    np.testing.assert_array_equal(off["num_loss_tokens"], [4, 1])


def test_collate_context_limit_and_mismatch():
    t = _two_turns()  # 7 tokens
    assert collate([t], [1.0], pad_token_id=0, max_length=7)["input_ids"].shape == (1, 7)  # at the limit: fine
    with pytest.raises(
        ValueError,
        match=r"^a trajectory has 7 tokens, more than max_context_tokens=6; the runner "
        r"should have stopped it \(raise max_context_tokens or lower max_turns\)$",
    ):
        collate([t], [1.0], pad_token_id=0, max_length=6)
    with pytest.raises(ValueError, match=r"^1 trajectories but 2 advantages$"):
        collate([t], [1.0, 2.0], pad_token_id=0)


def test_collate_of_nothing_is_an_empty_batch():
    b = collate([], [], pad_token_id=0)
    assert b["input_ids"].shape == b["loss_mask"].shape == (0, 0)
    assert b["advantages"].shape == b["num_loss_tokens"].shape == (0,)
