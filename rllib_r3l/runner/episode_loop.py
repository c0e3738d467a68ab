"""Episode loops: every episode advances on its own, against the engines' request streams (issue 47 item 1).

``rollout_loop="episodes"``. An episode submits its turn as soon as its environment has answered, the
engine batches whatever is pending (:mod:`rllib_r3l.generation.stream`), and each finished response goes
to a worker thread that steps that episode's environment while the engine keeps generating for the
others. Opening an episode (a reset, or a retry's replay up to its pivot, paper §4) also runs in the
threads. So a slow environment step (a tool call, a web page, a JVM) is paid per episode in parallel, not
once per episode per turn in turn, and a short episode never waits for the longest. Single requests (a
reflection, :mod:`rllib_r3l.runner.pipeline`) share the loop and the engine.

Everything else is the waves' own code (:class:`rllib_r3l.runner.rollout.EpisodeRunner`): the request of a
turn (context budget, choices, the pivot's exclusions and temperature), the recorded response and the
environment's answer, every status and counter. The worker threads only call the environment
(:mod:`rllib_r3l.runner.env_pool`); all bookkeeping stays on this thread. A free-text pivot turn that
repeats the failed action is sampled again up to ``pivot_resamples`` times, as in the waves.

Seeds: with ``sampling_seed``, turn ``t`` (attempt ``a``) of episode ``i`` of a loop is seeded from
(``sampling_seed``, the loop, the sample's task seeds, i, t, a), and a single request from its own key:
what it samples does not depend on timing with vLLM, whose requests each sample with their own seed. (A
batched backend takes one seed per call, so its samples depend on which turns are pending together.)
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Dict, List, Optional, Tuple

from rllib_r3l.generation.base import GenerationRequest
from rllib_r3l.generation.stream import RequestStream, open_stream
from rllib_r3l.runner import pivot_turn
from rllib_r3l.runner.episode import EpisodeSpec, Turn
from rllib_r3l.runner.episode import Live as _Live
from rllib_r3l.trajectory import Kind, Status, Trajectory

logger = logging.getLogger(__name__)


def _seeds(backend: Any) -> Callable[..., Optional[int]]:
    """(numbers...) -> a request's seed (None: unseeded)."""
    make = getattr(backend, "request_seeds", None)
    return make() if callable(make) else (lambda *_: None)


