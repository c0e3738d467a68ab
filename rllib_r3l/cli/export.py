"""Checkpoint -> Hugging Face model directory (``rllib-r3l export``).

An R3L algorithm checkpoint (``Algorithm.save_to_path`` / Tune's ``checkpoint_*``) holds the learner's
module under ``learner_group/learner/rl_module/default_policy``: the causal LM's weights with
``lm.``-prefixed names and the module's constructor arguments (its ``model_config`` names the base
model). Exporting loads the base model's architecture, puts the trained weights in, and writes
config, safetensors, tokenizer and chat template, so that ``AutoModelForCausalLM.from_pretrained``
and ``vllm.LLM`` load the directory directly. ``r3l_export.json`` beside them records where the
weights came from and the rollout settings ``rllib-r3l evaluate`` reuses.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import tempfile
from typing import Any, Dict, Optional, Tuple

from rllib_r3l.errors import UsageError

MODULE_SUBDIR = os.path.join("learner_group", "learner", "rl_module", "default_policy")
EXPORT_META = "r3l_export.json"
# Rollout settings kept with an export (what ``evaluate`` needs to prompt the model as in training).
ROLLOUT_KEYS = (
    "env",
    "env_config",
    "evaluation_temperature",
    "max_response_tokens",
    "max_context_tokens",
    "max_turns",
    "top_p",
    "action_decoding",
    "system_prompt",
    "success_reward",
    "backend",
    "backend_options",
    "model_id",
    "model_dtype",
)


def is_hf_model_dir(path: str) -> bool:
    """A Hugging Face model directory: its config.json names a ``model_type`` (any JSON is not a model)."""
    return _config_model_type(path) is not None and not is_algorithm_checkpoint(path)


def _config_model_type(path: str) -> Optional[str]:
    """``model_type`` of ``path/config.json``; None when the file is absent, unreadable or has none."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None
    value = cfg.get("model_type") if isinstance(cfg, dict) else None
    return value if isinstance(value, str) and value else None


def _checkpoint_parts(path: str) -> dict:
    """Which of the two parts that make an RLlib algorithm checkpoint folder are there."""
    return {
        "rllib_checkpoint.json": os.path.isfile(os.path.join(path, "rllib_checkpoint.json")),
        "learner_group/": os.path.isdir(os.path.join(path, "learner_group")),
    }


def is_algorithm_checkpoint(path: str) -> bool:
    return all(_checkpoint_parts(path).values())


def _subdirs(path: str) -> list:
    return [os.path.join(path, d) for d in sorted(os.listdir(path)) if os.path.isdir(os.path.join(path, d))]


