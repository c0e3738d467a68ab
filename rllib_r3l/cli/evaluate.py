"""Evaluate a trained policy on base episodes (``rllib-r3l evaluate``): no reflection, no retry.

The policy comes from an algorithm checkpoint (the learner's weights and the training config, read
from the checkpoint without starting Ray) or from a directory written by ``rllib-r3l export``.
Episodes run with the project's own rollout code (:class:`rllib_r3l.runner.rollout.EpisodeRunner`,
:func:`rllib_r3l.generation.make_backend`, :class:`rllib_r3l.runner.chat.ChatFormat`), prompted exactly as
in training, at the evaluation temperature (paper K.1: 0.4) or greedily. Tasks are the seeds
``seed .. seed+episodes-1`` of the chosen split (default ``test``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
import time
from collections import Counter
from typing import Any, Callable, Dict, Optional

from rllib_r3l.config import R3L_OPTIONS
from rllib_r3l.errors import UsageError
from rllib_r3l.preflight import accepts, check_env
from rllib_r3l.runner.evaluation import episode_row, summarize


def _setting(cfg: Dict[str, Any], name: str) -> Any:
    """The training setting ``name`` from the checkpoint's config (R3L's default when absent)."""
    value = cfg.get(name)
    return R3L_OPTIONS[name][0] if value is None else value


def evaluate(
    source: str,
    *,
    env: Optional[str] = None,
    episodes: int = 20,
    env_config: Optional[Dict[str, Any]] = None,
    split: Optional[str] = None,
    temperature: Optional[float] = None,
    backend: Optional[str] = None,
    backend_options: Optional[Dict[str, Any]] = None,
    max_turns: Optional[int] = None,
    max_response_tokens: Optional[int] = None,
    seed: int = 0,
    batch_size: int = 32,
    base_model: Optional[str] = None,
    extra: Optional[Callable[..., Dict[str, Any]]] = None,
):
    """Run ``episodes`` base episodes; returns ``(summary dict, per-episode DataFrame)``.

    ``base_model`` replaces the checkpoint's base model (moved or renamed since training).
    ``extra(runner, chat, trajectories, setting, temperature, success_reward)`` adds keys to the summary from
    the finished episodes while the engine still runs; ``setting(name)`` is the checkpoint's training setting
    (no flag sets it: :func:`rllib_r3l.runner.reflection_quality.reflection_summary`, the policy's reflection
    quality, is one)."""
    import pandas as pd

    import environments
    from environments import registry
    from rllib_r3l.cli import export as ex
    from rllib_r3l.generation import make_backend, resolve_backend_name, unknown_backend_option
    from rllib_r3l.generation.hf_backend import HFBackend
    from rllib_r3l.model_check import local_model_problem
    from rllib_r3l.models import load_tokenizer
    from rllib_r3l.runner.chat import ChatFormat
    from rllib_r3l.runner.rollout import EpisodeRunner, EpisodeSpec, RolloutOptions

    path = os.path.abspath(os.path.expanduser(source))
    tmp = None
    model = None
    if os.path.isdir(path) and ex.is_hf_model_dir(path):
        problem = local_model_problem(path)  # damaged or missing weights, no tokenizer: one line, not a traceback
        if problem:
            raise UsageError(problem)
        cfg = dict(ex.read_export_meta(path).get("rollout", {}))
        model_dir = path
        what = f"exported model {path}"
    else:
        ckpt = ex.find_checkpoint(path)
        cfg = ex.load_checkpoint_config(ckpt)
        what = f"checkpoint {ckpt}"
        model_dir = None
    train_backend = cfg.get("backend", "auto")
    name = resolve_backend_name(backend or train_backend)
    if backend_options is None:
        backend_options = (
            dict(cfg.get("backend_options") or {}) if (resolve_backend_name(train_backend) == name) else {}
        )
    else:
        problem = unknown_backend_option(name, backend_options)
        if problem:
            raise UsageError(f"--backend-options: {problem}")

    # Environment: the training env and env_config unless told otherwise.
    train_env = cfg.get("env")
    env_id = env or train_env
    if not env_id:
        raise UsageError(f"{what} does not name its environment; pass --env (e.g. --env r3l/ToyCorridor)")
    env_config_given = env_config is not None
    # --env-config changes the keys it names (replacing the training env_config would evaluate a checkpoint
    # trained with max_turns 6 at the environment's default 8 without a word)
    env_config = {**(cfg.get("env_config") or {} if env_id == train_env else {}), **(env_config or {})}
    eval_split = env_config.pop("eval_split", None)
    try:
        factory = registry.resolve(env_id)
    except ValueError as e:
        raise UsageError(f"--env: {e}") from None
    split_flag = split is not None and "split" not in env_config  # --split is what goes in
    split = split or eval_split or "test"
    if "split" not in env_config and accepts(factory, "split"):
        env_config["split"] = split
    try:  # one environment built now: a bad option is one error, not a traceback per episode
        check_env(env_id, env_config)
    except ValueError as e:
        # the source of the bad value: --split when it went in and the environment names the split
        flag = (
            "--split"
            if split_flag and "split" in str(e)
            else "--env-config"
            if env_config_given
            else f"the env_config of {what}"
        )
        raise UsageError(f"{flag}: {str(e).split(': ', 1)[1]}") from None

    if model_dir is None:  # the weights, once the environment is known to work
        if name == "transformers":  # in memory: no copy of the weights on disk
            model, tokenizer, _ = ex.load_policy(ckpt, base_model=base_model)
        else:  # vLLM loads from a directory
            tmp = tempfile.TemporaryDirectory(prefix="r3l-eval-")
            model_dir = ex.export_checkpoint(ckpt, tmp.name, force=True, base_model=base_model)

    temp = float(temperature if temperature is not None else _setting(cfg, "evaluation_temperature"))
    opts = RolloutOptions(
        max_turns=max_turns if max_turns is not None else cfg.get("max_turns"),
        max_response_tokens=int(max_response_tokens or _setting(cfg, "max_response_tokens")),
        max_context_tokens=int(_setting(cfg, "max_context_tokens")),
        temperature=temp,
        top_p=float(_setting(cfg, "top_p")),
        action_decoding=_setting(cfg, "action_decoding"),
        system_prompt=cfg.get("system_prompt"),
    )
    success_reward = float(_setting(cfg, "success_reward"))

    t0 = time.perf_counter()
    if model is not None:
        if backend_options.get("dtype") not in (None, "auto"):  # else ignored for a model in memory
            from rllib_r3l.models import _torch_dtype

            model = model.to(_torch_dtype(backend_options["dtype"]))
        gen = HFBackend(model=model, tokenizer=tokenizer, **backend_options)
    else:
        tokenizer = load_tokenizer(model_dir)
        gen = make_backend(name, model_dir, **backend_options)
    counters: Counter = Counter()
    runner = EpisodeRunner(gen, ChatFormat(tokenizer), lambda: environments.make(env_id, env_config), opts, counters)
    rows = []
    finished = []  # the trajectories, for ``extra``
    extra_metrics: Dict[str, Any] = {}
    try:
        seeds = list(range(seed, seed + episodes))
        for start in range(0, len(seeds), max(1, batch_size)):
            chunk = seeds[start : start + batch_size]
            trajs = runner.run([EpisodeSpec(seed=s, group_id=f"eval-{s}") for s in chunk])
            finished.extend(trajs)
            rows.extend(episode_row(s, t, success_reward) for s, t in zip(chunk, trajs))
        if extra is not None:
            setting = functools.partial(_setting, cfg)
            extra_metrics = extra(runner, ChatFormat(tokenizer), finished, setting, temp, success_reward)
    finally:
        runner.close()
        gen.close()
        if tmp is not None:
            tmp.cleanup()
    df = pd.DataFrame(rows)
    summary = {
        "source": what,
        "env": env_id,
        "split": env_config.get("split", split),
        "env_config": {k: v for k, v in env_config.items() if k != "split"},
        **summarize(rows),
        "temperature": temp,
        "backend": name,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    summary.update(extra_metrics)
    return summary, df


def format_summary(summary: Dict[str, Any]) -> str:
    import pandas as pd

    cols = ["env", "split", "episodes", "success_rate", "mean_return", "mean_turns", "errors", "temperature"]
    table = pd.DataFrame([{k: summary[k] for k in cols}])
    with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
        body = table.to_string(index=False)
    env_config = f"\nenv_config {json.dumps(summary['env_config'])}" if summary.get("env_config") else ""
    return f"evaluated {summary['source']} ({summary['backend']} backend, {summary['seconds']} s)\n{body}{env_config}"


def check_flags(args) -> Optional[str]:
    """``rllib-r3l evaluate``'s numbers and ``--out``, refused before anything loads; ``--out`` made absolute."""
    if args.episodes < 1:
        raise UsageError(f"--episodes {args.episodes}: must be >= 1")
    if args.temperature is not None and not (0 <= args.temperature < math.inf):  # nan: a traceback per episode
        raise UsageError(f"--temperature {args.temperature}: must be a finite number >= 0")
    if args.greedy and args.temperature not in (None, 0):  # greedy would win without a word
        raise UsageError(
            f"--greedy and --temperature {args.temperature} exclude each other: --greedy decodes at "
            "temperature 0; drop one of them"
        )
    if args.batch_size < 1:  # a negative one cut or repeated the task seeds, 0 was a KeyError
        raise UsageError(f"--batch-size {args.batch_size}: must be >= 1 (episodes run together)")
    if args.seed < 0:  # environments take seeds >= 0 (gymnasium raises per episode)
        raise UsageError(f"--seed {args.seed}: must be >= 0 (the first task seed)")
    for flag, value in (("--max-turns", args.max_turns), ("--max-response-tokens", args.max_response_tokens)):
        if value is not None and value < 1:  # 0 would fall back to the training value without a word
            raise UsageError(f"{flag} {value}: must be >= 1 (leave the flag out for the training setting)")
    if not args.out:
        return None
    from rllib_r3l.cli.storage import check_storage

    out = os.path.abspath(os.path.expanduser(args.out))
    if os.path.isdir(out):
        raise UsageError(f"--out {out}: is a folder; give a file name, e.g. {os.path.join(out, 'episodes.csv')}")
    check_storage(os.path.dirname(out), None, "--out")
    return out
