"""Experiment files: apply ``--set``/``--stop`` overrides and validate every config (the file is read by
:mod:`rllib_r3l.cli.experiment_file`).

An experiments file is ``{name: {run: R3L, stop: {...}, config: {...}}}`` (the same files
``tune.run_experiments(yaml.safe_load(f))`` runs after ``import rllib_r3l``). Everything here is
checked without starting Ray or loading a model, and every mistake is a :class:`UsageError` that
names the key (``FILE: EXPERIMENT.config.KEY`` or ``--set KEY=...``) and the fix. The checks that
need the machine (the environment can be built, the model can be found) are in
``rllib_r3l.preflight``; stop criteria in ``rllib_r3l.cli.stopping``.
"""

from __future__ import annotations

import copy
import itertools
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from rllib_r3l.cli.experiment_file import SPEC_KEYS, DuplicateKeyError, _parse_value_strict, load_yaml_file, parse_value  # noqa: F401 - reading the file; re-exported for the CLI
from rllib_r3l.errors import UsageError, did_you_mean
from rllib_r3l.stopping import check_stop_criteria, known_stop_keys

# env_config values that are file paths: made absolute before Tune changes directories.
PATH_KEYS = ("data_files", "data_path", "webshop_path")
MAX_VALIDATED_VARIANTS = 256


# ==================================================================================================
# Overrides
# ==================================================================================================
def parse_assignment(text: str, flag: str) -> Tuple[str, Any]:
    if "=" not in text:
        raise UsageError(
            f"{flag} {text!r}: expected KEY=VALUE, e.g. {flag} "
            f"{'training_iteration=10' if flag == '--stop' else 'group_size=4'}"
        )
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise UsageError(f"{flag} {text!r}: the key before '=' is empty")
    try:
        return key, _parse_value_strict(raw)
    except DuplicateKeyError as e:
        raise UsageError(f"{flag} {text!r}: duplicate key {e.key!r} in the value; write each key once") from None


def apply_set(config: Dict[str, Any], dotted: str, value: Any) -> None:
    """``config[a][b] = value`` for ``dotted = "a.b"`` (intermediate mappings are created)."""
    parts = dotted.split(".")
    node = config
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise UsageError(
                f"--set {dotted}=...: {'.'.join(parts[: i + 1])} is {child!r}, not a mapping, so it "
                f"has no key {parts[i + 1]!r}; set the whole value instead, e.g. --set "
                f"{'.'.join(parts[: i + 1])}={{{parts[i + 1]}: ...}}"
            )
        node = child
    node[parts[-1]] = value


def apply_overrides(spec: Dict[str, Any], sets: Sequence[Tuple[str, Any]], stops: Sequence[Tuple[str, Any]]) -> None:
    for key, value in sets:
        apply_set(spec["config"], key, copy.deepcopy(value))
    if stops:
        stop = spec.get("stop") or {}
        for key, value in stops:
            stop[key] = value
        spec["stop"] = stop


# ==================================================================================================
# Validation (before Ray starts)
# ==================================================================================================
_DEFAULTS: Dict[str, Any] = {}


def known_config_keys() -> frozenset:
    """Every key a config may hold: R3L options, ``model`` and RLlib's AlgorithmConfig fields."""
    from rllib_r3l.config import R3L_OPTIONS, R3LConfig, config_keys

    if not _DEFAULTS:
        cfg = R3LConfig()
        _DEFAULTS.update({k: getattr(cfg, k) for k in R3L_OPTIONS})
        _DEFAULTS["lr"] = cfg.lr
    return config_keys() - {"model_config"}  # a read-only property; the YAML key is _model_config


def _check_keys(config: Dict[str, Any], where: str, overridden: set) -> None:
    from rllib_r3l.config import R3L_OPTIONS, fresh_defaults
    from rllib_r3l.not_options import CONCEPT_HINTS, REMOVED, RUN_LENGTH_WORDS, UNUSED_RLLIB
    from rllib_r3l.validation import stored, unused_rllib_option

    known = known_config_keys()
    for key in config:
        src = f"--set {key}=..." if key in overridden else f"{where}.config.{key}"
        if key in REMOVED:
            raise UsageError(f"{src}: {key!r} was removed; {REMOVED[key]}")
        if key == "model_config":
            raise UsageError(f"{src}: use `_model_config` (RLlib's model_config is read-only in config dicts)")
        unused = unused_rllib_option(key, config[key], stored(fresh_defaults(), key))
        if unused:
            raise UsageError(f"{src}: {unused}")
        if key not in known and key not in UNUSED_RLLIB:
            env_hint = _env_option_hint(config, key, src)
            if env_hint:
                raise UsageError(env_hint)
            if key in known_stop_keys() or key in RUN_LENGTH_WORDS:  # "how long" lives in stop:, not config:
                stop = key if key in known_stop_keys() else "training_iteration"
                shown = config[key] if key in known_stop_keys() and not isinstance(config[key], dict) else "N"
                flag = f"--stop {stop}={shown}" if src.startswith("--set") else f"stop: {{{stop}: {shown}}}"
                raise UsageError(
                    f"{src}: {key!r} is not a config key: when a run stops is a stop criterion: "
                    f"{flag} (in a file: under the experiment's stop:, beside config:)"
                )
            if key in CONCEPT_HINTS:
                raise UsageError(f"{src}: unknown config key {key!r}: {CONCEPT_HINTS[key]}")
            # the closest of all, but never an option R3L refuses (num_rooms -> 'num_epochs' misleads)
            public = [k for k in known if not k.startswith("_") and k not in UNUSED_RLLIB]
            hint = did_you_mean(key, list(R3L_OPTIONS) + ["model"] + public)
            raise UsageError(
                f"{src}: unknown config key {key!r}{hint}; "
                "`rllib-r3l options` lists the R3L options (RLlib's AlgorithmConfig names work too)"
            )
        value = config[key]
        if isinstance(value, dict) and "grid_search" in value:
            continue
        _check_type(key, value, src)


