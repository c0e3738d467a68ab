"""Requests in flight on one engine, each handed back as soon as it finishes (issue 47: episode loops).

The episode loops (:mod:`rllib_r3l.runner.episode_loop`) submit one request per episode turn whenever the
episode is ready and take finished ones back one engine step at a time, so a short episode never waits
for a long one and a slow environment step never holds the engine:

- :class:`EngineStream` (vLLM): requests go into the engine's own queue (``LLMEngine.add_request``) and
  every ``step()`` is one scheduler step over whatever is pending: the continuous batching vLLM's
  ``AsyncLLM`` serves. ``AsyncLLM`` runs its engine core in another process; the in-process engine (the
  CPU build, and the learner-colocated GPU layout whose weights load directly) is driven through the
  same request API from the runner's thread.
- :class:`BatchedStream` (any backend, e.g. transformers): each ``step()`` is one batched ``generate``
  over everything pending (per temperature): the fallback the issue allows.

A request's ``seed`` (None: unseeded) is its own, so what it samples does not depend on which other
requests share its engine step (``sampling_seed``: reproducible whatever the timing).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from rllib_r3l.generation.base import GenerationBackend, GenerationRequest, GenerationResult


@dataclass
class Pending:
    key: Any
    request: GenerationRequest
    temperature: float
    top_p: float
    seed: Optional[int]


class RequestStream(abc.ABC):
    """Submit requests at any time; ``step()`` advances the engine and returns the ones that finished."""

    @abc.abstractmethod
    def submit(
        self, key: Any, request: GenerationRequest, *, temperature: float, top_p: float, seed: Optional[int]
    ) -> None:
        """Queue ``request`` under ``key`` (a key is in flight at most once)."""

    @abc.abstractmethod
    def step(self) -> List[Tuple[Any, GenerationResult]]:
        """Advance the engine; ``(key, result)`` for each request that finished (maybe none). Raises
        when the engine fails; the caller then ends every request in flight with ``abort_all``."""

    @property
    @abc.abstractmethod
    def in_flight(self) -> int:
        """Requests submitted and not yet returned."""

    @abc.abstractmethod
    def abort_all(self) -> List[Any]:
        """Drop every request in flight; their keys."""


class BatchedStream(RequestStream):
    """Any backend: each ``step()`` generates everything pending, one ``generate`` call per
    (temperature, top-p), request ``i`` of a call seeded ``seed_i`` where every request has a seed."""

    def __init__(self, backend: GenerationBackend) -> None:
        self.backend = backend
        self._pending: Dict[Any, Pending] = {}

    def submit(self, key, request, *, temperature, top_p, seed) -> None:
        if key in self._pending:
            raise ValueError(f"request {key!r} is already in flight")
        self._pending[key] = Pending(key, request, float(temperature), float(top_p), seed)

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def abort_all(self) -> List[Any]:
        keys = list(self._pending)
        self._pending.clear()
        return keys

    def step(self) -> List[Tuple[Any, GenerationResult]]:
        by_params: Dict[Tuple[float, float], List[Pending]] = {}
        for p in self._pending.values():
            by_params.setdefault((p.temperature, p.top_p), []).append(p)
        out: List[Tuple[Any, GenerationResult]] = []
        for (temp, top_p), items in by_params.items():
            # a batched backend takes one seed a call (request i gets seed + i): the first request's
            results = self.backend.generate(
                [p.request for p in items], temperature=temp, top_p=top_p, seed=items[0].seed
            )
            out.extend((p.key, r) for p, r in zip(items, results))
        self._pending.clear()
        return out


def open_stream(backend: GenerationBackend) -> RequestStream:
    """The engine's own request stream where it has one (``backend.request_stream()``), else the batched one."""
    make = getattr(type(backend), "request_stream", None)
    stream = make(backend) if callable(make) else None
    return stream if stream is not None else BatchedStream(backend)


__all__ = ["BatchedStream", "Pending", "RequestStream", "open_stream"]
