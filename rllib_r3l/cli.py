"""``rllib-r3l``: train, evaluate, export and report R3L experiments from the command line.

    rllib-r3l train tuned_examples/cpu/toy_corridor_tiny.yaml --stop training_iteration=1
    rllib-r3l evaluate ~/ray_results/toy-corridor-r3l/R3L_.../checkpoint_000000 --episodes 20
    rllib-r3l export CHECKPOINT --out exported/
    rllib-r3l report ~/ray_results/toy-corridor-r3l
    rllib-r3l options                  # every R3L option with its default and help

``train`` reads Tune-style YAML files (``{name: {run: R3L, stop: {...}, config: {...}}}``, the same
files ``tune.run_experiments(yaml.safe_load(f))`` runs after ``import rllib_r3l``), applies
``--set``/``--stop`` overrides, and checks every config by building an ``R3LConfig`` *before*
Ray starts. A mistake in a file or a flag is reported with the key and the fix, exit code 2,
without a traceback. See docs/cli.md.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import importlib.util
import inspect
import itertools
import json
import os
import re
import sys
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

# Keys of one experiment spec (Tune's ``Experiment`` arguments that make sense in a file).
SPEC_KEYS = ("run", "stop", "config", "num_samples", "storage_path", "checkpoint_config", "time_budget_s",
             "max_failures", "log_to_file", "sync_config")
# env_config values that are file paths: made absolute before Tune changes directories.
PATH_KEYS = ("data_files", "data_path", "webshop_path")
# env_config keys the env runner consumes itself (not passed to the environment).
RUNNER_ENV_KEYS = ("eval_split",)
MAX_VALIDATED_VARIANTS = 256


class UsageError(Exception):
    """A mistake in the command line or a config file: printed without a traceback, exit code 2."""


# ==================================================================================================
# YAML
# ==================================================================================================
def _yaml_loader():
    """``yaml.SafeLoader`` that also reads ``1e-6`` as a float (YAML 1.2; PyYAML reads it as a string)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )
    return Loader


def parse_value(text: str) -> Any:
    """A ``--set``/``--stop`` value as a YAML scalar or flow collection (``4``, ``true``, ``1e-6``,
    ``null``, ``[1, 2]``, ``{num_rooms: 3}``); text that is not valid YAML stays a string."""
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())
    except yaml.YAMLError:
        return text


def load_yaml_file(path: str) -> Dict[str, Dict[str, Any]]:
    """Read an experiments file: ``{name: {run: ..., stop: ..., config: ...}}``."""
    import yaml

    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file (give a YAML experiments file, e.g. tuned_examples/cpu/coin_collector.yaml)")
    try:
        with open(path) as f:
            data = yaml.load(f, Loader=_yaml_loader())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise UsageError(f"{path}:{where}: not valid YAML ({problem}); fix the syntax there") from None
    if not isinstance(data, dict) or not data:
        raise UsageError(f"{path}: expected a mapping of experiment names to {{run, stop, config}}, "
                         f"got {type(data).__name__}")
    data = {name: copy.deepcopy(spec) for name, spec in data.items()}  # YAML anchors share objects
    for name, spec in data.items():
        where = f"{path}: experiment {name!r}"
        if not isinstance(spec, dict):
            raise UsageError(f"{where}: expected a mapping with run/stop/config, got {type(spec).__name__}")
        if "env" in spec:  # Tune moves a spec-level env into the config; so do we
            spec.setdefault("config", {})["env"] = spec.pop("env")
        for key in spec:
            if key not in SPEC_KEYS:
                raise UsageError(f"{where}: unknown key {key!r}{_did_you_mean(key, SPEC_KEYS)}; "
                                 f"an experiment has {', '.join(SPEC_KEYS)} (R3L options go under 'config:')")
        if "run" not in spec:
            raise UsageError(f"{where}: missing 'run'; add `run: R3L`")
        if spec["run"] != "R3L":
            raise UsageError(f"{where}: run: {spec['run']!r} is not supported here; use `run: R3L`")
        spec.setdefault("config", {})
        if not isinstance(spec["config"], dict):
            raise UsageError(f"{where}: 'config' must be a mapping of option names to values")
        if spec.get("stop") is not None and not isinstance(spec["stop"], dict):
            raise UsageError(f"{where}: 'stop' must be a mapping like {{training_iteration: 100}}")
    return data


