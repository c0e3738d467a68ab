"""GPU kit: the learner's R3L loss and backward on one GPU in a short window, torch and transformers only.

    python benchmarks/gpu_kit.py                  # a CUDA GPU: under 8 minutes (a time guard skips what would not fit)
    python benchmarks/gpu_kit.py --dry-run        # CPU, tiny random models: about a minute on 2 cores
    python benchmarks/gpu_kit.py --out FILE.md    # the table as markdown, FILE.json beside it

No Ray, no vLLM, nothing downloaded: the two model shapes (SmolLM2-135M, Qwen2.5-1.5B) are randomly
initialised from the configs below, and the batch is an R3L task group (a shared task prompt, N/2
base episodes of several turns, retries that replay their base up to the pivot with credit from
the pivot, a retry-SFT auxiliary item) built with the project's own ``Trajectory``/``Segment`` types
and ``batch.build_train_batch``, token ids drawn from a seeded generator. The forward is the
learner's (``rl_module.R3LCausalLMModule.token_logprobs``, shared prefixes through
``shared_prefix_hidden``), the loss ``core_algos.policy_gradient_loss`` with the learner's
micro-batching and per-token broadcast. Ray and vLLM are blocked when this runs as a script, so
it behaves here as on a bare GPU machine.

One line per check (a row of the table), PASS/FAIL with the measured value and the tolerance; the
exit code is 1 on any FAIL, 2 without CUDA (unless ``--dry-run``). What each row checks:
docs/scaling.md, 'A short GPU window: the GPU kit'.
"""

from __future__ import annotations

import sys

# As a script: run as on a bare GPU machine (torch and transformers only). Nothing may import these.
BLOCKED = ("ray", "vllm", "gymnasium", "deepspeed")
if __name__ == "__main__":
    for _name in BLOCKED:
        sys.modules.setdefault(_name, None)

import argparse  # noqa: E402
import contextlib  # noqa: E402
import copy  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

T0 = time.perf_counter()  # the time guard counts from here (imports included)

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rllib_r3l import core_algos  # noqa: E402
from rllib_r3l.batch import build_train_batch  # noqa: E402
from rllib_r3l.learner import cascade_attention, precision  # noqa: E402
from rllib_r3l.learner.forward import split_micro_batches, token_logprobs  # noqa: E402
from rllib_r3l.learner.prefix_tree import computed_tokens, trie_tokens  # noqa: E402
from rllib_r3l.options import default  # noqa: E402
from rllib_r3l.trajectory import Kind, Segment, Trajectory  # noqa: E402

# ------------------------------------------------------------------------------------------------
# Model shapes: the published configs' numbers (random weights; nothing is downloaded)

MODEL_SHAPES: Dict[str, Tuple[str, Dict[str, Any]]] = {
    # HuggingFaceTB/SmolLM2-135M: 134.5 M parameters
    "smollm2-135m": (
        "llama",
        dict(
            hidden_size=576,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            intermediate_size=1536,
            vocab_size=49152,
            tie_word_embeddings=True,
            rope_theta=100000.0,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
        ),
    ),
    # Qwen/Qwen2.5-1.5B: 1,543.7 M parameters (q/k/v biases are Qwen2's own)
    "qwen2.5-1.5b": (
        "qwen2",
        dict(
            hidden_size=1536,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            intermediate_size=8960,
            vocab_size=151936,
            tie_word_embeddings=True,
            rope_theta=1000000.0,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            use_sliding_window=False,
        ),
    ),
    # the dry run's stand-ins: the same two architectures, tiny
    "tiny-llama": (
        "llama",
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            vocab_size=4096,
            tie_word_embeddings=True,
            rope_theta=100000.0,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
        ),
    ),
    "tiny-qwen2": (
        "qwen2",
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            vocab_size=4096,
            tie_word_embeddings=True,
            rope_theta=1000000.0,
            max_position_embeddings=8192,
            rms_norm_eps=1e-6,
            use_sliding_window=False,
        ),
    ),
}


def model_config(shape: str):
    """The transformers config of ``shape`` (SDPA attention, no KV cache in training: as the learner)."""
    from transformers import LlamaConfig, Qwen2Config

    kind, kw = MODEL_SHAPES[shape]
    cfg = (LlamaConfig if kind == "llama" else Qwen2Config)(**kw)
    cfg.use_cache = False
    return cfg


def build_model(shape: str, device: torch.device, seed: int = 0) -> torch.nn.Module:
    """``shape`` randomly initialised on ``device`` (fp32 master weights, as the learner keeps)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        lm = AutoModelForCausalLM.from_config(model_config(shape), attn_implementation="sdpa")
    lm.config.use_cache = False
    return lm.to(device=device, dtype=torch.float32).train()


# ------------------------------------------------------------------------------------------------
# The batch: R3L task groups with the project's own types


@dataclasses.dataclass(frozen=True)
class Layout:
    """Token counts of one task group's episodes."""

    prompt: int  # system + task (turn -1), shared by every item of the group
    obs: int  # each observation prompt
    resp: int  # each response
    turns: int  # turns of a base episode
    guidance: int  # the reflection's guidance in a retry's pivot prompt (stripped for training)