def _env_option_hint(config: Dict[str, Any], key: str, src: str) -> Optional[str]:
    """The message for a top-level key that is an option of the config's environment, else None."""
    from environments import registry
    from rllib_r3l.config import DEFAULT_ENV
    from rllib_r3l.preflight import env_options

    env_id = config.get("env", DEFAULT_ENV)
    try:
        allowed = env_options(registry.resolve(env_id)) if isinstance(env_id, str) else None
    except (ValueError, ImportError, AttributeError):  # a bad env id is _check_env's error
        return None
    if not allowed or key not in allowed:
        return None
    flag = "--set " if src.startswith("--set") else ""
    return (
        f"{src}: {key!r} is an option of the environment {env_id}, not of the algorithm: "
        f"{flag}env_config.{key}=... (in a file: under config.env_config)"
    )


def _check_type(key: str, value: Any, src: str) -> None:
    if key not in _DEFAULTS or value is None:
        return
    default = _DEFAULTS[key]
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise UsageError(f"{src}: {key} must be true or false, got {value!r}")
    elif isinstance(default, (int, float)):
        if isinstance(value, str):
            hint = (
                " (PyYAML reads 1e-6 as a string: write 1.0e-6)"
                if re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value)
                else ""
            )
            raise UsageError(f"{src}: {key} must be a number, got the string {value!r}{hint}")
        if isinstance(value, bool):
            raise UsageError(f"{src}: {key} must be a number, got {value!r}")
    elif isinstance(default, dict) and not isinstance(value, dict):
        raise UsageError(f"{src}: {key} must be a mapping, got {value!r}")


def _grid_paths(node: Any, prefix: Tuple[str, ...] = ()) -> List[Tuple[Tuple[str, ...], list]]:
    out = []
    if isinstance(node, dict):
        if set(node) == {"grid_search"}:
            return [(prefix, list(node["grid_search"]))]
        for k, v in node.items():
            out.extend(_grid_paths(v, prefix + (k,)))
    return out


def expand_variants(config: Dict[str, Any], where: str) -> List[Dict[str, Any]]:
    """The configs a ``grid_search`` expands to (every combination; the config itself if none)."""
    grids = _grid_paths(config)
    for path, values in grids:
        if not values:
            raise UsageError(f"{where}.config.{'.'.join(path)}: grid_search needs at least one value")
    combos = list(itertools.islice(itertools.product(*[v for _, v in grids]), MAX_VALIDATED_VARIANTS))
    variants = []
    for combo in combos:
        c = copy.deepcopy(config)
        for (path, _), value in zip(grids, combo):
            node = c
            for p in path[:-1]:
                node = node[p]
            node[path[-1]] = value
        variants.append(c)
    return variants


def _check_env(config: Dict[str, Any], where: str, overridden: set) -> None:
    from environments import registry
    from rllib_r3l.config import DEFAULT_ENV
    from rllib_r3l.preflight import bad_env_option, unknown_env_option

    env_id = config.get("env", DEFAULT_ENV)
    src = "--set env=..." if "env" in overridden else f"{where}.config.env"
    if not isinstance(env_id, str):
        raise UsageError(f"{src}: env must be an environment id such as 'r3l/CoinCollector', got {env_id!r}")
    try:
        factory = registry.resolve(env_id)
    except (ValueError, ImportError, AttributeError) as e:
        raise UsageError(f"{src}: {e}{did_you_mean(env_id, registry.registered())}") from None
    env_config = config.get("env_config") or {}
    esrc = "--set env_config" if "env_config" in overridden else f"{where}.config.env_config"
    if not isinstance(env_config, dict):
        raise UsageError(f"{esrc}: env_config must be a mapping, got {env_config!r}")
    for found in (unknown_env_option(env_id, factory, env_config), bad_env_option(env_id, factory, env_config)):
        if found:
            key, msg = found
            raise UsageError(f"{esrc}.{key}{'=...' if 'env_config' in overridden else ''}: {msg}")