# ==================================================================================================
# Overrides
# ==================================================================================================
def parse_assignment(text: str, flag: str) -> Tuple[str, Any]:
    if "=" not in text:
        raise UsageError(f"{flag} {text!r}: expected KEY=VALUE, e.g. {flag} "
                         f"{'training_iteration=10' if flag == '--stop' else 'group_size=4'}")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise UsageError(f"{flag} {text!r}: the key before '=' is empty")
    return key, parse_value(raw)


def apply_set(config: Dict[str, Any], dotted: str, value: Any) -> None:
    """``config[a][b] = value`` for ``dotted = "a.b"`` (intermediate mappings are created)."""
    parts = dotted.split(".")
    node = config
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise UsageError(f"--set {dotted}=...: {'.'.join(parts[:i + 1])} is {child!r}, not a mapping, so it "
                             f"has no key {parts[i + 1]!r}; set the whole value instead, e.g. --set "
                             f"{'.'.join(parts[:i + 1])}={{{parts[i + 1]}: ...}}")
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
def _did_you_mean(word: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


_KNOWN_KEYS: Optional[set] = None
_DEFAULTS: Dict[str, Any] = {}


def known_config_keys() -> set:
    """Every key a config may hold: R3L options, ``model`` and RLlib's AlgorithmConfig fields."""
    global _KNOWN_KEYS
    if _KNOWN_KEYS is None:
        from rllib_r3l.config import R3L_OPTIONS, R3LConfig

        cfg = R3LConfig()
        keys = {k for k in vars(cfg) if k not in ("algo_class", "_is_frozen")}
        keys |= set(cfg.to_dict())
        keys |= set(R3L_OPTIONS) | {"model"}
        keys.discard("model_config")  # a read-only property; the YAML key is _model_config
        _DEFAULTS.update({k: getattr(cfg, k) for k in R3L_OPTIONS})
        _DEFAULTS["lr"] = cfg.lr
        _KNOWN_KEYS = keys
    return _KNOWN_KEYS


def _check_keys(config: Dict[str, Any], where: str, overridden: set) -> None:
    from rllib_r3l.config import R3L_OPTIONS

    known = known_config_keys()
    for key in config:
        src = f"--set {key}=..." if key in overridden else f"{where}.config.{key}"
        if key == "model_config":
            raise UsageError(f"{src}: use `_model_config` (RLlib's model_config is read-only in config dicts)")
        if key not in known:
            public = [k for k in known if not k.startswith("_")]
            hint = _did_you_mean(key, list(R3L_OPTIONS) + ["model"]) or _did_you_mean(key, public)
            raise UsageError(f"{src}: unknown config key {key!r}{hint}; "
                             "`rllib-r3l options` lists the R3L options (RLlib's AlgorithmConfig names work too)")
        value = config[key]
        if isinstance(value, dict) and "grid_search" in value:
            continue
        _check_type(key, value, src)


def _check_type(key: str, value: Any, src: str) -> None:
    if key not in _DEFAULTS or value is None:
        return
    default = _DEFAULTS[key]
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise UsageError(f"{src}: {key} must be true or false, got {value!r}")
    elif isinstance(default, (int, float)):
        if isinstance(value, str):
            hint = (" (PyYAML reads 1e-6 as a string: write 1.0e-6)"
                    if re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value) else "")
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
    import environments
    from environments import registry

    from rllib_r3l.config import DEFAULT_ENV

    env_id = config.get("env", DEFAULT_ENV)
    src = "--set env=..." if "env" in overridden else f"{where}.config.env"
    if not isinstance(env_id, str):
        raise UsageError(f"{src}: env must be an environment id such as 'r3l/CoinCollector', got {env_id!r}")
    try:
        factory = registry.resolve(env_id)
    except (ValueError, ImportError, AttributeError) as e:
        hint = _did_you_mean(env_id, environments.registered())
        raise UsageError(f"{src}: {e}{hint}") from None
    env_config = config.get("env_config") or {}
    esrc = "--set env_config" if "env_config" in overridden else f"{where}.config.env_config"
    if not isinstance(env_config, dict):
        raise UsageError(f"{esrc}: env_config must be a mapping, got {env_config!r}")
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    allowed = [p for p in params if p not in ("self",)] + list(RUNNER_ENV_KEYS)
    for key in env_config:
        if key not in allowed:
            raise UsageError(f"{esrc}.{key}{'=...' if 'env_config' in overridden else ''}: {env_id} has no option {key!r}{_did_you_mean(key, allowed)}; "
                             f"its options: {', '.join(sorted(allowed))}")


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