# a coin-collector-like group (docs/benchmarks.md: ~260-token task prompt, ~100-token observations),
# with longer responses (a model that thinks a little): ~1,400 tokens per base episode
GPU_LAYOUT = Layout(prompt=260, obs=100, resp=16, turns=10, guidance=80)
SHORT_LAYOUT = Layout(prompt=96, obs=32, resp=8, turns=4, guidance=24)  # the GPU-vs-CPU batch
DRY_LAYOUT = Layout(prompt=48, obs=16, resp=4, turns=4, guidance=12)

# the outcomes of a group of N = 8: base 0 succeeds, bases 1-3 fail and are retried from a pivot;
# the retries succeed, fail, and reach a partial reward. The successful retry beats its base, so it
# adds a retry-SFT item (the default aux_items): 4 base + 3 retry + 1 retry_sft items.
BASE_REWARDS = (1.0, 0.0, 0.0, 0.0)
RETRY_REWARDS = (1.0, 0.0, 0.5)
TOKEN_LOW = 100  # token ids are drawn from [TOKEN_LOW, vocab)


def retry_pivots(turns: int, n: int) -> List[int]:
    """Pivots of ``n`` retries spread over turns 1 .. turns - 1 (a pivot of 0 shares nothing but the prompt)."""
    if turns < 2:
        raise ValueError(f"a layout needs at least 2 turns to have a pivot, got {turns}")
    return [1 + (i * (turns - 2)) // max(n - 1, 1) for i in range(n)]


def r3l_group(
    rng: np.random.Generator, vocab: int, layout: Layout, group_id: str, aux_weight: float = 1.0
) -> List[Trajectory]:
    """One task group as the explorer hands it to the driver (``runner/explore.py``): base episodes
    that share the task prompt and first observation, retries that replay their base's segments up
    to the pivot (``prefix_segments``) then continue with their own turns, the guidance stripped
    (``strip_guidance``); pivotal credit from the pivot in the retry and its base; the successful
    retry's guided view (``guided_view``) as a retry-SFT item with advantage 1.0."""

    def toks(n: int) -> List[int]:
        return rng.integers(TOKEN_LOW, vocab, size=n).tolist()

    def response(turn: int) -> Segment:
        return Segment(
            "response", toks(layout.resp), turn=turn, logprobs=rng.uniform(-3.0, 0.0, size=layout.resp).tolist()
        )

    system, first_obs = toks(layout.prompt), toks(layout.obs)
    bases: List[Trajectory] = []
    for reward in BASE_REWARDS:
        segs = [Segment("prompt", list(system), turn=-1)]
        for t in range(layout.turns):
            segs += [Segment("prompt", list(first_obs) if t == 0 else toks(layout.obs), turn=t), response(t)]
        bases.append(
            Trajectory(
                segs, reward=reward, group_id=group_id, kind=Kind.BASE, success=reward >= 1.0, num_turns=layout.turns
            )
        )
    failed = [b for b in bases if not b.success]
    items: List[Trajectory] = list(bases)
    aux: List[Trajectory] = []
    for i, (base, k, reward) in enumerate(
        zip(failed, retry_pivots(layout.turns, len(failed)), RETRY_REWARDS, strict=True)
    ):
        segs = [dataclasses.replace(s) for s in base.prefix_segments(k)]
        unguided = next(s.token_ids for s in base.segments if s.role == "prompt" and s.turn == k)  # replayed
        segs += [
            Segment("prompt", list(unguided), turn=k, unguided_only=True),
            Segment("guidance", list(unguided) + toks(layout.guidance), turn=k),
            response(k),
        ]
        for t in range(k + 1, layout.turns):
            segs += [Segment("prompt", toks(layout.obs), turn=t), response(t)]
        retry = Trajectory(
            segs,
            reward=reward,
            group_id=group_id,
            kind=Kind.RETRY,
            success=reward >= 1.0,
            num_turns=layout.turns,
            pivot=k,
            credit_from_turn=k,
        )
        base.credit_from_turn = k  # pivotal credit in the base/retry pair (explore._add_retry)
        items.append(retry.strip_guidance())
        if retry.success and not aux:
            sft = retry.guided_view()
            sft.kind, sft.fixed_advantage, sft.weight, sft.credit_from_turn = Kind.RETRY_SFT, 1.0, aux_weight, k
            sft.group_id = f"{group_id}/retry_sft/{i}"
            aux.append(sft)
    return items + aux


def train_batch_options(max_length: int) -> Dict[str, Any]:
    """``build_train_batch``'s options at R3L's defaults (``options.py``; ``batch.train_batch_options``
    reads the same from an ``R3LConfig``)."""
    return dict(
        std_normalize=default("std_normalize"),
        positive_amplification=default("positive_amplification"),
        alpha=default("amplification_alpha"),
        success_reward=default("success_reward"),
        pivotal_credit=default("pivotal_credit"),
        max_length=max_length,
        loss_aggregation=default("loss_aggregation"),
    )


def make_batch(groups: int, layout: Layout, vocab: int, seed: int = 0, device: str = "cpu"):
    """``groups`` task groups through ``build_train_batch``: the learner's tensors and their counts."""
    rng = np.random.default_rng(seed)
    trajs = [t for g in range(groups) for t in r3l_group(rng, vocab, layout, f"task{g}", default("aux_weight"))]
    max_len = max(t.num_tokens for t in trajs)
    batch, adv = build_train_batch(trajs, pad_token_id=0, **train_batch_options(max_len))
    tb = {k: torch.as_tensor(v).to(device) for k, v in batch.items()}
    lengths = batch["attention_mask"].sum(axis=1).tolist()
    seqs = [batch["input_ids"][i, :n].tolist() for i, n in enumerate(lengths)]
    info = {
        "items": len(trajs),
        "rows": len(lengths),
        "tokens": int(sum(lengths)),
        "trie_tokens": trie_tokens(seqs),
        "credited": int(batch["num_loss_tokens"].sum()),
        "longest": int(max(lengths)),
        "kinds": {k.value: sum(t.kind == k for t in trajs) for k in Kind},
    }
    return tb, info, trajs, adv


def layout_problems(trajs: Sequence[Trajectory], adv: Sequence[float], layout: Layout) -> List[str]:
    """What is wrong with a batch of ``r3l_group`` s (empty: it is an R3L group layout): the kinds per
    group, retries sharing their base's tokens exactly up to the pivot's prompt and diverging after,
    no credit before the pivot, R3L's advantages (positive amplification, fixed 1.0 for aux items)."""
    out: List[str] = []
    by_group: Dict[str, List[int]] = {}
    for i, t in enumerate(trajs):
        by_group.setdefault(t.group_id.split("/")[0], []).append(i)
    rewards = list(BASE_REWARDS) + list(RETRY_REWARDS)
    mean = sum(rewards) / len(rewards)
    alpha = default("amplification_alpha")
    want = {1.0: 1.0, 0.0: -mean, 0.5: (0.5 - mean) * alpha}
    for gid, idx in by_group.items():
        items = [trajs[i] for i in idx]
        kinds = [t.kind for t in items]
        if (kinds.count(Kind.BASE), kinds.count(Kind.RETRY), kinds.count(Kind.RETRY_SFT)) != (4, 3, 1):
            out.append(f"{gid}: kinds {[k.value for k in kinds]}")
        bases = [t for t in items if t.kind == Kind.BASE]
        prompt = bases[0].segments[0].token_ids
        if any(t.token_ids[: len(prompt)] != prompt for t in items):
            out.append(f"{gid}: an item does not start with the task prompt")
        for r in (t for t in items if t.kind == Kind.RETRY):
            ids = r.token_ids
            base = max(bases, key=lambda b: _common_prefix(b.token_ids, ids))  # the one it replayed
            arr = r.to_arrays()
            # the base's tokens through the pivot turn's prompt (the observation the replay reaches)
            cut = sum(
                len(s.token_ids)
                for s in base.segments
                if s.turn < r.pivot or (s.turn == r.pivot and s.role == "prompt")
            )
            if _common_prefix(base.token_ids, ids) != cut:
                out.append(f"{gid}: retry from turn {r.pivot} does not share exactly its base's prefix")
            for t in (r, base):
                a = t.to_arrays()
                if a["loss_mask"][a["turn_ids"] < r.pivot].any():
                    out.append(f"{gid}: credit before the pivot ({t.kind.value})")
            if r.has_guidance() or not arr["loss_mask"].any():
                out.append(f"{gid}: retry holds guidance or no credited token")
        for i in idx:
            t = trajs[i]
            expect = 1.0 if t.kind == Kind.RETRY_SFT else want.get(t.reward, math.nan)
            if not abs(float(adv[i]) - expect) <= 1e-9:
                out.append(f"{gid}: {t.kind.value} reward {t.reward}: advantage {float(adv[i]):.4f}, want {expect:.4f}")
    return out


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


# ------------------------------------------------------------------------------------------------
# The learner's forward and loss, without Ray


def r3l_loss(batch: Dict[str, torch.Tensor], fwd_out: Dict[str, torch.Tensor], loss_scale: float = 1.0) -> torch.Tensor:
    """``R3LTorchLearner.compute_loss_for_module`` at R3L's defaults (no importance ratio, no KL):
    the per-trajectory advantages and weights broadcast to the selected tokens, then
    ``core_algos.policy_gradient_loss`` normalised by the whole batch's credited tokens."""
    sel, logp = fwd_out["selection"], fwd_out["logprobs"]
    B, Tm1 = sel.shape

    def per_token(x: torch.Tensor) -> torch.Tensor:
        return x[:, None].expand(B, Tm1)[sel]

    loss, _ = core_algos.policy_gradient_loss(
        logp,
        per_token(batch["advantages"]),
        torch.ones_like(logp),
        normalizer=float(batch["normalizer"]),
        weights=per_token(batch["weights"]),
    )
    return loss * float(loss_scale)


@dataclasses.dataclass
class Pass:
    loss: float
    logprobs: torch.Tensor  # [B, T-1] on the CPU, float32; 0 where not credited
    forward_tokens: int
    micro_batches: int


def forward_backward(
    lm: torch.nn.Module,
    batch: Dict[str, torch.Tensor],
    *,
    share: bool,
    mixed_precision: str,
    micro_batch_size: int = 64,
    micro_batch_tokens: Optional[int] = None,
    keep_logprobs: bool = True,
) -> Pass:
    """One update's forward and backward as ``R3LTorchLearner._update`` runs it (gradients accumulate
    in ``lm``; no optimizer step): micro-batches, each under ``precision.autocast(mixed_precision)``,
    the learner's own forward (``learner.forward.token_logprobs``) and ``r3l_loss``.
    ``keep_logprobs``: gather each credited token's log-prob on the CPU (the comparisons; not timed)."""
    device = batch["input_ids"].device
    normalizer = max(float(batch["num_loss_tokens"].sum()), 1.0)
    B, T = batch["input_ids"].shape
    logprobs = torch.zeros(B, max(T - 1, 0))
    acc = torch.zeros((), dtype=torch.float32, device=device)
    fwd_tokens = n = 0
    for idx, sub in split_micro_batches(batch, share, micro_batch_size, micro_batch_tokens):
        if float(sub["num_loss_tokens"].sum()) == 0:
            continue
        sub["normalizer"] = normalizer
        lengths = sub["attention_mask"].sum(dim=1).tolist()
        fwd_tokens += (
            computed_tokens([sub["input_ids"][i, :m].tolist() for i, m in enumerate(lengths)])
            if share
            else int(sub["input_ids"].numel())
        )
        n += 1
        with precision.autocast(mixed_precision, device.type):
            out = token_logprobs(lm, sub, share_prefixes=share)
            loss = r3l_loss(sub, out)
        loss.backward()
        acc = acc + loss.detach().float()
        if not keep_logprobs:
            continue
        full = torch.zeros(len(idx), sub["input_ids"].shape[1] - 1)
        full[out["selection"].cpu()] = out["logprobs"].detach().float().cpu()
        logprobs[idx, : full.shape[1]] = full
    return Pass(float(acc), logprobs, fwd_tokens, n)


def grads_of(lm: torch.nn.Module) -> List[torch.Tensor]:
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in lm.parameters()]


