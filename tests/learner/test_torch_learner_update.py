"""``R3LTorchLearner``'s own code with hand values, fast: the loss of a micro-batch (importance
ratio on base rows only, weights, loss scale, KL, the log-prob gap sums), micro-batch cutting, and
one ``_update`` (accumulation over micro-batches normalised by the whole batch, skipped empty
micro-batches, token accounting, NaN/inf skips, the logged metrics).

No Ray runtime and no language model: the learner is built without RLlib's machinery
(``StubLearner``: the RLlib parts it would inherit, gradient post-processing and the optimizer
step, are replaced by a plain SGD step) around a bigram table, whose log-probs and gradients are
computed by hand. The same behaviours on the real learner with the tiny model:
``tests/learner/test_torch_learner_loss.py``.
"""

from __future__ import annotations

import math
import types

import pytest
import torch

from rllib_r3l import R3LConfig
from rllib_r3l.learner.torch_learner import R3LTorchLearner
from rllib_r3l.reliability.learner_faults import FaultInjectingLearner
from rllib_r3l.trajectory import KINDS, Kind

MID = "default_policy"
V = 4  # the bigram table's vocabulary
L = math.log(V)  # -log p of every token under a zero table


class Metrics:
    """Records ``log_value`` calls: key -> (value, reduce, window); a key logged twice is an error."""

    def __init__(self):
        self.logged = {}

    def log_value(self, key, value, reduce=None, window=None, **kw):  # RLlib's defaults
        assert key not in self.logged, key
        self.logged[key] = (value, reduce, window)

    def learner(self, name):
        return self.logged[("r3l", "learner", name)]


class Bigram(torch.nn.Module):
    """p(next | previous) = softmax(table[previous]); forward_train as the RLModule's: the log-probs
    of the credited positions, flattened, and the selection."""

    def __init__(self, share_prefixes=False):
        super().__init__()
        self.table = torch.nn.Parameter(torch.zeros(V, V))
        self.share_prefixes = share_prefixes
        self.seen = []  # the micro-batches it ran

    def forward_train(self, batch):
        self.seen.append(batch["input_ids"].tolist())
        ids = batch["input_ids"]
        sel = batch["loss_mask"][:, 1:] > 0
        logp = torch.log_softmax(self.table[ids[:, :-1]], -1).gather(-1, ids[:, 1:, None])[..., 0]
        return {"logprobs": logp[sel], "selection": sel}


class StubLearner(R3LTorchLearner):
    def __init__(self, module=None, **training):
        opts = dict(micro_batch_size=1, micro_batch_tokens=None, mixed_precision="none", num_threads=1)
        opts.update(training)
        self.config = R3LConfig().training(**opts)
        self._module = {MID: module if module is not None else Bigram()}
        self.metrics = Metrics()
        self._device = None
        self._params = {"table": self._module[MID].table}
        self.sgd = torch.optim.SGD([self._module[MID].table], lr=1.0)
        self._optimizer_parameters = {self.sgd: ["table"]}
        self.applied = None
        self._updates = self._skipped = 0  # what build() sets after RLlib's own build
        self._reset_step_stats()

    def postprocess_gradients(self, grads):
        return grads

    def apply_gradients(self, grads):
        self.applied = {k: g.clone() for k, g in grads.items()}
        self.sgd.step()


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def batch3(**over):
    """row 0: 3 tokens, 2 credited, A=1, base; row 1: 4 tokens, the last credited, A=-0.5, weight
    0.5, an auxiliary item; row 2: 2 tokens, none credited. 3 credited tokens in all."""
    b = {
        "input_ids": torch.tensor([[1, 2, 3, 0], [1, 2, 1, 2], [3, 1, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]]),
        "loss_mask": torch.tensor([[0, 1, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]], dtype=torch.float32),
        "advantages": torch.tensor([1.0, -0.5, 2.0]),
        "weights": torch.tensor([1.0, 0.5, 1.0]),
        "on_policy": torch.tensor([1.0, 0.0, 1.0]),
        "num_loss_tokens": torch.tensor([2.0, 1.0, 0.0]),
    }
    b.update(over)
    return b


