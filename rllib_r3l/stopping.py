"""Stop criteria: a misspelt stop key must be an error, not a run that never ends.

Tune stops a trial when a result's value reaches any ``stop`` criterion; a key the results never
hold is only a one-time warning there, and the run goes on forever. ``check_stop_criteria`` checks
every key of a file's ``stop:`` and of ``--stop`` against the metrics an R3L result has (the names
below, as Tune flattens them with ``/``), with "did you mean", before anything starts.

Metrics whose names depend on the run (per-module learner stats, evaluation results, fault
counters) live under ``OPEN_NAMESPACES``: a key there passes unless it is close to a known name
(then it is taken for a typo).

The same check guards the Python doors: importing the algorithm (Tune resolving ``"R3L"`` does; ``import
rllib_r3l`` alone does not) names :class:`StopCriteriaCheck` in Tune's ``RAY_TUNE_CALLBACKS`` (Tune's own
hook for callbacks from the environment), so
``tune.run("R3L", stop={...})`` and ``tune.Tuner("R3L", run_config=RunConfig(stop=...))`` refuse a
misspelt key when the trial starts instead of training until killed.
"""

from __future__ import annotations

import difflib
import math
from typing import Any, Dict, Iterable, Optional

from rllib_r3l.errors import UsageError, did_you_mean

TUNE_DEFAULT_METRIC = "_metric"  # what Tune's schedulers hold when nobody named a metric (ray.tune.result)
# Tune's own (auto-filled) result keys.
TUNE_KEYS = (
    "training_iteration",
    "time_total_s",
    "time_this_iter_s",
    "time_since_restore",
    "timestamp",
    "iterations_since_restore",
    "timesteps_total",
    "timesteps_since_restore",
    "episodes_total",
)
# What an R3L training result holds (RLlib's keys and R3L's; see README "Metrics" and docs/reliability.md).
RESULT_KEYS = (
    "num_env_steps_sampled_lifetime",
    "num_training_step_calls_per_iteration",
    "env_runners/episode_return_mean",
    "env_runners/success_rate",
    "env_runners/episode_len_mean",
    "env_runners/num_episodes",
    "env_runners/num_groups",
    "env_runners/r3l/reflection_valid_rate",
    "env_runners/r3l/retry_trigger_rate",
    "env_runners/r3l/retry_success_rate",
    "env_runners/r3l/retry_improvement_rate",
    "env_runners/r3l/reward_gain",
    "env_runners/r3l/mean_pivot_turn",
    "env_runners/r3l/num_retries",
    "env_runners/r3l/rollout_turns_per_sample",
    "env_runners/r3l/generated_tokens",
    "env_runners/r3l/generated_tokens_per_sample",
    "env_runners/r3l/generated_tokens_per_s",
    "env_runners/r3l/prompt_tokens",
    "env_runners/r3l/prompt_tokens_per_sample",
    "env_runners/r3l/rollout_seconds",
    "env_runners/r3l/faults/episodes_lost",
    "env_runners/r3l/faults/env_errors",
    "env_runners/r3l/faults/env_create_errors",
    "env_runners/r3l/faults/generation_errors",
    "env_runners/r3l/faults/context_overflow",
    "env_runners/r3l/faults/truncated_responses",
    "r3l/trained_tokens",
    "r3l/trained_tokens_per_sample",
    "r3l/advantage_mean",
    "r3l/batch/items",
    "r3l/batch/groups",
    "r3l/batch/empty_batches",
    "r3l/batch/zero_advantage_items",
    "r3l/batch/num_base",
    "r3l/batch/num_retry",
    "r3l/faults/episodes_lost",
    "r3l/faults/partial_groups",
    "learners/default_policy/total_loss",
    "learners/default_policy/policy_loss",
    "learners/default_policy/gradients_default_optimizer_global_norm",
    "evaluation/env_runners/episode_return_mean",
    "evaluation/env_runners/success_rate",
)
# Namespaces with run-dependent names: a key there passes unless it looks like a typo of a known one.
OPEN_NAMESPACES = (
    "learners/",
    "evaluation/",
    "env_runners/r3l/",
    "r3l/",
    "timers/",
    "perf/",
    "fault_tolerance/",
    "env_runner_group/",
)
EXAMPLES = "training_iteration, time_total_s, env_runners/success_rate, env_runners/episode_return_mean"


