"""Exact shared-prefix training (issue 12): each shared prefix runs once, the gradient is unchanged."""

from __future__ import annotations

import pytest
import torch

from rllib_r3l.learner.prefix_tree import (
    build_prefix_tree,
    children_of,
    computed_tokens,
    leaf_batches,
    plan_shared_micro_batches,
    tokens_split_by_cuts,
    trie_tokens,
)


def _rebuild(seqs, nodes, path):
    return [t for j in path for t in seqs[nodes[j].row][nodes[j].start : nodes[j].end]]


def test_prefix_tree_hand_values():
    seqs = [[1, 2, 3, 4], [1, 2, 3, 5, 6], [1, 2, 7], [9, 9], [1, 2, 3, 4]]
    nodes, paths = build_prefix_tree(seqs)
    # [1 2] -> [3] -> {[4], [5 6]}, [1 2] -> [7], and [9 9]: 2 + 1 + 1 + 2 + 1 + 2 tokens
    assert sorted(sum(([t for t in seqs[n.row][n.start : n.end]],), []) for n in nodes) == sorted(
        [[1, 2], [3], [4], [5, 6], [7], [9, 9]]
    )
    assert trie_tokens(seqs) == 9 and sum(len(s) for s in seqs) == 18
    for i, s in enumerate(seqs):
        assert _rebuild(seqs, nodes, paths[i]) == s
        assert [nodes[j].parent for j in paths[i]] == [-1] + paths[i][:-1]  # a path runs root -> leaf
    assert paths[0] == paths[4]  # identical rows share one path
    for j, n in enumerate(nodes):
        assert n.parent < j  # parents come first (the order the forward pass needs)
    # the schedule: [1 2] and [3] have children and run alone; each parent's leaves run as one batch
    text = {j: tuple(seqs[n.row][n.start : n.end]) for j, n in enumerate(nodes)}
    named = {
        text.get(p): ([[text[j] for j in b] for b in batches], [text[j] for j in inner])
        for p, (batches, inner) in children_of(nodes).items()
    }
    assert named == {None: ([[(9, 9)]], [(1, 2)]), (1, 2): ([[(7,)]], [(3,)]), (3,): ([[(4,), (5, 6)]], [])}
    # computed: [9 9] 2, [1 2] 2, [7] 1, [3] 1, and [4] / [5 6] padded to 2: 2 * 2
    assert computed_tokens(seqs) == 2 + 2 + 1 + 1 + 2 * 2


