"""Checks that need the machine, done before anything expensive starts: can the environment be
built with its ``env_config``, and can the policy model be found?

Both run when the algorithm is built (``R3L.setup``, so every door: ``build_algo``, ``tune.run`` with
an ``R3LConfig`` or a dict, YAML files) and in ``rllib-r3l train`` (``--dry-run`` included) before
Ray starts. A failure is a ``ValueError("R3LConfig.<field>: <what is wrong and the fix>")``.

* Environment: the options are checked against the constructor's signature, then one environment
  is built and closed (or the class's cheap ``validate_config(**env_config)`` classmethod is called,
  where it has one). The constructor's own error is the message: a missing dataset, a misspelt
  ``data_files`` path, ``ALFWORLD_DATA`` not set. A successful check is remembered per process.
* First prompt: the runner's prompt for task seed 0 (policy tokenizer and chat template, no weights)
  plus ``max_response_tokens`` must fit ``max_context_tokens`` (else every episode overflows at turn 0).
* Model: ``rllib_r3l.model_check`` (a local folder whose files are whole, the built-in models, the
  hub cache, the hub once).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from rllib_r3l.errors import did_you_mean, one_line
from rllib_r3l.model_check import check_model, local_model_problem  # noqa: F401 - re-exported

# env_config keys the env runner consumes itself (not passed to the environment).
RUNNER_ENV_KEYS = ("eval_split", "step_delay_s")

_ENVS_OK: set = set()  # (env_id, env_config, split) already built successfully in this process


# --------------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------------
def env_options(factory: Callable[..., Any]) -> Optional[List[str]]:
    """The ``env_config`` keys ``factory`` accepts (plus the runner's own), or None if it takes ``**kwargs``."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return [p for p in params if p != "self"] + list(RUNNER_ENV_KEYS)


def unknown_env_option(
    env_id: str, factory: Callable[..., Any], env_config: Dict[str, Any]
) -> Optional[Tuple[str, str]]:
    """``(key, message)`` for the first key of ``env_config`` the environment does not take, or None."""
    allowed = env_options(factory)
    if allowed is None:
        return None
    for key in env_config:
        if key not in allowed:
            return key, (
                f"{env_id} has no option {key!r}{did_you_mean(key, allowed)}; its options: {', '.join(sorted(allowed))}"
            )
    return None


def bad_env_option(env_id: str, factory: Callable[..., Any], env_config: Dict[str, Any]) -> Optional[Tuple[str, str]]:
    """``(key, message)`` for the first ``env_config`` value outside the type or range the environment declares
    (its constructor's annotation, its ``option_bounds``), or None."""
    from environments.option_check import bad_option

    return bad_option(env_id, factory, env_config)


def accepts(factory: Callable[..., Any], kwarg: str) -> bool:
    try:
        return kwarg in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def env_kwargs(factory: Callable[..., Any], env_config: Dict[str, Any], split: Optional[str]) -> Dict[str, Any]:
    """The constructor arguments an env runner passes: ``env_config`` without the runner's keys, plus
    ``split`` where the environment takes one and ``env_config`` does not set it."""
    kwargs = {k: v for k, v in dict(env_config or {}).items() if k not in RUNNER_ENV_KEYS}
    if split and "split" not in kwargs and accepts(factory, "split"):
        kwargs["split"] = split
    return kwargs


def check_env(
    env_id: Any,
    env_config: Optional[Dict[str, Any]] = None,
    split: Optional[str] = None,
    on_env: Optional[Callable[[Any], None]] = None,
) -> None:
    """Raise ``ValueError("R3LConfig.env...: ...")`` unless ``env_id`` builds with ``env_config``;
    ``on_env(env)`` looks at the built environment before it is closed."""
    from environments import registry

    env_config = dict(env_config or {})
    if isinstance(env_id, str):
        try:
            factory = registry.resolve(env_id)
        except (ValueError, ImportError, AttributeError) as e:
            raise ValueError(f"R3LConfig.env: {e}{did_you_mean(env_id, registry.registered())}") from None
    elif callable(env_id):
        factory = env_id
    else:
        raise ValueError(f"R3LConfig.env: must be an environment id such as 'r3l/CoinCollector', got {env_id!r}")
    name = env_id if isinstance(env_id, str) else getattr(env_id, "__name__", repr(env_id))
    unknown = unknown_env_option(name, factory, env_config)
    if unknown:
        raise ValueError(f"R3LConfig.env_config: {unknown[1]}")
    bad = bad_env_option(name, factory, env_config)
    if bad:
        raise ValueError(f"R3LConfig.env_config: {bad[1]}; fix env_config.{bad[0]}")
    kwargs = env_kwargs(factory, env_config, split)
    key = (name, json.dumps(kwargs, sort_keys=True, default=repr))
    if key in _ENVS_OK and on_env is None:
        return
    try:
        _build(factory, kwargs, on_env)
    except Exception as e:  # noqa: BLE001 - the environment's own error is the message
        if (
            "split" in kwargs
            and "split" not in (env_config or {})
            and _builds(factory, env_kwargs(factory, env_config, None))
        ):
            # task_split='nope' is not env_config's fault: it holds no split
            raise ValueError(f"R3LConfig.task_split: {name} has no task split {split!r} ({one_line(e)})") from None
        raise ValueError(
            f"R3LConfig.env_config: {name} cannot be created with env_config={env_config!r}: {one_line(e)}"
        ) from None
    _ENVS_OK.add(key)


def _build(factory: Callable[..., Any], kwargs: Dict[str, Any], on_env: Optional[Callable[[Any], None]] = None) -> None:
    """Build the environment (or only validate its config, where the factory offers that) and close it;
    the environment's own exception (or ``on_env``'s) propagates. A failed close is not a failed build."""
    validate = getattr(factory, "validate_config", None)
    if callable(validate):
        validate(**kwargs)
        return
    env = factory(**kwargs)
    try:
        if on_env is not None:
            on_env(env)
    finally:  # closed even when on_env fails (a JVM environment would otherwise outlive the check)
        close = getattr(env, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001 - the check is whether it builds, not whether it closes
                pass


def _builds(factory: Callable[..., Any], kwargs: Dict[str, Any]) -> bool:
    """Whether the environment builds with ``kwargs`` (on an error path only: it may take a while)."""
    try:
        _build(factory, kwargs)
        return True
    except Exception:  # noqa: BLE001 - it does not: the caller's message stands
        return False


# The first prompt: below it plus one response, every episode overflows at turn 0 (nothing to train) ---------
_PROMPTS: Dict[tuple, Optional[int]] = {}  # (model, env, env_config, split, system_prompt) -> its tokens
_RESET_ERRORS: Dict[tuple, str] = {}  # the same keys -> the environment's failure at its first reset


def _tokenizer_source(model_id: str) -> Optional[str]:
    """Where the model's tokenizer is on this machine, building and downloading nothing; None: not here."""
    from rllib_r3l import models
    from rllib_r3l.build_cache import cache_root, is_complete

    if os.path.isdir(os.path.expanduser(model_id)):
        return os.path.expanduser(model_id)
    for alias, name in (
        (models.is_default_model, models._DEFAULT_DIRNAME),
        (models.is_tiny_model, models._TINY_DIRNAME),
        (models.is_gemma_model, models._GEMMA_DIRNAME),
    ):
        if alias(model_id):  # built into the cache once; not built yet: not here
            return str(cache_root() / name) if is_complete(cache_root() / name) else None
    return model_id  # a hub id: read from the local Hugging Face cache only


def first_prompt_tokens(config: Any, env: Any) -> Optional[int]:
    """Tokens of ``EpisodeRunner``'s first prompt (system message, first observation) for task seed 0 on ``env``;
    None when the tokenizer is not here or its template unusable (the runner says why). Raises
    ``EnvResetError`` when ``env`` fails at ``reset(seed=0)``, whether or not the tokenizer is here: a first
    dry run (before the model's first conversion) must refuse a broken environment as a later one does."""
    from rllib_r3l.models import load_tokenizer
    from rllib_r3l.runner.chat import ChatFormat
    from rllib_r3l.runner.env_pool import check_env_output
    from rllib_r3l.runner.rollout import EpisodeRunner, EpisodeSpec, RolloutOptions

    source = _tokenizer_source(config.model_id)
    try:
        chat = ChatFormat(load_tokenizer(source, local_files_only=True)) if source else None
    except Exception:  # noqa: BLE001 - not in the cache, no usable template: the model check and the run say more
        chat = None
    if chat is None:  # nothing to count the prompt with: the reset is still checked, as the runner does it
        try:
            check_env_output(*env.reset(seed=0))
        except Exception as e:  # noqa: BLE001 - the environment's own error is the message
            raise _reset_error(config, f"{type(e).__name__}: {e}") from None
        return None
    runner = EpisodeRunner(None, chat, lambda: env, RolloutOptions.from_config(config))
    rollout_log = logging.getLogger("rllib_r3l.runner.rollout")
    level = rollout_log.level
    rollout_log.setLevel(logging.ERROR)  # a failed reset is raised below, not logged with its traceback
    try:
        live = runner._start(EpisodeSpec(seed=0, group_id="preflight"))
    finally:
        rollout_log.setLevel(level)
    if live is not None and live.env is None and live.traj.info.get("error"):
        raise _reset_error(config, [line for line in str(live.traj.info["error"]).splitlines() if line.strip()][-1])
    return len(live.traj.context_ids()) if live is not None and live.env is not None else None


def _reset_error(config: Any, last_line: str) -> "EnvResetError":
    return EnvResetError(
        f"R3LConfig.env: {config.env} fails at reset(seed=0) ({last_line.strip()[:300]}), so every "
        "episode would be lost and nothing trained; fix the environment or its env_config"
    )


class EnvResetError(ValueError):
    """The environment builds but fails at its first reset: every episode of the run would be lost."""


def check_first_prompt(config: Any, tokens: Optional[int]) -> None:
    """``ValueError`` when the first prompt (``tokens``) plus ``max_response_tokens`` exceeds ``max_context_tokens``."""
    if tokens is not None and config.max_context_tokens < (need := tokens + config.max_response_tokens):
        raise ValueError(
            f"R3LConfig.max_context_tokens: {config.max_context_tokens} is below the first prompt of "
            f"{config.env} ({tokens} tokens: system prompt and first observation of task seed 0 in the "
            f"chat template of {config.model_id}) plus max_response_tokens ({config.max_response_tokens})"
            f" = {need}: every episode would overflow at turn 0 and nothing would be trained; set "
            f"max_context_tokens to {need} or more (that fits the first turn alone: every further turn "
            f"adds its response and observation; default 4096), or lower max_response_tokens"
        )


# --------------------------------------------------------------------------------------------------
# Resources: a request Ray can never grant waits forever without a word (no autoscaler here)
# --------------------------------------------------------------------------------------------------
def machine_gpus() -> int:
    """GPUs this machine has (what a local Ray runtime detects)."""
    try:
        import torch

        return int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001 - no torch or no driver: no GPU
        return 0


def _bundles(config: Any) -> List[Dict[str, float]]:
    """The resource bundles Tune reserves for one trial: the driver's (with a local learner's GPU) first."""
    # config.algo_class, not an import: the algorithm imports this module
    return [dict(b) for b in config.algo_class.default_resource_request(config).bundles]


def _gpu_option(config: Any) -> str:
    if (config.num_gpus_per_learner or 0) > 0:
        return "num_gpus_per_learner"
    return "num_gpus_per_env_runner"


def _cpu_option(config: Any) -> str:
    if (config.num_env_runners or 0) > 0:
        return "num_env_runners"
    return "num_learners" if (config.num_learners or 0) > 0 else "num_cpus_for_main_process"


def check_resources(
    config: Any,
    cpus: Optional[float] = None,
    gpus: Optional[float] = None,
    source: str = "this machine",
    count_driver: bool = True,
) -> None:
    """Raise ``ValueError("R3LConfig.<option>: ...")`` when the run asks for more GPUs or CPUs than there are.

    ``cpus``/``gpus``: what Ray has (None: the CPU check is skipped, GPUs are the machine's).
    ``count_driver``: Tune reserves a CPU for the trainable; ``build_algo()`` runs it in the driver."""
    bundles = _bundles(config)
    need_gpu = sum(b.get("GPU", 0.0) for b in bundles)
    have_gpu = machine_gpus() if gpus is None else gpus
    tp = (config.backend_options or {}).get("tensor_parallel_size", 1)
    if isinstance(tp, int) and tp > max(have_gpu, 1):  # vLLM splits the engine over tp GPUs: none on CPU
        raise ValueError(
            f"R3LConfig.backend_options: tensor_parallel_size={tp} splits the vLLM engine over {tp} "
            f"GPUs, {'this machine' if gpus is None else source} has {have_gpu:g}; drop it (1) on CPU"
        )
    device = (config.backend_options or {}).get("device")
    if isinstance(device, str) and device.startswith("cuda") and have_gpu == 0:  # else passes --dry-run
        raise ValueError(
            f"R3LConfig.backend_options: device={device!r} puts the generation engines on a GPU, "
            f"{'this machine' if gpus is None else source} has none; use 'cpu' or drop it (None)"
        )
    if need_gpu > have_gpu:
        option = _gpu_option(config)
        raise ValueError(
            f"R3LConfig.{option}: the run asks for {need_gpu:g} GPU(s) ({option}="
            f"{getattr(config, option)!r}), {'this machine' if gpus is None else source} has "
            f"{have_gpu:g}; set {option}=0 to train on CPU, "
            "or run on a machine with GPUs"
        )
    if cpus is None:
        return
    need_cpu = sum(b.get("CPU", 0.0) for b in (bundles if count_driver else bundles[1:]))
    if need_cpu > cpus:
        option = _cpu_option(config)
        raise ValueError(
            f"R3LConfig.{option}: the run needs {need_cpu:g} CPUs ({_cpu_split(config, count_driver)}), "
            f"{source} gives {cpus:g}; {_more_cpus(source, need_cpu)}, or lower {option}"
        )


def _more_cpus(source: str, need: float) -> str:
    """How to give the run more logical CPUs, for where the count came from (a flag, or a running cluster)."""
    if "Ray cluster" in source:  # the Python door (build_algo, tune.run) or --address: Ray was started by the user
        return (
            f"start Ray with {need:g} logical CPUs or more (ray.init(num_cpus={need:g}), or "
            f"`ray start --num-cpus {need:g}`; logical CPUs may exceed the cores)"
        )
    return f"use --num-cpus {need:g} or more"


def check_local_learner_gpu(config: Any) -> None:
    """A local learner (``num_learners=0``) runs in this process: a GPU it asks for must be one this process
    sees (RLlib would fail later with a raw ``local_gpu_idx`` assertion)."""
    if not config.num_learners and (config.num_gpus_per_learner or 0) > 0 and machine_gpus() == 0:
        raise ValueError(
            f"R3LConfig.num_gpus_per_learner: {config.num_gpus_per_learner!r} GPU(s) for the local "
            "learner (num_learners=0), which runs in this process, and this process sees no GPU; set "
            "num_gpus_per_learner=0 to train on CPU, or run on a machine with GPUs"
        )


def _cpu_split(config: Any, count_driver: bool) -> str:
    parts = [f"{config.num_cpus_for_main_process:g} for the trial's driver and local learner"] if count_driver else []
    if config.num_env_runners:
        parts.append(f"{config.num_cpus_per_env_runner:g} per env runner x {config.num_env_runners}")
    if config.num_learners:
        parts.append(f"{config.num_cpus_per_learner} per learner x {config.num_learners}")
    return ", ".join(parts) or "the driver"


def ray_capacity() -> Tuple[Optional[float], Optional[float]]:
    """``(CPUs, GPUs)`` of a running Ray cluster, ``(None, None)`` when Ray is not running."""
    try:
        import ray

        if not ray.is_initialized():
            return None, None
        total = ray.cluster_resources()
    except Exception:  # noqa: BLE001 - no Ray: the machine's GPUs only
        return None, None
    return float(total.get("CPU", 0.0)), float(total.get("GPU", 0.0))


# --------------------------------------------------------------------------------------------------
def check_config(config: Any) -> None:
    """The checks for an ``R3LConfig``: the environment with the training split, policy and reflector models,
    the first prompt against max_context_tokens, and, where Ray runs (``build_algo()``), its resources."""
    key = (
        config.model_id,
        repr(config.env),
        json.dumps(config.env_config, sort_keys=True, default=repr),
        config.task_split,
        config.system_prompt,
    )

    def measure(env: Any) -> None:  # on the environment check_env builds anyway
        try:
            _PROMPTS[key] = first_prompt_tokens(config, env)
        except EnvResetError as e:
            _PROMPTS[key], _RESET_ERRORS[key] = None, str(e)
        except Exception:  # noqa: BLE001 - a check that cannot run is no reason to refuse
            _PROMPTS[key] = None

    check_env(config.env, config.env_config, split=config.task_split, on_env=None if key in _PROMPTS else measure)
    if key in _RESET_ERRORS:
        raise ValueError(_RESET_ERRORS[key])
    eval_split = (config.env_config or {}).get("eval_split")
    if eval_split is not None and eval_split != config.task_split:  # R3L.evaluate()'s tasks: every episode lost
        try:
            check_env(config.env, config.env_config, split=eval_split)
        except ValueError as e:
            raise ValueError(
                f"R3LConfig.env_config: eval_split={eval_split!r} (the held-out tasks of R3L.evaluate()): "
                f"{str(e).split(': ', 1)[-1]}"
            ) from None
    check_model(config.model_id, "model_id")
    if config.reflector_model:  # reflector names a separate model
        check_model(config.reflector_model, "reflector")
    check_first_prompt(config, _PROMPTS.get(key))
    cpus, gpus = ray_capacity()
    if cpus is None:  # before Ray starts the cluster is unknown (--address): the CLI checks its own Ray
        return
    # in a Tune trial the bundles are already granted; for build_algo() the driver holds no CPU
    check_resources(config, cpus=cpus, gpus=gpus, source="the Ray cluster", count_driver=False)


def raise_if_no_environment(groups: List[Any], create_errors: int) -> None:
    """Raise ``RuntimeError`` with the environment's own message when every episode of an iteration was
    lost because no environment could be created: nothing would ever be trained."""
    lost = [t for g in groups for t in g.lost]
    if not lost or any(g.trajectories for g in groups) or create_errors < len(lost):
        return
    errors = [str(t.info.get("error", "")).strip() for t in lost]
    last = next((e.splitlines()[-1] for e in errors if e), "no error message")
    raise RuntimeError(
        f"every episode of this iteration ({len(lost)}) was lost because the environment could not "
        f"be created: {last}; fix env/env_config (docs/reliability.md)"
    )
