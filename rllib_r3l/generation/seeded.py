"""Reproducible sampling: with ``sampling_seed`` set, every ``generate`` call of a runner's engine gets a
seed derived from (``sampling_seed``, the sample's task seeds, the call number), so sampling depends only
on the runner's (checkpointed) task-seed RNG state and the weights: a resumed run repeats an uninterrupted
one (docs/reliability.md).
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence

import numpy as np

from rllib_r3l.generation.base import GenerationBackend


class SeededBackend(GenerationBackend):
    """Passes a derived seed to every unseeded ``generate`` call of the wrapped backend."""

    def __init__(self, inner: GenerationBackend, sampling_seed: int) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", "seeded")
        self.sampling_seed = int(sampling_seed)
        self._key: List[int] = []
        self._calls = 0

    def begin_sample(self, task_seeds: Iterable[int]) -> None:
        self._key = [int(s) for s in task_seeds]
        self._calls = 0

    def next_seed(self) -> int:
        ss = np.random.SeedSequence([self.sampling_seed, self._calls, *self._key])
        self._calls += 1
        return int(ss.generate_state(1)[0] & 0x7FFFFFFF)

    def request_seeds(self):
        """Seeds for one run of episode loops: (numbers...) -> a seed from (``sampling_seed``, this call, the
        sample's task seeds, the numbers naming the request: its episode, turn and attempt), independent of
        when each request is made."""
        call, key = self._calls, list(self._key)
        self._calls += 1

        def seed(*numbers: int) -> int:
            ss = np.random.SeedSequence([self.sampling_seed, call, *key, *(int(n) for n in numbers)])
            return int(ss.generate_state(1)[0] & 0x7FFFFFFF)

        return seed

    def request_stream(self):
        """The wrapped engine's request stream (seeds come from ``request_seeds``)."""
        from rllib_r3l.generation.stream import open_stream

        return open_stream(self.inner)

    def generate(self, requests, *, temperature, top_p=1.0, seed=None, on_done=None):
        if seed is None:
            seed = self.next_seed()
        return self.inner.generate(requests, temperature=temperature, top_p=top_p, seed=seed, on_done=on_done)

    def update_weights(self, named_tensors):
        return self.inner.update_weights(named_tensors)

    def score(self, prompt_token_ids, continuation_ids):
        return self.inner.score(prompt_token_ids, continuation_ids)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def seeded_backend(backend: Optional[GenerationBackend], sampling_seed: Optional[int]):
    if backend is None or sampling_seed is None:
        return backend
    return SeededBackend(backend, sampling_seed)


def begin_sample(task_seeds: Sequence[int], *backends: Any) -> None:
    """Key the seeds of the coming generate calls to this sample's task seeds."""
    seen = set()
    for b in backends:
        if isinstance(b, SeededBackend) and id(b) not in seen:
            seen.add(id(b))
            b.begin_sample(task_seeds)