def test_leaf_batches_trade_padding_against_calls():
    # one batch of 4 costs 4 * 101 + 64 = 468; by length in two, 2 * 12 + 64 + 2 * 101 + 64 = 354;
    # one call each, 223 + 4 * 64 = 479
    assert leaf_batches([100, 10, 101, 12]) == [[1, 3], [0, 2]]
    assert leaf_batches([100, 10, 101, 12], call_tokens=10_000) == [[1, 3, 0, 2]]
    assert leaf_batches([100, 10, 101, 12], call_tokens=0) == [[1], [3], [0], [2]]
    assert leaf_batches([5]) == [[0]] and leaf_batches([]) == []
    g = torch.Generator().manual_seed(1)
    for _ in range(20):  # every leaf exactly once, each batch a run of the sorted lengths
        lengths = torch.randint(1, 700, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
        batches = leaf_batches(lengths)
        assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
        flat = [lengths[i] for b in batches for i in b]
        assert flat == sorted(lengths)


def test_prefix_tree_on_random_batches_reconstructs_every_row():
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        base = torch.randint(0, 4, (12,), generator=g).tolist()
        seqs = [
            base[: int(torch.randint(1, 12, (1,), generator=g))]
            + torch.randint(0, 4, (int(torch.randint(0, 6, (1,), generator=g)),), generator=g).tolist()
            for _ in range(int(torch.randint(1, 7, (1,), generator=g)))
        ]
        nodes, paths = build_prefix_tree(seqs)
        assert all(_rebuild(seqs, nodes, p) == s for p, s in zip(paths, seqs))
        assert trie_tokens(seqs) <= sum(len(s) for s in seqs)


def test_plan_shared_micro_batches_keeps_shared_prefixes_together():
    a, a_retry, b, b_retry = [5, 1, 1, 1, 2], [5, 1, 1, 1, 3, 3], [7, 2, 2], [7, 2, 4]
    seqs = [a, b, a_retry, b_retry]
    # token order puts each retry beside its base; 2 rows each
    assert plan_shared_micro_batches(seqs, max_sequences=2) == [[0, 2], [1, 3]]
    # trie budget 7: a (5) + a_retry (+2) fits, b would add 3
    assert plan_shared_micro_batches(seqs, max_sequences=4, max_tokens=7) == [[0, 2], [1, 3]]
    assert plan_shared_micro_batches(seqs, max_sequences=4, max_tokens=10) == [[0, 2, 1], [3]]
    assert plan_shared_micro_batches([[1] * 20, [2]], max_sequences=4, max_tokens=5) == [[0], [1]]
    with pytest.raises(ValueError, match="max_sequences"):
        plan_shared_micro_batches(seqs, max_sequences=0)


def test_tokens_split_by_cuts_counts_the_prefix_each_cut_computes_again():
    a, a_retry, a_other, b = [5, 1, 1, 1, 2], [5, 1, 1, 1, 3, 3], [5, 1, 9], [7, 2, 2]
    seqs = [a, a_retry, a_other, b]
    # token order: (5,1,1,1,2) < (5,1,1,1,3,3) < (5,1,9) < (7,2,2), the given order
    assert plan_shared_micro_batches(seqs, max_sequences=1) == [[0], [1], [2], [3]]
    # cuts: a | a_retry share 4, a_retry | a_other share 2, a_other | b share 0
    assert tokens_split_by_cuts(seqs, [[0], [1], [2], [3]]) == 4 + 2 + 0
    # together, the trie is the sum of the parts minus exactly those prefixes
    parts = sum(trie_tokens([seqs[i]]) for i in range(4))
    assert trie_tokens(seqs) == parts - 6
    assert tokens_split_by_cuts(seqs, [[0, 1], [2, 3]]) == 2
    assert tokens_split_by_cuts(seqs, [[0, 1, 2, 3]]) == 0 and tokens_split_by_cuts(seqs, []) == 0
    # the planner's budget is what cuts the retry from its base: trie tokens 5 + 2 > 6
    plan = plan_shared_micro_batches(seqs, max_sequences=4, max_tokens=6)
    assert plan[0] == [0] and tokens_split_by_cuts(seqs, plan) >= 4


@pytest.fixture(params=["cascade", "short_masked"])
def attention_path(request, monkeypatch):
    """Run a model-level test both ways a continuation attends to its cache on CPU: cascade
    attention for every call (threshold 0), and the default threshold, under which these short
    test rows take transformers' masked SDPA (rllib_r3l.learner.cascade_attention.CASCADE_MIN_KEYS)."""
    if request.param == "cascade":
        monkeypatch.setattr("rllib_r3l.learner.cascade_attention.CASCADE_MIN_KEYS", 0)
    return request.param


def _shared_batch(vocab: int, with_prefix_credit: bool):
    """Two groups: a base and its retry sharing 40 tokens, a third item sharing the task prompt
    (12 tokens), and an unrelated item; credited suffixes (and, without pivotal credit, a credited
    shared span), right-padded."""
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(1, vocab, (12,), generator=g).tolist()
    base = prompt + torch.randint(1, vocab, (40,), generator=g).tolist()
    rows = [
        base,
        base[:40] + torch.randint(1, vocab, (17,), generator=g).tolist(),
        prompt + torch.randint(1, vocab, (25,), generator=g).tolist(),
        torch.randint(1, vocab, (30,), generator=g).tolist(),
    ]
    B, T = len(rows), max(len(r) for r in rows)
    ids = torch.zeros(B, T, dtype=torch.long)
    att = torch.zeros(B, T, dtype=torch.long)
    loss = torch.zeros(B, T)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        att[i, : len(r)] = 1
        loss[i, len(r) - 6 : len(r)] = 1.0
        if with_prefix_credit and i < 2:
            loss[i, 20:26] = 1.0  # inside the shared span: credited in both rows
    return {
        "input_ids": ids,
        "attention_mask": att,
        "loss_mask": loss,
        "sampler_logprobs": torch.zeros(B, T),
        "advantages": torch.tensor([1.0, -0.5, 0.25, -1.0]),
        "weights": torch.tensor([1.0, 1.0, 3.0, 1.0]),
        "on_policy": torch.ones(B),
        "num_loss_tokens": loss.sum(1),
    }


@pytest.mark.usefixtures("attention_path")
def test_shared_hidden_states_equal_the_unshared_ones(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rllib_r3l.learner.rl_module import shared_prefix_hidden

    lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    b = _shared_batch(lm.config.vocab_size, with_prefix_credit=False)
    with torch.no_grad():
        plain = lm.get_decoder()(input_ids=b["input_ids"]).last_hidden_state
        shared = shared_prefix_hidden(lm.get_decoder(), b["input_ids"], b["attention_mask"].sum(1).tolist())
    m = b["attention_mask"].bool()
    torch.testing.assert_close(shared[m], plain[m], atol=1e-5, rtol=1e-5)
    assert torch.all(shared[~m] == 0)


@pytest.mark.usefixtures("attention_path")
def test_shared_hidden_states_with_prefix_rows_duplicates_and_unrelated_rows(tiny_model_dir):
    """A row that ends where others go on (a base and its transcript reflection), identical rows,
    leaves of different lengths under one parent, and two unrelated rows batched at the root."""
    from transformers import AutoModelForCausalLM

    from rllib_r3l.learner.rl_module import shared_prefix_hidden

    lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(5)

    def r(n):
        return torch.randint(1, lm.config.vocab_size, (n,), generator=g).tolist()

    p, x = r(20), r(9)
    rows = [p + x, p, p + x, p + r(3), r(14), r(6)]
    T = max(len(row) for row in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    lengths = [len(row) for row in rows]
    with torch.no_grad():
        shared = shared_prefix_hidden(lm.get_decoder(), ids, lengths)
        for i, row in enumerate(rows):
            alone = lm.get_decoder()(input_ids=torch.tensor([row])).last_hidden_state[0]
            torch.testing.assert_close(shared[i, : len(row)], alone, atol=1e-5, rtol=1e-5)
            assert torch.all(shared[i, len(row) :] == 0)


def _grads(learner, batch):
    from tests.scripted_rllib import grads_after_update as _grads_after_update

    return _grads_after_update(learner, batch)


def _rel_err(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.slow
@pytest.mark.usefixtures("attention_path")
@pytest.mark.parametrize("with_prefix_credit", [False, True])
def test_shared_prefix_gradient_equals_unshared_tiny(tiny_model_dir, with_prefix_credit):
    from tests.scripted_rllib import build_learner as _learner

    off = _learner(micro_batch_size=4, mixed_precision="none", share_prefixes=False)
    on = _learner(micro_batch_size=4, mixed_precision="none", share_prefixes=True)
    assert on.shares_prefixes("default_policy") and not off.shares_prefixes("default_policy")
    batch = _shared_batch(off.module["default_policy"].lm.config.vocab_size, with_prefix_credit)
    g_off, g_on = _grads(off, batch), _grads(on, batch)
    assert g_off.abs().sum() > 0
    assert _rel_err(g_on, g_off) <= 1e-5
    m_on = {k: float(v) for k, v in on.metrics.reduce()["r3l"]["learner"].items()}
    # 4 rows of 52 + 57 + 37 + 30 tokens. Computed: the task prompt (12) once, the base/retry span
    # after it (28) once, the third row's 25 after the prompt, the base's and the retry's own 12 and
    # 17 as one batch padded to 17, and the unrelated row's 30
    assert m_on["forward_tokens"] == 12 + 28 + 25 + 2 * 17 + 30
    assert m_on["shared_prefix_tokens_saved"] == 52 + 57 + 37 + 30 - (12 + 28 + 25 + 2 * 17 + 30)


@pytest.mark.slow
@pytest.mark.usefixtures("attention_path")
def test_kl_reference_shares_prefixes_too_with_the_same_gradient(tiny_model_dir):
    """GRPO's KL to a frozen reference (kl_coef > 0): the reference forward shares prefixes like
    the policy's, and the gradient, KL term included, equals the unshared one."""
    from tests.scripted_rllib import build_learner as _learner

    batch = _shared_batch(4096, with_prefix_credit=True)
    grads, kls = {}, {}
    for share in (False, True):
        lrn = _learner(micro_batch_size=4, mixed_precision="none", share_prefixes=share, kl_coef=0.5, kl_estimator="k3")
        with torch.no_grad():  # move the reference off the policy (both start from the same weights)
            for p in lrn._ref_model.parameters():
                p.mul_(0.9)
        mbs = lrn.micro_batches(batch, share_prefixes=share)
        ref = [lrn._ref_logprobs(mb, share_prefixes=share) for mb in mbs]
        assert all(torch.isfinite(r).all() for r in ref)
        grads[share] = _grads(lrn, batch)
        kls[share] = float(lrn.metrics.reduce()["r3l"]["learner"]["kl"])
    assert (
        kls[True] == pytest.approx(kls[False], rel=1e-4) and kls[True] > 1e-4
    )  # a small difference of logs: fp32 noise
    assert _rel_err(grads[True], grads[False]) <= 1e-5
    no_kl = _grads(_learner(micro_batch_size=4, mixed_precision="none", share_prefixes=True), batch)
    assert _rel_err(no_kl, grads[True]) > 1e-3  # the KL term is in the gradient


@pytest.mark.slow
@pytest.mark.usefixtures("attention_path")
def test_shared_prefix_gradient_with_micro_batches_and_autocast(tiny_model_dir):
    from tests.scripted_rllib import build_learner as _learner

    batch = _shared_batch(4096, with_prefix_credit=True)
    # two rows per micro-batch: token order keeps base and retry together
    off = _learner(micro_batch_size=2, mixed_precision="none", share_prefixes=False)
    on = _learner(micro_batch_size=2, mixed_precision="none", share_prefixes=True)
    assert _rel_err(_grads(on, batch), _grads(off, batch)) <= 1e-5
    b16_off = _learner(micro_batch_size=2, mixed_precision="bfloat16", share_prefixes=False)
    b16_on = _learner(micro_batch_size=2, mixed_precision="bfloat16", share_prefixes=True)
    cos = torch.nn.functional.cosine_similarity(_grads(b16_on, batch), _grads(b16_off, batch), dim=0)
    assert cos > 0.99, float(cos)


def test_prefix_sharing_falls_back_with_a_reason(tiny_model_dir, caplog):
    from tests.scripted_rllib import build_learner as _learner

    with caplog.at_level("WARNING"):
        learner = _learner(share_prefixes=True, gradient_checkpointing=True)
    assert not learner.shares_prefixes("default_policy")
    assert "share_prefixes off: gradient checkpointing" in caplog.text
    from rllib_r3l.learner.rl_module import prefix_sharing_unsupported

    cfg = type("Cfg", (), {"layer_types": ["sliding_attention", "full_attention"]})()
    assert "sliding-window" in prefix_sharing_unsupported(cfg, False)


@pytest.mark.usefixtures("attention_path")
@pytest.mark.slow
def test_shared_prefix_gradient_equals_unshared_real_model():
    """SmolLM2-135M-Instruct (the default model), fp32: relative gradient error <= 1e-5."""
    import gymnasium as gym
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_r3l import R3LConfig

    def build(share):
        cfg = R3LConfig().training(
            backend="transformers",
            lr=1e-3,
            weight_decay=0.0,
            micro_batch_size=4,
            mixed_precision="none",
            share_prefixes=share,
        )
        space = (gym.spaces.Text(max_length=8), gym.spaces.Text(max_length=8))
        learner = cfg.build_learner(env=None, spaces={"__env__": space, DEFAULT_MODULE_ID: space})
        learner.build()
        return learner

    off = build(False)
    batch = _shared_batch(off.module["default_policy"].lm.config.vocab_size, with_prefix_credit=True)
    g_off = _grads(off, batch)
    del off
    assert _rel_err(_grads(build(True), batch), g_off) <= 1e-5
