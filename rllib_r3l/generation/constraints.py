"""Constrained decoding to a fixed set of strings for the transformers backend.

Each choice is tokenised once (``tokenizer.encode(choice, add_special_tokens=False)``) and the
token sequences are stored in a prefix trie; at every step only the children of the current trie
node are allowed, plus the stop token where a choice ends. The output is therefore exactly one
choice followed by the stop token.

vLLM's structured outputs constrain characters and so also admit other tokenisations of the same
string; the vLLM backend therefore uses this trie too, through a logits processor
(``rllib_r3l.generation.vllm_choice``), unless ``choice_tokenization="any"``.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch

try:  # a transformers LogitsProcessor, so it also works with ``model.generate``
    from transformers import LogitsProcessor as _LogitsProcessorBase
except Exception:  # pragma: no cover - transformers is a hard dependency
    _LogitsProcessorBase = object

_END = -1  # trie key marking "a choice ends here"


class ChoiceTrie:
    """Token-prefix trie over the tokenisations of ``choices``."""

    def __init__(self, choices: Sequence[str], tokenizer, stop_token_id: int) -> None:
        if not choices:
            raise ValueError("choices is empty")
        sequences = []
        for choice in choices:
            ids = [int(t) for t in tokenizer.encode(choice, add_special_tokens=False)]
            if not ids:
                raise ValueError(f"choice {choice!r} tokenises to nothing")
            sequences.append(ids)
        self._build(sequences, stop_token_id)

    @classmethod
    def from_token_ids(cls, sequences: Sequence[Sequence[int]], stop_token_id: int) -> "ChoiceTrie":
        """The trie of already tokenised choices (the vLLM processor gets them through the engine)."""
        if not sequences or any(len(s) == 0 for s in sequences):
            raise ValueError("choice token sequences must be non-empty")
        trie = cls.__new__(cls)
        trie._build([[int(t) for t in s] for s in sequences], stop_token_id)
        return trie

    def _build(self, sequences: List[List[int]], stop_token_id: int) -> None:
        self.stop_token_id = int(stop_token_id)
        self.root: Dict[int, dict] = {}
        self.sequences: List[List[int]] = sequences
        for ids in sequences:
            node = self.root
            for t in ids:
                node = node.setdefault(t, {})
            node[_END] = {}

    def node_after(self, generated: Sequence[int]) -> Optional[dict]:
        """The trie node reached after ``generated``; None when it left the trie or stopped."""
        node = self.root
        for t in generated:
            t = int(t)
            if t in node and t != _END:
                node = node[t]
            else:
                return None
        return node

    def allowed(self, generated: Sequence[int]) -> List[int]:
        """Token ids allowed after ``generated`` (the stop token once a choice is complete)."""
        node = self.node_after(generated)
        if node is None:
            return [self.stop_token_id]
        ids = [t for t in node if t != _END]
        if _END in node:
            ids.append(self.stop_token_id)
        return ids


class ChoicesLogitsProcessor(_LogitsProcessorBase):
    """Masks the logits of each row to its trie (rows with ``None`` are left free).

    ``input_ids`` holds, per row, the (padded) prompt of width ``prompt_width`` followed by the
    tokens generated so far; this makes the processor stateless and usable with ``generate``.
    """

    def __init__(self, tries: Sequence[Optional[ChoiceTrie]], prompt_width: int) -> None:
        self.tries = list(tries)
        self.prompt_width = int(prompt_width)

    @property
    def active(self) -> bool:
        return any(t is not None for t in self.tries)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if not self.active:
            return scores
        generated = input_ids[:, self.prompt_width :].tolist()
        mask = torch.zeros_like(scores, dtype=torch.bool)
        for row, trie in enumerate(self.tries):
            if trie is None:
                continue
            allowed = trie.allowed(generated[row])
            mask[row] = True
            mask[row, torch.tensor(allowed, dtype=torch.long, device=scores.device)] = False
        return scores.masked_fill(mask, float("-inf"))