def relative_error(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    """``|got - want| / |want|`` over all tensors together (L2; devices may differ)."""
    num = den = 0.0
    for g, w in zip(got, want, strict=True):
        w64 = w.detach().to(torch.float64)
        num += float((g.detach().to(device=w.device, dtype=torch.float64) - w64).square().sum())
        den += float(w64.square().sum())
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def compare(got: Pass, got_grads, want: Pass, want_grads, mask: torch.Tensor) -> Dict[str, float]:
    """Per-token log-prob max |difference| over the credited tokens, the loss difference relative to
    the loss's scale (its mean |term|, so a loss near 0 is not divided by 0), gradient relative error."""
    m = mask.cpu() > 0
    scale = max(float(want.logprobs[m].abs().mean()) if m.any() else 1.0, 1e-6)
    return {
        "logp": float((got.logprobs[m] - want.logprobs[m]).abs().max()) if m.any() else 0.0,
        "loss": abs(got.loss - want.loss) / scale,
        "grad": relative_error(got_grads, want_grads),
    }


# tolerances of ``compare``'s three numbers
TOL_BF16 = {"logp": 0.05, "loss": 1e-2, "grad": 5e-2}  # bf16 autocast, two paths or two devices
TOL_FP32 = {"logp": 1e-3, "loss": 1e-4, "grad": 1e-3}  # fp32 (no TF32) on two devices


def within(values: Dict[str, float], tol: Dict[str, float]) -> bool:
    return all(math.isfinite(values[k]) and values[k] <= tol[k] for k in tol)


def fmt_cmp(values: Dict[str, float]) -> str:
    return f"Δlogp {values['logp']:.2e}, Δloss/scale {values['loss']:.2e}, grad rel err {values['grad']:.2e}"


def fmt_tol(tol: Dict[str, float]) -> str:
    return f"≤ {tol['logp']:g}, {tol['loss']:g}, {tol['grad']:g}"


@contextlib.contextmanager
def cascade_everywhere(device: torch.device):
    """On CPU, every continuation on a cache through ``cascade_attention`` (not only those of at
    least ``CASCADE_MIN_KEYS`` keys), so the short rows of a check exercise its kernels; on CUDA
    the learner attends to a cache through transformers' SDPA, unchanged."""
    before = cascade_attention.CASCADE_MIN_KEYS
    if device.type == "cpu":
        cascade_attention.CASCADE_MIN_KEYS = 0
    try:
        yield
    finally:
        cascade_attention.CASCADE_MIN_KEYS = before


@contextlib.contextmanager
def no_tf32():
    m, c = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = m, c


# ------------------------------------------------------------------------------------------------
# The plan, the rows, the time guard


@dataclasses.dataclass(frozen=True)
class Throughput:
    micro_batch_tokens: Optional[int]
    share: bool = True
    bf16_weights: bool = False

    @property
    def label(self) -> str:
        return (
            f"mbt {self.micro_batch_tokens}"
            + ("" if self.share else ", unshared")
            + (", bf16 weights" if self.bf16_weights else "")
        )

    @property
    def key(self) -> str:
        return (
            f"mbt{self.micro_batch_tokens}"
            + ("" if self.share else "-unshared")
            + ("-bf16w" if self.bf16_weights else "")
        )


@dataclasses.dataclass(frozen=True)
class Plan:
    shapes: Tuple[str, ...]  # the first one also runs the device-vs-CPU checks
    layout: Layout
    short_layout: Layout
    groups: int  # task groups in a throughput batch
    check_micro_batch_tokens: Optional[int]  # micro-batches of the equality checks (bounds their memory)
    throughput: Tuple[Throughput, ...]  # per shape, in this order: the largest batch last
    reps: int
    budget_s: float


# every throughput row of a shape, in order; the largest micro-batch last (the time guard drops it first)
# (4 groups of GPU_LAYOUT: 45,760 tokens, 28,256 in the prefix trie; at 16384 two micro-batches of
# up to 15,564 trie tokens, about 60 GiB of 1.5B activations under autocast besides 24 GiB of fp32
# weights, gradients and AdamW state: the memory guard skips it on an 80 GB card)
GPU_PLAN = Plan(
    shapes=("smollm2-135m", "qwen2.5-1.5b"),
    layout=GPU_LAYOUT,
    short_layout=SHORT_LAYOUT,
    groups=4,
    check_micro_batch_tokens=4096,
    throughput=(
        Throughput(2048),
        Throughput(8192),
        Throughput(8192, share=False),
        Throughput(8192, bf16_weights=True),
        Throughput(16384),
    ),
    reps=3,
    budget_s=420.0,
)
DRY_PLAN = Plan(
    shapes=("tiny-llama", "tiny-qwen2"),
    layout=DRY_LAYOUT,
    short_layout=DRY_LAYOUT,
    groups=2,
    check_micro_batch_tokens=512,
    throughput=(
        Throughput(256),
        Throughput(1024),
        Throughput(1024, share=False),
        Throughput(1024, bf16_weights=True),
        Throughput(4096),
    ),
    reps=1,
    budget_s=600.0,
)


def row_ids(plan: Plan) -> List[str]:
    """Every row the plan's table holds, in order."""
    ids = ["imports", "layout"]
    for i, shape in enumerate(plan.shapes):
        ids.append(f"shared_vs_plain/{shape}")
        if i == 0:
            ids += [f"device_vs_cpu_fp32/{shape}", f"device_vs_cpu_bf16/{shape}"]
        ids += [f"throughput/{shape}/{t.key}" for t in plan.throughput]
    return ids


@dataclasses.dataclass
class Row:
    id: str
    check: str
    model: str
    batch: str
    measured: str
    tolerance: str
    result: str  # PASS | FAIL | SKIP
    values: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def markdown(self) -> str:
        cells = (self.result, self.check, self.model, self.batch, self.measured, self.tolerance)
        return "| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |"


TABLE_HEADER = "| result | check | model | batch | measured | tolerance |\n|---|---|---|---|---|---|"


class TimeGuard:
    """The run's time budget: a throughput row runs only if its estimate fits what is left."""

    def __init__(self, budget_s: float, clock: Callable[[], float] = time.perf_counter, start: Optional[float] = None):
        self.budget_s, self.clock = float(budget_s), clock
        self.start = clock() if start is None else start
        self.per_token: Dict[str, float] = {}  # seconds per forward token of one fwd+bwd, by model shape

    def elapsed(self) -> float:
        return self.clock() - self.start

    def estimate(self, shape: str, forward_tokens: int, reps: int) -> Optional[float]:
        """Seconds a throughput row of ``forward_tokens`` should take (warm-up + reps, and the
        optimizer step), from the shape's rows so far; None before the first."""
        if shape not in self.per_token:
            return None
        return 1.3 * self.per_token[shape] * forward_tokens * (reps + 1) + 2.0

    def skip_reason(self, shape: str, forward_tokens: int, reps: int) -> Optional[str]:
        est = self.estimate(shape, forward_tokens, reps)
        left = self.budget_s - self.elapsed()
        if left <= 0 or (est is not None and est > left):
            need = f"~{est:.0f} s needed, " if est is not None else ""
            return f"skipped by the time guard: {need}{max(left, 0):.0f} s left of {self.budget_s:.0f} s"
        return None

    def record(self, shape: str, seconds: float, forward_tokens: int) -> None:
        if forward_tokens > 0:
            self.per_token[shape] = max(self.per_token.get(shape, 0.0), seconds / forward_tokens)


# ------------------------------------------------------------------------------------------------
# The memory guard: a throughput row that cannot fit the card is skipped with its line (issue 47 item 4:
# the last 1.5B row needs ~84 GiB and would fail on an 80 GB H100). An estimate, not a measurement: per
# parameter the fp32 master weights, gradients and AdamW's two moments (16 bytes; bf16 weights 8); per
# computed token of the largest micro-batch, what autograd keeps under bf16 autocast: per decoder layer
# about 10 hidden-size and 4 intermediate-size bf16 values (norm inputs and outputs, q/k/v, attention
# output, gate/up/activation), and the fp32 logits with their log-softmax (8 bytes a vocabulary entry).

STATE_BYTES = {False: 16, True: 8}  # per parameter, by bf16 weights
ACT_HIDDEN, ACT_INTERMEDIATE, LOGIT_BYTES = 10, 4, 8
CARD_HEADROOM = 0.95  # of the card's memory: the CUDA context, the allocator's fragmentation


@functools.lru_cache(maxsize=None)
def parameter_count(shape: str) -> int:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(model_config(shape))
    return sum(p.numel() for p in lm.parameters())


def largest_micro_batch_tokens(batch: Dict[str, torch.Tensor], spec: Throughput) -> int:
    """Tokens the forward computes in the row's largest micro-batch (as ``forward_backward`` cuts it)."""
    most = 0
    for _, sub in split_micro_batches(batch, spec.share, 64, spec.micro_batch_tokens):
        if spec.share:
            lengths = sub["attention_mask"].sum(dim=1).tolist()
            most = max(most, computed_tokens([sub["input_ids"][i, :m].tolist() for i, m in enumerate(lengths)]))
        else:
            most = max(most, int(sub["input_ids"].numel()))
    return most


def memory_estimate_gib(shape: str, spec: Throughput, micro_batch_tokens: int) -> float:
    """Peak GiB of a throughput row of ``shape`` whose largest micro-batch computes ``micro_batch_tokens``."""
    cfg = model_config(shape)
    per_token = 2 * cfg.num_hidden_layers * (ACT_HIDDEN * cfg.hidden_size + ACT_INTERMEDIATE * cfg.intermediate_size)
    per_token += LOGIT_BYTES * cfg.vocab_size
    return (STATE_BYTES[spec.bf16_weights] * parameter_count(shape) + per_token * micro_batch_tokens) / 2**30


def card_memory_gib(device: torch.device) -> Optional[float]:
    """The card's memory (None on CPU: no limit checked)."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory / 2**30


def memory_skip_reason(shape: str, spec: Throughput, batch: Dict[str, torch.Tensor], device: torch.device):
    """The one-line reason a throughput row cannot fit the card, or None."""
    card = card_memory_gib(device)
    if card is None:
        return None
    need = memory_estimate_gib(shape, spec, largest_micro_batch_tokens(batch, spec))
    if need <= CARD_HEADROOM * card:
        return None
    return f"skipped by the memory guard: ~{need:.0f} GiB needed, the card has {card:.0f} GiB"


# ------------------------------------------------------------------------------------------------
# The checks


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def imports_row() -> Row:
    loaded = sorted(n for n, m in sys.modules.items() if m is not None and n.split(".")[0] in BLOCKED)
    return Row(
        "imports",
        "runs without Ray, vLLM, gymnasium, DeepSpeed",
        "-",
        "-",
        "loaded: " + (", ".join(loaded[:5]) if loaded else "none"),
        "none loaded",
        "FAIL" if loaded else "PASS",
        {"loaded": loaded},
    )


def layout_row(plan: Plan, vocab: int) -> Row:
    _, info, trajs, adv = make_batch(plan.groups, plan.layout, vocab)
    problems = layout_problems(trajs, adv, plan.layout)
    k = info["kinds"]
    measured = (
        f"{info['items']} items ({k['base']} base, {k['retry']} retry, {k['retry_sft']} retry_sft), "
        f"{info['tokens']:,} tokens, {info['trie_tokens']:,} in the prefix trie, {info['credited']:,} credited"
        + ("; " + "; ".join(problems[:3]) if problems else "")
    )
    return Row(
        "layout",
        "R3L group layout (kinds, shared prefixes, pivotal credit, advantages)",
        "-",
        f"{plan.groups} groups",
        measured,
        "4 base + 3 retry + 1 retry_sft per group, exact",
        "FAIL" if problems else "PASS",
        {**info, "problems": problems},
    )


def shared_vs_plain_row(lm, shape: str, plan: Plan, device: torch.device) -> Row:
    """The learner's shared-prefix forward (a group's prompt and each pivot's prefix once; CPU:
    cascade attention) against every row on its own through plain SDPA, both under bf16 autocast;
    and, for scale, the plain path in fp32 against bf16."""
    batch, info, _, _ = make_batch(1, plan.layout, lm.config.vocab_size, seed=1, device=str(device))
    mask = batch["loss_mask"][:, 1:]
    runs = {}
    for name, share, mp in (("plain", False, "bfloat16"), ("shared", True, "bfloat16"), ("fp32", False, "none")):
        lm.zero_grad(set_to_none=True)
        with cascade_everywhere(device), no_tf32():
            p = forward_backward(
                lm, batch, share=share, mixed_precision=mp, micro_batch_tokens=plan.check_micro_batch_tokens
            )
        runs[name] = (p, grads_of(lm))
    lm.zero_grad(set_to_none=True)
    v = compare(*runs["shared"], *runs["plain"], mask)
    noise = compare(*runs["plain"], *runs["fp32"], mask)
    saved = 1 - runs["shared"][0].forward_tokens / max(runs["plain"][0].forward_tokens, 1)
    ok = within(v, TOL_BF16) and math.isfinite(runs["shared"][0].loss)
    how = "cascade attention" if device.type == "cpu" else "SDPA on the KV cache"
    return Row(
        f"shared_vs_plain/{shape}",
        f"shared prefix ({how}) = plain SDPA, bf16",
        shape,
        f"1 group, {info['tokens']:,} tokens ({saved:.0%} fewer computed)",
        f"{fmt_cmp(v)} (bf16 vs fp32 itself: {fmt_cmp(noise)})",
        fmt_tol(TOL_BF16),
        "PASS" if ok else "FAIL",
        {
            **v,
            "bf16_vs_fp32": noise,
            "forward_tokens_shared": runs["shared"][0].forward_tokens,
            "forward_tokens_plain": runs["plain"][0].forward_tokens,
        },
    )


def device_vs_cpu_rows(lm, shape: str, plan: Plan, device: torch.device) -> List[Row]:
    """The loss, log-probs and gradient of one small batch on the device against the same weights on
    the CPU in fp32 (the learner's default path: shared prefixes): fp32 on the device (no TF32), and
    the device under bf16 autocast (the learner's default on CUDA)."""
    cpu = torch.device("cpu")
    batch, info, _, _ = make_batch(1, plan.short_layout, lm.config.vocab_size, seed=2, device=str(device))
    cpu_batch = {k: v.to(cpu) for k, v in batch.items()}
    cpu_lm = copy.deepcopy(lm).to(cpu)
    cpu_lm.zero_grad(set_to_none=True)
    want = forward_backward(cpu_lm, cpu_batch, share=True, mixed_precision="none")
    want_grads = grads_of(cpu_lm)
    del cpu_lm
    mask = cpu_batch["loss_mask"][:, 1:]
    stand_in = " (dry run: the CPU stands in for the GPU)" if device.type == "cpu" else ""
    rows = []
    for tag, mp, tol in (("fp32", "none", TOL_FP32), ("bf16", "bfloat16", TOL_BF16)):
        lm.zero_grad(set_to_none=True)
        with no_tf32():
            got = forward_backward(lm, batch, share=True, mixed_precision=mp)
        v = compare(got, grads_of(lm), want, want_grads, mask)
        lm.zero_grad(set_to_none=True)
        ok = within(v, tol)
        rows.append(
            Row(
                f"device_vs_cpu_{tag}/{shape}",
                f"{device.type} {tag} loss = CPU fp32 loss{stand_in}",
                shape,
                f"1 group, {info['tokens']:,} tokens",
                f"loss {got.loss:.6f} vs {want.loss:.6f}; {fmt_cmp(v)}",
                fmt_tol(tol),
                "PASS" if ok else "FAIL",
                {**v, "loss_device": got.loss, "loss_cpu": want.loss},
            )
        )
    return rows


def throughput_row(
    lm, shape: str, spec: Throughput, plan: Plan, device: torch.device, guard: TimeGuard, batch=None, info=None
) -> Row:
    """Forward + backward of a ``plan.groups``-group batch as the learner runs it (fp32 master weights
    under bf16 autocast, or bf16 weights), ``plan.reps`` times after a warm-up, then a fused AdamW
    step (its state counts in the peak memory). Passes when the loss and gradients are finite."""
    if batch is None:
        batch, info, _, _ = make_batch(plan.groups, plan.layout, lm.config.vocab_size, seed=3, device=str(device))
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    seqs = [batch["input_ids"][i, :n].tolist() for i, n in enumerate(lengths)]
    fwd_est = computed_tokens(seqs) if spec.share else info["tokens"]
    rid = f"throughput/{shape}/{spec.key}"
    check = "loss + backward, bf16: tokens/s and peak memory"
    label = f"{plan.groups} groups, {info['tokens']:,} tokens, {spec.label}"
    reason = memory_skip_reason(shape, spec, batch, device) or guard.skip_reason(shape, fwd_est, plan.reps)
    if reason:
        return Row(rid, check, shape, label, reason, "loss and gradients finite", "SKIP", {"skipped": reason})
    if spec.bf16_weights:
        lm.to(torch.bfloat16)
    try:
        return _timed(lm, shape, spec, plan, device, guard, batch, info, rid, check, label)
    finally:
        if spec.bf16_weights:
            lm.to(torch.float32)  # the next rows train fp32 master weights again (bf16-rounded: speed only)


def _timed(lm, shape, spec, plan, device, guard, batch, info, rid, check, label) -> Row:
    mp = "none" if spec.bf16_weights else "bfloat16"
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    times, last = [], None
    for rep in range(plan.reps + 1):
        lm.zero_grad(set_to_none=True)
        synchronize(device)
        t0 = time.perf_counter()
        last = forward_backward(
            lm,
            batch,
            share=spec.share,
            mixed_precision=mp,
            micro_batch_size=64,
            micro_batch_tokens=spec.micro_batch_tokens,
            keep_logprobs=False,
        )
        synchronize(device)
        if rep:
            times.append(time.perf_counter() - t0)
    finite = math.isfinite(last.loss) and all(
        bool(torch.isfinite(p.grad).all()) for p in lm.parameters() if p.grad is not None
    )
    opt = torch.optim.AdamW(lm.parameters(), lr=1e-6, fused=True if device.type == "cuda" else None)
    opt.step()
    synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    reserved = torch.cuda.max_memory_reserved(device) / 2**30 if device.type == "cuda" else None
    del opt
    lm.zero_grad(set_to_none=True)
    sec = statistics.median(times)
    guard.record(shape, sec, last.forward_tokens)
    v = {
        "seconds": sec,
        "tokens": info["tokens"],
        "forward_tokens": last.forward_tokens,
        "credited_tokens": info["credited"],
        "micro_batches": last.micro_batches,
        "tokens_per_s": info["tokens"] / sec,
        "forward_tokens_per_s": last.forward_tokens / sec,
        "peak_gib": peak,
        "peak_reserved_gib": reserved,
        "loss": last.loss,
        "times": times,
    }
    mem = f"peak {peak:.1f} GiB" if peak is not None else "peak n/a (CPU)"
    measured = (
        f"{sec:.3f} s, {v['tokens_per_s']:,.0f} tok/s ({v['forward_tokens_per_s']:,.0f} computed tok/s, "
        f"{last.micro_batches} micro-batch{'es' if last.micro_batches != 1 else ''}); {mem}"
    )
    return Row(rid, check, shape, label, measured, "loss and gradients finite", "PASS" if finite else "FAIL", v)


def failed_row(rid: str, shape: str, exc: BaseException) -> Row:
    msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:240]
    return Row(rid, rid.split("/")[0], shape, "-", "error: " + msg, "-", "FAIL", {"error": msg})


# ------------------------------------------------------------------------------------------------


def default_out(dry_run: bool) -> Path:
    name = "gpu_kit_dry_run.md" if dry_run else "gpu_kit.md"
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / name
    return ROOT / "benchmarks" / "results" / "gpu_kit" / name


def environment(device: torch.device) -> Dict[str, Any]:
    import transformers

    env = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            device=torch.cuda.get_device_name(device),
            memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            bf16=bool(torch.cuda.is_bf16_supported()),
        )
    else:
        env.update(
            device=f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} thread"
            f"{'s' if torch.get_num_threads() != 1 else ''})",
            bf16_native=precision.native_bf16("cpu"),
        )
    return env


