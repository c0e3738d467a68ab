"""Multi-turn text episodes with an LLM, batched across episodes (one generate call per turn wave).

Used for base rollouts and for retries from a pivot (paper §4 "Reflect-then-retry"): a retry replays
the base episode's first ``pivot`` actions on a fresh environment, checks the replayed observations
against the recorded ones, reuses the prefix tokens verbatim and inserts the guidance into the
context at the pivot. Every failure (environment exception, replay mismatch, context overflow) is
recorded on the trajectory's ``status`` and counted; nothing is dropped silently.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any, Callable, List, Optional

from rllib_r3l.generation.base import GenerationBackend, GenerationRequest
from rllib_r3l.options import default
from rllib_r3l.runner import pivot_turn
from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.trajectory import Kind, Segment, Status, Trajectory

logger = logging.getLogger(__name__)

# the phase timers EpisodeRunner keeps in its counters as ``seconds_<name>`` (r3l/timers/<name>_s)
ROLLOUT_TIMERS = ("generate_base", "generate_retry", "env_step", "env_reset", "replay")

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent acting in a text environment. {rules}\n"
    "Your task: {task}\n"
    "Reply with exactly one action and nothing else."
)


@dataclass
class EpisodeSpec:
    """What to run: a fresh episode on task ``seed``, or a retry of ``base`` from ``pivot``."""

    seed: int
    group_id: str
    kind: Kind = Kind.BASE
    base: Optional[Trajectory] = None  # retry: the trajectory to restart
    pivot: int = 0
    guidance: Optional[str] = None


@dataclass
class RolloutOptions:
    """What ``EpisodeRunner`` reads of the config (names and defaults are ``R3LConfig``'s, from
    ``rllib_r3l.options``; ``from_config`` builds it from a config)."""

    max_turns: Optional[int] = default("max_turns")
    max_response_tokens: int = default("max_response_tokens")
    max_context_tokens: int = default("max_context_tokens")
    temperature: float = default("temperature")
    top_p: float = default("top_p")
    action_decoding: str = default("action_decoding")
    system_prompt: Optional[str] = default("system_prompt")
    verify_replay: bool = default("verify_replay")
    pivot_action: str = default("pivot_action")  # a retry's pivot turn (rllib_r3l.runner.pivot_turn)
    pivot_resamples: int = default("pivot_resamples")
    pivot_temperature: Optional[float] = default("pivot_temperature")

    @classmethod
    def from_config(cls, config: Any, evaluation: bool = False) -> "RolloutOptions":
        """The options of ``config`` (an ``R3LConfig``); ``evaluation`` samples at ``evaluation_temperature``."""
        kw = {f.name: getattr(config, f.name) for f in fields(cls)}
        if evaluation:
            kw["temperature"] = config.evaluation_temperature
        return cls(**kw)


@dataclass
class _Live:
    spec: EpisodeSpec
    env: Any
    traj: Trajectory
    system_text: str
    turn: int = 0
    admissible: Optional[List[str]] = None
    done: bool = False
    close_prev: List[int] = field(default_factory=list)  # stop token owed by a truncated response


def format_observation(obs: str, admissible: Optional[List[str]]) -> str:
    """The user message of a turn: the observation and, where the environment has them, the valid actions."""
    text = str(obs).strip()
    if admissible:
        text += "\nValid actions: " + ", ".join(admissible)
    return text


def system_text(template: Optional[str], rules: str, task: str) -> str:
    return (template or DEFAULT_SYSTEM_PROMPT).format(rules=rules.strip(), task=task.strip())


class EpisodeRunner:
    """Runs batches of episodes with one backend and a pool of environments."""

    def __init__(
        self,
        backend: GenerationBackend,
        chat: ChatFormat,
        env_factory: Callable[[], Any],
        options: RolloutOptions,
        counters: Optional[Counter] = None,
    ) -> None:
        self.backend = backend
        self.chat = chat
        self.env_factory = env_factory
        self.opts = options
        self.counters = counters if counters is not None else Counter()
        self._pool: List[Any] = []

    # -- environment pool ----------------------------------------------------------------------------
    def _acquire(self) -> Any:
        return self._pool.pop() if self._pool else self.env_factory()

    def _release(self, env: Any, healthy: bool) -> None:
        if healthy:
            self._pool.append(env)
            return
        try:
            env.close()
        except Exception:  # a crashed environment may fail to close; it is replaced either way
            self.counters["env_close_errors"] += 1

    def close(self) -> None:
        for env in self._pool:
            try:
                env.close()
            except Exception:
                self.counters["env_close_errors"] += 1
        self._pool.clear()

    # -- episodes ------------------------------------------------------------------------------------
    def _max_turns(self, env: Any) -> int:
        return int(self.opts.max_turns or getattr(env, "max_turns", 20))

    def _user_segment(self, live: _Live, obs: str, guidance: Optional[str] = None) -> List[int]:
        first = live.turn == 0
        text = format_observation(obs, live.admissible)
        return live.close_prev + self.chat.user_turn(live.system_text, text, first=first, guidance=guidance)

    def _timed(self, name: str, t0: float) -> None:
        """Add the seconds since ``t0`` to the phase timer ``name`` (``r3l/timers/<name>_s``)."""
        self.counters[f"seconds_{name}"] += time.perf_counter() - t0

    def _start(self, spec: EpisodeSpec) -> Optional[_Live]:
        t0 = time.perf_counter()
        try:
            return self._start_episode(spec)
        finally:
            self._timed("env_reset" if spec.kind == Kind.BASE else "replay", t0)

    def _start_episode(self, spec: EpisodeSpec) -> Optional[_Live]:
        traj = Trajectory(segments=[], reward=0.0, group_id=spec.group_id, kind=spec.kind, seed=spec.seed)
        try:
            env = self._acquire()
        except Exception:  # e.g. a JVM that does not start: the episode is lost, counted
            self.counters["env_errors"] += 1
            self.counters["env_create_errors"] += 1
            logger.warning("environment creation failed:\n%s", traceback.format_exc())
            traj.status = Status.ENV_ERROR
            traj.info["error"] = traceback.format_exc(limit=3)
            return _Live(spec=spec, env=None, traj=traj, system_text="", done=True)
        try:
            if spec.kind == Kind.BASE:
                obs, info = env.reset(seed=spec.seed)
                check_env_output(obs, info)
                traj.task = str(info.get("task", ""))
                traj.observations.append(str(obs))
            else:
                obs, info = self._replay_prefix(env, spec)
        except _ReplayMismatch as e:
            self._release(env, healthy=True)
            self.counters["replay_mismatch"] += 1
            logger.info("retry skipped: %s", e)
            return None
        except Exception:
            self.counters["env_errors"] += 1
            logger.warning("environment failed at reset/replay:\n%s", traceback.format_exc())
            self._release(env, healthy=False)
            traj.status = Status.ENV_ERROR
            traj.info["error"] = traceback.format_exc(limit=3)
            return _Live(spec=spec, env=None, traj=traj, system_text="", done=True)
        live = _Live(spec=spec, env=env, traj=traj, system_text="")
        live.admissible = info.get("admissible_actions")
        if spec.kind == Kind.BASE:
            live.system_text = system_text(self.opts.system_prompt, getattr(env, "rules", ""), traj.task)
            traj.segments.append(Segment("prompt", self.chat.system(live.system_text), turn=-1))
            traj.segments.append(Segment("prompt", self._user_segment(live, obs), turn=0))
        else:
            base = spec.base
            k = spec.pivot
            live.system_text = base.info["system_text"]
            live.turn = k
            traj.task, traj.pivot, traj.num_turns = base.task, k, k
            traj.actions = list(base.actions[:k])
            traj.observations = list(base.observations[: k + 1])
            traj.info["step_rewards"] = list(base.info.get("step_rewards", [])[:k])
            traj.reward = float(sum(traj.info["step_rewards"]))
            traj.segments = [dataclasses.replace(s) for s in base.prefix_segments(spec.pivot)]
            if k > 0 and (k - 1) in base.info.get("truncated_turns", []):
                live.close_prev = self.chat.closes_turn([])
            unguided = self._user_segment(live, obs)
            guided = self._user_segment(live, obs, guidance=spec.guidance)
            traj.segments.append(Segment("prompt", unguided, turn=spec.pivot, unguided_only=True))
            traj.segments.append(Segment("guidance", guided, turn=spec.pivot))
            live.close_prev = []
        traj.info["system_text"] = live.system_text
        traj.info["truncated_turns"] = [
            t for t in (spec.base.info.get("truncated_turns", []) if spec.base else []) if t < live.turn
        ]
        traj.env_id = type(env).__name__
        return live

    def _replay_prefix(self, env: Any, spec: EpisodeSpec):
        """Restore the state before turn ``pivot`` by replaying the recorded actions (verified)."""
        base = spec.base
        t = spec.pivot
        traj_obs = base.observations
        obs, info = env.reset(seed=base.seed)
        check_env_output(obs, info)
        if self.opts.verify_replay and str(obs) != traj_obs[0]:
            raise _ReplayMismatch(f"observation 0 differs after reset(seed={base.seed})")
        for i in range(t):
            obs, _r, term, trunc, info = env.step(base.actions[i])
            check_env_output(obs, info)
            if self.opts.verify_replay and str(obs) != traj_obs[i + 1]:
                raise _ReplayMismatch(f"observation {i + 1} differs on replay")
            if term or trunc:
                raise _ReplayMismatch(f"episode ended during replay at action {i}")
        return obs, info

    def run(self, specs: List[EpisodeSpec]) -> List[Optional[Trajectory]]:
        """Run all episodes to the end; one trajectory per spec (None: a retry whose replay mismatched)."""
        started = [self._start(s) for s in specs]
        lives = [lv for lv in started if lv is not None]
        while True:
            active = [lv for lv in lives if not lv.done]
            if not active:
                break
            requests, ready, temps, failed = [], [], [], []
            for lv in active:
                ctx = lv.traj.context_ids()
                budget = self.opts.max_context_tokens - len(ctx)
                if budget < 2:
                    lv.traj.status = Status.CONTEXT_OVERFLOW
                    self.counters["context_overflow"] += 1
                    # the prompt that no longer fits was never answered: it is not part of the episode
                    while len(lv.traj.segments) > 1 and lv.traj.segments[-1].role != "response":
                        lv.traj.segments.pop()
                    self._end_unfinished(lv)
                    self._finish(lv)
                    continue
                choices = lv.admissible if (self.opts.action_decoding == "choice" and lv.admissible) else None
                failed.append(pivot_turn.failed_action(lv.spec, lv.turn, self.opts.pivot_action))
                choices = pivot_turn.exclude(choices, failed[-1], self.counters)
                failed[-1] = failed[-1] if choices is None else None  # free text: resampled when it repeats
                temps.append(
                    pivot_turn.temperature(lv.spec, lv.turn, self.opts.temperature, self.opts.pivot_temperature)
                )
                requests.append(GenerationRequest(ctx, min(self.opts.max_response_tokens, budget - 1), choices=choices))
                self.counters["prompt_tokens"] += len(ctx)  # context submitted this turn (prefill work before caching)
                self.counters[f"prompt_tokens_{_phase(lv)}"] += len(ctx)
                ready.append(lv)
            if not ready:
                continue
            t0 = time.perf_counter()
            try:
                results = pivot_turn.generate(
                    partial(self.backend.generate, top_p=self.opts.top_p),
                    requests,
                    temps,
                    failed,
                    self.opts.pivot_resamples,
                    self.counters,
                )
            except Exception:
                self.counters["generation_errors"] += 1
                logger.error("generation failed:\n%s", traceback.format_exc())
                for lv in ready:
                    lv.traj.status = Status.GENERATION_ERROR
                    self._finish(lv, healthy=True)
                continue
            finally:  # one wave holds one phase: explore runs bases and retries in separate calls
                self._timed(f"generate_{_phase(ready[0])}", t0)
            for lv, res in zip(ready, results):
                self.counters[f"prompt_tokens_cached_{_phase(lv)}"] += res.cached_prompt_tokens
                self._advance(lv, res)
        return [lv.traj if lv is not None else None for lv in started]

    def score_behaviour(self, trajectories: List[Trajectory]) -> None:
        """Attach the behaviour model's own log-probs (T=1, unconstrained) to each response.

        The sampler's log-probs are those of the distribution it sampled from (temperature, top-p,
        the choice or JSON constraint), while the learner computes the model's own; an importance
        ratio needs like with like, so the engine scores each trajectory once with the weights it
        sampled with (one prefill per trajectory: only done when the ratio is used).
        """
        todo = [
            t
            for t in trajectories
            if t.status not in (Status.ENV_ERROR, Status.GENERATION_ERROR)
            and t.num_generated_tokens
            and not t.has_guidance()
        ]
        if not todo:
            return
        pairs = [(t.token_ids[:1], t.token_ids[1:]) for t in todo]
        scores = self.backend.score_batch(pairs)
        for t, sc in zip(todo, scores):
            start = 0  # sc[j] is the log-prob of token j + 1; a response never starts at token 0
            for s in t.segments:
                n = len(s.token_ids)
                if s.role == "response":
                    s.model_logprobs = [float(x) for x in sc[start - 1 : start - 1 + n]]
                start += n
            self.counters["behaviour_scored_tokens"] += len(t.token_ids)

    def _advance(self, lv: _Live, res) -> None:
        traj = lv.traj
        traj.segments.append(Segment("response", list(res.token_ids), turn=lv.turn, logprobs=list(res.logprobs)))
        self.counters["progress_turns"] += 1  # live progress (rllib_r3l.runner.progress)
        self.counters["progress_tokens"] += len(res.token_ids)
        if res.finish_reason == "length":
            self.counters["truncated_responses"] += 1
            traj.info["truncated_turns"].append(lv.turn)
        action = res.text.strip()
        traj.actions.append(action)
        t0 = time.perf_counter()
        try:
            obs, reward, term, trunc, info = lv.env.step(action)
            check_env_output(obs, info)
            reward = float(reward)
            if not math.isfinite(reward):
                raise ValueError(f"environment returned a non-finite reward {reward!r}")
        except Exception:
            self.counters["env_errors"] += 1
            logger.warning("environment step failed:\n%s", traceback.format_exc())
            traj.status = Status.ENV_ERROR
            traj.info["error"] = traceback.format_exc(limit=3)
            self._finish(lv, healthy=False)
            return
        finally:
            self._timed("env_step", t0)
        traj.reward += reward
        traj.info.setdefault("step_rewards", []).append(reward)
        traj.observations.append(obs)
        if info.get("invalid_action"):
            self.counters["invalid_actions"] += 1
        if info.get("won"):
            traj.success = True
        lv.admissible = info.get("admissible_actions")
        lv.turn += 1
        traj.num_turns = lv.turn
        if term or trunc or lv.turn >= self._max_turns(lv.env):
            traj.status = Status.OK if term else Status.TRUNCATED
            if not (term or trunc):
                self._end_unfinished(lv)
            self._finish(lv)
            return
        lv.close_prev = self.chat.closes_turn(res.token_ids)
        traj.segments.append(Segment("prompt", self._user_segment(lv, obs), turn=lv.turn))
        lv.close_prev = []

    def _end_unfinished(self, lv: _Live) -> None:
        """The runner, not the environment, ends this episode (context overflow, or a turn limit
        below the environment's): it gets the return the environment gives an unfinished episode,
        ``env.failure_reward`` (0 unless the environment penalises failure, e.g. WebShop's -0.1)."""
        penalty = float(getattr(lv.env, "failure_reward", 0.0) or 0.0)
        if penalty and not lv.traj.success:
            lv.traj.reward += penalty
            lv.traj.info["unfinished_reward"] = penalty

    def _finish(self, lv: _Live, healthy: bool = True) -> None:
        lv.done = True
        self.counters["progress_episodes" if lv.spec.kind == Kind.BASE else "progress_retries"] += 1
        lv.traj.num_turns = lv.turn
        if lv.env is not None:
            self._release(lv.env, healthy)
            lv.env = None


def _phase(lv: _Live) -> str:
    """The cost phase a turn belongs to: base rollouts or retries (reflection counts its own)."""
    return "base" if lv.spec.kind == Kind.BASE else "retry"


class _ReplayMismatch(RuntimeError):
    pass


def check_env_output(obs: Any, info: Any) -> None:
    """An environment must return a str observation and a dict info (else: an environment error)."""
    if not isinstance(obs, str):
        raise TypeError(f"environment returned a {type(obs).__name__} observation, expected str")
    if not isinstance(info, dict):
        raise TypeError(f"environment returned a {type(info).__name__} info, expected dict")
