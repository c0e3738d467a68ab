"""``R3LEnvRunner``: an RLlib EnvRunner that explores text environments with an LLM (paper §4).

It owns a generation backend (vLLM, or transformers as the fallback), a pool of environments and an
:class:`~rllib_r3l.runner.explore.Explorer`. ``sample()`` returns explored task groups (Python objects,
see ``rllib_r3l.runner.explore.GroupResult``); the Algorithm turns them into the learner's batch.
``set_state`` with new module weights loads them into the running engine in place.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
import traceback
from collections import Counter
from typing import Any, Dict, List, Optional

import gymnasium as gym
import numpy as np
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.checkpoints import Checkpointable

from rllib_r3l.reliability.engine_recovery import EngineKeeper
from rllib_r3l.runner.explore import ExploreOptions, Explorer, GroupResult
from rllib_r3l.runner.sample_metrics import log_sample_metrics

logger = logging.getLogger(__name__)


class R3LEnvRunner(EnvRunner, Checkpointable):
    """Samples R3L task groups: base rollouts, reflections and retries."""

    def __init__(self, *, config, **kwargs) -> None:
        super().__init__(config=config, **kwargs)
        self.worker_index = kwargs.get("worker_index") or 0
        self._backend = None
        self._reflector = None
        self._explorer: Optional[Explorer] = None
        self._progress = None  # live progress for the console (rllib_r3l.runner.progress), when it asks for it
        self._engine_start_logged = False
        self._episodes = None
        self._chat = None
        self._tokenizer = None
        self._weights_seq_no = 0
        self._pending_weights = None
        self._engine_fault_trigger = None  # engine fault injection (a testing aid): shared across rebuilt engines
        self._keeper = None
        self._stop_sampling = False
        self._episodes_left: Optional[int] = None  # sample(max_episodes=...): what the budget still allows
        self._num_groups_sampled = 0
        self._eval_episodes = None  # evaluate_episodes' own EpisodeRunner (the evaluation split and temperature)
        self._in_eval = bool(self.config.in_evaluation)
        seed = self.config.seed if self.config.seed is not None else int.from_bytes(os.urandom(4), "little")
        self._rng = np.random.default_rng([int(seed), int(self.worker_index), int(self._in_eval)])
        self.counters: Counter = Counter()
        self._obs_space = gym.spaces.Text(max_length=1 << 20)
        self._act_space = gym.spaces.Text(max_length=1 << 16)
        if self.config.num_threads:
            import torch

            torch.set_num_threads(int(self.config.num_threads))

    # -- lazy set-up (the local runner of a multi-runner group never loads a model) -----------------
    def _env_factory(self, evaluation: bool = False):
        import environments

        env_id = self.config.env
        env_config = dict(self.config.env_config or {})
        evaluation = evaluation or self._in_eval
        split = self.config.task_split if not evaluation else env_config.get("eval_split", "dev")
        env_config.pop("eval_split", None)
        delay = env_config.pop("step_delay_s", 0) or 0  # a stand-in for tool/web latency (environments.latency)

        if split and "split" not in env_config and _accepts(environments.registry.resolve(env_id), "split"):
            env_config["split"] = split
        from environments.latency import with_step_delay
        from rllib_r3l.reliability.faults import wrap_env_factory

        # fault_injection (a testing aid, off by default) wraps the environments; else unchanged
        return wrap_env_factory(
            lambda: with_step_delay(environments.make(env_id, env_config), delay),
            self.config,
            self.counters,
            self.worker_index,
        )

    def _setup(self) -> None:
        if self._explorer is not None:
            return
        from rllib_r3l.generation import make_backend
        from rllib_r3l.models import load_tokenizer, resolve_model
        from rllib_r3l.runner.chat import ChatFormat
        from rllib_r3l.runner.rollout import EpisodeRunner, RolloutOptions

        c = self.config
        path = resolve_model(c.model_id)
        t0 = time.perf_counter()
        self._tokenizer = load_tokenizer(path)
        self._chat = ChatFormat(self._tokenizer)
        self._model_path = path
        self._backend = self._build_policy_backend()
        reflector_chat = None
        if c.reflector_model:
            rpath = resolve_model(c.reflector_model)
            self._reflector = make_backend(c.backend, rpath, **engine_options(c))
            reflector_chat = ChatFormat(load_tokenizer(rpath))
        self.counters["backend_start_seconds"] = int(time.perf_counter() - t0)
        from rllib_r3l.generation.seeded import seeded_backend

        # sampling_seed: every generate call seeded from the sample's task seeds (reproducible resume)
        self._reflector = seeded_backend(self._reflector, c.sampling_seed)
        self._keeper = EngineKeeper(
            self._build_policy_backend, self._load_into, self.counters, probe_token_id=self._tokenizer.eos_token_id or 0
        )
        opts = RolloutOptions.from_config(c, evaluation=self._in_eval)
        self._episodes = EpisodeRunner(self._backend, self._chat, self._env_factory(), opts, self.counters)
        eopts = ExploreOptions.from_config(c, evaluation=self._in_eval)
        self._explorer = Explorer(
            self._episodes, self._chat, eopts, reflector=self._reflector, reflector_chat=reflector_chat
        )
        if not self._in_eval:
            from rllib_r3l.runner import progress

            self._progress = progress.start_publisher(self.counters, str(self.worker_index))
        if self._pending_weights is not None:
            self._load_weights(self._pending_weights)
            self._pending_weights = None

    def _build_policy_backend(self):
        """The policy's engine as exploration uses it: seeded sampling and (a testing aid) engine faults."""
        from rllib_r3l.generation import make_backend
        from rllib_r3l.generation.seeded import seeded_backend
        from rllib_r3l.reliability.faults import wrap_backend

        backend = make_backend(self.config.backend, self._model_path, **engine_options(self.config))
        backend, self._engine_fault_trigger = wrap_backend(
            backend, self.config, self.counters, self.worker_index, trigger=self._engine_fault_trigger
        )
        return seeded_backend(backend, self.config.sampling_seed)

    def _recover_engine(self, before: Counter) -> None:
        """After a round with generation errors: keep, rebuild or (failed again) give up on the engine."""
        if not self._keeper.generation_failed_since(before):
            return
        old = self._backend
        new = self._keeper.recover(old)
        if new is None:
            self._stop_sampling = True
        elif new is not old:
            self._backend = self._episodes.backend = new
            if self._explorer.reflector is old:
                self._explorer.reflector = new
            self._stop_sampling = self._stop_sampling or self._keeper.needs_weights

    def needs_weights(self) -> bool:
        """Its engine was rebuilt with older weights than the learner's: the driver restores them first."""
        return self._keeper is not None and self._keeper.needs_weights

    @property
    def backend(self):
        self._setup()
        return self._backend

    @property
    def tokenizer(self):
        self._setup()
        return self._tokenizer

    # -- EnvRunner API -------------------------------------------------------------------------------
    def assert_healthy(self) -> None:
        assert self.config is not None

    def get_spaces(self) -> Dict[str, Any]:
        return {"__env__": (self._obs_space, self._act_space), DEFAULT_MODULE_ID: (self._obs_space, self._act_space)}

    def sample(
        self,
        *,
        num_groups: Optional[int] = None,
        max_episodes: Optional[int] = None,
        evaluate: Optional[bool] = None,
        **kwargs,
    ) -> List[GroupResult]:
        """Explore ``num_groups`` tasks (default: this runner's share of ``tasks_per_iteration``); with
        ``max_episodes``, at most that many base and retry episodes start, dynamic sampling's rounds included
        (an exact trajectory budget, ``R3L.episode_cap``).

        Never raises for a failing environment or generation: failures are recorded on the
        trajectories, counted under ``r3l/faults/...`` and returned in ``GroupResult.lost``.
        """
        self._setup()
        c = self.config
        if num_groups is None:
            n_runners = max(c.num_env_runners, 1)
            num_groups = c.tasks_per_iteration // n_runners + int(
                self.worker_index - 1 < c.tasks_per_iteration % n_runners if self.worker_index else 0
            )
            num_groups = max(num_groups, 1)
        t0 = time.perf_counter()
        before = Counter(self.counters)
        self._keeper.begin_sample()
        self._stop_sampling = False
        self._episodes_left = max_episodes
        groups = self._explore_round(num_groups)
        if groups is None:  # the exploration failed (counted): nothing trainable
            self._sample_done()
            return []
        reflect_s = self._explorer.reflect_seconds
        groups, reflect_s = self._dynamic_sampling(groups, num_groups, reflect_s)
        dt = time.perf_counter() - t0
        log_sample_metrics(self, groups, dt, before, reflect_s)
        self._sample_done()
        return groups

    def evaluate_episodes(self, seeds: List[int]) -> List[Dict[str, Any]]:
        """One base episode per task seed (no reflection, no retry) on the evaluation split
        (``env_config["eval_split"]``, default "dev") at ``evaluation_temperature``, with the weights this
        runner's engine holds: the rows of ``R3L.evaluate()`` (runner/evaluation.py). The training task
        stream is untouched (its RNG is not drawn from); the episodes' faults count apart, in the rows."""
        from rllib_r3l.generation.seeded import begin_sample
        from rllib_r3l.runner.evaluation import episode_row
        from rllib_r3l.runner.rollout import EpisodeRunner, EpisodeSpec, RolloutOptions

        self._setup()
        if self._eval_episodes is None:
            opts = RolloutOptions.from_config(self.config, evaluation=True)
            self._eval_episodes = EpisodeRunner(
                self._backend, self._chat, self._env_factory(evaluation=True), opts, Counter()
            )
        self._eval_episodes.backend = self._backend  # a rebuilt engine (engine_recovery) replaces the old one
        begin_sample(seeds, self._backend)  # sampling_seed: the same seeds sample the same episodes
        trajs = self._eval_episodes.run([EpisodeSpec(seed=s, group_id=f"eval-{s}") for s in seeds])
        return [episode_row(s, t, float(self.config.success_reward)) for s, t in zip(seeds, trajs)]

    def _explore_round(self, num_groups: int) -> Optional[List[GroupResult]]:
        """One round of exploration on ``num_groups`` new tasks; None when it failed (counted)."""
        seeds = [int(s) for s in self._rng.integers(0, 2**31 - 1, size=num_groups)]
        from rllib_r3l.generation.seeded import begin_sample

        begin_sample(seeds, self._backend, self._reflector)
        gids = [f"w{self.worker_index}-g{self._num_groups_sampled + i}-s{s}" for i, s in enumerate(seeds)]
        self._num_groups_sampled += num_groups
        before = Counter(self.counters)
        try:
            if self._episodes_left is None:
                return self._explorer.explore(seeds, gids)
            started = self.counters["episodes_started"]
            out = self._explorer.explore(seeds, gids, max_episodes=self._episodes_left)
            self._episodes_left -= self.counters["episodes_started"] - started
            return out
        except Exception:  # a bug or an unexpected backend failure: count it, return nothing trainable
            logger.error("exploration failed:\n%s", traceback.format_exc())
            self.metrics.log_value(("r3l", "faults", "exploration_errors"), 1, reduce="sum")
            self.metrics.log_value(("r3l", "faults", "groups_lost_with_exploration_error"), num_groups, reduce="sum")
            return None
        finally:
            self._recover_engine(before)

    def _dynamic_sampling(self, groups: List[GroupResult], num_groups: int, reflect_s: float):
        """``dynamic_sampling_rounds``: while none of this sample's groups carries a learning signal,
        explore ``num_groups`` more new tasks, at most that many rounds (DAPO's dynamic sampling).
        Every round's groups are returned (the silent ones add nothing to the batch, but count in
        the success rates); the groups without a signal are counted either way."""
        from rllib_r3l.batch import carries_signal, train_batch_options

        c, m = self.config, self.metrics
        opts = train_batch_options(c)
        signal = [carries_signal(g, **opts) for g in groups]
        rounds = 0
        max_rounds = 0 if self._in_eval else int(c.dynamic_sampling_rounds)
        while (
            not any(signal)
            and rounds < max_rounds
            and not self._stop_sampling
            and (self._episodes_left is None or self._episodes_left > 0)
        ):
            rounds += 1
            self.counters["progress_rounds"] += 1  # live progress: a new round of tasks
            more = self._explore_round(num_groups)
            if more is None:
                break
            reflect_s += self._explorer.reflect_seconds
            groups = groups + more
            signal += [carries_signal(g, **opts) for g in more]
        m.log_value(("r3l", "dynamic_sampling", "groups_without_signal"), signal.count(False), reduce="sum")
        if max_rounds:
            m.log_value(("r3l", "dynamic_sampling", "extra_rounds"), rounds, reduce="sum")
            m.log_value(("r3l", "dynamic_sampling", "rounds_exhausted"), int(not any(signal)), reduce="sum")
        return groups, reflect_s

    def _sample_done(self) -> None:
        """Count the finished ``sample()`` and publish the progress now, not at the next tick: the
        console takes the next iteration's baseline once every sample has returned, and a count
        published after that would show up in the next iteration's live line."""
        self.counters["progress_samples"] += 1
        if self._progress is not None:
            self._progress.write()

    def get_metrics(self):
        return self.metrics.reduce()

    # -- weights -------------------------------------------------------------------------------------
    def _load_weights(self, module_state: Dict[str, Any]) -> None:
        t0 = time.perf_counter()
        self._load_into(self._backend, module_state)
        self._keeper.remember(module_state)  # what a rebuilt engine must hold
        self.metrics.log_value(("r3l", "weight_sync_seconds"), time.perf_counter() - t0, reduce="mean", window=1)

    @staticmethod
    def _load_into(backend: Any, module_state: Dict[str, Any]) -> None:
        from rllib_r3l.learner.rl_module import hf_named_tensors

        backend.update_weights(hf_named_tensors(module_state))

    def get_state(self, components=None, *, not_components=None, **kwargs) -> Dict[str, Any]:
        return {
            "num_groups_sampled": self._num_groups_sampled,
            "rng": self._rng.bit_generator.state,
            "weights_seq_no": self._weights_seq_no,
        }

    def set_state(self, state: Dict[str, Any]) -> None:
        import ray

        if "rng" in state:
            self._rng.bit_generator.state = state["rng"]
        if "num_groups_sampled" in state:
            self._num_groups_sampled = state["num_groups_sampled"]
        if COMPONENT_RL_MODULE not in state:
            return
        seq = state.get("weights_seq_no", 0)
        if seq and seq <= self._weights_seq_no:
            return
        module_state = state[COMPONENT_RL_MODULE]
        if isinstance(module_state, ray.ObjectRef):
            module_state = ray.get(module_state)
        if isinstance(module_state, dict) and DEFAULT_MODULE_ID in module_state:
            module_state = module_state[DEFAULT_MODULE_ID]
        if self._explorer is None:
            if self.worker_index == 0 and self.config.num_env_runners > 0:
                return  # the driver's idle local runner: holding a model copy would only cost memory
            import torch

            # loaded when the engine starts; a copy, since an in-process learner's state holds its live
            # parameters (Algorithm._sync_weights), which later updates change in place
            self._pending_weights = {
                k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in module_state.items()
            }
        else:
            self._load_weights(module_state)
        if seq:
            self._weights_seq_no = seq

    # -- colocated learner (colocate_engine_sleep): free the accelerator during the update --------------
    def sleep_engine(self, level: int = 1) -> bool:
        """Put the engine(s) to sleep (vLLM on GPU with sleep mode; else a no-op). True if slept."""
        slept = False
        for b in (self._backend, self._reflector):
            if b is not None and getattr(b, "enable_sleep_mode", False):
                b.sleep(level=level)
                slept = True
        return slept

    def wake_engine(self, tags: Optional[List[str]] = None) -> None:
        """Wake the engine(s): ``tags=["weights"]`` before a weight sync, None for everything."""
        for b in (self._backend, self._reflector):
            if b is not None and getattr(b, "is_sleeping", False):
                b.wake_up(tags)

    def get_ctor_args_and_kwargs(self):
        return ((), {"config": self.config})

    def get_checkpointable_components(self):
        return []

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        for episodes in (self._episodes, self._eval_episodes):
            if episodes is not None:
                episodes.close()
        for b in (self._backend, self._reflector):
            if b is not None:
                try:
                    b.close()
                except Exception:
                    logger.warning("backend close failed:\n%s", traceback.format_exc())


def engine_options(config) -> Dict[str, Any]:
    """The generation backend's constructor options: ``backend_options`` plus what the scale-out
    options imply (vLLM sleep mode for ``colocate_engine_sleep``)."""
    from rllib_r3l.generation import resolve_backend_name

    opts = dict(config.backend_options or {})
    if config.colocate_engine_sleep and resolve_backend_name(config.backend) == "vllm":
        opts.setdefault("enable_sleep_mode", True)
    return opts


def _accepts(factory: Any, kwarg: str) -> bool:
    try:
        return kwarg in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
