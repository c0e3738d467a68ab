"""The policy RLModule (rllib_r3l.learner.rl_module) on the tiny model: what ``setup`` builds from the
model config, the credited-token log-probs against a plain forward, the state in and out, and the
pure helpers. Fast: no Ray runtime, no learner."""

from __future__ import annotations

import logging
import types

import gymnasium as gym
import numpy as np
import pytest
import torch

from rllib_r3l.learner.rl_module import (
    R3LCausalLMModule,
    _strip,
    hf_named_tensors,
    prefix_sharing_unsupported,
    right_padded,
)

SPACE = gym.spaces.Text(max_length=8)


def ours(caplog):
    """This module's log lines (RLlib may log its own deprecation notices meanwhile)."""
    return [r.getMessage() for r in caplog.records if r.name == "rllib_r3l.learner.rl_module"]


def module(**model_config):
    return R3LCausalLMModule(
        observation_space=SPACE, action_space=SPACE, model_config={"model_id": "tiny", **model_config}
    )


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    return module()


# ---------------------------------------------------------------------------------- setup
def test_setup_needs_a_model_id():
    with pytest.raises(
        ValueError, match=r"^R3LCausalLMModule needs model_config\['model_id'\] \(set training\(model=\.\.\.\)\)$"
    ):
        R3LCausalLMModule(observation_space=SPACE, action_space=SPACE, model_config={})


def test_setup_defaults(plain, tiny_model_dir):
    assert plain.model_path == tiny_model_dir
    assert all(p.dtype == torch.float32 for p in plain.lm.parameters())
    assert plain.lm.config.use_cache is False  # training: no KV cache kept
    assert not plain.lm.is_gradient_checkpointing
    assert plain.share_prefixes is False and plain.lora is None


