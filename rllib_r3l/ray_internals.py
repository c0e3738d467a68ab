"""Every private name of Ray (Tune, Train, RLlib, core) that R3L relies on, in one place (issue 48, item 1).

Each has no public equivalent in the Ray version below (the reason is listed beside each in
tests/test_private_names.py). A Ray upgrade may move any of them without notice; the readers of Tune's
saved state used to catch every exception and return nothing, which would have switched resume features
off silently. So every function here first checks the installed Ray against the version it was written
for and raises :class:`RayInternalsError`, which names both and the fix, on any other.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from rllib_r3l.errors import UsageError

WRITTEN_FOR = "2.60"  # Ray's major.minor these readers were written against (pyproject pins ray<2.61)


class RayInternalsError(UsageError):
    """The installed Ray is not the one R3L's use of Ray's private state was written for (the CLI prints it
    as one line, exit 2, like any other setup mistake)."""


def check_version(version: Optional[str] = None) -> None:
    """Raise :class:`RayInternalsError` unless ``version`` (default: the installed Ray's) is ``WRITTEN_FOR``."""
    if version is None:
        import ray

        version = ray.__version__
    if not (version == WRITTEN_FOR or version.startswith(WRITTEN_FOR + ".")):
        raise RayInternalsError(
            f"rllib-r3l reads Ray's private state (Tune's saved experiment state, RLlib's actor managers) as Ray "
            f"{WRITTEN_FOR}.x writes it; this is Ray {version}: install ray[rllib]=={WRITTEN_FOR}.* (what "
            "pyproject.toml pins), or port rllib_r3l/ray_internals.py to it"
        )


# ---------------------------------------------------------------------------------------------------
# Tune's saved experiment state (cli/resume_from.py: which checkpoint a resumed trial continues from)
# ---------------------------------------------------------------------------------------------------
def load_trial_state(trial_json: str) -> Dict[str, Any]:
    """A trial's entry of ``experiment_state-*.json``, decoded as Tune decodes it."""
    check_version()
    from ray.tune.utils.serialization import _loads_with_cloudpickle

    return _loads_with_cloudpickle(trial_json)


def dump_trial_state(trial: Dict[str, Any]) -> str:
    check_version()
    import json

    from ray.tune.utils.serialization import TuneFunctionEncoder

    return json.dumps(trial, indent=2, cls=TuneFunctionEncoder)


def load_run_metadata(meta_json: str) -> Any:
    """A trial's run metadata (its checkpoint manager among it) from Tune's saved state."""
    check_version()
    from ray.tune.trainable.metadata import _TrainingRunMetadata

    return _TrainingRunMetadata.from_json_state(meta_json)


def checkpoint_results(metadata: Any) -> List[Any]:
    """The checkpoint results a trial's checkpoint manager holds, oldest first ([] without a manager)."""
    check_version()
    cm = metadata.checkpoint_manager
    return list(cm._checkpoint_results or []) if cm is not None else []


def training_result(checkpoint_path: str, metrics: Dict[str, Any]) -> Any:
    """A checkpoint result as Tune records one (a checkpoint and the row it was saved with)."""
    check_version()
    from ray.train import Checkpoint
    from ray.train._internal.session import _TrainingResult

    return _TrainingResult(checkpoint=Checkpoint(path=checkpoint_path), metrics=metrics)


def set_checkpoint_results(metadata: Any, results: List[Any], latest: Any) -> None:
    """Make ``results`` the trial's checkpoints and ``latest`` the one a restored trial starts from."""
    check_version()
    if metadata.checkpoint_manager is None:
        from ray.train._internal.checkpoint_manager import _CheckpointManager

        metadata.checkpoint_manager = _CheckpointManager(checkpoint_config=None)
    metadata.checkpoint_manager._checkpoint_results = list(results)
    metadata.checkpoint_manager._latest_checkpoint_result = latest
    metadata.invalidate_cache()


def ray_temp_dir() -> str:
    """Ray's temp folder, where Tune stages a trial's rows before the driver syncs them to storage."""
    check_version()
    from ray._common.utils import get_default_ray_temp_dir

    return get_default_ray_temp_dir()


def set_experiment_stopper(experiment: Any, stopper: Any) -> None:
    """Where ``tune.Experiment`` keeps ``time_budget_s``'s stopper (no public setter; a ``CombinedStopper``
    passed as ``stop=`` would leave ``trial.stopping_criterion`` empty, which the console reads)."""
    check_version()
    experiment._stopper = stopper


def trial_storage(trainable: Any) -> Any:
    """A class trainable's StorageContext (``tune.get_context().get_trial_dir()`` is None there)."""
    check_version()
    return getattr(trainable, "_storage", None)


def calling_tune_controller() -> Any:
    """The Tune controller whose ``Callback.setup`` call is on the call stack (None outside one): Tune hands
    its callbacks neither the scheduler nor the search algorithm, which the controller holds publicly."""
    check_version()
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and hasattr(type(owner), "scheduler_alg") and hasattr(type(owner), "search_alg"):
            return owner
        frame = frame.f_back
    return None


def gcs_client() -> Any:
    """This process's GCS client, None without a connected Ray session."""
    check_version()
    import ray._private.worker as ray_worker

    return ray_worker.global_worker.gcs_client if ray_worker.global_worker.connected else None


# ---------------------------------------------------------------------------------------------------
# RLlib (runner health and restarts, the weight transfer, fault injection, config keys)
# ---------------------------------------------------------------------------------------------------
def actor_ids(group: Any) -> List[int]:
    """The actor ids of an EnvRunnerGroup's or a LearnerGroup's remote actors."""
    check_version()
    return list(group._worker_manager.actor_ids())


def actor(group: Any, actor_id: int) -> Any:
    """The actor handle of one remote env runner (None when it is gone)."""
    check_version()
    return group._worker_manager._actors.get(actor_id)


def mark_unhealthy(group: Any, actor_id: int) -> None:
    check_version()
    group._worker_manager.set_actor_state(actor_id, healthy=False)


def local_learner(learner_group: Any) -> Any:
    """The learner of a local LearnerGroup (the default layout)."""
    check_version()
    return learner_group._learner


def algorithm_counters(algo: Any) -> Dict[str, Any]:
    """The Algorithm's counters (restored runners are counted as RLlib counts them)."""
    check_version()
    return algo._counters


def asked_for_component(algo: Any, key: str, components: Any, not_components: Any) -> bool:
    """Whether a ``get_state(components=..., not_components=...)`` call asks for the state under ``key``."""
    check_version()
    return algo._check_component(key, components, not_components)


def learner_params(learner: Any) -> Dict[Any, Any]:
    """A Learner's parameters by id."""
    check_version()
    return learner._params


def translate_config_key(key: str) -> str:
    """The AlgorithmConfig attribute an ``update_from_dict`` key names (RLlib's own aliases)."""
    check_version()
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    return AlgorithmConfig._translate_special_keys(key, warn_deprecated=False)


def deprecated_value() -> Any:
    """RLlib's marker for a retired config field."""
    check_version()
    from ray._common.deprecation import DEPRECATED_VALUE

    return DEPRECATED_VALUE