def _absolutize_paths(config: Dict[str, Any]) -> None:
    env_config = config.get("env_config")
    if not isinstance(env_config, dict):
        return

    def fix(v):
        if isinstance(v, str) and v and "://" not in v:
            return os.path.abspath(os.path.expanduser(v))
        if isinstance(v, list):
            return [fix(x) for x in v]
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        return v

    for key in PATH_KEYS:
        if key in env_config and env_config[key] is not None:
            env_config[key] = fix(env_config[key])


def validate_config(config: Dict[str, Any], where: str = "config", overridden: Optional[set] = None):
    """Check a config dict as a trial would receive it; returns the first variant's ``R3LConfig``.

    Raises :class:`UsageError` naming the key and the fix. Loads no model and starts no Ray.
    """
    from rllib_r3l.config import R3LConfig

    overridden = overridden or set()
    if not isinstance(config, dict):
        raise UsageError(f"{where}: config must be a mapping, got {type(config).__name__}")
    _check_keys(config, where, overridden)
    first = None
    for variant in expand_variants(config, where):
        _check_keys(variant, where, overridden)
        _check_env(variant, where, overridden)
        try:
            cfg = R3LConfig().update_from_dict(copy.deepcopy(variant))
            cfg.validate()
        except (ValueError, TypeError, KeyError) as e:
            raise UsageError(_explain(str(e), where, overridden)) from None
        except Exception as e:  # RLlib raises its own error types for some checks
            raise UsageError(_explain(f"{type(e).__name__}: {e}", where, overridden)) from None
        if first is None:
            first = cfg
    return first


# a resumed run keeps its config: neither an edit of the file nor --set can fix what it lacks
RESUME_ADVICE = (
    "a resumed experiment runs with the config it started with: put back what it names, or start "
    "again with --new (a fresh run of the file from its base model at iteration 1, beside the old one, "
    "which stays as it is)"
)


def _explain(msg: str, where: str, overridden: set, resume: bool = False) -> str:
    m = re.match(r"R3LConfig\.(\w+): (.*)", msg, re.S)
    if m:
        field = "model" if m.group(1) == "model_id" else m.group(1)
        src = f"--set {field}=..." if field in overridden else f"{where}.config.{field}"
        advice = RESUME_ADVICE if resume else f"fix it in the file or override with --set {field}=VALUE"
        return f"{src}: {m.group(2)} ({advice})"
    return f"{where}.config: {msg}" + (f" ({RESUME_ADVICE})" if resume else "")


def check_resources(
    experiments: Dict[str, Dict[str, Any]], path: str, sets: Sequence[str] = (), resume: bool = False
) -> None:
    """What needs the machine, for every variant of every experiment: the environment can be built with
    its env_config and the model can be found (``rllib_r3l.preflight``); a :class:`UsageError` otherwise.
    ``rllib-r3l train`` runs this (``--dry-run`` too); :func:`prepare_experiments` does not."""
    from rllib_r3l.config import R3LConfig
    from rllib_r3l.preflight import check_config

    overridden = {parse_assignment(s, "--set")[0].split(".")[0] for s in sets}
    for name, spec in experiments.items():
        where = f"{path}: {name}"
        for variant in expand_variants(spec["config"], where):
            try:
                check_config(R3LConfig().update_from_dict(copy.deepcopy(variant)))
            except ValueError as e:
                raise UsageError(_explain(str(e), where, overridden, resume)) from None


def prepare_experiments(
    path: str, sets: Sequence[str] = (), stops: Sequence[str] = (), only: Sequence[str] = ()
) -> Dict[str, Dict[str, Any]]:
    """Load a file, apply overrides, validate every config; the specs ready for Tune."""
    experiments = load_yaml_file(path)
    if only:
        missing = [n for n in only if n not in experiments]
        if missing:
            raise UsageError(
                f"--experiment {missing[0]!r}: not in {path}"
                f"{did_you_mean(missing[0], experiments)}; it has {', '.join(experiments)}"
            )
        experiments = {n: experiments[n] for n in only}
    set_pairs = [parse_assignment(s, "--set") for s in sets]
    stop_pairs = [parse_assignment(s, "--stop") for s in stops]
    overridden = {k.split(".")[0] for k, _ in set_pairs}
    for name, spec in experiments.items():
        apply_overrides(spec, set_pairs, stop_pairs)
        _absolutize_paths(spec["config"])
        validate_config(spec["config"], where=f"{path}: {name}", overridden=overridden)
        check_stop_criteria(spec.get("stop") or {}, where=f"{path}: {name}", overridden={k for k, _ in stop_pairs})
    return experiments


def validate_env_only(env_id: str, env_config: Dict[str, Any]) -> None:
    try:
        _check_env({"env": env_id, "env_config": env_config}, "--env", set())
    except UsageError as e:
        msg = str(e).replace("--env.config.env_config", "--env-config").replace("--env.config.env", "--env")
        raise UsageError(msg) from None
