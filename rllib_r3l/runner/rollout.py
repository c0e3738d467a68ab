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
import time
import traceback
from collections import Counter
from dataclasses import dataclass, fields
from functools import partial
from typing import Any, Callable, List, Optional

from rllib_r3l.generation.base import GenerationBackend, GenerationRequest
from rllib_r3l.options import default
from rllib_r3l.runner import pivot_turn
from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.runner.env_pool import EnvPool, Outcome
from rllib_r3l.runner.episode import EpisodeSpec, Turn
from rllib_r3l.runner.episode import Live as _Live
from rllib_r3l.trajectory import Kind, Segment, Status, Trajectory

logger = logging.getLogger(__name__)

# the phase timers EpisodeRunner keeps in its counters as ``seconds_<name>`` (r3l/timers/<name>_s)
# score_behaviour: the behaviour log-probs' prefill (use_importance_ratio, max_policy_lag >= 1)
ROLLOUT_TIMERS = ("generate_base", "generate_retry", "env_step", "env_reset", "replay", "score_behaviour")

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent acting in a text environment. {rules}\n"
    "Your task: {task}\n"
    "Reply with exactly one action and nothing else."
)


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
    rollout_loop: str = default("rollout_loop")  # "waves" or "episodes" (rllib_r3l.runner.episode_loop)
    env_step_workers: int = default("env_step_workers")  # "episodes": threads stepping environments

    @classmethod
    def from_config(cls, config: Any, evaluation: bool = False) -> "RolloutOptions":
        """The options of ``config`` (an ``R3LConfig``); ``evaluation`` samples at ``evaluation_temperature``."""
        kw = {f.name: getattr(config, f.name) for f in fields(cls)}
        if evaluation:
            kw["temperature"] = config.evaluation_temperature
        return cls(**kw)


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
        self.opts = options
        self.counters = counters if counters is not None else Counter()
        self.envs = EnvPool(env_factory, self.counters)

    @property
    def env_factory(self) -> Callable[[], Any]:
        """What builds this runner's environments (the pool's factory; replacing it replaces future ones)."""
        return self.envs.factory

    @env_factory.setter
    def env_factory(self, factory: Callable[[], Any]) -> None:
        self.envs.factory = factory

    def close(self) -> None:
        self.envs.close()

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
        return self._started(spec, self.open_env(spec))

    def open_env(self, spec: EpisodeSpec) -> Outcome:
        """The environment of ``spec`` opened (reset, or a retry's replay checked by ``verify_replay``); safe in a
        worker thread."""
        return self.envs.open_env(spec.seed, spec.base, spec.pivot, self.opts.verify_replay)

    def _started(self, spec: EpisodeSpec, opened: Outcome) -> Optional[_Live]:
        """The live episode of ``spec`` from its environment's opening (None: a retry whose replay
        mismatched, counted); a failed opening is an ENV_ERROR episode, counted."""
        self.counters["seconds_env_reset" if spec.kind == Kind.BASE else "seconds_replay"] += opened.seconds
        traj = Trajectory(segments=[], reward=0.0, group_id=spec.group_id, kind=spec.kind, seed=spec.seed)
        if opened.mismatch is not None:
            self.envs.release(opened.env, healthy=True)
            self.counters["replay_mismatch"] += 1
            logger.info("retry skipped: %s", opened.mismatch)
            return None
        if opened.error is not None:
            self.counters["env_errors"] += 1
            if not opened.created:
                self.counters["env_create_errors"] += 1
                logger.warning("environment creation failed:\n%s", opened.error)
            else:
                logger.warning("environment failed at reset/replay:\n%s", opened.error)
                self.envs.release(opened.env, healthy=False)
            traj.status = Status.ENV_ERROR
            traj.info["error"] = opened.error_short
            return _Live(spec=spec, env=None, traj=traj, system_text="", done=True)
        env = opened.env
        obs, info = opened.value
        if spec.kind == Kind.BASE:
            traj.task = str(info.get("task", ""))
            traj.observations.append(str(obs))
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
        traj.env_id = getattr(env, "env_name", type(env).__name__)  # a wrapper names what it wraps
        return live

    def run(self, specs: List[EpisodeSpec]) -> List[Optional[Trajectory]]:
        """Run all episodes to the end; one trajectory per spec (None: a retry whose replay mismatched).

        ``rollout_loop="waves"``: every live episode's turn is one batched generate, then the environments
        step one after another; ``"episodes"``: each episode is its own loop (rllib_r3l.runner.episode_loop)."""
        if self.opts.rollout_loop == "episodes":
            from rllib_r3l.runner.episode_loop import run_episodes

            return run_episodes(self, specs)
        started = [self._start(s) for s in specs]
        lives = [lv for lv in started if lv is not None]
        while True:
            active = [lv for lv in lives if not lv.done]
            if not active:
                break
            ready, turns = [], []
            for lv in active:
                turn = self._prepare(lv)
                if turn is not None:
                    ready.append(lv)
                    turns.append(turn)
            if not ready:
                continue
            t0 = time.perf_counter()
            try:
                results = pivot_turn.generate(
                    partial(self.backend.generate, top_p=self.opts.top_p),
                    [t.request for t in turns],
                    [t.temperature for t in turns],
                    [t.failed for t in turns],
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
                action = self._respond(lv, res)
                self._stepped(lv, res, self.envs.step_env(lv.env, action))
        return [lv.traj if lv is not None else None for lv in started]

    def _prepare(self, lv: _Live) -> Optional[Turn]:
        """The generation request of ``lv``'s next turn, or None when its context is full (the episode
        then ends as a context overflow, counted)."""
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
            return None
        choices = lv.admissible if (self.opts.action_decoding == "choice" and lv.admissible) else None
        failed = pivot_turn.failed_action(lv.spec, lv.turn, self.opts.pivot_action)
        choices = pivot_turn.exclude(choices, failed, self.counters)
        failed = failed if choices is None else None  # free text: resampled when it repeats
        temp = pivot_turn.temperature(lv.spec, lv.turn, self.opts.temperature, self.opts.pivot_temperature)
        request = GenerationRequest(ctx, min(self.opts.max_response_tokens, budget - 1), choices=choices)
        self.counters["prompt_tokens"] += len(ctx)  # context submitted this turn (prefill work before caching)
        self.counters[f"prompt_tokens_{_phase(lv)}"] += len(ctx)
        return Turn(request, temp, failed)

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
        t0 = time.perf_counter()
        scores = self.backend.score_batch(pairs)
        self._timed("score_behaviour", t0)
        for t, sc in zip(todo, scores):
            start = 0  # sc[j] is the log-prob of token j + 1; a response never starts at token 0
            for s in t.segments:
                n = len(s.token_ids)
                if s.role == "response":
                    s.model_logprobs = [float(x) for x in sc[start - 1 : start - 1 + n]]
                start += n
            self.counters["behaviour_scored_tokens"] += len(t.token_ids)

    def _respond(self, lv: _Live, res) -> str:
        """Record the policy's response to ``lv``'s turn; the action it takes."""
        self.counters[f"prompt_tokens_cached_{_phase(lv)}"] += res.cached_prompt_tokens
        traj = lv.traj
        traj.segments.append(Segment("response", list(res.token_ids), turn=lv.turn, logprobs=list(res.logprobs)))
        self.counters["progress_turns"] += 1  # live progress (rllib_r3l.runner.progress)
        self.counters["progress_tokens"] += len(res.token_ids)
        if res.finish_reason == "length":
            self.counters["truncated_responses"] += 1
            traj.info["truncated_turns"].append(lv.turn)
        action = res.text.strip()
        traj.actions.append(action)
        return action

    def _stepped(self, lv: _Live, res, step: Outcome) -> None:
        """Apply the environment's answer to ``lv``'s action: the next turn's prompt, or the episode's end."""
        self.counters["seconds_env_step"] += step.seconds
        traj = lv.traj
        if step.error is not None:
            self.counters["env_errors"] += 1
            logger.warning("environment step failed:\n%s", step.error)
            traj.status = Status.ENV_ERROR
            traj.info["error"] = step.error_short
            self._finish(lv, healthy=False)
            return
        obs, reward, term, trunc, info = step.value
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
            self.envs.release(lv.env, healthy)
            lv.env = None


def _phase(lv: _Live) -> str:
    """The cost phase a turn belongs to: base rollouts or retries (reflection counts its own)."""
    return "base" if lv.spec.kind == Kind.BASE else "retry"