def run(plan: Plan, device: torch.device, out: Path, dry_run: bool) -> int:
    import transformers

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    guard = TimeGuard(plan.budget_s, start=T0)
    env = environment(device)
    print(
        f"gpu_kit{' --dry-run' if dry_run else ''}: {env['device']}, torch {env['torch']}, "
        f"transformers {env['transformers']}; budget {plan.budget_s:.0f} s",
        flush=True,
    )
    print(TABLE_HEADER, flush=True)
    rows: List[Row] = []

    def emit(row: Row) -> None:
        rows.append(row)
        print(row.markdown(), flush=True)

    def attempt(rid: str, shape: str, fn: Callable[..., Any], *args: Any) -> None:
        t0 = time.perf_counter()
        try:
            out_rows = fn(*args)
            for r in out_rows if isinstance(out_rows, list) else [out_rows]:
                r.values["wall_s"] = round(time.perf_counter() - t0, 3)  # of the call that made the row(s)
                emit(r)
        except Exception as exc:  # a check that raises is a FAIL row; the others still run
            emit(failed_row(rid, shape, exc))
            if device.type == "cuda":
                torch.cuda.empty_cache()

    emit(imports_row())
    vocab0 = model_config(plan.shapes[0]).vocab_size
    attempt("layout", "-", layout_row, plan, vocab0)
    for i, shape in enumerate(plan.shapes):
        try:
            lm = build_model(shape, device)
        except Exception as exc:
            emit(failed_row(f"build/{shape}", shape, exc))
            continue
        attempt(f"shared_vs_plain/{shape}", shape, shared_vs_plain_row, lm, shape, plan, device)
        if i == 0:
            attempt(f"device_vs_cpu/{shape}", shape, device_vs_cpu_rows, lm, shape, plan, device)
        batch, info, _, _ = make_batch(plan.groups, plan.layout, lm.config.vocab_size, seed=3, device=str(device))
        for spec in plan.throughput:
            attempt(
                f"throughput/{shape}/{spec.key}",
                shape,
                throughput_row,
                lm,
                shape,
                spec,
                plan,
                device,
                guard,
                batch,
                info,
            )
        del lm, batch
        if device.type == "cuda":
            torch.cuda.empty_cache()
    wall = guard.elapsed()
    counts = {k: sum(r.result == k for r in rows) for k in ("PASS", "FAIL", "SKIP")}
    summary = f"{len(rows)} rows: {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP; {wall:.0f} s"
    out.parent.mkdir(parents=True, exist_ok=True)
    head = (
        f"# GPU kit{' (dry run)' if dry_run else ''}: {env['device']}\n\n"
        f"{env['date']}; torch {env['torch']}, transformers {env['transformers']}"
        + (f", CUDA {env['cuda']}, {env['memory_gib']} GiB" if device.type == "cuda" else "")
        + f"; `python benchmarks/gpu_kit.py{' --dry-run' if dry_run else ''}`; budget {plan.budget_s:.0f} s\n\n"
    )
    out.write_text(head + TABLE_HEADER + "\n" + "\n".join(r.markdown() for r in rows) + f"\n\n{summary}\n")
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "dry_run": dry_run,
                "environment": env,
                "plan": dataclasses.asdict(plan),
                "wall_s": wall,
                "counts": counts,
                "rows": [dataclasses.asdict(r) for r in rows],
            },
            indent=1,
            default=str,
        )
    )
    print(f"{summary}; table: {out}", flush=True)
    return 1 if counts["FAIL"] or len(rows) < len(row_ids(plan)) else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny random models (about a minute on 2 cores)")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="markdown table (FILE.json beside it); default $OUT/gpu_kit.md, else benchmarks/results/gpu_kit/",
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help=f"time guard, seconds from start (default {GPU_PLAN.budget_s:.0f}; dry run {DRY_PLAN.budget_s:.0f})",
    )
    ap.add_argument("--threads", type=int, default=None, help="CPU threads of the dry run (default 1)")
    args = ap.parse_args(argv)
    plan = DRY_PLAN if args.dry_run else GPU_PLAN
    if args.budget_s is not None:
        plan = dataclasses.replace(plan, budget_s=args.budget_s)
    if args.dry_run:
        # one thread: on a shared 2-core machine, torch's threads stall each other when the cores are
        # busy (the dry run took 40 s on one thread and 9 minutes on two at a load average of 15)
        torch.set_num_threads(args.threads or 1)
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("gpu_kit: no CUDA GPU visible; this kit is for a GPU window (on CPU: --dry-run)", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda", 0)
    return run(plan, device, args.out or default_out(args.dry_run), args.dry_run)


if __name__ == "__main__":
    raise SystemExit(main())