def _explain(msg: str, where: str, overridden: set) -> str:
    m = re.match(r"R3LConfig\.(\w+): (.*)", msg, re.S)
    if m:
        field = "model" if m.group(1) == "model_id" else m.group(1)
        src = f"--set {field}=..." if field in overridden else f"{where}.config.{field}"
        return f"{src}: {m.group(2)} (fix it in the file or override with --set {field}=VALUE)"
    return f"{where}.config: {msg}"


def prepare_experiments(path: str, sets: Sequence[str] = (), stops: Sequence[str] = (),
                        only: Sequence[str] = ()) -> Dict[str, Dict[str, Any]]:
    """Load a file, apply overrides, validate every config; the specs ready for Tune."""
    experiments = load_yaml_file(path)
    if only:
        missing = [n for n in only if n not in experiments]
        if missing:
            raise UsageError(f"--experiment {missing[0]!r}: not in {path}"
                             f"{_did_you_mean(missing[0], experiments)}; it has {', '.join(experiments)}")
        experiments = {n: experiments[n] for n in only}
    set_pairs = [parse_assignment(s, "--set") for s in sets]
    stop_pairs = [parse_assignment(s, "--stop") for s in stops]
    overridden = {k.split(".")[0] for k, _ in set_pairs}
    for name, spec in experiments.items():
        apply_overrides(spec, set_pairs, stop_pairs)
        _absolutize_paths(spec["config"])
        validate_config(spec["config"], where=f"{path}: {name}", overridden=overridden)
    return experiments