def find_checkpoint(path: str) -> str:
    """An algorithm checkpoint directory from ``path``: the checkpoint itself, or the latest
    ``checkpoint_*`` of a Tune trial directory (or of the single trial of an experiment directory)."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such checkpoint or directory")
    if not os.path.isdir(path):
        inside = next((p for p in _parents(path) if is_algorithm_checkpoint(p)), None)
        raise UsageError(
            f"{path}: is a file, not a checkpoint directory; pass "
            f"{inside if inside else 'the checkpoint_* directory printed by `rllib-r3l train`'}"
        )
    if is_algorithm_checkpoint(path):
        return path
    ckpts = _checkpoints_in(path)
    if ckpts:
        return _newest_complete(ckpts)
    trials = [os.path.join(path, d) for d in sorted(os.listdir(path)) if _checkpoints_in(os.path.join(path, d))]
    if len(trials) == 1:
        return _newest_complete(_checkpoints_in(trials[0]))
    if len(trials) > 1:
        raise UsageError(
            f"{path} holds {len(trials)} trials with checkpoints; pass one of them: "
            + ", ".join(os.path.basename(t) for t in trials)
        )
    model_type = _config_model_type(path)
    if model_type is not None:  # export of an exported (or any plain) model folder: it is one already
        raise UsageError(
            f"{path}: is a Hugging Face model folder (model_type {model_type!r}), not an R3L "
            "checkpoint; it needs no export: evaluate it with `rllib-r3l evaluate "
            f"{path}` or train from it with --set model={path}"
        )
    if os.path.isfile(os.path.join(path, "config.json")):  # looks like a model, but is none
        raise UsageError(
            f"{path}: has a config.json without model_type, so it is neither a Hugging Face model "
            "directory nor an R3L checkpoint; pass a checkpoint printed by `rllib-r3l train` or a "
            "directory written by `rllib-r3l export`"
        )
    parts = _checkpoint_parts(path)
    if any(parts.values()):  # half a checkpoint: name what is missing, not "not an R3L checkpoint"
        missing = next(k for k, there in parts.items() if not there)
        raise UsageError(
            f"{path}: a damaged checkpoint: {missing} is missing; restore it from a copy or pass an "
            "earlier checkpoint_* of the run"
        )
    experiments = [os.path.basename(e) for e in _subdirs(path) if any(_checkpoints_in(t) for t in _subdirs(e))]
    if experiments:  # a storage path: its experiments hold the trials
        raise UsageError(
            f"{path} holds {len(experiments)} experiment folder(s) with checkpoints; pass one of them "
            f"(or a trial in it): " + ", ".join(experiments[:5]) + (", ..." if len(experiments) > 5 else "")
        )
    raise UsageError(
        f"{path}: not an R3L checkpoint (no rllib_checkpoint.json + learner_group/) and no "
        "checkpoint_* directories in it; pass a checkpoint printed by `rllib-r3l train`"
    )


def _checkpoints_in(d: str) -> list:
    if not os.path.isdir(d):
        return []
    found = []
    for name in os.listdir(d):
        m = re.fullmatch(r"checkpoint_(\d+)", name)
        if m and is_algorithm_checkpoint(os.path.join(d, name)):
            found.append((int(m.group(1)), os.path.join(d, name)))
    return [p for _, p in sorted(found)]


def _newest_complete(ckpts: list) -> str:
    """The newest complete ``checkpoint_*`` of a trial, naming on stderr the newer incomplete ones it skips
    (a crash or a full disk mid-copy); the newest one when none is complete (its loading names the damage)."""
    import sys

    from rllib_r3l.checkpoint_integrity import problem, skipped_note

    for i, ckpt in enumerate(reversed(ckpts)):
        if problem(ckpt) is None:
            for newer in ckpts[len(ckpts) - i :]:
                print(skipped_note(newer, problem(newer)), file=sys.stderr)
            return ckpt
    return ckpts[-1]


def _parents(path: str) -> list:
    out, d = [], os.path.dirname(path)
    while d and d != os.path.dirname(d):
        out.append(d)
        d = os.path.dirname(d)
    return out


def _load_pickle(path: str) -> Any:
    """A pickle of the checkpoint; a missing, truncated or corrupt file is a one-line :class:`UsageError`."""
    if not os.path.isfile(path):
        raise UsageError(
            f"{path}: missing; the checkpoint is incomplete (was it copied or written only in part?); "
            "use another checkpoint_* of the trial"
        )
    if os.path.getsize(path) == 0:
        raise UsageError(f"{path}: empty file; the checkpoint is damaged, use another checkpoint_* of the trial")
    # RLlib checkpoints are pickles written by RLlib itself (trusted like any RLlib checkpoint).
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (
        EOFError,
        pickle.UnpicklingError,
        ValueError,
        TypeError,
        AttributeError,
        ImportError,
        IndexError,
        KeyError,
        MemoryError,
        OverflowError,
    ) as e:
        what = "truncated" if isinstance(e, EOFError) else "corrupt"
        raise UsageError(
            f"{path}: {what} ({type(e).__name__}: {' '.join(str(e).split())[:120]}); the checkpoint is "
            "damaged, use another checkpoint_* of the trial"
        ) from None


def _stored_config(ckpt: str) -> Any:
    """The config ``class_and_ctor_args.pkl`` holds: the algorithm's first constructor argument (None: none)."""
    args, kwargs = _load_pickle(os.path.join(ckpt, "class_and_ctor_args.pkl")).get("ctor_args_and_kwargs", ((), {}))
    return args[0] if args else kwargs.get("config")


