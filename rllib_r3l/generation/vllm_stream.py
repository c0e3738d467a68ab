"""vLLM's request queue as a :class:`~rllib_r3l.generation.stream.RequestStream`: continuous batching for
episode loops (issue 47 item 1).

Requests enter through ``LLMEngine.add_request`` under ids of our own (``LLM.enqueue`` would answer with the
engine's internal ids, while outputs carry the ids given), and each ``step()`` is one ``LLMEngine.step()``: one
scheduler step over every request pending, new ones joining the running batch (prefills beside decodes), the
finished ones returned at once. This is the loop ``LLM.generate`` and ``AsyncLLM`` run, with our requests entering
between steps; the request's own sampling parameters (choices, JSON schema, seed, log-probs of the sampled
distribution) are the backend's, built by ``VLLMBackend._sampling_params`` as for ``generate``.

A decision named here: the prompt goes in as a ``TokensPrompt``, which this vLLM accepts with a deprecation
warning (it prefers the output of its renderer, reachable only through ``LLM``'s private helpers); the
stream's tests fail the day it stops.
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, List, Optional, Tuple

from rllib_r3l.generation.base import GenerationRequest, GenerationResult
from rllib_r3l.generation.stream import RequestStream


def logprob_of(entry: Any, token_id: int) -> float:
    if entry is None:
        return float("nan")
    lp = entry.get(token_id)
    if lp is None:  # should not happen with logprobs=0 (the sampled token is always included)
        return float("nan")
    return float(lp.logprob)


def result_of(out: Any) -> GenerationResult:
    """A finished ``RequestOutput`` as a ``GenerationResult`` (token ids with the sampler's log-probs)."""
    o = out.outputs[0]
    ids = [int(t) for t in o.token_ids]
    lps = [logprob_of(d, t) for d, t in zip(o.logprobs or [], ids)]
    if len(lps) != len(ids):
        raise RuntimeError(f"vLLM returned {len(ids)} tokens but {len(lps)} log-probs")
    if o.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM request ended with finish_reason={o.finish_reason!r}")
    return GenerationResult(
        token_ids=ids,
        logprobs=lps,
        text=o.text,
        finish_reason=o.finish_reason,
        cached_prompt_tokens=int(getattr(out, "num_cached_tokens", 0) or 0),
    )


class EngineStream(RequestStream):
    """Requests of one ``VLLMBackend`` in flight in its engine, keyed by the caller."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._keys: Dict[str, Any] = {}  # our request id -> the caller's key
        self._count = itertools.count()

    @property
    def _llm(self):
        return self.backend._llm

    def submit(
        self, key: Any, request: GenerationRequest, *, temperature: float, top_p: float, seed: Optional[int]
    ) -> None:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if key in self._keys.values():
            raise ValueError(f"request {key!r} is already in flight")
        if not request.prompt_token_ids:
            raise ValueError("a GenerationRequest needs at least one prompt token")
        params = self.backend._sampling_params(request, temperature, top_p, seed)
        prompt = TokensPrompt(prompt_token_ids=[int(t) for t in request.prompt_token_ids])
        params.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, when it finishes
        rid = f"r3l-stream-{next(self._count)}"
        self._llm.llm_engine.add_request(rid, prompt, params)
        self._keys[rid] = key

    @property
    def in_flight(self) -> int:
        return len(self._keys)

    def step(self) -> List[Tuple[Any, GenerationResult]]:
        with self.backend._compile_stance():
            outputs = self._llm.llm_engine.step()
        done = []
        for out in outputs:
            if out.finished:
                done.append((self._keys.pop(str(out.request_id)), result_of(out)))
        return done

    def abort_all(self) -> List[Any]:
        keys = list(self._keys.values())
        if self._keys and self._llm is not None:
            try:
                self._llm.llm_engine.abort_request(list(self._keys))
            except Exception:  # noqa: BLE001 - a dead engine has nothing left to abort
                pass
        self._keys.clear()
        return keys


__all__ = ["EngineStream"]