def test_setup_options(tiny_model_dir, caplog):
    bf16 = module(model_dtype="bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in bf16.lm.parameters())
    assert module(share_prefixes=True).share_prefixes is True
    with caplog.at_level(logging.WARNING, logger="rllib_r3l.learner.rl_module"):
        gc = module(gradient_checkpointing=True, share_prefixes=True)
    assert gc.lm.is_gradient_checkpointing and gc.share_prefixes is False
    assert ours(caplog) == [
        "share_prefixes off: gradient checkpointing recomputes without a KV cache; every sequence runs on its own"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rllib_r3l.learner.rl_module"):
        assert module(gradient_checkpointing=True).share_prefixes is False
    assert ours(caplog) == []  # nothing asked, nothing to warn about


def test_setup_with_lora_trains_the_adapters_only(tiny_model_dir):
    pytest.importorskip("peft")
    m = module(lora={"r": 4, "target_modules": ["q_proj", "v_proj"]})
    assert m.lora == {"r": 4, "target_modules": ["q_proj", "v_proj"]}
    cfg = m.lm.peft_config["default"]
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout, cfg.bias) == (4, 8, 0.0, "none")  # alpha defaults to 2 r
    assert set(cfg.target_modules) == {"q_proj", "v_proj"}
    trainable = {n for n, p in m.lm.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    m2 = module(lora={"target_modules": ["q_proj"], "alpha": 3, "dropout": 0.1})
    cfg2 = m2.lm.peft_config["default"]
    assert (cfg2.r, cfg2.lora_alpha, cfg2.lora_dropout) == (16, 3, 0.1)
    # with gradient checkpointing the embeddings' output requires grad (else no gradient reaches the adapters)
    gc = module(lora={"r": 2, "target_modules": ["q_proj"]}, gradient_checkpointing=True)
    assert gc.lm.get_input_embeddings()(torch.tensor([[1, 2]])).requires_grad
    assert not m.lm.get_input_embeddings()(torch.tensor([[1, 2]])).requires_grad


def test_a_sliding_window_model_trains_without_shared_prefixes(tiny_model_dir, monkeypatch, caplog):
    import transformers

    load = transformers.AutoModelForCausalLM.from_pretrained

    def sliding(*a, **kw):
        lm = load(*a, **kw)
        lm.config.use_sliding_window = True
        return lm

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", sliding)
    with caplog.at_level(logging.WARNING, logger="rllib_r3l.learner.rl_module"):
        m = module(share_prefixes=True)
    assert m.share_prefixes is False
    assert ours(caplog) == [
        "share_prefixes off: the model has sliding-window attention layers (a cache would "
        "drop their window's edge); every sequence runs on its own"
    ]


def test_lora_adapts_every_linear_layer_by_default(tiny_model_dir):
    pytest.importorskip("peft")
    from peft.tuners.lora import LoraLayer

    m = module(lora={"r": 2})
    adapted = {name.rsplit(".", 1)[-1] for name, mod in m.lm.named_modules() if isinstance(mod, LoraLayer)}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


# ------------------------------------------------------------------------------ log-probs
def _reference(lm, ids, attention, loss_mask):
    """log p(ids[t] | ids[:t]) of the credited positions, from a full forward with the mask."""
    with torch.no_grad():
        logits = lm(input_ids=ids, attention_mask=attention).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    return lp[loss_mask[:, 1:] > 0]


def _batch(vocab, left_padded=False):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, vocab, (2, 6), generator=g)
    att = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    loss = torch.tensor([[0, 0, 1, 1, 0, 1], [0, 1, 1, 1, 0, 0]], dtype=torch.float32)
    if left_padded:
        att = att.flip(1)
        loss = torch.tensor([[0, 0, 1, 1, 0, 1], [0, 0, 0, 1, 1, 1]], dtype=torch.float32)
    ids = ids * att  # padding id 0
    return {"input_ids": ids, "attention_mask": att, "loss_mask": loss}


@pytest.mark.parametrize("left_padded", [False, True])
def test_token_logprobs_are_the_credited_positions_of_a_full_forward(plain, left_padded):
    b = _batch(plain.lm.config.vocab_size, left_padded)
    with torch.no_grad():
        out = plain.token_logprobs(b)
    assert torch.equal(out["selection"], b["loss_mask"][:, 1:] > 0)
    assert out["logprobs"].shape == (int(b["loss_mask"][:, 1:].sum()),) and out["logprobs"].dtype == torch.float32
    want = _reference(plain.lm, b["input_ids"], b["attention_mask"], b["loss_mask"])
    torch.testing.assert_close(out["logprobs"], want, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        for fwd in (plain._forward, plain._forward_train):
            torch.testing.assert_close(fwd(b)["logprobs"], want, atol=1e-5, rtol=1e-5)


def test_token_logprobs_with_shared_prefixes_equal_the_plain_ones(plain):
    shared = module(share_prefixes=True)
    shared.lm.load_state_dict(plain.lm.state_dict())
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 3, 0], [5, 6, 0, 0, 0]])
    b = {
        "input_ids": ids,
        "attention_mask": (ids > 0).long(),
        "loss_mask": torch.tensor([[0, 1, 1, 1, 1], [0, 0, 1, 1, 0], [0, 1, 0, 0, 0]], dtype=torch.float32),
    }
    calls = []
    decoder = shared.lm.get_decoder()
    hook = decoder.register_forward_hook(
        lambda mod, args, kw, out: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        with torch.no_grad():
            got = shared.token_logprobs(b)["logprobs"]
            want = plain.token_logprobs(b)["logprobs"]
    finally:
        hook.remove()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the trie's nodes [5 6] -> [7] -> {[8 9], [3]}: every token once, the two leaves under [7] as
    # one batch padded to 2 (4 positions and one call cheaper than 3 positions in two calls)
    assert calls == [(1, 2), (1, 1), (2, 2)]
    # a batch that is not right-padded runs as a whole (no trie), with its mask
    lb = _batch(plain.lm.config.vocab_size, left_padded=True)
    with torch.no_grad():
        torch.testing.assert_close(
            shared.token_logprobs(lb)["logprobs"], plain.token_logprobs(lb)["logprobs"], atol=1e-5, rtol=1e-5
        )


def test_a_shim_without_the_option_runs_the_plain_forward(plain):
    """token_logprobs on a bare object holding the LM (the learner's KL reference does this): one
    decoder call for the whole batch, no prefix trie."""
    shim = types.SimpleNamespace(lm=plain.lm)
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 0]])
    b = {
        "input_ids": ids,
        "attention_mask": (ids > 0).long(),
        "loss_mask": torch.tensor([[0, 1, 1, 1], [0, 0, 1, 0]], dtype=torch.float32),
    }
    calls = []
    hook = plain.lm.get_decoder().register_forward_hook(lambda *a: calls.append(1))
    try:
        with torch.no_grad():
            got = R3LCausalLMModule.token_logprobs(shim, b)["logprobs"]
    finally:
        hook.remove()
    assert calls == [1]
    torch.testing.assert_close(
        got, _reference(plain.lm, ids, b["attention_mask"], b["loss_mask"]), atol=1e-5, rtol=1e-5
    )