def hand_gradient(scale=1.0):
    """d loss / d table: a credited token (a -> b) with dloss/dlogp = c adds c (e_b - 1/V) to row a.
    Row 0's tokens 1->2 and 2->3 have c = -A w / N = -1/3; row 1's 1->2 has c = 0.5 * 0.5 / 3."""
    g = torch.zeros(V, V)
    for a, b, c in ((1, 2, -1 / 3), (2, 3, -1 / 3), (1, 2, 1 / 12)):
        g[a] += c * (torch.nn.functional.one_hot(torch.tensor(b), V).float() - 1 / V)
    return g * scale


# ------------------------------------------------------------------------------ one update
@pytest.mark.parametrize("micro_batch_size", [1, 3])
def test_update_accumulates_the_whole_batch_token_mean(micro_batch_size):
    lrn = StubLearner(micro_batch_size=micro_batch_size)
    torch.set_num_threads(2)
    _, losses, _ = lrn._update({MID: batch3()})
    assert torch.get_num_threads() == 1  # the configured learner threads
    # loss: sum of w (-A log p) / 3 = (2 L - 0.25 L) / 3, whatever the micro-batching
    assert float(losses[MID]) == pytest.approx(1.75 * L / 3, rel=1e-6)
    torch.testing.assert_close(lrn.applied["table"], hand_gradient(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(lrn._module[MID].table.detach(), -hand_gradient(), rtol=1e-5, atol=1e-7)
    assert lrn._updates == 1 and lrn._skipped == 0
    m = lrn.metrics
    assert m.learner("pg_loss") == (pytest.approx(0.5 * L, rel=1e-6), "mean", 1)  # unweighted: (2L - 0.5L) / 3
    assert m.learner("trained_tokens") == (3, "sum", None)
    if micro_batch_size == 1:
        # longest first, the row without credited tokens never runs
        assert lrn._module[MID].seen == [[[1, 2, 1, 2]], [[1, 2, 3]]]
        assert m.learner("micro_batches") == (2, "sum", None) and m.learner("forward_tokens") == (7, "sum", None)
    else:
        assert lrn._module[MID].seen == [[[1, 2, 1, 2], [1, 2, 3, 0], [3, 1, 0, 0]]]
        assert m.learner("micro_batches") == (1, "sum", None) and m.learner("forward_tokens") == (12, "sum", None)
    assert m.learner("shared_prefix_tokens_saved") == (0, "sum", None)
    dt, reduce, window = m.learner("update_seconds")
    assert dt > 0 and (reduce, window) == ("mean", 1)
    assert m.learner("trained_tokens_per_s")[0] == pytest.approx(3 / dt, rel=1e-6)
    assert m.learner("forward_tokens_per_s")[0] == pytest.approx(m.learner("forward_tokens")[0] / dt, rel=1e-6)
    assert m.learner("trained_tokens_per_s")[1:] == m.learner("forward_tokens_per_s")[1:] == ("mean", 1)
    assert ("r3l", "faults", "nonfinite_updates_skipped") not in m.logged


def test_update_with_shared_prefixes_counts_the_trie():
    lrn = StubLearner(Bigram(share_prefixes=True), micro_batch_size=3)
    _, losses, _ = lrn._update({MID: batch3()})
    assert float(losses[MID]) == pytest.approx(1.75 * L / 3, rel=1e-6)
    torch.testing.assert_close(lrn.applied["table"], hand_gradient(), rtol=1e-5, atol=1e-7)
    # rows in token order (1,2,1,2) < (1,2,3) < (3,1); the trie holds 4 + 1 + 2 = 7 of the 9 tokens,
    # computed as the shared (1,2) once, its leaves (1,2) and (3,) as one batch padded to 2, and the
    # root leaf (3,1): 2 + 2 * 2 + 2 = 8
    assert lrn._module[MID].seen == [[[1, 2, 1, 2], [1, 2, 3, 0], [3, 1, 0, 0]]]
    assert lrn.metrics.learner("forward_tokens") == (8, "sum", None)
    assert lrn.metrics.learner("shared_prefix_tokens_saved") == (1, "sum", None)
    assert lrn.metrics.learner("shared_prefix_tokens_split") == (0, "sum", None)  # one micro-batch


def test_update_counts_the_shared_prefix_a_micro_batch_cut_splits():
    # one row a micro-batch: (1,2,1,2) and (1,2,3) share (1,2), computed in both; (3,1) carries no
    # credit and never runs, so its cut splits nothing
    lrn = StubLearner(Bigram(share_prefixes=True), micro_batch_size=1)
    _, losses, _ = lrn._update({MID: batch3()})
    assert float(losses[MID]) == pytest.approx(1.75 * L / 3, rel=1e-6)
    torch.testing.assert_close(lrn.applied["table"], hand_gradient(), rtol=1e-5, atol=1e-7)
    assert lrn.metrics.learner("micro_batches") == (2, "sum", None)
    assert lrn.metrics.learner("forward_tokens") == (7, "sum", None)
    assert lrn.metrics.learner("shared_prefix_tokens_split") == (2, "sum", None)


def test_an_update_without_credited_tokens_changes_nothing():
    zero = torch.zeros(3, 4)
    lrn = StubLearner(micro_batch_size=3)
    _, losses, _ = lrn._update({MID: batch3(loss_mask=zero, num_loss_tokens=torch.zeros(3))})
    assert float(losses[MID]) == 0.0 and lrn._module[MID].seen == []
    assert lrn.applied == {} and torch.equal(lrn._module[MID].table.detach(), torch.zeros(V, V))
    m = lrn.metrics
    assert m.learner("forward_tokens") == (0, "sum", None) and m.learner("shared_prefix_tokens_saved")[0] == 0
    assert m.learner("micro_batches")[0] == 0 and m.learner("trained_tokens")[0] == 0
    assert ("r3l", "learner", "pg_loss") not in m.logged  # no micro-batch ran: no loss statistics


class FaultyStub(StubLearner, FaultInjectingLearner):
    """The stub with the fault-injecting learner's hooks (what R3LConfig picks when a plan names them)."""


def _faulty(kind, **training):
    lrn = FaultyStub(**training)
    lrn.arm(types.SimpleNamespace(next=lambda: [kind]), [lrn._module[MID].table])
    return lrn


def test_r3l_s_own_learner_has_no_fault_code():
    """Fault injection lives in a subclass the config picks only for a plan with learner faults."""
    from rllib_r3l.reliability import faults

    assert R3LConfig().get_default_learner_class() is R3LTorchLearner
    picked = faults.inject(R3LConfig(), {"nan_grad_at_updates": [1]}).get_default_learner_class()
    assert picked is FaultInjectingLearner
    assert faults.inject(R3LConfig(), {"env_raise_at_steps": [0]}).get_default_learner_class() is R3LTorchLearner
    lrn = StubLearner()
    lrn._update({MID: batch3()})
    assert lrn.applied is not None and not any("injected" in k[-1] for k in lrn.metrics.logged)


@pytest.mark.parametrize("kind", ["nan_loss", "nan_grad"])
def test_a_nonfinite_loss_or_gradient_skips_the_step(kind):
    lrn = _faulty(kind)
    lrn._update({MID: batch3()})
    assert lrn.applied is None and lrn._skipped == 1 and lrn._updates == 0
    assert torch.equal(lrn._module[MID].table.detach(), torch.zeros(V, V))
    assert lrn._module[MID].table.grad is None  # the gradients are dropped too
    assert lrn.metrics.logged[("r3l", "faults", "nonfinite_updates_skipped")] == (1, "sum", None)
    assert lrn.metrics.logged[("r3l", "faults", f"injected_{kind}")] == (1, "sum", None)
    if kind == "nan_loss":  # the first micro-batch's loss is NaN: the rest do not run
        assert len(lrn._module[MID].seen) == 1


def test_a_nonfinite_update_is_applied_when_skipping_is_off():
    lrn = _faulty("nan_grad", skip_nonfinite_updates=False)
    lrn._update({MID: batch3()})
    assert lrn._updates == 1 and lrn._skipped == 0 and lrn.applied is not None
    # RLlib's rule for an update applied with non-finite gradients (which R3L applies itself, since
    # R3LConfig turns RLlib's per-tensor checks off): NaN -> 0, +inf -> the dtype's largest value
    assert float(lrn.applied["table"].view(-1)[0]) == torch.finfo(torch.float32).max
    assert bool(torch.isfinite(lrn.applied["table"]).all())


# -------------------------------------------------------------------------- micro-batches
def test_micro_batches_trim_padding_and_keep_row_columns():
    lrn = StubLearner(micro_batch_size=2)
    b = batch3(normalizer=3.0, extra=torch.zeros(5))
    mbs = lrn.micro_batches(b)
    assert [mb["input_ids"].tolist() for mb in mbs] == [[[1, 2, 1, 2], [1, 2, 3, 0]], [[3, 1]]]
    assert set(mbs[0]) == {
        "input_ids",
        "attention_mask",
        "loss_mask",
        "advantages",
        "weights",
        "on_policy",
        "num_loss_tokens",
    }  # per-row tensors only
    assert mbs[1]["advantages"].tolist() == [2.0] and mbs[0]["weights"].tolist() == [0.5, 1.0]
    assert mbs[1]["loss_mask"].shape == (1, 2)
    # a token budget: 2 rows of 4 padded tokens exceed 6
    assert [
        mb["input_ids"].shape[0] for mb in StubLearner(micro_batch_size=2, micro_batch_tokens=6).micro_batches(b)
    ] == [1, 2]
    shared = lrn.micro_batches(b, share_prefixes=True)  # token order
    assert [mb["input_ids"].tolist() for mb in shared] == [[[1, 2, 1, 2], [1, 2, 3, 0]], [[3, 1]]]
    # token budget of the trie: (1,2,1,2) + (1,2,3) is 5 trie tokens, over 4
    shared4 = StubLearner(micro_batch_size=2, micro_batch_tokens=4).micro_batches(b, share_prefixes=True)
    assert [mb["input_ids"].shape[0] for mb in shared4] == [1, 1, 1]


def test_shares_prefixes_asks_the_unwrapped_module():
    lrn = StubLearner(Bigram(share_prefixes=True))
    assert lrn.shares_prefixes(MID) is True
    inner = Bigram(share_prefixes=False)
    lrn._module[MID] = types.SimpleNamespace(share_prefixes=True, unwrapped=lambda: inner)
    assert lrn.shares_prefixes(MID) is False
    lrn._module[MID] = types.SimpleNamespace()
    assert lrn.shares_prefixes(MID) is False


def test_optimizer_is_adamw_with_the_configured_lr_and_decay():
    lrn = StubLearner(lr=3e-4, weight_decay=0.05)
    got = {}
    lrn.register_optimizer = lambda **kw: got.update(kw)
    lrn.configure_optimizers_for_module(MID)
    opt = got["optimizer"]
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["weight_decay"] == 0.05
    assert got["module_id"] == MID and got["lr_or_lr_schedule"] == 3e-4
    assert got["params"] == [lrn._module[MID].table] and opt.param_groups[0]["params"] == got["params"]
    assert opt.defaults["fused"] is True  # CPU float parameters: torch's fused kernel


def test_fused_adamw_only_where_torch_has_the_kernel():
    from rllib_r3l.learner.torch_learner import fused_adamw_supported

    assert fused_adamw_supported(
        [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))]
    )
    assert not fused_adamw_supported([torch.nn.Parameter(torch.zeros(2, device="meta"))])
    # the fused step is AdamW's step
    a, b = (torch.nn.Parameter(torch.linspace(-1, 1, 7)) for _ in range(2))
    for p in (a, b):
        p.grad = torch.linspace(0.5, -0.3, 7)
    torch.optim.AdamW([a], lr=0.1, weight_decay=0.01, fused=True).step()
    torch.optim.AdamW([b], lr=0.1, weight_decay=0.01).step()
    assert torch.allclose(a, b, atol=1e-7) and not torch.equal(a.detach(), torch.linspace(-1, 1, 7))