def known_stop_keys() -> frozenset:
    return frozenset(TUNE_KEYS) | frozenset(RESULT_KEYS)


# counters that start at 0 and only grow: a stop value below 1 is met by the first result
COUNTERS = (
    "training_iteration",
    "time_total_s",
    "timesteps_total",
    "episodes_total",
    "num_env_steps_sampled_lifetime",
    "num_episodes_lifetime",
)


def check_stop_criteria(stop: Dict[str, Any], where: str, overridden: Iterable[str] = ()) -> None:
    """Raise :class:`UsageError` for a stop key no R3L result has, or a value that is not a number."""
    overridden = set(overridden)
    for key, value in (stop or {}).items():
        src = f"--stop {key}=..." if key in overridden else f"{where}.stop.{key}" if where else f"stop[{key!r}]"
        if isinstance(value, dict):
            inner = next(iter(value), "KEY")
            raise UsageError(
                f"{src}: nested stop criteria are not read; write the flattened key, e.g. "
                f"{key}/{inner}: {value.get(inner, 'VALUE')!r}"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UsageError(
                f"{src}: a stop value must be a number (the trial stops when the metric reaches it), got {value!r}"
            )
        if not math.isfinite(value):  # .inf would pass and the trial never stop on it
            raise UsageError(f"{src}: a stop value must be a finite number, got {value!r}")
        if isinstance(key, str) and key.endswith("_rate") and value > 1:  # rates are in [0, 1]: never reached
            raise UsageError(
                f"{src}: {key!r} is a rate between 0 and 1, so {value!r} is never reached and the trial "
                "would never stop on it; give a value <= 1, e.g. 0.9"
            )
        if key in COUNTERS and value < 1:  # reached before the first result: one iteration, then "done"
            raise UsageError(
                f"{src}: must be >= 1 (a count that is reached from the start stops the trial after "
                f"one iteration), got {value!r}"
            )
        hint = unknown_metric_hint(key)
        if hint is not None:
            raise UsageError(
                f"{src}: {key!r} is not a metric of R3L's results{hint}, so the trial would never stop "
                f"on it; e.g. {EXAMPLES} (nested metrics are joined with '/')"
            )


def unknown_metric_hint(key: Any) -> Optional[str]:
    """None for a metric an R3L result may hold; else the "did you mean" hint ("" when none is close)."""
    known = known_stop_keys()
    if key in known:
        return None
    if isinstance(key, str) and key.startswith(OPEN_NAMESPACES):
        # run-dependent names: only a near-copy of a known name is taken for a typo
        typo = difflib.get_close_matches(key, known, n=1, cutoff=0.9)
        return f" (did you mean {typo[0]!r}?)" if typo else None
    return did_you_mean(key, known) if isinstance(key, str) else ""


def check_checkpoint_score(attribute: Any, src: str) -> None:
    """Raise :class:`UsageError` for a ``checkpoint_score_attribute`` no R3L result has: Tune then ranks
    no checkpoint by it and ``num_to_keep`` deletes the best one, without a word."""
    if attribute is None:
        return
    hint = unknown_metric_hint(attribute)
    if hint is not None:
        raise UsageError(
            f"{src}: {attribute!r} is not a metric of R3L's results{hint}, so checkpoints could not be "
            f"ranked by it (num_to_keep would delete the best); e.g. {EXAMPLES}"
        )


ENV_CALLBACK = "rllib_r3l.stopping.StopCriteriaCheck"


def install_env_callback(environ=None) -> None:
    """Name :class:`StopCriteriaCheck` in Tune's ``RAY_TUNE_CALLBACKS`` (kept beside any already named)."""
    import os

    environ = os.environ if environ is None else environ
    named = [c.strip() for c in environ.get("RAY_TUNE_CALLBACKS", "").split(",") if c.strip()]
    if ENV_CALLBACK not in named:
        environ["RAY_TUNE_CALLBACKS"] = ",".join(named + [ENV_CALLBACK])


def _is_r3l(trial) -> bool:
    try:  # R3L as Tune registered it: config.py's checks import this module, so it imports no algorithm
        from ray.tune.registry import get_trainable_cls

        cls = trial.get_trainable_cls()
        return isinstance(cls, type) and issubclass(cls, get_trainable_cls("R3L"))
    except Exception:  # an unregistered trainable is Tune's error to report, not ours
        return False


try:
    from ray.tune import Callback as _TuneCallback
except ImportError:  # Ray not installed: the pure modules import this file without it
    _TuneCallback = object


def check_search_metric(metric: Any, src: str) -> None:
    """Raise :class:`UsageError` for a scheduler's or search algorithm's ``metric`` no R3L result has: Tune
    raises its own error on the first result (after a whole iteration), as a traceback."""
    if not isinstance(metric, str) or metric == TUNE_DEFAULT_METRIC:
        return
    hint = unknown_metric_hint(metric)
    if hint is not None:
        raise UsageError(
            f"{src}: {metric!r} is not a metric of R3L's results{hint}, so Tune would stop the run at "
            f"the first result; e.g. {EXAMPLES} (nested metrics are joined with '/')"
        )


def controller_metrics() -> list:
    """``[(where, metric)]``: the metrics the running Tune experiment schedules and searches by.

    Tune hands its callbacks neither the scheduler nor the search algorithm; the controller that calls
    ``Callback.setup`` is found on the call stack and read through its public ``scheduler_alg`` and
    ``search_alg``. This is the one place R3L relies on how Tune calls its callbacks; a test
    (tests/test_algorithm.py) fails when a Ray version moves it, rather than users losing the check."""
    from rllib_r3l import ray_internals

    owner = ray_internals.calling_tune_controller()
    if owner is None:
        return []
    found = []
    scheduler, search = owner.scheduler_alg, owner.search_alg
    name = type(scheduler).__name__
    # FIFOScheduler takes no metric of its own: it holds TuneConfig's / tune.run's
    where = (
        "tune.TuneConfig(metric=...) / tune.run(metric=...)"
        if name == "FIFOScheduler"
        else f"{name}(metric=...) (or tune.TuneConfig(metric=...) / tune.run(metric=...))"
    )
    found.append((where, getattr(scheduler, "metric", None)))
    searcher = getattr(search, "searcher", search)
    metrics = getattr(searcher, "metric", None)
    for m in [metrics] if isinstance(metrics, str) else list(metrics or []):
        found.append((f"{type(searcher).__name__}(metric=...)", m))
    return found


class StopCriteriaCheck(_TuneCallback):
    """Tune callback: an R3L trial whose ``stop``, ``checkpoint_score_attribute``, scheduler metric or search
    metric names a metric R3L never reports is refused, when Tune first lists the trial (before its actor
    loads a model) or at the latest when it starts."""

    def __init__(self):
        self._checked = set()
        self._search_metrics: list = []

    def setup(self, **info):
        self._search_metrics = controller_metrics()

    def _check(self, trial) -> None:
        if trial.trial_id in self._checked:
            return
        self._checked.add(trial.trial_id)
        if not _is_r3l(trial):
            return
        try:
            check_stop_criteria(dict(trial.stopping_criterion or {}), where="")
            manager = getattr(getattr(trial, "run_metadata", None), "checkpoint_manager", None)
            score = getattr(getattr(manager, "checkpoint_config", None), "checkpoint_score_attribute", None)
            check_checkpoint_score(score, "CheckpointConfig.checkpoint_score_attribute")
            for where, metric in self._search_metrics:
                check_search_metric(metric, where)
        except UsageError as e:
            raise ValueError(f"{trial}: {e}") from None

    def on_step_begin(self, iteration, trials, **info):
        for trial in trials:
            self._check(trial)

    def on_trial_start(self, iteration, trials, trial, **info):
        self._check(trial)