def test_shared_prefix_hidden_of_empty_rows_is_zeros(plain):
    from rllib_r3l.learner.rl_module import shared_prefix_hidden

    decoder = plain.lm.get_decoder()
    ids = torch.tensor([[5, 6, 7], [0, 0, 0]])
    hidden_size = plain.lm.config.hidden_size
    with torch.no_grad():
        out = shared_prefix_hidden(decoder, ids, [3, 0])
        want = decoder(input_ids=ids[:1]).last_hidden_state[0]
    assert out.shape == (2, 3, hidden_size) and out.dtype == torch.float32
    torch.testing.assert_close(out[0], want, atol=1e-5, rtol=1e-5)
    assert torch.count_nonzero(out[1]) == 0
    with torch.no_grad():
        none = shared_prefix_hidden(decoder, ids, [0, 0])  # no token at all: nothing to run
    assert none.shape == (2, 3, 1) and none.dtype == torch.float32 and torch.count_nonzero(none) == 0


# ---------------------------------------------------------------------------------- state
def test_state_out_and_in(plain):
    state = plain.get_state()
    assert state.keys() == plain.state_dict().keys() and all(k.startswith("lm.") for k in state)
    assert all(not v.requires_grad and v.device.type == "cpu" for v in state.values())
    assert plain.get_state(inference_only=True).keys() == state.keys()  # no LoRA: the full state
    hf = plain.hf_state_dict()
    assert set(hf) == {k[3:] for k in state} and all(not v.requires_grad for v in hf.values())
    other = module()
    key = "lm.model.norm.weight"
    new = {key: np.full(tuple(state[key].shape), 0.5, dtype=np.float32), "lm.not_a_parameter": np.zeros(1)}
    other.set_state(new)  # numpy in, unknown keys ignored
    assert torch.equal(other.state_dict()[key], torch.full_like(state[key], 0.5))


def test_lora_state_for_the_engines_is_the_merged_adapted_layers(tiny_model_dir):
    pytest.importorskip("peft")
    from rllib_r3l.learner.engine_state import lora_engine_state

    m = module(lora={"r": 2, "target_modules": ["q_proj"]})
    got = m.get_state(inference_only=True)
    want = lora_engine_state(m.lm)
    assert got.keys() == {"lm." + k for k in want} and got
    assert all(torch.equal(got["lm." + k], v) for k, v in want.items())
    assert any("lora_" in k for k in m.get_state())  # the full state keeps the adapters


# ---------------------------------------------------------------------------- pure helpers
def test_strip_and_hf_names():
    assert _strip("lm.", "lm.model.x") == "model.x" and _strip("lm.", "model.lm.x") == "model.lm.x"
    named = hf_named_tensors({"lm.a.weight": np.ones(2, dtype=np.float32), "b": torch.zeros(1)})
    assert [n for n, _ in named] == ["a.weight", "b"]
    assert all(isinstance(t, torch.Tensor) for _, t in named) and named[0][1].tolist() == [1.0, 1.0]


def test_prefix_sharing_unsupported_reasons():
    plain_cfg = types.SimpleNamespace(layer_types=["full_attention"], use_sliding_window=False)
    assert prefix_sharing_unsupported(plain_cfg, False) is None
    assert prefix_sharing_unsupported(types.SimpleNamespace(), False) is None
    assert prefix_sharing_unsupported(types.SimpleNamespace(layer_types=None), False) is None
    assert prefix_sharing_unsupported(plain_cfg, True) == "gradient checkpointing recomputes without a KV cache"
    sliding = "the model has sliding-window attention layers (a cache would drop their window's edge)"
    assert prefix_sharing_unsupported(types.SimpleNamespace(layer_types=["sliding_attention"]), False) == sliding
    assert prefix_sharing_unsupported(types.SimpleNamespace(layer_types=[], use_sliding_window=True), False) == sliding


def test_right_padded_edges():
    assert right_padded(torch.ones(2, 3, dtype=torch.bool))
    assert right_padded(torch.tensor([[1, 0, 0]]))
    assert not right_padded(torch.tensor([[1, 1], [0, 0]]))  # an empty row is not right-padded
    assert not right_padded(torch.tensor([[1, 0, 1, 0]]))