def test_rllibs_per_tensor_nan_checks_are_off_since_the_learner_checks_itself():
    from rllib_r3l import R3LConfig

    assert R3LConfig().torch_skip_nan_gradients is True
    assert R3LConfig().skip_nonfinite_updates is True


# ---------------------------------------------------------------------- the micro-batch loss
def _loss_batch():
    """3 rows, T=3; credited positions: row 0 at 1 and 2 (base, behaviour log-probs known), row 1
    at 2 (base, none known), row 2 at 1 (a retry). The whole batch has 4 credited tokens."""
    return {
        "advantages": torch.tensor([1.0, -1.0, 0.5]),
        "weights": torch.tensor([1.0, 0.5, 1.0]),
        "on_policy": torch.tensor([1.0, 1.0, 0.0]),
        "behaviour_logprobs": torch.tensor([[0.0, -1.5, -2.0], [0.0, 0.0, -9.0], [0.0, -9.0, 0.0]]),
        "has_behaviour_logprobs": torch.tensor([1.0, 0.0, 0.0]),
        "sampler_logprobs": torch.tensor([[0.0, -1.2, -2.5], [0.0, 0.0, -0.7], [0.0, -0.5, 0.0]]),
        "has_sampler_logprobs": torch.tensor([1.0, 1.0, 1.0]),
        "kind": torch.tensor([KINDS.index(Kind.BASE), KINDS.index(Kind.BASE), KINDS.index(Kind.RETRY)]),
        "normalizer": 4.0,
    }


