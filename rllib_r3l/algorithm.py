"""The R3L Algorithm: ``training_step`` reads like the paper's loop (§4, Algorithm 1).

explore   -> env runners: base rollouts, reflect, retry from the pivot (language-guided)
credit    -> driver: group-relative advantages, positive amplification, pivotal credit masks
optimize  -> learner(s): one accumulated policy-gradient step
sync      -> every S steps, the new weights into every engine, in place
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, List, Optional

import numpy as np
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_LEARNER_GROUP, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TIMERS,
    WEIGHTS_SEQ_NO,
)

from rllib_r3l import preflight, ray_internals, retry_ledger, stopping, timeline
from rllib_r3l.batch import (
    build_train_batch,
    drop_overlong,
    log_batch_metrics,
    mark_policy_lag,
    select_trainable,
    train_batch_options,
)
from rllib_r3l.config import R3LConfig
from rllib_r3l.learner.distributed import pad_batch_for_learners
from rllib_r3l.reliability import resilience
from rllib_r3l.replay_buffer import replay_from_config
from rllib_r3l.runner import dispatch, lagged

logger = logging.getLogger(__name__)
# where a Tune run of R3L starts (Tune resolving "R3L" imports this module, as does ``from rllib_r3l import
# R3L``): tune.run("R3L", stop={misspelt key}) is refused instead of trained on forever
stopping.install_env_callback()
LEDGER_STATE_KEY = "r3l_retry_ledger"


def _trial_folder(algo: Any) -> Optional[str]:
    """The trial's own folder when Tune runs ``algo`` on a local filesystem, else None (``algo.logdir`` is
    Tune's working directory, which reaches the trial folder only with ``SyncConfig(sync_artifacts=True)``).

    Tune gives a class trainable no public way to it (``tune.get_context().get_trial_dir()`` is None
    there), so this reads ``Trainable._storage`` (its StorageContext) through ``ray_internals``."""
    storage = ray_internals.trial_storage(algo)
    try:
        import pyarrow.fs

        if storage is not None and isinstance(storage.storage_filesystem, pyarrow.fs.LocalFileSystem):
            os.makedirs(storage.trial_fs_path, exist_ok=True)
            return storage.trial_fs_path
    except Exception:  # noqa: BLE001 - another Ray's layout: the working directory, as documented
        logger.warning("the trial folder could not be found; the retry ledger goes to %s", algo.logdir)
    return None


class R3L(Algorithm):
    """Reflect-then-Retry RL (arXiv 2601.03715) on RLlib's new API stack."""

    _checking_resources = False

    @classmethod
    @override(Algorithm)
    def get_default_config(cls) -> R3LConfig:
        return R3LConfig()

    @classmethod
    @override(Algorithm)
    def default_resource_request(cls, config):
        """RLlib's request, refused up front when the running Ray cluster can never grant it: Tune would
        otherwise wait forever for a GPU learner on a CPU cluster, with nothing on the console."""
        request = super().default_resource_request(config)
        cpus, gpus = preflight.ray_capacity()
        if cpus is not None and not cls._checking_resources:  # the check asks for this request again
            cls._checking_resources = True
            try:
                cfg = config if isinstance(config, R3LConfig) else cls.get_default_config().update_from_dict(config)
                preflight.check_resources(cfg, cpus=cpus, gpus=gpus, source="the Ray cluster")
            finally:
                cls._checking_resources = False
        return request

    @override(Algorithm)
    def setup(self, config) -> None:
        from rllib_r3l.learner.precision import bound_kernel_caches

        # a bf16 matmul on a CPU caches a JIT kernel per shape, 1,024 by default: bounded before anything in
        # this process runs one (learner/precision.py; the driver's memory grew with every iteration)
        bound_kernel_caches()
        preflight.check_config(self.config)  # the env builds with its env_config, the model exists: fail now
        preflight.check_local_learner_gpu(self.config)
        if preflight.ray_capacity()[0] is None:  # no Ray yet: RLlib runs (or starts) everything on this machine
            preflight.check_resources(self.config)  # its GPUs (a CUDA engine device on a CPU machine fails here)
        super().setup(config)
        self._num_updates = 0
        self._pad_token_id = None
        self._replay = replay_from_config(self.config)  # S > 1: decay-limit priority replay (replay.py)
        self._synced_update = 0  # learner-update count of the weights in the engines
        # every reflection and retry, one JSON line each (rllib_r3l/retry_ledger.py): in the trial's folder
        # under Tune, beside result.json; the main job points it at its --out folder
        self.retry_ledger_path = os.path.join(_trial_folder(self) or self.logdir, retry_ledger.LEDGER_FILE)
        # an exact trajectory budget: when set, the next iterations start at most this many base and retry
        # episodes in all runners together (r3l/episodes_started counts them); comparisons at equal budgets
        # set it to what is left before each iteration (benchmarks/learning_curves.py)
        self.episode_cap: Optional[int] = None

    @property
    def learner_updates(self) -> int:
        """Learner updates so far (the policy version the next update trains)."""
        return self._num_updates

    @property
    def engine_weights_version(self) -> int:
        """Learner updates in the weights the engines hold (a sample request's ``policy_version``)."""
        return self._synced_update

    # ------------------------------------------------------------------------------------------------
    @override(Algorithm)
    def training_step(self) -> None:
        c = self.config
        # 1. Explore: base rollouts -> reflect -> retry from the pivot (on the env runners).
        with timeline.phase(self, "explore"), self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            groups, runner_metrics = self._explore()
        self.metrics.aggregate(runner_metrics, key=ENV_RUNNER_RESULTS)
        retry_ledger.append(self.retry_ledger_path, self.iteration + 1, (r for g in groups for r in g.ledger))
        preflight.raise_if_no_environment(
            groups, self.metrics.peek((ENV_RUNNER_RESULTS, "r3l", "faults", "env_create_errors"), default=0)
        )

        # 2. Credit: group-relative advantages, positive amplification, pivotal credit.
        trajectories, counts = select_trainable(groups, drop_partial_groups=True)
        for k, v in counts.items():
            self.metrics.log_value(("r3l", "faults" if k != "groups" else "batch", k), v, reduce="sum")
        if self._replay is not None:  # S > 1: train on a prioritised sample of recent whole groups
            trajectories = self._replay_sample(groups)
        trajectories, n_long = drop_overlong(trajectories, c.max_context_tokens)
        self.metrics.log_value(("r3l", "faults", "items_too_long"), n_long, reduce="sum")
        batch, adv = None, None
        if trajectories:
            batch, adv = build_train_batch(
                trajectories, pad_token_id=self._get_pad_token_id(), **train_batch_options(c)
            )
            log_batch_metrics(self.metrics, trajectories, batch, adv)
            stale = mark_policy_lag(batch, self.learner_updates)  # max_policy_lag: base items from older weights
            self.metrics.log_value(("r3l", "batch", "stale_items"), stale, reduce="sum")

        # 3. Optimize: one accumulated step on the learner(s).
        if batch is None or len(batch["input_ids"]) == 0:
            self.metrics.log_value(("r3l", "batch", "empty_batches"), 1, reduce="sum")
            return
        if c.num_learners > 1:  # no learner may get an empty shard (distributed.py)
            batch = pad_batch_for_learners(batch, c.num_learners)
        n = len(batch["input_ids"])
        ma_batch = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, env_steps=n)
        if c.colocate_engine_sleep:  # free the shared GPU for the learner
            self._foreach_runner(lambda r: r.sleep_engine())
        with (
            timeline.phase(self, "update"),
            self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)),
            resilience.learner_lost_is_clear(self),
        ):
            learner_results = self.learner_group.update(
                batch=ma_batch,
                timesteps={
                    NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                        (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0
                    )
                },
                num_epochs=1,
                minibatch_size=None,
            )
        self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
        self._num_updates += 1

        # 4. Sync: the new weights into every engine (every S updates), in place.
        if self._num_updates % c.weight_sync_interval == 0:
            t_sync = time.perf_counter()
            with (
                timeline.phase(self, "sync"),
                self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)),
                resilience.learner_lost_is_clear(self),
            ):
                self._sync_weights()  # a learner process outlives its lost node for a moment: this may be the call
                # that fails
            self._synced_update = self._num_updates
            # this iteration's sync, exact (RLlib's timer above is a moving average): the console's split
            self.metrics.log_value(
                ("r3l", "timers", "weight_sync_s"), time.perf_counter() - t_sync, reduce="mean", window=1
            )
        if c.colocate_engine_sleep:  # queued after the weight sync on every runner
            self._foreach_runner(lambda r: r.wake_engine())

    # -- S > 1: replay; checkpoint state -----------------------------------------------------------------
    def _replay_sample(self, groups) -> List[Any]:
        """Add the fresh complete groups (generated by the weights of update ``_synced_update``) and
        draw this update's groups; returns their trainable trajectories."""
        c, rb = self.config, self._replay
        rb.add([g for g in groups if g.complete], version=self._synced_update)
        k = c.replay_groups_per_update or c.tasks_per_iteration
        sampled = rb.sample(k, now=self._num_updates)
        for key, v in rb.stats(self._num_updates).items():
            self.metrics.log_value(("r3l", "replay", key), v, reduce="mean", window=1)
        if rb.last_sample_ages:
            self.metrics.log_value(
                ("r3l", "replay", "sampled_policy_lag"), float(np.mean(rb.last_sample_ages)), reduce="mean", window=1
            )
        return select_trainable(sampled, drop_partial_groups=True)[0]

    def _sync_weights(self) -> None:
        """The learner's weights into every engine, in place.

        Through vLLM's weight-transfer engines where the engines have them (learner/weight_sync.py: in
        the engine's dtype, packed, no driver and no object store); otherwise, with remote runners, RLlib's
        ``sync_weights``: one ``ray.put`` shared by every runner.
        timeout_seconds=None: first collect the previous sync's acknowledgements (long done), else
        RLlib silently drops this sync for a runner whose previous one it has not yet seen complete
        (max_requests_in_flight_per_env_runner), leaving a stale engine. With only the driver's runner
        (``num_env_runners=0``, the main job), the state goes to it directly: RLlib would still pickle
        it into the object store (the whole fp32 state, seconds on CPU) for no reader."""
        from rllib_r3l.learner.weight_sync import sync_weights_via_transfer

        if sync_weights_via_transfer(self):  # vLLM's weight-transfer engines: learner rank 0 -> engines, no driver
            return
        group = self.env_runner_group
        if group.num_remote_workers() > 0 or group.local_env_runner is None:
            group.sync_weights(
                from_worker_or_learner_group=self.learner_group, inference_only=True, timeout_seconds=None
            )
            return
        state = self.learner_group.get_state(
            components=[f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}"], inference_only=True
        )[COMPONENT_LEARNER]
        group.local_env_runner.set_state({k: v for k, v in state.items() if k in (COMPONENT_RL_MODULE, WEIGHTS_SEQ_NO)})

    @override(Algorithm)
    def evaluate(self, parallel_train_future=None) -> Dict[str, Any]:
        """Held-out evaluation of the learner's current weights (paper §5: success on unseen tasks):
        ``evaluation_duration`` base episodes, no reflection, task seeds ``0..N-1`` of the evaluation split
        (``env_config["eval_split"]``, default "dev"; the same tasks every call, so calls compare) at
        ``evaluation_temperature``, spread over the training env runners and their engines (no second
        engine). Engines that hold older weights (``weight_sync_interval`` > 1) are synced first.
        Returns ``{"env_runners": {...}}``, what ``train()`` reports under ``"evaluation"`` with
        ``evaluation_interval``; episodes of a runner that died, or that an environment or the engine lost, are
        counted in ``lost_episodes``."""
        from rllib_r3l.runner.evaluation import play_heldout, summarize

        c = self.config
        if self._synced_update != self._num_updates:
            self._sync_weights()
            self._synced_update = self._num_updates
        t0 = time.perf_counter()
        rows, lost = play_heldout(self.env_runner_group, range(int(c.evaluation_duration)))
        s = summarize(rows)
        return {
            ENV_RUNNER_RESULTS: {
                "num_episodes": s["episodes"],
                "episode_return_mean": s["mean_return"],
                "episode_len_mean": s["mean_turns"],
                "success_rate": s["success_rate"],
                "lost_episodes": s["errors"] + lost,
                "split": (c.env_config or {}).get("eval_split", "dev"),
                "temperature": c.evaluation_temperature,
                "policy_updates": self._num_updates,
                "seconds": round(time.perf_counter() - t0, 2),
            }
        }

    def _foreach_runner(self, fn):
        local = self.env_runner_group.num_remote_workers() <= 0
        return self.env_runner_group.foreach_env_runner(fn, local_env_runner=local)

    @classmethod
    @override(Algorithm)
    def from_checkpoint(cls, path, filesystem=None, **kwargs):
        if filesystem is None:
            _refuse_incomplete_checkpoint(path)
        return super().from_checkpoint(path, filesystem, **kwargs)

    @override(Algorithm)
    def restore_from_path(self, path, *args, **kwargs) -> None:
        if kwargs.get("component") is None and kwargs.get("filesystem") is None:
            _refuse_incomplete_checkpoint(path)
        super().restore_from_path(path, *args, **kwargs)

    @override(Algorithm)
    def get_state(self, components=None, *, not_components=None, **kwargs) -> Dict[str, Any]:
        if (
            self.config.deepspeed
            and self.config.num_learners > 1
            and self._check_component(COMPONENT_LEARNER_GROUP, components, not_components)
        ):
            from rllib_r3l.learner.deepspeed_learner import prepare_checkpoints

            prepare_checkpoints(self.learner_group)  # RLlib asks only the first learner: it gathers every partition
        state = super().get_state(components, not_components=not_components, **kwargs)
        state["r3l_scaling"] = {
            "num_updates": self._num_updates,
            "replay": self._replay.get_state() if self._replay is not None else None,
        }
        if self._check_component(LEDGER_STATE_KEY, components, not_components):  # the ledger up to here, for a resume
            state[LEDGER_STATE_KEY] = retry_ledger.read(self.retry_ledger_path)
        extra = resilience.get_extra_state(self, components, not_components)  # remote runners' task RNGs
        if extra is not None:
            state[resilience.STATE_KEY] = extra
        return state

    @override(Algorithm)
    def set_state(self, state: Dict[str, Any]) -> None:
        discarded = lagged.discard_queued(self)  # what the runners sample now comes from the state being replaced
        super().set_state(state)
        if discarded:  # after RLlib restored the metrics' own state
            self.metrics.log_value(("r3l", "inflight_groups_discarded"), discarded, reduce="sum")
        resilience.set_extra_state(self, state.get(resilience.STATE_KEY))
        if state.get(LEDGER_STATE_KEY) is not None:  # the checkpoint's rows: what ran after it runs again
            retry_ledger.replace(self.retry_ledger_path, state[LEDGER_STATE_KEY])
        s = state.get("r3l_scaling")
        if s:
            self._num_updates = int(s.get("num_updates", self._num_updates))
            self._synced_update = self._num_updates  # restoring syncs the learner's weights
            if s.get("replay") is not None and self._replay is not None:
                self._replay.set_state(s["replay"])

    # ------------------------------------------------------------------------------------------------
    def _explore(self):
        """Each runner samples its explicit share of the iteration's task groups (runner/dispatch.py; with
        max_policy_lag >= 1 from requests queued before the last update, runner/lagged.py); recovery is
        wrapped around the rounds: a runner that dies mid-sample is counted, restored and its
        share re-sampled (runner_failure_retries; resilience.sample_with_recovery, docs/reliability.md)."""
        if self.env_runner_group.num_remote_workers() <= 0:
            groups, metrics = dispatch.sample_local(self)
        elif self.config.max_policy_lag > 0:  # the runners sample the next groups while the learner trains
            return lagged.sampler(self).explore(self)
        else:
            groups, metrics = resilience.sample_with_recovery(self, dispatch.sample_round)
        for g in groups:
            lagged.tag_version(g, self._synced_update)
        return groups, metrics

    @override(Algorithm)
    def restore_env_runners(self, env_runner_group) -> List[int]:
        # RLlib's default copies the local runner's state (no weights, another task RNG) into a restarted one
        return resilience.restore_env_runners(self, env_runner_group)

    def _get_pad_token_id(self) -> int:
        if self._pad_token_id is None:
            from rllib_r3l.models import load_tokenizer, resolve_model

            tok = load_tokenizer(resolve_model(self.config.model_id))
            self._pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        return self._pad_token_id


def _refuse_incomplete_checkpoint(path: Any) -> None:
    """A ``ValueError`` naming the file when a local checkpoint folder is cut or incomplete (a full disk, a
    kill mid-save): RLlib's unpickler error names none. Remote paths are left to RLlib."""
    import os

    from rllib_r3l.checkpoint_integrity import problem

    local = str(getattr(path, "path", path))  # a ray.train.Checkpoint, or a path
    if os.path.isfile(local):  # else RLlib calls a YAML experiment file "a v0 checkpoint"
        raise ValueError(
            f"{local}: a file, not a checkpoint folder; pass a checkpoint_* folder of a run (the "
            "folder Algorithm.save() returned, or one inside a trial's folder)"
        )
    if not os.path.isdir(local):
        return
    found = problem(local)
    if found:
        raise ValueError(
            f"{local}: not a complete R3L checkpoint ({found}); restore from an earlier checkpoint "
            "(`rllib-r3l train ... --resume` picks the newest complete one)"
        )
