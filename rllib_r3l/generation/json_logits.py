"""JSON-schema-constrained decoding in the tokenizer's own tokens (the transformers backend).

At every step a row may only sample tokens whose text keeps its output a prefix of a document of the
schema (:mod:`rllib_r3l.generation.json_grammar`), and a stop token only once the object is closed.
The mask is the exact set of such tokens, so the sampler renormalises over all of them and its
log-probs stay those of the distribution it sampled from.

Speed, for a 50k vocabulary on a CPU:

* :class:`TokenTexts` decodes every token once per tokenizer and sorts the texts, so the tokens
  that share a prefix form one slice: a state's allowed tokens are found by walking that sorted
  list as a trie and cutting every branch whose prefix the automaton rejects (outside strings,
  almost every branch is cut at its first character);
* inside a string value nearly every token is allowed: a token of plain characters (no quote,
  backslash or control character) is allowed exactly when it fits the string's remaining length,
  one vectorised comparison, and only the few hundred other tokens are walked;
* each state's walk is cached (:class:`TokenGrammar`), and grammars per schema (the backend).

Tokens the automaton cannot see as characters are never allowed: special and added tokens, and
byte tokens that are only part of a UTF-8 character (they decode to U+FFFD on their own).
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from rllib_r3l.generation.json_grammar import Grammar, State, is_plain_string_char

logger = logging.getLogger(__name__)


class TokenTexts:
    """Each token's text, decoded once: a plain-length per token and two sorted (text, id) lists."""

    def __init__(self, tokenizer, vocab_size: Optional[int] = None) -> None:
        n_tok = len(tokenizer)
        self.vocab_size = int(vocab_size or n_tok)
        excluded = set(int(i) for i in getattr(tokenizer, "all_special_ids", []) or [])
        excluded |= set(int(i) for i in (getattr(tokenizer, "added_tokens_decoder", None) or {}))
        # A token's text after a fixed ordinary token: tokenizers that drop a word's leading space at the
        # start of a text (sentencepiece) keep it here, as they do inside the generated text.
        anchor = tokenizer.encode("a", add_special_tokens=False)[:1]
        head = tokenizer.decode(anchor, clean_up_tokenization_spaces=False)
        ids = list(range(min(n_tok, self.vocab_size)))
        decoded = tokenizer.batch_decode([anchor + [i] for i in ids], clean_up_tokenization_spaces=False)
        plain_len = torch.zeros(self.vocab_size, dtype=torch.int32)
        self.text: List[Optional[str]] = [None] * self.vocab_size  # None: never allowed
        plain: List[Tuple[str, int]] = []
        other: List[Tuple[str, int]] = []
        for i, text in zip(ids, decoded):
            if i in excluded or not text.startswith(head):
                continue
            text = text[len(head) :]
            if not text or "\ufffd" in text:
                continue
            self.text[i] = text
            if all(is_plain_string_char(c) for c in text):
                plain_len[i] = len(text)
                plain.append((text, i))
            else:
                other.append((text, i))
        self.plain_len = plain_len
        self.plain = _SortedTexts(plain)
        self.other = _SortedTexts(other)
        self.max_len = max((len(t) for t, _ in plain + other), default=0)
        self._fits: Dict[int, torch.Tensor] = {}

    def plain_fitting(self, room: int) -> torch.Tensor:
        """Bool mask of the plain tokens of at most ``room`` characters (cached: a string's room takes
        at most maxLength + 1 values, and every room beyond the longest token is the same mask)."""
        key = min(int(room), self.max_len)
        mask = self._fits.get(key)
        if mask is None:
            mask = self._fits[key] = (self.plain_len > 0) & (self.plain_len <= key)
        return mask