SEL = torch.tensor([[True, True], [False, True], [True, False]])
LOGP = torch.tensor([-1.0, -2.0, -0.5, -0.25])  # row-major over SEL


def _loss(lrn, batch=None, logp=LOGP):
    return float(
        lrn.compute_loss_for_module(
            module_id=MID, config=lrn.config, batch=batch or _loss_batch(), fwd_out={"logprobs": logp, "selection": SEL}
        )
    )


def test_loss_with_the_importance_ratio_on_base_rows_with_behaviour_log_probs():
    lrn = StubLearner(use_importance_ratio=True, clip_ratio_low=0.2, clip_ratio_high=0.2, loss_scale=2.0)
    # row 0: ratios e^0.5 (clipped to 1.2) and 1 -> -1.2 A and -1.0 A; row 1 (no behaviour
    # log-probs) and row 2 (a retry): -A log p = -0.5 and 0.125, row 1 weighted 0.5
    assert _loss(lrn) == pytest.approx(2.0 * (-1.2 - 1.0 - 0.25 + 0.125) / 4, rel=1e-6)
    st = lrn._micro_stats[-1]
    assert st["pg_loss"] == pytest.approx((-1.2 - 1.0 - 0.5 + 0.125) / 4, rel=1e-6)
    assert st["clip_fraction"] == pytest.approx(0.5) and st["mean_ratio"] == pytest.approx((math.exp(0.5) + 1) / 2)
    assert st["logprob_sum"] == pytest.approx(-3.75)
    g = lrn._gap_stats
    assert g["ratio_tokens_without_behaviour_logprobs"] == 1.0  # row 1's base token
    # |learner - sampler| per kind: base 0.2 + 0.5 + 0.2, retry 0.25; |learner - behaviour|: base 0.5 + 0
    assert g["sampler_logprob_gap_base/sum"] == pytest.approx(0.9) and g["sampler_logprob_gap_base/n"] == 3
    assert g["sampler_logprob_gap_retry/sum"] == pytest.approx(0.25) and g["sampler_logprob_gap_retry/n"] == 1
    assert g["behaviour_logprob_gap_base/sum"] == pytest.approx(0.5) and g["behaviour_logprob_gap_base/n"] == 2
    assert "behaviour_logprob_gap_retry/sum" not in g


