"""Surviving a dead generation engine inside an env runner (a killed vLLM process, an engine that
raises on every call): probe, rebuild with the latest weights, count; give up after a second failure.

A failed ``generate`` call already costs only its episodes (the rollout records them as generation
errors, counted and lost). What this adds: after a sample round with generation errors the runner
probes its engine with a one-token request; an engine that fails the probe is closed and built anew,
loaded with the weights the runner last received (so it samples from the learner's current policy,
not the checkpoint on disk), and counted under ``r3l/faults/engine_rebuilds``. Weights that came by
weight transfer went into the engine only: an engine rebuilt after one holds older weights, so the
sample stops there and the runner refuses the next until the driver restores its weights
(``r3l/faults/engine_rebuilt_behind``). An engine that fails
again within the same ``sample()`` ends that sample's exploration (no further dynamic-sampling
rounds), counted under ``r3l/faults/engine_failures_after_rebuild`` with one error line, instead of
spending the iteration on an engine that keeps failing. docs/reliability.md lists the fault paths.
"""

from __future__ import annotations

import logging
import traceback
from collections import Counter
from typing import Any, Callable, Dict, Optional

from rllib_r3l.generation.base import GenerationRequest

logger = logging.getLogger(__name__)

# counters whose increase during a round means the policy engine may be dead
GENERATION_FAULTS = ("generation_errors", "reflection_generation_errors")


class EngineKeeper:
    """Builds the policy engine, remembers the weights it should hold, and rebuilds it when it is dead.

    ``build()`` returns a fresh, ready backend (with the runner's wrappers); ``load(backend, state)``
    loads a module state into one. The runner tells the keeper every module state it loads
    (``remember``); the reference is kept, not copied (a remote runner's state is its own copy, and a
    local runner's is the learner's live parameters, which are always current).
    """

    def __init__(
        self,
        build: Callable[[], Any],
        load: Callable[[Any, Dict[str, Any]], None],
        counters: Counter,
        probe_token_id: int,
    ) -> None:
        self._build, self._load = build, load
        self.counters = counters
        self.probe_token_id = int(probe_token_id)
        self.weights: Optional[Dict[str, Any]] = None
        self.rebuilt_this_sample = False
        self.behind = False  # the engine got newer weights than ``weights`` (a weight-transfer sync)
        self.needs_weights = False  # rebuilt while behind: it holds older weights than the learner's

    def remember(self, module_state: Dict[str, Any]) -> None:
        self.weights = module_state
        self.behind = self.needs_weights = False

    def engine_moved_on(self) -> None:
        """A weight-transfer sync went straight into the engine: ``weights`` is older than what it holds."""
        self.behind = True

    def begin_sample(self) -> None:
        self.rebuilt_this_sample = False

    def generation_failed_since(self, before: Counter) -> bool:
        return any(self.counters[k] > before.get(k, 0) for k in GENERATION_FAULTS)

    def is_alive(self, backend: Any) -> bool:
        """A one-token request: does the engine still answer?"""
        try:
            backend.generate([GenerationRequest([self.probe_token_id], 1)], temperature=1.0)
            return True
        except Exception:  # noqa: BLE001 - any failure means the engine cannot serve the next round
            logger.warning("the generation engine failed its health probe:\n%s", traceback.format_exc())
            return False

    def recover(self, backend: Any) -> Optional[Any]:
        """After a round with generation errors: the backend to go on with (the same one when it still
        answers, a rebuilt one when it does not), or None when the engine failed again after a rebuild
        in this sample (the caller stops exploring for this sample)."""
        if self.is_alive(backend):
            return backend
        if self.rebuilt_this_sample:
            self.counters["engine_failures_after_rebuild"] += 1
            logger.error(
                "the generation engine failed again after a rebuild in this sample: exploration stops "
                "for this iteration (counted under r3l/faults/engine_failures_after_rebuild)"
            )
            return None
        try:
            backend.close()
        except Exception:  # noqa: BLE001 - a dead engine may fail to close; it is replaced either way
            logger.warning("closing the dead engine failed:\n%s", traceback.format_exc())
        fresh = self._build()
        if self.weights is not None:
            self._load(fresh, self.weights)
        self.counters["engine_rebuilds"] += 1
        self.rebuilt_this_sample = True
        logger.warning("the generation engine was rebuilt (counted under r3l/faults/engine_rebuilds)")
        if self.behind:  # it would sample from older weights than the learner's until the next sync
            self.needs_weights = True
            self.counters["engine_rebuilt_behind"] += 1
            logger.warning(
                "the rebuilt engine holds older weights than the learner's (they came by weight "
                "transfer): exploration stops for this sample, and the runner asks the driver for "
                "the weights before the next (counted under r3l/faults/engine_rebuilt_behind)"
            )
        return fresh
