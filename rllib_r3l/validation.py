"""Checks of ``R3LConfig`` that read tables rather than one field at a time (``R3LConfig.validate_r3l``
calls them): numeric ranges (``rllib_r3l.options.RANGES``), RLlib options R3L does not read
(``not_options.UNUSED_RLLIB``), configs that run but can never learn, and the scale-out options.

Every error is ``ValueError("R3LConfig.<field>: <what is wrong and the fix>")``; no message suggests a
value that is itself invalid.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

from rllib_r3l.not_options import UNUSED_RLLIB
from rllib_r3l.options import R3L_OPTIONS, RANGES

# switches whose default is None (resolved from another option) but whose value is a bool
_OPTIONAL_BOOLS = ("reflection_structured",)


def _err(field: str, msg: str) -> None:
    raise ValueError(f"R3LConfig.{field}: {msg}")


def check_ranges(cfg: Any) -> None:
    """Every numeric option inside its range (``options.RANGES``); NaN and inf never are."""
    for name, rng in RANGES.items():
        value = getattr(cfg, name, None)
        if name == "num_cpus_per_learner" and value == "auto":  # RLlib's default
            continue
        if name == "lr" and isinstance(value, (list, tuple)):
            _check_lr_schedule(value)
            continue
        if name == "evaluation_duration" and getattr(cfg, "evaluation_duration_unit", "episodes") != "episodes":
            _err(
                "evaluation_duration_unit",
                f"R3L.evaluate() runs whole episodes: must be 'episodes', got {cfg.evaluation_duration_unit!r}",
            )
        if not rng.contains(value):
            finite = "" if not isinstance(value, float) or math.isfinite(value) else " (finite)"
            _err(name, f"must be {rng.describe()}{finite}, got {value!r}")


def check_switches(cfg: Any) -> None:
    """Every on/off option is a bool: ``reflect="false"`` is a non-empty string, which Python reads as true
    (a Python-door run trained with reflection; the CLI and YAML parse true/false themselves)."""
    for name, (default, _) in R3L_OPTIONS.items():
        if not isinstance(default, bool) and name not in _OPTIONAL_BOOLS:
            continue
        value = getattr(cfg, name, default)
        if value is None and name in _OPTIONAL_BOOLS:
            continue
        if not isinstance(value, bool) and type(value).__name__ != "bool_":  # numpy's bool passes
            allowed = "True, False or None" if name in _OPTIONAL_BOOLS else "True or False"
            why = f" (the string {value!r} would read as true)" if isinstance(value, str) and value else ""
            _err(name, f"must be {allowed}, got {value!r}{why}")


def check_not_strings(cfg: Any) -> None:
    """Numbers given as strings, before RLlib's own checks (which call a string ``lr`` a bad schedule):
    YAML reads ``1e-6`` without a dot as the string '1e-6'."""
    for name in RANGES:
        value = getattr(cfg, name, None)
        if isinstance(value, str) and not (name == "num_cpus_per_learner" and value == "auto"):
            hint = " (YAML reads 1e-6 without a dot as a string: write 1.0e-6)" if "e" in value.lower() else ""
            _err(name, f"must be a number, got the string {value!r}{hint}")


def _check_lr_schedule(schedule) -> None:
    """An lr schedule ``[[timestep, lr], ...]`` (RLlib checks its shape): every lr must be > 0."""
    rng = RANGES["lr"]
    steps = []
    for entry in schedule:
        lr = entry[1] if isinstance(entry, (list, tuple)) and len(entry) == 2 else entry
        if not rng.contains(lr):
            _err(
                "lr",
                f"every learning rate of a schedule [[timestep, lr], ...] must be {rng.describe()}, "
                f"got {lr!r} in {list(schedule)!r}",
            )
        if isinstance(entry, (list, tuple)) and len(entry) == 2:
            steps.append(entry[0])
    # else timesteps out of order reach RLlib's bare `assert idxes == sorted(idxes)` in the trial
    # a whole float (1e6, as in RLlib's own example) is a timestep too
    bad = [
        t
        for t in steps
        if isinstance(t, bool)
        or not isinstance(t, (int, float))
        or t < 0
        or (isinstance(t, float) and not t.is_integer())
    ]
    if bad or steps != sorted(steps):
        what = f"{bad[0]!r} is not a whole number >= 0" if bad else "they are not in increasing order"
        _err(
            "lr",
            f"the timesteps of a schedule [[timestep, lr], ...] must be whole numbers >= 0 in increasing "
            f"order (env steps sampled), starting at 0; {what} in {list(schedule)!r}",
        )


def minus_one_advice(field: str) -> str:
    """What to use instead of -1 (which RLlib's get_state drops): a neighbour inside the field's range,
    or no value at all when none is known to be valid (the -1.001 once offered for grad_clip was
    gradient ascent)."""
    rng = RANGES.get(field)
    if rng is None:
        return "use another value"
    candidates = (-2, 0) if rng.integer else (-1.001, -0.999)
    valid = [c for c in candidates if rng.contains(c)]
    return f"use another value (e.g. {valid[0]})" if valid else f"use a value that is {rng.describe()}"


def unused_rllib_option(name: str, value: Any, default: Any) -> Optional[str]:
    """The error text for an RLlib option R3L does not read, set away from its ``default`` (else None)."""
    if name not in UNUSED_RLLIB or value == default:
        return None
    return f"R3L does not use RLlib's {name} (got {value!r}): {UNUSED_RLLIB[name]}; remove it"


def stored(attrs: Dict[str, Any], name: str) -> Any:
    """An option as stored in ``vars(config)``: a property (train_batch_size_per_learner) by the
    attribute behind it (``_<name>``), not by what it derives from other options."""
    return attrs[name] if name in attrs else attrs.get(f"_{name}")


def check_unused_rllib(cfg: Any, defaults: Dict[str, Any]) -> None:
    """``defaults``: ``vars()`` of a fresh config."""
    for name in UNUSED_RLLIB:
        msg = unused_rllib_option(name, stored(vars(cfg), name), stored(defaults, name))
        if msg:
            _err(name, msg)


def check_learning_signal(cfg: Any) -> None:
    """Configs that run to the end and can never update the policy, refused before anything starts."""
    if cfg.temperature == 0:
        _err(
            "temperature",
            "0 (greedy) samples the same episode for every base rollout of a task group, so "
            "their rewards are equal and their group-relative advantages (reward - group mean) 0: nothing "
            "to learn from; use a temperature > 0 for training (paper: 1.0; evaluation_temperature may be 0)",
        )
    env_config = cfg.env_config if isinstance(cfg.env_config, dict) else {}
    if "max_turns" in env_config:
        v = env_config["max_turns"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            _err(
                "env_config",
                f"max_turns must be an integer >= 1 (an episode of 0 turns ends before the "
                f"policy acts: nothing to learn from), got {v!r}; leave it out for the environment's default",
            )


_LORA_KEYS = {"r", "alpha", "target_modules", "dropout"}
_DEEPSPEED_KEYS = {"stage", "offload_optimizer", "offload_param", "config"}


def validate_scaling(cfg: Any, err) -> None:
    """Scale-out options: engine sleep, LoRA, DeepSpeed, replay on/off (docs/scaling.md; the replay numbers
    are in options.RANGES)."""
    for f in ("colocate_engine_sleep", "replay_buffer"):
        if not isinstance(getattr(cfg, f), bool):
            err(f, f"must be True or False, got {getattr(cfg, f)!r}")
    if cfg.lora is not None:
        _validate_lora(cfg.lora, err)
    if cfg.deepspeed is not None:
        if not isinstance(cfg.deepspeed, dict):
            err("deepspeed", f"must be None or a dict like {{'stage': 2}}, got {cfg.deepspeed!r}")
        unknown = set(cfg.deepspeed) - _DEEPSPEED_KEYS
        if unknown:
            err("deepspeed", f"unknown keys {sorted(unknown)}; allowed: {sorted(_DEEPSPEED_KEYS)}")
        if cfg.deepspeed.get("stage", 2) not in (0, 1, 2, 3):
            err("deepspeed", f"'stage' must be 0, 1, 2 or 3, got {cfg.deepspeed.get('stage')!r}")
        if not isinstance(cfg.deepspeed.get("config", {}), dict):
            err("deepspeed", "'config' must be a dict of extra DeepSpeed settings")
        if cfg.lora is not None:
            err("deepspeed", "DeepSpeed together with lora is not supported; use one of them")


def check_policy_lag(cfg: Any, err) -> None:
    """``max_policy_lag`` >= 1 queues sample requests on remote env runners while the learner trains
    (runner/lagged.py): it needs remote runners, RLlib's in-flight limit, and nothing that stops the
    engines during the update."""
    k = cfg.max_policy_lag
    if not k or getattr(cfg, "in_evaluation", False):  # RLlib's evaluation copy has no runners of its own
        return
    if cfg.num_env_runners < 1:
        err(
            "max_policy_lag",
            f"{k} needs remote env runners (the driver's own runner cannot sample while the learner trains): set "
            ".env_runners(num_env_runners=1) or max_policy_lag=0",
        )
    if k > cfg.max_requests_in_flight_per_env_runner:
        err(
            "max_policy_lag",
            f"{k} queues up to {k} sample requests per env runner, but RLlib's max_requests_in_flight_per_env_runner "
            f"is {cfg.max_requests_in_flight_per_env_runner}: set .env_runners(max_requests_in_flight_per_env_runner="
            f"{k}) or a smaller max_policy_lag",
        )
    if cfg.weight_sync_interval > 1:
        err(
            "max_policy_lag",
            f"cannot be combined with weight_sync_interval={cfg.weight_sync_interval} (its replay already trains "
            "on older weights' groups): use one of them",
        )
    if cfg.colocate_engine_sleep:
        err(
            "max_policy_lag",
            "cannot be combined with colocate_engine_sleep=True (the engines would sleep while they sample): "
            "use one of them",
        )


def _validate_lora(lora: Any, err) -> None:
    if not isinstance(lora, dict):
        err(
            "lora",
            f"must be None or a dict like {{'r': 16, 'alpha': 32, 'target_modules': ['q_proj', 'v_proj']}}, got "
            f"{lora!r}",
        )
    unknown = set(lora) - _LORA_KEYS
    if unknown:
        err("lora", f"unknown keys {sorted(unknown)}; allowed: {sorted(_LORA_KEYS)}")
    r = lora.get("r", 16)
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        err("lora", f"'r' must be an integer >= 1, got {r!r}")
    alpha = lora.get("alpha", 2 * r)
    if not isinstance(alpha, (int, float)) or alpha <= 0:
        err("lora", f"'alpha' must be a number > 0, got {alpha!r}")
    tm = lora.get("target_modules", "all-linear")
    if not (tm == "all-linear" or (isinstance(tm, (list, tuple)) and tm and all(isinstance(m, str) for m in tm))):
        err("lora", f"'target_modules' must be 'all-linear' or a non-empty list of module names, got {tm!r}")
    d = lora.get("dropout", 0.0)
    if not isinstance(d, (int, float)) or not (0 <= d < 1):
        err("lora", f"'dropout' must be in [0, 1), got {d!r}")


def check_callbacks(cfg: Any) -> None:
    """RLlib accepts any callable as ``callbacks_class`` and calls it with no arguments in every worker: a
    function that needs arguments (``callbacks: os.system``) fails in the trial with a
    ``TypeError`` that names no option."""
    import inspect

    value = getattr(cfg, "callbacks_class", None)
    for item in value if isinstance(value, (list, tuple)) else [value]:
        if item is None or isinstance(item, type) or not callable(item):
            continue  # classes: RLlib's own check; strings are resolved by RLlib
        try:
            inspect.signature(item).bind()
        except TypeError as e:
            name = getattr(item, "__qualname__", repr(item))
            _err(
                "callbacks",
                f"{getattr(item, '__module__', '')}.{name} cannot be called without arguments "
                f"({e}), as RLlib calls it in every worker; give an RLlibCallback subclass (callbacks: "
                "my_module.MyCallbacks)",
            )
        except ValueError:  # no signature to read (some builtins): RLlib's call will tell
            continue


def check_stack(cfg: Any) -> None:
    """What R3L runs on, checked before RLlib's own validate (each is a traceback later otherwise): the new
    API stack, one policy, and an ``env_config`` that is a mapping."""
    if not getattr(cfg, "enable_rl_module_and_learner", True) or not getattr(
        cfg, "enable_env_runner_and_connector_v2", True
    ):
        _err(
            "api_stack",
            "R3L runs on RLlib's new API stack only (RLModule, Learner, EnvRunner): remove "
            "api_stack(enable_rl_module_and_learner=False, ...)",
        )
    if getattr(cfg, "is_multi_agent", False):
        _err(
            "multi_agent", "R3L trains one policy (the LLM) on single-agent text environments: remove multi_agent(...)"
        )
    env_config = getattr(cfg, "env_config", None)
    if env_config is not None and not isinstance(env_config, dict):
        _err(
            "env_config", f"must be a mapping of the environment's options, e.g. {{'num_rooms': 3}}, got {env_config!r}"
        )


def unknown_key_hint(key: str) -> Optional[str]:
    """Where what an unknown key asks for lives (a run's length, a stop metric, greedy decoding), or None."""
    from rllib_r3l.not_options import CONCEPT_HINTS, RUN_LENGTH_HINT, RUN_LENGTH_WORDS
    from rllib_r3l.stopping import known_stop_keys

    if key in RUN_LENGTH_WORDS or key in known_stop_keys():
        return RUN_LENGTH_HINT
    return CONCEPT_HINTS.get(key)


# options that act only on retries, and the value that leaves them off
RETRY_OPTIONS = {
    "retry_control": False,
    "pivot_action": "any",
    "pivot_backoff": 0,
    "pivot_selector": "reflection",
    "pivot_temperature": None,
}


def check_retry_options(cfg: Any) -> None:
    """A retry option set while ``reflect=False`` (no reflection, no retry) would change nothing without a word."""
    if cfg.reflect:
        return
    for name, off in RETRY_OPTIONS.items():
        if getattr(cfg, name, off) != off:
            _err(
                name,
                f"{getattr(cfg, name)!r} acts on retries, and reflect=False runs none (GRPO-style "
                f"exploration); drop it (back to {off!r}) or set reflect=True",
            )