# ==================================================================================================
# train
# ==================================================================================================
def _require(module: str, flag: str, pip_name: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise UsageError(f"{flag} needs the '{pip_name}' package, which is not installed: `pip install {pip_name}` "
                         f"(or drop {flag})")


def make_callbacks(args) -> list:
    """Extra Tune logger callbacks (CSV, JSON and TensorBoard loggers are Tune's defaults)."""
    callbacks = []
    if args.wandb:
        _require("wandb", "--wandb", "wandb")
        from ray.air.integrations.wandb import WandbLoggerCallback

        callbacks.append(WandbLoggerCallback(project=args.wandb, log_config=True))
    if args.mlflow:
        _require("mlflow", "--mlflow", "mlflow")
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        callbacks.append(MLflowLoggerCallback(experiment_name=args.mlflow, tracking_uri=args.mlflow_tracking_uri,
                                              save_artifact=False))
    return callbacks


def _checkpoint_config(spec: Dict[str, Any], freq: Optional[int]):
    from ray.tune import CheckpointConfig

    raw = dict(spec.get("checkpoint_config") or {})
    raw.setdefault("checkpoint_at_end", True)
    if freq is not None:
        raw["checkpoint_frequency"] = freq
    try:
        return CheckpointConfig(**raw)
    except (TypeError, ValueError) as e:
        raise UsageError(f"checkpoint_config / --checkpoint-freq: {e}; keys: checkpoint_frequency (>= 0), "
                         "checkpoint_at_end, num_to_keep") from None


def cmd_train(args) -> int:
    experiments = prepare_experiments(args.file, args.set or [], args.stop or [], args.experiment or [])
    if args.num_cpus is not None and args.num_cpus < 1:
        raise UsageError(f"--num-cpus {args.num_cpus}: must be >= 1")
    callbacks = make_callbacks(args)  # a missing logger package is a usage error, before anything runs
    checkpoint_configs = {name: _checkpoint_config(spec, args.checkpoint_freq) for name, spec in experiments.items()}
    if args.dry_run:
        import yaml

        print(yaml.safe_dump(experiments, sort_keys=False, default_flow_style=False).rstrip())
        print(f"# {len(experiments)} experiment(s) valid; not started (--dry-run)")
        return EXIT_OK
    storage = os.path.abspath(os.path.expanduser(args.storage_path)) if args.storage_path else None

    import ray

    started = False
    if not ray.is_initialized():
        os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
        ray.init(address=args.address, num_cpus=None if args.address else (args.num_cpus or max(os.cpu_count() or 1, 4)),
                 include_dashboard=False, log_to_driver=not args.quiet_workers)
        started = True
    import rllib_r3l
    from ray import tune

    rllib_r3l.register()
    rows: List[Dict[str, Any]] = []
    try:
        exps = []
        for name, spec in experiments.items():
            kwargs = {k: v for k, v in spec.items() if k not in ("run", "config", "stop", "checkpoint_config",
                                                                   "storage_path", "sync_config")}
            if spec.get("sync_config"):
                from ray.tune import SyncConfig

                kwargs["sync_config"] = SyncConfig(**spec["sync_config"])
            exp_storage = storage or (os.path.abspath(os.path.expanduser(spec["storage_path"]))
                                      if spec.get("storage_path") else None)
            exps.append(tune.Experiment(name, spec["run"], config=spec["config"], stop=spec.get("stop"),
                                        storage_path=exp_storage,
                                        checkpoint_config=checkpoint_configs[name], **kwargs))
        # One experiment after the other: with several experiments in one Tune run, Ray 2.60 syncs only
        # the first experiment's results to its storage path (the others stay in the session's
        # staging directory).
        for name, exp in zip(experiments, exps):
            analysis = tune.run(exp, callbacks=callbacks or None, raise_on_failed_trial=False, verbose=args.verbose,
                                max_concurrent_trials=args.max_concurrent)
            rows += _trial_rows(analysis.trials)
            print(f"\nexperiment {name!r}: results in {analysis.experiment_path}")
    finally:
        if started:
            ray.shutdown()
    _print_train_summary(rows)
    return EXIT_OK if all(r["status"] == "TERMINATED" for r in rows) else EXIT_FAILED


def _trial_rows(trials) -> List[Dict[str, Any]]:
    rows = []
    for trial in trials:
        res = trial.last_result or {}
        rows.append({
            "experiment": trial.experiment_dir_name,
            "trial": str(trial),
            "status": trial.status,
            "iterations": res.get("training_iteration"),
            "reward": _get(res, "env_runners/episode_return_mean"),
            "success_rate": _get(res, "env_runners/success_rate"),
            "dir": trial.path,
            "checkpoint": trial.checkpoint.path if trial.checkpoint is not None else None,
            "error": trial.error_file if trial.status == "ERROR" else None,
        })
    return rows


def _get(result: Dict[str, Any], path: str) -> Any:
    node: Any = result
    for p in path.split("/"):
        if not isinstance(node, dict) or p not in node:
            return result.get(path)
        node = node[p]
    return node


def _print_train_summary(rows: List[Dict[str, Any]]) -> None:
    print("\n=== rllib-r3l train: summary ===")
    for r in rows:
        print(f"{r['experiment']} / {r['trial']}: {r['status']}, {r['iterations']} iteration(s), "
              f"reward {_fmt(r['reward'])}, success rate {_fmt(r['success_rate'])}")
        print(f"  results:    {r['dir']}")
        print(f"  checkpoint: {r['checkpoint'] or '(none)'}")
        if r["error"]:
            print(f"  error:      {r['error']}")
    exps = sorted({os.path.dirname(r["dir"]) for r in rows if r["dir"]})
    for e in exps:
        print(f"next: rllib-r3l report {e}    |    tensorboard --logdir {e}")
    ckpts = [r["checkpoint"] for r in rows if r["checkpoint"]]
    if ckpts:
        print(f"      rllib-r3l evaluate {ckpts[0]} --episodes 20")
        print(f"      rllib-r3l export {ckpts[0]} --out exported_model")


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) else "n/a"


# ==================================================================================================
# evaluate / export / report / options
# ==================================================================================================
def _parse_json_flag(text: Optional[str], flag: str) -> Optional[Dict[str, Any]]:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as e:
        raise UsageError(f"{flag}: not valid JSON ({e}); e.g. {flag} '{{\"num_rooms\": 3}}'") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag}: expected a JSON object, got {value!r}")
    return value


def _quiet_transformers() -> None:
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass


def cmd_evaluate(args) -> int:
    from rllib_r3l import evaluate as ev

    _quiet_transformers()
    if args.episodes < 1:
        raise UsageError(f"--episodes {args.episodes}: must be >= 1")
    if args.temperature is not None and args.temperature < 0:
        raise UsageError(f"--temperature {args.temperature}: must be >= 0")
    env_config = _parse_json_flag(args.env_config, "--env-config")
    backend_options = _parse_json_flag(args.backend_options, "--backend-options")
    if args.env is not None:
        validate_env_only(args.env, env_config or {})
    summary, episodes = ev.evaluate(
        args.checkpoint, env=args.env, episodes=args.episodes, env_config=env_config, split=args.split,
        temperature=0.0 if args.greedy else args.temperature, backend=args.backend,
        backend_options=backend_options, max_turns=args.max_turns, max_response_tokens=args.max_response_tokens,
        seed=args.seed, batch_size=args.batch_size,
    )
    print(ev.format_summary(summary))
    if args.out:
        episodes.to_csv(args.out, index=False)
        print(f"per-episode results: {os.path.abspath(args.out)}")
    return EXIT_OK


def validate_env_only(env_id: str, env_config: Dict[str, Any]) -> None:
    try:
        _check_env({"env": env_id, "env_config": env_config}, "--env", set())
    except UsageError as e:
        msg = str(e).replace("--env.config.env_config", "--env-config").replace("--env.config.env", "--env")
        raise UsageError(msg) from None


def cmd_export(args) -> int:
    from rllib_r3l import export as ex

    _quiet_transformers()
    out = ex.export_checkpoint(args.checkpoint, args.out, dtype=args.dtype, force=args.force,
                               base_model=args.base_model)
    print(f"exported a Hugging Face model directory: {out}")
    print(f"  load: transformers.AutoModelForCausalLM.from_pretrained({out!r})  |  vllm.LLM(model={out!r})")
    return EXIT_OK


def cmd_report(args) -> int:
    from rllib_r3l import report

    table, pngs, out_dir = report.make_report(args.experiment_dir, args.out)
    import pandas as pd

    with pd.option_context("display.max_columns", None, "display.width", 200):
        print(table.to_string(index=False))
    print(f"\ntable: {os.path.join(out_dir, report.SUMMARY_FILE)}")
    for p in pngs:
        print(f"plot:  {p}")
    return EXIT_OK


def cmd_options(args) -> int:
    from rllib_r3l.config import R3L_OPTIONS

    for name, (default, help_text) in R3L_OPTIONS.items():
        key = "model" if name == "model_id" else name
        print(f"{key:24s} {default!r:38s} {help_text}")
    print("\nRLlib options (AlgorithmConfig attribute names) work too: lr, grad_clip, env, env_config, "
          "num_env_runners, num_gpus_per_env_runner, num_learners, num_gpus_per_learner, seed, ...")
    return EXIT_OK


