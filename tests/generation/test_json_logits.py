"""JSON-schema decoding in the transformers backend, on the tiny model and the real SmolLM2 tokenizer:
the fast masks equal a brute-force check of every token, and the backend samples only inside the
schema with the log-probs of the renormalised distribution."""

from __future__ import annotations

import json

import pytest
import torch

from rllib_r3l.generation.base import GenerationRequest
from rllib_r3l.generation.hf_backend import HFBackend
from rllib_r3l.generation.json_grammar import compile_schema
from rllib_r3l.generation.json_logits import JsonRow, TokenGrammar, TokenTexts
from rllib_r3l.models import load_causal_lm
from rllib_r3l.runner.reflection.reflect import ParseStatus, parse_report, report_json_schema

SCHEMA = report_json_schema(3, failed=True, max_chars=24)


@pytest.fixture(scope="module")
def texts(tiny_tokenizer):
    return TokenTexts(tiny_tokenizer)


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    return HFBackend(tiny_model_dir, dtype="float32", seed=0)


@pytest.fixture(scope="module")
def prompt(tiny_tokenizer):
    msgs = [{"role": "user", "content": "Review the attempt and answer with the JSON report."}]
    return tiny_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)


def test_token_texts_leave_out_what_is_not_text(texts, tiny_tokenizer):
    for special in tiny_tokenizer.all_special_ids:
        assert texts.text[special] is None
    partial = [i for i in range(len(tiny_tokenizer)) if "\ufffd" in tiny_tokenizer.decode([i])]
    assert partial and all(texts.text[i] is None for i in partial)  # part of a UTF-8 character
    space_the = tiny_tokenizer.encode(" the", add_special_tokens=False)
    assert len(space_the) == 1 and texts.text[space_the[0]] == " the"  # the leading space kept
    assert int(texts.plain_len[space_the[0]]) == 4
    quote = tiny_tokenizer.encode('",', add_special_tokens=False)
    assert len(quote) == 1 and int(texts.plain_len[quote[0]]) == 0  # not plain: walked per state


@pytest.mark.parametrize(
    "prefix",
    [
        '',
        '{',
        '{"summary": ',
        '{"summary":"ab',
        '{"summary":"' + "x" * 23,
        '{"summary":"a\\',
        '{"summary":"a\\u00',
        '{"summary":"' + "x" * 24,
        '{"summary":"a","root_cause":"b","outcome":"fail',
        '{"summary":"a","root_cause":"b","outcome":"failure","suggestion":"x","retry_from_step": 2',
    ],
)
def test_masks_equal_a_brute_force_check_of_every_token(texts, prefix):
    g = compile_schema(SCHEMA)
    state = g.step_text(g.start, prefix)
    assert state is not None
    tg = TokenGrammar(g, texts, stop_token_ids=[0, 2])
    brute = [i for i, t in enumerate(texts.text) if t is not None and g.step_text(state, t) is not None]
    assert tg.allowed(state) == brute
    assert len(brute) > 0


def test_stop_only_once_the_object_is_closed(texts):
    g = compile_schema(SCHEMA)
    tg = TokenGrammar(g, texts, stop_token_ids=[0, 2])
    done = g.step_text(
        g.start,
        json.dumps({"summary": "a", "root_cause": "b", "outcome": "failure", "suggestion": "c", "retry_from_step": 1}),
    )
    assert tg.allowed(done) == [0, 2]
    assert not {0, 2} & set(tg.allowed(g.step_text(g.start, '{"summary":"a"')))


def ref_masked_logprobs(model, texts, prompt, out_ids, temperature, stop_ids):
    """Each generated token's log-prob under an independent forward, masked to the tokens the grammar
    allows at that point (brute force over the vocabulary) and renormalised."""
    g = compile_schema(SCHEMA)
    tg = TokenGrammar(g, texts, stop_token_ids=stop_ids)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(prompt) + list(out_ids)])).logits[0].float()
    row, lps = JsonRow(tg), []
    for k, tok in enumerate(out_ids):
        allowed = tg.allowed(row.state)
        assert tok in allowed
        lp = torch.log_softmax(logits[len(prompt) - 1 + k][allowed] / temperature, -1)
        lps.append(lp[allowed.index(tok)].item())
        row.advance(tok)
    return lps


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_reports_are_valid_and_logprobs_those_sampled_from(backend, tiny_model_dir, texts, prompt, temperature):
    """The random tiny model writes no JSON on its own (the free row); held to the schema every report
    closes within the budget and parses VALID, and each log-prob is the renormalised masked one (T=0:
    greedy, the T=1 log-probs of the masked logits)."""
    reqs = [GenerationRequest(list(prompt), 160, json_schema=SCHEMA) for _ in range(3)]
    free, *outs = backend.generate([GenerationRequest(list(prompt), 60)] + reqs, temperature=temperature, seed=3)
    assert parse_report(free.text, 3).status is not ParseStatus.VALID
    model = load_causal_lm(tiny_model_dir, dtype="float32")
    for out in outs:
        assert out.finish_reason == "stop" and out.token_ids[-1] in backend.stop_token_ids, out.text
        assert parse_report(out.text, 3).status is ParseStatus.VALID, out.text
        ref = ref_masked_logprobs(model, texts, prompt, out.token_ids, temperature or 1.0, backend.stop_token_ids)
        assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(ref), atol=1e-4, rtol=0)


def test_a_schema_outside_the_subset_is_refused_by_generate(backend, prompt):
    from rllib_r3l.generation.json_grammar import SchemaNotSupported

    schema = {"type": "object", "properties": {"a": {"type": "string", "format": "date"}}, "required": ["a"]}
    with pytest.raises(SchemaNotSupported, match="keyword 'format' at properties/a"):
        backend.generate([GenerationRequest(list(prompt), 4, json_schema=schema)], temperature=1.0)
