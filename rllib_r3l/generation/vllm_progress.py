"""Requests finished so far inside one ``vllm.LLM.generate`` call, as a callback.

``LLM.generate`` returns only when its whole batch is done; its public ``use_tqdm`` argument takes a
progress-bar factory, which the engine loop updates each time a request finishes. :class:`FinishedCounter`
is such a bar that draws nothing and hands each update to ``on_done(n)``: the live progress line counts
reflections as each report finishes, not once per batch minutes later.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Union


class FinishedCounter:
    """The part of tqdm's interface vLLM's engine loop uses (``n``, ``update``, ``format_dict``, ``postfix``,
    ``refresh``, ``close``); each ``update(n)`` calls ``on_done(n)``."""

    def __init__(self, on_done: Callable[[int], None], total: int = 0, **_: Any) -> None:
        self.on_done, self.total, self.n, self.postfix = on_done, total, 0, ""
        self._start = time.monotonic()

    @property
    def format_dict(self) -> dict:  # the loop divides token counts by "elapsed" for its speed estimate
        return {"elapsed": max(time.monotonic() - self._start, 1e-9), "n": self.n, "total": self.total}

    def update(self, n: int = 1) -> None:
        self.n += n
        self.on_done(n)

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


def progress_factory(on_done: Optional[Callable[[int], None]]) -> Union[bool, Callable[..., Any]]:
    """The ``use_tqdm`` value that reports finished requests to ``on_done`` (False, no bar, without one)."""
    if on_done is None:
        return False

    def factory(iterable: Any = None, **kwargs: Any) -> Any:
        if iterable is not None:  # vLLM also wraps the prompts it renders in a bar: passed through, uncounted
            return iterable
        return FinishedCounter(on_done, **kwargs)

    return factory