def test_log_prob_gaps_add_up_over_micro_batches_and_skip_unknown_log_probs():
    lrn = StubLearner()
    b = _loss_batch()
    b["has_sampler_logprobs"] = torch.tensor([1.0, 1.0, 0.0])  # the retry's sampler log-probs unknown
    _loss(lrn, b)
    _loss(lrn, b)  # a second micro-batch of the same update
    g = lrn._gap_stats
    assert g["sampler_logprob_gap_base/sum"] == pytest.approx(1.8) and g["sampler_logprob_gap_base/n"] == 6
    assert g["behaviour_logprob_gap_base/sum"] == pytest.approx(1.0) and g["behaviour_logprob_gap_base/n"] == 4
    assert not [k for k in g if "retry" in k]


def test_autocast_follows_the_learners_device(monkeypatch):
    from rllib_r3l.learner import precision

    monkeypatch.setattr(precision, "autocast", lambda mode, device_type: (mode, device_type))
    lrn = StubLearner(mixed_precision="bfloat16")
    assert lrn.autocast() == ("bfloat16", "cpu")  # no device: the CPU
    lrn._device = types.SimpleNamespace(type="cuda")
    assert lrn.autocast() == ("bfloat16", "cuda")


def test_loss_without_the_importance_ratio_is_the_weighted_token_mean():
    lrn = StubLearner(loss_scale=2.0)  # use_importance_ratio off (default)
    assert _loss(lrn) == pytest.approx(2.0 * (1.0 + 2.0 - 0.25 + 0.125) / 4, rel=1e-6)
    assert (
        "clip_fraction" not in lrn._micro_stats[-1] and "ratio_tokens_without_behaviour_logprobs" not in lrn._gap_stats
    )
    # a hand-made batch without the optional columns: no gaps logged, same loss
    b = {k: v for k, v in _loss_batch().items() if k in ("advantages", "weights", "on_policy", "normalizer")}
    lrn = StubLearner(loss_scale=1.0, use_importance_ratio=True)
    assert _loss(lrn, b) == pytest.approx((1.0 + 2.0 - 0.25 + 0.125) / 4, rel=1e-6)  # no behaviour: no ratio
    assert lrn._gap_stats == {"ratio_tokens_without_behaviour_logprobs": 3.0}  # the three base tokens


