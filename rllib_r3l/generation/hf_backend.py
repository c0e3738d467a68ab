"""transformers generation backend (fallback when vLLM is not installed, and the reference in tests).

Batched, left-padded sampling from token ids with a KV cache, written out step by step so that the
returned log-probs are exactly those of the distribution each token was sampled from: log-softmax
of the (choice-constrained) logits divided by the temperature, restricted to the top-p nucleus.
``temperature=0`` is greedy and reports the T=1 log-probs of the constrained logits (as vLLM does).

``choices`` are enforced with a token trie (:mod:`rllib_r3l.generation.constraints`) and
``GenerationRequest.json_schema`` with a character automaton over the tokenizer's own tokens
(:mod:`rllib_r3l.generation.json_logits`, the report schema's subset of JSON schema; a schema
feature outside it raises ``SchemaNotSupported`` naming it). Both mask the logits before the
temperature and top-p, so the log-probs are those of the constrained distribution.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

import torch

from rllib_r3l.generation.base import GenerationBackend, GenerationRequest, GenerationResult
from rllib_r3l.generation.constraints import ChoicesLogitsProcessor, ChoiceTrie
from rllib_r3l.generation.json_grammar import compile_schema, schema_key
from rllib_r3l.generation.json_logits import JsonRow, TokenGrammar, TokenTexts

logger = logging.getLogger(__name__)


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set logits outside the top-p nucleus to -inf (the smallest set of most likely tokens whose
    probability reaches ``top_p``; the most likely token is always kept)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cum <= (1.0 - top_p)
    remove_sorted[..., -1] = False
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


class HFBackend(GenerationBackend):
    """transformers model as a sampler.

    Args:
        model_path: local HF directory or hub id (or pass ``model=`` an already loaded model).
        dtype: "float32" (default) or "bfloat16" (faster on CPUs with AVX512-bf16).
        device: default "cuda" when available, else "cpu".
        stop_token_ids: tokens that end a generation (default EOS and the end-of-turn token).
        max_batch_size: rows per forward pass (larger batches are split).
        num_threads: call ``torch.set_num_threads`` with it (None: leave torch's setting).
        seed: seeds the generator of calls made without ``seed``.
        choice_tokenization: only "canonical" (the token trie); accepted so that one
            ``backend_options`` serves both backends.
    """

    name = "transformers"

    def __init__(
        self,
        model_path: Optional[str] = None,
        *,
        model=None,
        tokenizer=None,
        dtype: str = "float32",
        device: Optional[str] = None,
        stop_token_ids: Optional[Sequence[int]] = None,
        max_batch_size: int = 32,
        num_threads: Optional[int] = None,
        seed: Optional[int] = None,
        choice_tokenization: str = "canonical",
    ) -> None:
        from rllib_r3l import models

        if choice_tokenization != "canonical":  # accepted so one backend_options suits both backends
            raise ValueError(
                f"choice_tokenization={choice_tokenization!r}: the transformers backend holds "
                "choices to the tokenizer's own tokens only ('canonical'); 'any' is vLLM's grammar"
            )
        if num_threads is not None:
            torch.set_num_threads(int(num_threads))
        if model is None and model_path is None:
            raise ValueError("HFBackend needs model_path or model")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        t0 = time.perf_counter()
        self.model = model if model is not None else models.load_causal_lm(model_path, dtype=dtype)
        self.model.to(self.device).eval()
        self.dtype: torch.dtype = next(self.model.parameters()).dtype
        self.tokenizer = (
            tokenizer
            if tokenizer is not None
            else models.load_tokenizer(model_path if model_path is not None else self.model.config.name_or_path)
        )
        self.start_seconds = time.perf_counter() - t0
        self.model_path = model_path
        if stop_token_ids is None:
            path = model_path if model_path is not None and os.path.isdir(model_path) else None
            stop_token_ids = models.stop_token_ids(self.tokenizer, path)
        self.stop_token_ids = [int(t) for t in stop_token_ids]
        if not self.stop_token_ids:
            raise ValueError("no stop token: pass stop_token_ids")
        self.pad_token_id = (
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.stop_token_ids[0]
        )
        self.max_batch_size = int(max_batch_size)
        # JSON-schema decoding: the token texts once, and each schema's grammar with its cached masks
        self._token_texts: Optional[TokenTexts] = None
        self._token_grammars: dict = {}
        self.last_update_seconds: Optional[float] = None
        # Unseeded calls draw from this generator (reproducible per backend when ``seed`` is set).
        self._generator = torch.Generator(device=self.device)
        if seed is not None:
            self._generator.manual_seed(int(seed))
        else:
            self._generator.seed()

    # ----------------------------------------------------------------------------------------------
    def generate(
        self,
        requests: Sequence[GenerationRequest],
        *,
        temperature: float,
        top_p: float = 1.0,
        seed: Optional[int] = None,
        on_done: Optional[Callable[[int], None]] = None,
    ) -> List[GenerationResult]:
        """One completion per request. With ``seed`` the call is reproducible (for the same batch);
        ``on_done(n)`` is told as requests finish (each row at its stop token or length, inside its batch)."""
        if not requests:
            return []
        generator = self._generator
        if seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(int(seed))
        results: List[GenerationResult] = []
        for start in range(0, len(requests), self.max_batch_size):
            chunk = requests[start : start + self.max_batch_size]
            results.extend(self._generate_batch(chunk, float(temperature), float(top_p), generator, on_done))
        return results

    @torch.inference_mode()
    def _generate_batch(
        self,
        requests: Sequence[GenerationRequest],
        temperature: float,
        top_p: float,
        generator: Optional[torch.Generator],
        on_done: Optional[Callable[[int], None]] = None,
    ) -> List[GenerationResult]:
        B = len(requests)
        done = on_done or (lambda n: None)
        for r in requests:
            if not r.prompt_token_ids:
                raise ValueError("a GenerationRequest needs at least one prompt token")
        tries: List[Optional[ChoiceTrie]] = []
        json_rows: List[Optional[JsonRow]] = []
        for r in requests:
            if r.choices is not None and r.json_schema is not None:
                raise ValueError("a GenerationRequest may set choices or json_schema, not both")
            tries.append(
                ChoiceTrie(r.choices, self.tokenizer, self.stop_token_ids[0]) if r.choices is not None else None
            )
            json_rows.append(JsonRow(self._token_grammar(r.json_schema)) if r.json_schema is not None else None)
        any_json = any(j is not None for j in json_rows)
        max_new = [int(r.max_tokens) for r in requests]
        lengths = [len(r.prompt_token_ids) for r in requests]
        width = max(lengths)
        dev = self.device
        input_ids = torch.full((B, width), self.pad_token_id, dtype=torch.long, device=dev)
        attention = torch.zeros((B, width), dtype=torch.long, device=dev)
        for i, r in enumerate(requests):
            input_ids[i, width - lengths[i] :] = torch.tensor(r.prompt_token_ids, dtype=torch.long)
            attention[i, width - lengths[i] :] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        processor = ChoicesLogitsProcessor(tries, prompt_width=width)
        stop_ids = torch.tensor(self.stop_token_ids, dtype=torch.long, device=dev)

        out_ids: List[List[int]] = [[] for _ in range(B)]
        out_lps: List[List[float]] = [[] for _ in range(B)]
        reasons: List[Optional[str]] = [None if m > 0 else "length" for m in max_new]
        seq = input_ids
        if any(reason is not None for reason in reasons):
            done(sum(reason is not None for reason in reasons))
        if all(reason is not None for reason in reasons):
            return [self._result([], [], "length") for _ in range(B)]

        out = self.model(
            input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1
        )
        past = out.past_key_values
        next_pos = positions[:, -1:] + 1
        while True:
            logits = out.logits[:, -1, :].float()
            if processor.active:
                logits = processor(seq, logits)
            if any_json:
                logits = self._mask_json(logits, json_rows, reasons)
            if temperature <= 0.0:
                logprobs = torch.log_softmax(logits, dim=-1)
                tokens = logits.argmax(dim=-1)
            else:
                scaled = top_p_filter(logits / temperature, top_p)
                logprobs = torch.log_softmax(scaled, dim=-1)
                tokens = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(-1)
            token_lps = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
            is_stop = torch.isin(tokens, stop_ids)
            tok_list, lp_list, stop_list = tokens.tolist(), token_lps.tolist(), is_stop.tolist()
            for i in range(B):
                if reasons[i] is not None:
                    continue
                if json_rows[i] is not None:
                    json_rows[i].advance(tok_list[i])
                out_ids[i].append(tok_list[i])
                out_lps[i].append(lp_list[i])
                if stop_list[i]:
                    reasons[i] = "stop"
                elif len(out_ids[i]) >= max_new[i]:
                    reasons[i] = "length"
                if reasons[i] is not None:  # the live progress line counts it now, not after the batch
                    done(1)
            if all(reason is not None for reason in reasons):
                break
            feed = tokens[:, None]
            seq = torch.cat([seq, feed], dim=1)
            attention = torch.cat([attention, torch.ones((B, 1), dtype=attention.dtype, device=dev)], dim=1)
            out = self.model(
                input_ids=feed, attention_mask=attention, position_ids=next_pos, past_key_values=past, use_cache=True
            )
            past = out.past_key_values
            next_pos = next_pos + 1
        return [self._result(out_ids[i], out_lps[i], reasons[i]) for i in range(B)]

    def _token_grammar(self, schema: dict) -> TokenGrammar:
        """The schema's grammar over this tokenizer (compiled once per schema; its masks cached)."""
        key = schema_key(schema)
        tg = self._token_grammars.get(key)
        if tg is None:
            grammar = compile_schema(schema)
            if self._token_texts is None:  # the logits' width: the model's vocabulary, padding included
                vocab = int(getattr(self.model.config, "vocab_size", 0) or len(self.tokenizer))
                self._token_texts = TokenTexts(self.tokenizer, vocab)
            if len(self._token_grammars) >= 64:  # a schema per pivot bound and verdict: few, but bounded
                self._token_grammars.pop(next(iter(self._token_grammars)))
            tg = self._token_grammars[key] = TokenGrammar(grammar, self._token_texts, self.stop_token_ids)
        return tg

    @staticmethod
    def _mask_json(
        logits: torch.Tensor, rows: Sequence[Optional[JsonRow]], reasons: Sequence[Optional[str]]
    ) -> torch.Tensor:
        """-inf outside each JSON row's allowed tokens (rows without a schema, or finished, untouched)."""
        active = [i for i, row in enumerate(rows) if row is not None and reasons[i] is None]
        if not active:
            return logits
        keep = torch.zeros((len(active), logits.shape[-1]), dtype=torch.bool)
        for k, i in enumerate(active):
            rows[i].fill_mask(keep[k])
        index = torch.tensor(active, dtype=torch.long, device=logits.device)
        return logits.index_put((index,), logits[index].masked_fill(~keep.to(logits.device), float("-inf")))

    def _result(self, ids: List[int], lps: List[float], reason: str) -> GenerationResult:
        text_ids = ids[:-1] if reason == "stop" and ids else ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=True)
        return GenerationResult(token_ids=ids, logprobs=lps, text=text, finish_reason=reason)

    # ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """Copy weights (HF names) into the model in place (``load_state_dict(strict=False)``)."""
        t0 = time.perf_counter()
        state = {name: t.detach() for name, t in named_tensors}
        result = self.model.load_state_dict(state, strict=False)
        if result.unexpected_keys:
            raise KeyError(f"update_weights got unknown parameter names: {result.unexpected_keys[:5]}")
        self.last_update_seconds = time.perf_counter() - t0

    # ----------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def score(self, prompt_token_ids: List[int], continuation_ids: List[int]) -> List[float]:
        if not continuation_ids:
            return []
        if not prompt_token_ids:
            raise ValueError("score needs at least one prompt token")
        ids = torch.tensor([list(prompt_token_ids) + list(continuation_ids)], dtype=torch.long, device=self.device)
        n = len(continuation_ids)
        logits = self.model(input_ids=ids, logits_to_keep=n + 1).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        target = torch.tensor(continuation_ids, dtype=torch.long, device=self.device)
        return logprobs.gather(-1, target[:, None]).squeeze(-1).tolist()

    def score_batch(self, pairs: Sequence[Tuple[List[int], List[int]]]) -> List[List[float]]:
        """``score`` for several (prompt, continuation) pairs (same API as the vLLM backend)."""
        return [self.score(list(p), list(c)) for p, c in pairs]

    def close(self) -> None:
        self.model = None