class _SortedTexts:
    def __init__(self, pairs: List[Tuple[str, int]]) -> None:
        pairs.sort()
        self.texts = [t for t, _ in pairs]
        self.ids = [i for _, i in pairs]

    def walk(self, grammar: Grammar, state: State, out: List[int]) -> None:
        """Append to ``out`` every token whose whole text the automaton takes from ``state``: the sorted
        texts as a trie, each slice of a shared prefix entered only if the automaton takes that prefix."""
        texts, ids = self.texts, self.ids
        stack = [(0, len(texts), 0, state)]
        while stack:
            lo, hi, depth, st = stack.pop()
            j = lo
            while j < hi and len(texts[j]) == depth:  # the prefix itself is a token (shorter sorts first)
                if depth:
                    out.append(ids[j])
                j += 1
            while j < hi:
                c = texts[j][depth]
                if ord(c) == 0x10FFFF:
                    end = hi
                else:
                    end = bisect_left(texts, texts[j][:depth] + chr(ord(c) + 1), j, hi)
                nxt = grammar.step(st, c)
                if nxt is not None:
                    stack.append((j, end, depth + 1, nxt))
                j = end


class TokenGrammar:
    """A grammar over one vocabulary: each state's allowed tokens, found once and cached."""

    def __init__(self, grammar: Grammar, texts: TokenTexts, stop_token_ids: Sequence[int]) -> None:
        self.grammar = grammar
        self.texts = texts
        self.stop_ids = torch.tensor([int(t) for t in stop_token_ids], dtype=torch.long)
        # state -> (room of a string's plain tokens or None, the other allowed token ids)
        self._cache: Dict[State, Tuple[Optional[int], torch.Tensor]] = {}
        self.dead_ends = 0

    def _entry(self, state: State) -> Tuple[Optional[int], torch.Tensor]:
        entry = self._cache.get(state)
        if entry is not None:
            return entry
        g, tt = self.grammar, self.texts
        if g.complete(state):
            entry = (None, self.stop_ids)
        else:
            room = g.free_string_room(state)
            out: List[int] = []
            tt.other.walk(g, state, out)
            if room is None:
                tt.plain.walk(g, state, out)
            elif room <= 0:
                room = None
            ids = torch.tensor(sorted(out), dtype=torch.long)
            if room is None and not out:
                # no token continues the output (a vocabulary without some character the schema needs):
                # the row stops here and its report is counted invalid, never sampled outside the schema
                self.dead_ends += 1
                logger.warning("JSON grammar: no token continues the output; the generation stops there")
                ids = self.stop_ids
            entry = (room, ids)
        self._cache[state] = entry
        return entry

    def fill_mask(self, state: State, row: torch.Tensor) -> None:
        """Set ``row`` (bool, vocab-sized, all False) True on the tokens allowed at ``state``."""
        room, ids = self._entry(state)
        if room is not None:
            fits = self.texts.plain_fitting(room)[: row.shape[0]]
            row[: fits.shape[0]] = fits.to(row.device)
        if ids.numel():
            row[ids.to(row.device)] = True

    def allowed(self, state: State) -> List[int]:
        """The allowed token ids at ``state`` (tests and checks)."""
        row = torch.zeros(self.texts.vocab_size, dtype=torch.bool)
        self.fill_mask(state, row)
        return row.nonzero().flatten().tolist()


class JsonRow:
    """One generation's position in its grammar: masks its logits, advances by each sampled token."""

    def __init__(self, grammar: TokenGrammar) -> None:
        self.tg = grammar
        self.state: Optional[State] = grammar.grammar.start

    def fill_mask(self, row: torch.Tensor) -> None:
        if self.state is None:  # stopped: only a stop token (the backend ends the row on it)
            row[self.tg.stop_ids.to(row.device)] = True
        else:
            self.tg.fill_mask(self.state, row)

    def advance(self, token_id: int) -> None:
        """After a sampled token: a stop token (or anything after the closed object) ends the row."""
        if self.state is None:
            return
        text = self.tg.texts.text[int(token_id)] if 0 <= int(token_id) < self.tg.texts.vocab_size else None
        if text is None or self.tg.grammar.complete(self.state):
            self.state = None
            return
        self.state = self.tg.grammar.step_text(self.state, text)