class EpisodeLoop:
    """Episodes and single requests in flight together; ``run()`` returns when nothing is left."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.counters = runner.counters
        self.workers = ThreadPoolExecutor(
            max_workers=max(1, int(runner.opts.env_step_workers)), thread_name_prefix="r3l-env"
        )
        self._streams: Dict[int, Tuple[RequestStream, Callable[..., Optional[int]]]] = {}
        self._calls: Dict[Future, Tuple[str, int, Any]] = {}  # a worker's call -> ("open"|"step", episode, response)
        self._lives: Dict[int, _Live] = {}
        self._specs: Dict[int, EpisodeSpec] = {}
        self._on_end: Dict[int, Callable[[Optional[Trajectory]], None]] = {}
        self._turns: Dict[int, Tuple[Turn, int]] = {}  # episode -> its turn in flight, the attempt
        self._single: Dict[Any, tuple] = {}  # request key -> on_done, on_fail, phase, its stream
        self.seconds: Counter = Counter()  # engine-step seconds per phase (shared steps split by requests)

    # -- what goes in ------------------------------------------------------------------------------------
    def _stream(self, backend: Any) -> Tuple[RequestStream, Callable[..., Optional[int]]]:
        if id(backend) not in self._streams:
            self._streams[id(backend)] = (open_stream(backend), _seeds(backend))
        return self._streams[id(backend)]

    def episode(self, i: int, spec: EpisodeSpec, on_end: Callable[[Optional[Trajectory]], None]) -> None:
        """Start episode ``i`` (its number seeds its turns); ``on_end(trajectory or None)`` when it ends."""
        self._specs[i], self._on_end[i] = spec, on_end
        self._calls[self.workers.submit(self.runner.open_env, spec)] = ("open", i, None)

    def request(
        self,
        backend: Any,
        key: Tuple[Any, ...],
        request: GenerationRequest,
        temperature: float,
        on_done: Callable[[Any], None],
        on_fail: Callable[[], None],
        phase: str = "reflect",
    ) -> None:
        """One request (e.g. a reflection) into ``backend``'s stream; ``on_done(result)`` or ``on_fail()``."""
        stream, seed_of = self._stream(backend)
        self._single[key] = (on_done, on_fail, phase, stream)
        try:
            stream.submit(key, request, temperature=temperature, top_p=1.0, seed=seed_of(1, *key[1:]))
        except Exception:
            logger.exception("a request the engine refused")
            del self._single[key]
            on_fail()

    def _submit_turn(self, i: int, lv: _Live, attempt: int = 0) -> None:
        turn = self._turns[i][0] if attempt else self.runner._prepare(lv)
        if turn is None:  # the context is full: the episode ended (counted by _prepare)
            self._end(i)
            return
        self._turns[i] = (turn, attempt)
        stream, seed_of = self._stream(self.runner.backend)
        try:
            stream.submit(
                ("ep", i),
                turn.request,
                temperature=turn.temperature,
                top_p=self.runner.opts.top_p,
                seed=seed_of(0, i, lv.turn, attempt),
            )
        except Exception:  # a request the engine refuses: this episode's generation failed, counted
            self._episodes_failed([i])

    # -- what comes out ----------------------------------------------------------------------------------
    def _end(self, i: int) -> None:
        lv = self._lives.pop(i, None)
        self._turns.pop(i, None)
        self._on_end.pop(i)(lv.traj if lv is not None else None)

    def _episodes_failed(self, episodes: List[int]) -> None:
        self.counters["generation_errors"] += 1
        logger.exception("generation failed")
        for i in episodes:
            lv = self._lives[i]
            lv.traj.status = Status.GENERATION_ERROR
            self.runner._finish(lv, healthy=True)
            self._end(i)

    def _env_answered(self, fut: Future) -> None:
        what, i, res = self._calls.pop(fut)
        outcome = fut.result()  # never raises: env_pool returns what happened
        if what == "open":
            lv = self.runner._started(self._specs.pop(i), outcome)
            if lv is None:  # a retry whose replay mismatched (counted)
                self._on_end.pop(i)(None)
                return
            self._lives[i] = lv
        else:
            lv = self._lives[i]
            self.runner._stepped(lv, res, outcome)
        if lv.done:
            self._end(i)
        else:
            self._submit_turn(i, lv)

    def _generated(self, key: Tuple[Any, ...], res: Any) -> None:
        if key[0] != "ep":
            on_done = self._single.pop(key)[0]
            on_done(res)
            return
        i = key[1]
        lv = self._lives[i]
        turn, attempt = self._turns.pop(i)
        if turn.failed is not None and pivot_turn.repeats(res.text, turn.failed):
            if attempt < self.runner.opts.pivot_resamples:  # a free-text pivot turn repeating its failure
                self.counters["pivot_resamples"] += 1
                self._turns[i] = (turn, attempt)
                self._submit_turn(i, lv, attempt + 1)
                return
            self.counters["pivot_repeats_kept"] += 1
        action = self.runner._respond(lv, res)
        self._calls[self.workers.submit(self.runner.envs.step_env, lv.env, action)] = ("step", i, res)

    def _phases(self, stream: RequestStream) -> Counter:
        """``stream``'s requests in flight per phase (generate_base / generate_retry / reflect)."""
        out: Counter = Counter()
        if stream is self._stream(self.runner.backend)[0]:
            for i in self._turns:
                kind = self._lives[i].spec.kind
                out["generate_base" if kind == Kind.BASE else "generate_retry"] += 1
        for _on_done, _on_fail, phase, on_stream in self._single.values():
            out[phase] += on_stream is stream
        return out

    def _step(self, stream: RequestStream) -> None:
        phases = self._phases(stream)
        t0 = time.perf_counter()
        try:
            finished = stream.step()
        except Exception:
            keys = stream.abort_all()
            episodes = [k[1] for k in keys if k[0] == "ep"]
            if episodes:
                self._episodes_failed(episodes)
            for k in keys:
                if k[0] != "ep":
                    self._single.pop(k)[1]()
            return
        finally:
            dt, total = time.perf_counter() - t0, max(sum(phases.values()), 1)
            for phase, n in phases.items():
                self.seconds[phase] += dt * n / total
        for key, res in finished:
            self._generated(key, res)

    def run(self) -> None:
        """Until every episode and request has ended."""
        streams = lambda: [s for s, _ in self._streams.values() if s.in_flight]  # noqa: E731
        while self._calls or streams():
            if streams():
                done = [f for f in self._calls if f.done()]
            else:
                done = list(wait(list(self._calls), return_when=FIRST_COMPLETED).done)
            for fut in done:
                self._env_answered(fut)
            for stream in streams():
                self._step(stream)

    def close(self) -> None:
        """Stop: requests aborted, running environment calls waited for (on an error path)."""
        for fut in self._calls:
            fut.cancel()
        for stream, _ in self._streams.values():
            stream.abort_all()
        self.workers.shutdown(wait=True)
        for phase, sec in self.seconds.items():
            if phase != "reflect":
                self.counters[f"seconds_{phase}"] += sec


def run_episodes(runner: Any, specs: List[EpisodeSpec]) -> List[Optional[Trajectory]]:
    """``EpisodeRunner.run`` with one loop per episode; the same trajectories, statuses and counters."""
    out: List[Optional[Trajectory]] = [None] * len(specs)
    loop = EpisodeLoop(runner)
    try:
        for i, spec in enumerate(specs):
            loop.episode(i, spec, lambda traj, i=i: out.__setitem__(i, traj))
        loop.run()
    finally:
        loop.close()
    return out


__all__ = ["EpisodeLoop", "run_episodes"]