def load_checkpoint_config(ckpt: str) -> Dict[str, Any]:
    """The algorithm's config (as a dict) stored in the checkpoint."""
    # else evaluated with every default (another backend, max_turns), exit 0
    if not os.path.isfile(os.path.join(ckpt, "class_and_ctor_args.pkl")):
        raise UsageError(
            f"{ckpt}: class_and_ctor_args.pkl (the training config) is missing, so its environment, "
            "env_config and rollout settings are unknown; copy it back from the run's checkpoint, "
            "or evaluate a complete checkpoint"
        )
    cfg = _stored_config(ckpt)
    return dict((cfg.to_dict() if hasattr(cfg, "to_dict") else cfg) or {})


def load_checkpoint_algo_config(ckpt: str) -> Any:
    """The algorithm's config object stored in the checkpoint (what ``Algorithm.from_checkpoint`` builds with)."""
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    cfg = _stored_config(ckpt)
    return AlgorithmConfig.from_state(cfg) if isinstance(cfg, dict) and "class" in cfg else cfg  # get_state()


def checkpoint_iteration(ckpt: str) -> Optional[int]:
    f = os.path.join(ckpt, "algorithm_state.pkl")
    try:
        return int(_load_pickle(f).get("training_iteration"))
    except Exception:
        return None


