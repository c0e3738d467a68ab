"""Where a run writes: refused before training when it cannot be written or has no room for a checkpoint.

A full disk used to surface as hundreds of lines of tracebacks and a checkpoint of zero-byte files
at the first save. ``check_storage`` creates the folder, writes a probe file into it, and compares the
free space with what one checkpoint needs (``checkpoint_bytes``: the policy's weights plus AdamW's two
moments, in fp32, plus a margin), naming the path and both numbers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from typing import Any, Callable, Optional, Union

from rllib_r3l.errors import UsageError

_WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth")
_BYTES_PER_PARAM = {"float32": 4, "float16": 2, "bfloat16": 2}
# fp32 weights + AdamW's two fp32 moments = 12 bytes a parameter; 10 % for the rest (module state, RNGs)
CHECKPOINT_BYTES_PER_PARAM = 12 * 1.1
# a tied output head is one parameter in the optimizer but two entries (embedding, lm_head) in the module's
# saved state dict: vocab x hidden more fp32 values (the tiny model's 50 MB, against 42.8 without them)


def checkpoint_bytes(model_dir: Optional[str]) -> Optional[int]:
    """What one checkpoint of the policy in ``model_dir`` (a local Hugging Face folder) takes, estimated
    from its weight files; None when the folder or its weights are not there to measure."""
    if not model_dir or not os.path.isdir(model_dir):
        return None
    weights = sum(
        os.path.getsize(os.path.join(model_dir, f))
        for f in os.listdir(model_dir)
        if f.endswith(_WEIGHT_FILES) and os.path.isfile(os.path.join(model_dir, f))
    )
    if not weights:
        return None
    cfg = {}
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        pass
    cfg = cfg if isinstance(cfg, dict) else {}
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32").replace("torch.", "")
    params = weights / _BYTES_PER_PARAM.get(dtype, 4)
    tied = _tied_head_params(cfg)
    return int((params + tied / 3) * CHECKPOINT_BYTES_PER_PARAM)  # the head's copy: 4 of the 12 bytes


def _tied_head_params(cfg: dict) -> int:
    """vocab x hidden for a model whose output head shares the embedding, else 0."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    if not (cfg.get("tie_word_embeddings") or text.get("tie_word_embeddings")):
        return 0
    vocab, hidden = text.get("vocab_size"), text.get("hidden_size")
    return int(vocab * hidden) if isinstance(vocab, int) and isinstance(hidden, int) else 0


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def check_storage(
    path: str,
    need_bytes: Optional[int],
    flag: str,
    what: str = "one checkpoint of this model needs about {need} (weights and optimizer state)",
) -> None:
    """``UsageError`` naming ``flag`` and ``path`` when the folder cannot be created or written, or has
    less free space than ``need_bytes`` (None: the space is not checked)."""
    path = os.path.abspath(os.path.expanduser(path))
    existing = path  # the folder may not exist yet: probe the nearest one that does (nothing is created)
    while not os.path.isdir(existing) and os.path.dirname(existing) != existing:
        if os.path.lexists(existing):  # else a file there passes --dry-run, then Tune's traceback
            raise UsageError(f"{flag} {path}: {existing} is a file, not a folder; give a folder") from None
        existing = os.path.dirname(existing)
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".r3l-write-probe-"):
            pass
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write there ({e.strerror or e}); give a writable folder") from None
    if need_bytes is None:
        return
    free = shutil.disk_usage(existing).free
    if free < need_bytes:
        needs = what.format(need=_gb(need_bytes)) if "{need}" in what else f"{what} need {_gb(need_bytes)}"
        raise UsageError(f"{flag} {path}: {_gb(free)} free, {needs}; free space there or give another {flag}")


def checkpoint_bytes_of(model_id: str) -> Optional[int]:
    """``checkpoint_bytes`` for a model id or path where its folder is on this machine (a local folder;
    the default model and ``tiny`` once set-up converted them into the cache), else None."""
    from rllib_r3l.models import resolve_model

    try:
        return checkpoint_bytes(resolve_model(model_id))
    except Exception:  # noqa: BLE001 - a hub id not cached here: only writability is checked
        return None


def check_experiment_storages(experiments, plan, flag: str) -> None:
    """Every experiment's folder (``plan[name]["dir"]``) can be written and has room for one checkpoint
    of its largest model (a grid over models: the largest)."""
    from rllib_r3l.options import DEFAULT_MODEL

    for name, spec in experiments.items():
        models = spec["config"].get("model", DEFAULT_MODEL)
        models = models["grid_search"] if isinstance(models, dict) and "grid_search" in models else [models]
        sizes = [b for b in (checkpoint_bytes_of(m) for m in models if isinstance(m, str)) if b]
        check_storage(plan[name]["dir"], max(sizes) if sizes else None, flag)


_RUST_IO_ERROR = re.compile(r"^(?P<msg>.+?) \(os error (?P<errno>\d+)\)$")


def write_failure(e: BaseException) -> Optional[str]:
    """Why a write failed, when ``e`` is the storage refusing it (an ``OSError``, or the same error raised by
    the Rust side of tokenizers/safetensors as ``Exception("No space left on device (os error 28)")``);
    None for anything else."""
    if isinstance(e, OSError):
        return e.strerror or str(e)
    m = _RUST_IO_ERROR.match(str(e).strip())
    return m.group("msg") if m else None


def write_atomically(path: str, data: Union[str, bytes, Callable[[str], Any]]) -> None:
    """Replace ``path`` by ``data`` whole or not at all (a temporary file beside it, synced, renamed over it):
    text, bytes, or a function that writes the file name it is given (``DataFrame.to_csv``, ``shutil.copy2``).
    Tune's state and its copies, the result rows, summary.json and evaluate's CSV are never left half-written
    by a kill or a full disk."""
    tmp = path + ".r3l-tmp"
    try:
        if callable(data):
            data(tmp)
        else:
            with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
                f.write(data)
        with open(tmp, "rb") as f:  # on disk before the rename: a crash leaves the old file or the new one
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk: no half-written temporary left beside the file
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