def test_loss_with_kl_to_the_reference_on_base_rows():
    lrn = StubLearner(kl_coef=0.1, kl_estimator="k1")
    ref_model = object()
    ref = torch.tensor([-1.5, -1.0, -0.5, -1.0])

    def ref_forward(shim, batch):
        assert shim.lm is ref_model and batch["normalizer"] == 4.0
        return {"logprobs": ref}

    lrn._ref_model, lrn._ref_forward = ref_model, ref_forward
    # k1 = log p - ref on base tokens (rows 0 and 1): 0.5, -1.0, 0.0 -> + 0.1 * w * k1
    kl = [0.5, -1.0, 0.0, 0.0]
    pg = [1.0, 2.0, -0.5, 0.125]
    w = [1.0, 1.0, 0.5, 1.0]
    assert _loss(lrn) == pytest.approx(sum(wi * (p + 0.1 * k) for wi, p, k in zip(w, pg, kl)) / 4, rel=1e-6)
    assert lrn._micro_stats[-1]["kl"] == pytest.approx(-0.5 / 4)


def test_step_statistics_add_losses_and_average_ratios_over_micro_batches():
    lrn = StubLearner()
    lrn._micro_stats = [
        {"pg_loss": 0.5, "kl": 0.1, "clip_fraction": 0.2, "mean_ratio": 1.0},
        {"pg_loss": 0.25, "kl": 0.3, "clip_fraction": 0.6, "mean_ratio": 2.0},
    ]
    lrn._gap_stats.update(
        {
            "sampler_logprob_gap_base/sum": 3.0,
            "sampler_logprob_gap_base/n": 4.0,
            "ratio_tokens_without_behaviour_logprobs": 5.0,
        }
    )
    lrn._log_step_stats()
    m = lrn.metrics
    assert m.learner("pg_loss") == (0.75, "mean", 1) and m.learner("kl") == (pytest.approx(0.4), "mean", 1)
    assert m.learner("clip_fraction") == (pytest.approx(0.4), "mean", 1) and m.learner("mean_ratio") == (1.5, "mean", 1)
    assert m.learner("sampler_logprob_gap_base") == (0.75, "mean", 1)
    assert m.learner("ratio_tokens_without_behaviour_logprobs") == (5.0, "sum", None)
    assert len(m.logged) == 6