def _module_state_and_ctor(mdir: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    if not os.path.isdir(mdir):
        raise UsageError(f"{mdir}: no learner module state there; was the checkpoint saved by R3L?")
    ctor = _load_pickle(os.path.join(mdir, "class_and_ctor_args.pkl"))
    state_file = os.path.join(mdir, "module_state.pkl")
    if os.path.isfile(state_file):
        state = _load_pickle(state_file)
    elif os.path.isfile(os.path.join(mdir, "module_state.msgpack")):  # another serialisation: let RLlib read it
        from ray.rllib.core.rl_module.rl_module import RLModule

        state = RLModule.from_checkpoint(mdir).get_state()
    else:
        raise UsageError(
            f"{state_file}: missing (the policy's weights); the checkpoint is incomplete, use another "
            "checkpoint_* of the trial"
        )
    if not isinstance(state, dict):
        raise UsageError(
            f"{state_file}: holds a {type(state).__name__}, not the module's weights; the checkpoint is "
            "damaged, use another checkpoint_* of the trial"
        )
    return state, ctor


def load_policy(ckpt: str, base_model: Optional[str] = None, dtype: Optional[str] = None):
    """``(model, tokenizer, model_config)``: the trained causal LM of an algorithm checkpoint."""
    return load_module_dir(os.path.join(ckpt, MODULE_SUBDIR), base_model=base_model, dtype=dtype)


def load_module_dir(mdir: str, base_model: Optional[str] = None, dtype: Optional[str] = None):
    """The causal LM of a saved ``R3LCausalLMModule`` directory, as a plain Hugging Face model
    (LoRA adapters merged into the weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rllib_r3l.learner.rl_module import hf_named_tensors
    from rllib_r3l.models import ModelResolutionError, _torch_dtype, load_tokenizer, resolve_model

    state, ctor = _module_state_and_ctor(mdir)
    args, kwargs = ctor.get("ctor_args_and_kwargs", ((), {}))
    model_config = dict(kwargs.get("model_config") or {})
    model_id = base_model or model_config.get("model_id")
    if not model_id:
        raise UsageError(f"{mdir}: the checkpoint does not name its base model; pass --base-model")
    try:
        path = resolve_model(model_id)
    except ModelResolutionError as e:
        raise UsageError(f"base model {model_id!r}: {e}") from None
    if not os.path.isdir(path):
        raise UsageError(
            f"base model {model_id!r} is not a local directory (needed for its architecture and "
            "tokenizer); pass --base-model with a local copy"
        )
    if model_config.get("lora"):
        # The module wraps the model with peft: rebuild it as trained, load the state, merge.
        module = ctor["class"](*args, **dict(kwargs, model_config=dict(model_config, model_id=path)))
        module.set_state(state)
        model = module.lm.merge_and_unload()
    else:
        weights = dict(hf_named_tensors(state))
        if not weights:  # the checkpoint itself is damaged: not "another base model"
            raise UsageError(
                f"{mdir}: the checkpoint's module state holds no weights (damaged, or not written by "
                "R3L); use another checkpoint of the run"
            )
        trained_dtype = next((v.dtype for v in weights.values() if torch.is_floating_point(v)), torch.float32)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=trained_dtype)
        try:
            missing, unexpected = model.load_state_dict(weights, strict=False)
        except RuntimeError as e:  # shapes of another model: torch's 40-line "size mismatch" list
            raise UsageError(
                f"the checkpoint's weights do not fit base model {model_id!r} "
                f"({_first_mismatch(e)}); pass the right --base-model"
            ) from None
        tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
        missing = [k for k in missing if k not in tied]
        if missing or unexpected:
            raise UsageError(
                f"the checkpoint's weights do not fit base model {model_id!r} "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]}); pass the right --base-model"
            )
    if dtype is not None:
        model = model.to(_torch_dtype(dtype))
    if getattr(model, "is_gradient_checkpointing", False):
        model.gradient_checkpointing_disable()
    model.config.use_cache = True
    model.eval()
    tokenizer = load_tokenizer(path)
    model_config["base_model_path"] = path
    return model, tokenizer, model_config


def _first_mismatch(e: RuntimeError) -> str:
    """The first ``size mismatch for NAME: ...`` line of torch's error, shortened."""
    lines = [" ".join(line.split()) for line in str(e).splitlines()]
    first = next((line for line in lines if line.startswith("size mismatch")), lines[-1] if lines else "")
    more = sum(line.startswith("size mismatch") for line in lines) - 1
    return first[:200] + (f", and {more} more" if more > 0 else "")


def export_checkpoint(
    checkpoint: str, out: str, dtype: Optional[str] = None, force: bool = False, base_model: Optional[str] = None
) -> str:
    """Write the checkpoint's policy as a Hugging Face model directory; returns its path."""
    out = os.path.abspath(os.path.expanduser(out))
    if os.path.isdir(out) and os.listdir(out) and not force:
        raise UsageError(f"--out {out}: directory is not empty; choose a new one or pass --force")
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out}: exists and is not a directory")
    from rllib_r3l.cli.storage import check_storage, write_failure

    check_storage(out, None, "--out")  # before the checkpoint is loaded: a read-only --out fails in a second
    ckpt = find_checkpoint(checkpoint)
    model, tokenizer, model_config = load_policy(ckpt, base_model=base_model, dtype=dtype)
    if getattr(tokenizer, "chat_template", None) is None:
        raise UsageError(f"base model {model_config.get('model_id')!r} has no chat template; R3L policies need one")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    check_storage(out, weights, "--out", what="the exported weights")
    cfg = load_checkpoint_config(ckpt)
    meta = {
        "source_checkpoint": ckpt,
        "training_iteration": checkpoint_iteration(ckpt),
        "base_model": model_config.get("model_id"),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "rollout": {k: cfg[k] for k in ROLLOUT_KEYS if k in cfg and _jsonable(cfg[k])},
    }
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    # written aside, then moved in file by file: a full disk mid-write leaves --out as it was (never a
    # folder that looks like a model and holds half its weights)
    aside = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.export-", dir=parent)
    try:
        model.save_pretrained(aside, safe_serialization=True)
        tokenizer.save_pretrained(aside)
        with open(os.path.join(aside, EXPORT_META), "w") as f:
            json.dump(meta, f, indent=1)
        os.makedirs(out, exist_ok=True)
        for name in sorted(os.listdir(aside)):
            os.replace(os.path.join(aside, name), os.path.join(out, name))
    except Exception as e:
        reason = write_failure(e)
        if reason is None:
            raise
        raise UsageError(
            f"--out {out}: the model could not be written ({reason}); nothing was left half-written "
            "there; free space or give another --out"
        ) from None
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    return out


def read_export_meta(model_dir: str) -> Dict[str, Any]:
    f = os.path.join(model_dir, EXPORT_META)
    if not os.path.isfile(f):
        return {}
    with open(f) as fh:
        return json.load(fh)


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False