# ==================================================================================================
# Parser and entry point
# ==================================================================================================
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rllib-r3l", description="R3L (Reflect-then-Retry RL) on Ray RLlib: "
                                "train from YAML, evaluate, export to Hugging Face, report.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    t = sub.add_parser("train", help="run the experiments of a YAML file with Ray Tune",
                       description="Run {name: {run: R3L, stop, config}} experiments with Ray Tune "
                                   "(checkpoint at the end; TensorBoard/CSV/JSON logs in the trial directories).")
    t.add_argument("file", help="YAML experiments file (e.g. tuned_examples/cpu/coin_collector.yaml)")
    t.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config key (YAML value; dotted keys reach into mappings: env_config.num_rooms=3)")
    t.add_argument("--stop", action="append", metavar="KEY=VALUE",
                   help="override a stop criterion (e.g. training_iteration=10, env_runners/success_rate=0.9)")
    t.add_argument("--experiment", action="append", metavar="NAME", help="run only this experiment of the file")
    t.add_argument("--storage-path", metavar="DIR", help="where Tune writes results (default ~/ray_results)")
    t.add_argument("--num-cpus", type=int, metavar="N",
                   help="CPUs of the local Ray runtime (default: max(cores, 4))")
    t.add_argument("--address", help="connect to a running Ray cluster instead of starting one")
    t.add_argument("--checkpoint-freq", type=int, metavar="N", help="also checkpoint every N iterations")
    t.add_argument("--max-concurrent", type=int, metavar="N", help="max trials at once (grid searches)")
    t.add_argument("--wandb", metavar="PROJECT", help="also log to Weights & Biases (needs wandb)")
    t.add_argument("--mlflow", metavar="EXPERIMENT", help="also log to MLflow (needs mlflow)")
    t.add_argument("--mlflow-tracking-uri", metavar="URI", help="MLflow tracking URI (default: ./mlruns)")
    t.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2, 3), help="Tune's verbosity (default 1)")
    t.add_argument("--quiet-workers", action="store_true", help="do not forward worker logs to the console")
    t.add_argument("--dry-run", action="store_true", help="validate and print the final configs, do not train")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("evaluate", help="evaluate a checkpoint (or exported model) on base episodes",
                       description="Run base episodes (no reflection) at the evaluation temperature and print "
                                   "episodes, success rate, mean return and mean turns.")
    e.add_argument("checkpoint", help="algorithm checkpoint, Tune trial directory (latest checkpoint), "
                                      "or an exported Hugging Face model directory")
    e.add_argument("--env", help="environment id (default: the checkpoint's training env)")
    e.add_argument("--episodes", type=int, default=20, help="number of episodes (tasks seed..seed+N-1; default 20)")
    e.add_argument("--env-config", metavar="JSON", help="environment options as JSON (default: the checkpoint's "
                                                        "env_config when --env is the training env)")
    e.add_argument("--split", default=None, help="task split: train, dev or test (default: test)")
    e.add_argument("--temperature", type=float, help="sampling temperature (default: evaluation_temperature, 0.4)")
    e.add_argument("--greedy", action="store_true", help="greedy decoding (temperature 0)")
    e.add_argument("--backend", choices=("auto", "vllm", "transformers"), help="generation backend "
                                                                              "(default: the training backend)")
    e.add_argument("--backend-options", metavar="JSON", help="backend options as JSON")
    e.add_argument("--max-turns", type=int, help="max turns per episode (default: training setting)")
    e.add_argument("--max-response-tokens", type=int, help="max tokens per response (default: training setting)")
    e.add_argument("--seed", type=int, default=0, help="first task seed (default 0)")
    e.add_argument("--batch-size", type=int, default=32, help="episodes run together (default 32)")
    e.add_argument("--out", metavar="FILE.csv", help="also write the per-episode results as CSV")
    e.set_defaults(func=cmd_evaluate)

    x = sub.add_parser("export", help="write a Hugging Face model directory from a checkpoint",
                       description="Write config, safetensors weights, tokenizer and chat template of the trained "
                                   "policy; AutoModelForCausalLM.from_pretrained and vLLM load it directly.")
    x.add_argument("checkpoint", help="algorithm checkpoint or Tune trial directory (latest checkpoint)")
    x.add_argument("--out", required=True, metavar="DIR", help="output directory")
    x.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="cast the weights (default: as trained)")
    x.add_argument("--base-model", metavar="ID_OR_DIR",
                   help="the base model if the checkpoint's model path no longer exists")
    x.add_argument("--force", action="store_true", help="write into a non-empty --out directory")
    x.set_defaults(func=cmd_export)

    r = sub.add_parser("report", help="final metrics table (CSV) and learning curves (PNG) of an experiment",
                       description="Summarise the trials under EXPERIMENT_DIR (Tune's result.json / progress.csv).")
    r.add_argument("experiment_dir", help="a Tune experiment directory (or a trial directory, or a parent of several)")
    r.add_argument("--out", metavar="DIR", help="where to write summary.csv and the PNGs (default EXPERIMENT_DIR/report)")
    r.set_defaults(func=cmd_report)

    o = sub.add_parser("options", help="list the R3L options with defaults and help")
    o.set_defaults(func=cmd_options)
    return p


class _DropNewApiStackNotice:
    """RLlib warns on every config that the new API stack is on; R3L only runs on it."""

    def filter(self, record) -> bool:
        return "running R3L on the new API stack" not in str(record.msg)


def main(argv: Optional[Sequence[str]] = None) -> int:
    import logging

    rllib_config_logger = logging.getLogger("ray.rllib.algorithms.algorithm_config")
    if not any(isinstance(f, _DropNewApiStackNotice) for f in rllib_config_logger.filters):
        rllib_config_logger.addFilter(_DropNewApiStackNotice())
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a bad flag (2, message already printed)
        return int(e.code or 0) if not isinstance(e.code, str) else EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        print(f"rllib-r3l {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