def test_learner_faults_with_deepspeed_are_refused_not_silently_dropped():
    """DeepSpeed's learner is not the fault-injecting one: a plan with learner faults there is an error."""
    from rllib_r3l.reliability import faults

    cfg = faults.inject(R3LConfig().training(deepspeed=True), {"nan_loss_at_updates": [0]})
    with pytest.raises(ValueError, match="deepspeed=True"):
        faults.validate_reliability_options(cfg)
    faults.validate_reliability_options(faults.inject(R3LConfig().training(deepspeed=True), {"env_raise_prob": 0.1}))


def _stale_batch(lags):
    b = _loss_batch()
    b["policy_lag"] = torch.tensor(lags)
    return b


def test_base_rows_from_older_weights_take_the_ratio_with_their_own_clip_bounds():
    """max_policy_lag (issue 47 item 3): row 0 (base, behaviour log-probs, 1 update old) takes the clipped
    ratio at stale_clip_ratio_* even without use_importance_ratio: ratios e^0.5 (clipped to 1.1) and 1 ->
    -1.1 A and -1.0 A; row 1 (base, old, no behaviour log-probs) stays -A log p and is counted; the retry
    (row 2) never takes the ratio: -0.5 - 0.25 * 0.5 ... as in the plain loss."""
    lrn = StubLearner(stale_clip_ratio_low=0.1, stale_clip_ratio_high=0.1)
    assert _loss(lrn, _stale_batch([1.0, 1.0, 1.0])) == pytest.approx((-1.1 - 1.0 - 0.25 + 0.125) / 4, rel=1e-6)
    assert lrn._micro_stats[-1]["clip_fraction"] == pytest.approx(0.5)
    assert lrn._gap_stats["stale_tokens_without_behaviour_logprobs"] == 1.0
    # fresh rows with use_importance_ratio keep clip_ratio_*: row 0 fresh -> clipped at 1.2, old -> at 1.1
    both = StubLearner(use_importance_ratio=True, stale_clip_ratio_low=0.1, stale_clip_ratio_high=0.1)
    assert _loss(both, _stale_batch([0.0, 0.0, 0.0])) == pytest.approx((-1.2 - 1.0 - 0.25 + 0.125) / 4, rel=1e-6)
    assert _loss(both, _stale_batch([2.0, 0.0, 0.0])) == pytest.approx((-1.1 - 1.0 - 0.25 + 0.125) / 4, rel=1e-6)


def test_no_lag_leaves_the_plain_loss_without_a_ratio():
    lrn = StubLearner()
    assert _loss(lrn, _stale_batch([0.0, 0.0, 0.0])) == pytest.approx((1.0 + 2.0 - 0.25 + 0.125) / 4, rel=1e-6)
    assert "clip_fraction" not in lrn._micro_stats[-1] and not lrn._gap_stats.get(
        "stale_tokens_without_behaviour_logprobs"
    )
