"""``benchmarks/gpu_kit.py``: its dry run (CPU, tiny models, Ray and vLLM unimportable) has every row
and every check passes; its pure helpers on hand values; its loss equals the learner's.

No GPU here: the CUDA parts (peak GPU memory, TF32 off, the GPU side of the device-vs-CPU rows) run
only in a GPU window. In the dry run the CPU stands in for the GPU, so its device-vs-CPU rows compare
the CPU with itself: the test names say where something is faked or skipped.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from benchmarks import gpu_kit as kit
from tests import REPO_ROOT

BLOCK = ("ray", "vllm")


@pytest.mark.subprocess
def test_dry_run_cpu_stands_in_for_the_gpu_with_ray_and_vllm_unimportable_every_row_passes(tmp_path):
    out = tmp_path / "kit.md"
    code = (
        "import runpy, sys\n"
        + "".join(f"sys.modules[{b!r}] = None\n" for b in BLOCK)
        + f"sys.argv = ['benchmarks/gpu_kit.py', '--dry-run', '--out', {str(out)!r}]\n"
        + "runpy.run_path('benchmarks/gpu_kit.py', run_name='__main__')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    data = json.loads(out.with_suffix(".json").read_text())
    want = kit.row_ids(kit.DRY_PLAN)
    assert [row["id"] for row in data["rows"]] == want
    assert {row["id"]: row["result"] for row in data["rows"]} == {i: "PASS" for i in want}
    assert data["counts"] == {"PASS": len(want), "FAIL": 0, "SKIP": 0} and data["dry_run"] is True
    # the equality checks measured something and stayed within their tolerances
    rows = {row["id"]: row["values"] for row in data["rows"]}
    shared = rows["shared_vs_plain/tiny-llama"]
    assert (
        0 < shared["grad"] <= kit.TOL_BF16["grad"] and shared["forward_tokens_shared"] < shared["forward_tokens_plain"]
    )
    assert rows["imports"]["loaded"] == []
    assert all(rows[f"throughput/tiny-qwen2/{t.key}"]["tokens_per_s"] > 0 for t in kit.DRY_PLAN.throughput)
    # quiet: a preamble, the table (header, rule, one line per row) and a summary; the file holds the same rows
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 + 2 + len(want) + 1 and lines[-1].startswith(f"{len(want)} rows: {len(want)} PASS")
    table = [ln for ln in out.read_text().splitlines() if ln.startswith("| PASS |")]
    assert table == [ln for ln in lines if ln.startswith("| PASS |")] and len(table) == len(want)
    assert "Traceback" not in r.stderr


@pytest.mark.subprocess
def test_the_learners_forward_imports_without_ray():
    code = (
        "import sys\n"
        + "".join(f"sys.modules[{b!r}] = None\n" for b in BLOCK)
        + "from rllib_r3l.learner import forward\n"
        + "assert callable(forward.token_logprobs) and callable(forward.shared_prefix_hidden)\n"
        + "assert sys.modules['ray'] is None\n"
        + "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_without_cuda_the_kit_refuses_with_a_clear_message_cuda_faked_missing(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert kit.main([]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU visible" in err and "--dry-run" in err


def test_model_shapes_have_the_published_parameter_counts():
    from transformers import AutoModelForCausalLM

    counts = {}
    for shape in ("smollm2-135m", "qwen2.5-1.5b"):
        with torch.device("meta"):
            lm = AutoModelForCausalLM.from_config(kit.model_config(shape))
        counts[shape] = sum(p.numel() for p in lm.parameters())
        assert lm.config.tie_word_embeddings and lm.config.use_cache is False
    assert counts == {"smollm2-135m": 134_515_008, "qwen2.5-1.5b": 1_543_714_304}


def test_r3l_group_layout_kinds_prefixes_credit_and_advantages_seeded():
    b, info, trajs, adv = kit.make_batch(2, kit.DRY_LAYOUT, 4096, seed=7)
    assert kit.layout_problems(trajs, adv, kit.DRY_LAYOUT) == []
    assert info["kinds"] == {"base": 8, "retry": 6, "reflection_sft": 0, "retry_sft": 2}
    assert info["rows"] == 16 and info["trie_tokens"] < info["tokens"]
    assert int(b["num_loss_tokens"].sum()) == info["credited"] > 0
    # group-relative advantages, amplified: rewards (1, 0, 0, 0 | 1, 0, 0.5), mean 2.5 / 7, alpha 3
    assert sorted(set(np.round(adv, 6))) == sorted({1.0, round(-2.5 / 7, 6), round(3 * (0.5 - 2.5 / 7), 6)})
    again, _, _, _ = kit.make_batch(2, kit.DRY_LAYOUT, 4096, seed=7)
    other, _, _, _ = kit.make_batch(2, kit.DRY_LAYOUT, 4096, seed=8)
    assert torch.equal(again["input_ids"], b["input_ids"]) and not torch.equal(other["input_ids"], b["input_ids"])
    assert int(b["input_ids"][b["attention_mask"] > 0].min()) >= kit.TOKEN_LOW


def test_layout_problems_catch_a_broken_group():
    _, _, trajs, adv = kit.make_batch(1, kit.DRY_LAYOUT, 4096)
    retry = next(t for t in trajs if t.kind == kit.Kind.RETRY)
    retry.credit_from_turn = 0  # credit before the pivot
    assert any("credit before the pivot" in p for p in kit.layout_problems(trajs, adv, kit.DRY_LAYOUT))
    _, _, trajs, adv = kit.make_batch(1, kit.DRY_LAYOUT, 4096)
    adv = np.array(adv)
    adv[0] = 0.5
    assert any("advantage" in p for p in kit.layout_problems(trajs, adv, kit.DRY_LAYOUT))
    _, _, trajs, adv = kit.make_batch(1, kit.DRY_LAYOUT, 4096)
    assert any("kinds" in p for p in kit.layout_problems(trajs[:-1], adv[:-1], kit.DRY_LAYOUT))
    _, _, trajs, adv = kit.make_batch(1, kit.DRY_LAYOUT, 4096)
    retry = [t for t in trajs if t.kind == kit.Kind.RETRY][-1]  # pivot 3: its turn-1 prompt is replayed
    seg = next(i for i, s in enumerate(retry.segments) if s.turn == 1 and s.role == "prompt")
    retry.segments[seg] = dataclasses.replace(
        retry.segments[seg], token_ids=[t + 1 for t in retry.segments[seg].token_ids]
    )
    assert any("does not share exactly" in p for p in kit.layout_problems(trajs, adv, kit.DRY_LAYOUT))


def test_retry_pivots_spread_over_the_turns():
    assert kit.retry_pivots(10, 3) == [1, 5, 9]
    assert kit.retry_pivots(4, 3) == [1, 2, 3]
    assert kit.retry_pivots(2, 3) == [1, 1, 1]
    with pytest.raises(ValueError, match="at least 2 turns"):
        kit.retry_pivots(1, 3)


def test_time_guard_skips_a_row_that_would_not_fit_and_says_so():
    now = [0.0]
    guard = kit.TimeGuard(100.0, clock=lambda: now[0])
    assert guard.estimate("m", 1000, reps=3) is None and guard.skip_reason("m", 1000, reps=3) is None
    guard.record("m", seconds=2.0, forward_tokens=1000)  # 2 ms a token
    assert guard.estimate("m", 2000, reps=3) == pytest.approx(1.3 * 0.002 * 2000 * 4 + 2.0)
    now[0] = 70.0  # 30 s left: 2,000 tokens (~23 s) fit, 4,000 (~44 s) do not
    assert guard.skip_reason("m", 2000, reps=3) is None
    reason = guard.skip_reason("m", 4000, reps=3)
    assert reason.startswith("skipped by the time guard") and "30 s left of 100 s" in reason
    now[0] = 101.0
    assert guard.skip_reason("other", 1, reps=1) is not None  # nothing left: even an unknown shape waits


def test_a_throughput_row_past_the_budget_is_a_skip_row_not_a_failure():
    batch, info, _, _ = kit.make_batch(1, kit.DRY_LAYOUT, 4096)
    guard = kit.TimeGuard(0.0)
    # no model: the row is skipped before one is touched
    row = kit.throughput_row(
        None, "qwen2.5-1.5b", kit.Throughput(16384), kit.GPU_PLAN, torch.device("cpu"), guard, batch, info
    )
    assert row.result == "SKIP" and row.id == "throughput/qwen2.5-1.5b/mbt16384" and "time guard" in row.measured
    assert "| SKIP |" in row.markdown()


def test_the_last_1_5b_row_is_skipped_with_its_line_on_a_faked_80gb_card_and_runs_on_a_faked_139gb_card(monkeypatch):
    """Issue 47 item 4: the memory guard against the card's memory (faked: no GPU here; the row's own
    run is faked too, on the 139 GB card)."""
    gpu = torch.device("cuda", 0)  # never touched: the card's memory and the timed run are faked
    vocab = kit.model_config("qwen2.5-1.5b").vocab_size
    batch, info, _, _ = kit.make_batch(kit.GPU_PLAN.groups, kit.GPU_PLAN.layout, vocab, seed=3)
    last = kit.GPU_PLAN.throughput[-1]
    ran = []

    def faked_run(lm, shape, spec, plan, device, guard, batch, info, rid, check, label):
        ran.append(rid)
        return kit.Row(rid, check, shape, label, "ran", "loss and gradients finite", "PASS")

    monkeypatch.setattr(kit, "_timed", faked_run)

    def row(card_bytes, spec=last):
        monkeypatch.setattr(kit, "card_memory_gib", lambda device: card_bytes / 2**30)
        guard = kit.TimeGuard(600.0)
        return kit.throughput_row(None, "qwen2.5-1.5b", spec, kit.GPU_PLAN, gpu, guard, batch, info)

    h100 = row(85_031_714_816)  # an 80 GB H100's total_memory: 79.2 GiB
    assert h100.result == "SKIP" and h100.id == "throughput/qwen2.5-1.5b/mbt16384" and ran == []
    assert h100.measured.startswith("skipped by the memory guard: ~82 GiB needed, the card has 79 GiB")
    assert "| SKIP |" in h100.markdown() and "\n" not in h100.measured
    assert row(85_031_714_816, kit.GPU_PLAN.throughput[1]).result == "PASS"  # 8192 (~50 GiB) fits the H100
    h200 = row(139 * 2**30)
    assert h200.result == "PASS" and ran[-1] == "throughput/qwen2.5-1.5b/mbt16384"
    assert kit.memory_skip_reason("qwen2.5-1.5b", last, batch, torch.device("cpu")) is None  # no limit on CPU


def test_row_ids_of_the_gpu_plan_end_with_the_largest_batch_of_the_largest_model():
    ids = kit.row_ids(kit.GPU_PLAN)
    assert ids[:2] == ["imports", "layout"] and len(ids) == len(set(ids)) == 2 + (1 + 2 + 5) + (1 + 5)
    assert ids[-1] == "throughput/qwen2.5-1.5b/mbt16384"
    assert "device_vs_cpu_fp32/smollm2-135m" in ids and "device_vs_cpu_bf16/smollm2-135m" in ids
    assert [s for s in kit.row_ids(kit.DRY_PLAN) if s.startswith("shared_vs_plain")] == [
        "shared_vs_plain/tiny-llama",
        "shared_vs_plain/tiny-qwen2",
    ]


def test_default_out_under_OUT_when_set_else_the_results_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert kit.default_out(False) == tmp_path / "gpu_kit.md"
    monkeypatch.delenv("OUT")
    assert kit.default_out(True) == REPO_ROOT / "benchmarks" / "results" / "gpu_kit" / "gpu_kit_dry_run.md"


def test_compare_hand_values():
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    want = kit.Pass(loss=2.0, logprobs=torch.tensor([[-4.0, -9.0, -2.0]]), forward_tokens=3, micro_batches=1)
    got = kit.Pass(loss=2.03, logprobs=torch.tensor([[-4.1, 0.0, -2.0]]), forward_tokens=3, micro_batches=1)
    v = kit.compare(got, [torch.tensor([3.0, 4.0])], want, [torch.tensor([3.0, 4.5])], mask)
    assert v["logp"] == pytest.approx(0.1, abs=1e-6)  # the uncredited position is not compared
    assert v["loss"] == pytest.approx(0.03 / 3.0)  # relative to the mean |log-prob| of the credited tokens
    assert v["grad"] == pytest.approx(0.5 / (3.0**2 + 4.5**2) ** 0.5)
    assert kit.within(v, {"logp": 0.2, "loss": 0.02, "grad": 0.2}) and not kit.within(v, kit.TOL_FP32)
    assert not kit.within({"logp": float("nan"), "loss": 0.0, "grad": 0.0}, kit.TOL_BF16)


@pytest.mark.slow
def test_the_kits_loss_and_gradient_equal_the_learners_on_an_r3l_group(tiny_model_dir):
    """The kit's glue (micro-batches, per-token broadcast, ``policy_gradient_loss``) against a real
    ``R3LTorchLearner._update`` on the same weights and batch, shared prefixes on (CPU, fp32)."""
    from tests.learner.helpers import MID, make_learner

    learner = make_learner(micro_batch_size=3, micro_batch_tokens=None)
    lm = learner.module[MID].lm
    batch, _, _, _ = kit.make_batch(1, kit.DRY_LAYOUT, lm.config.vocab_size, seed=4)
    lm.zero_grad(set_to_none=True)
    mine = kit.forward_backward(lm, batch, share=True, mixed_precision="none", micro_batch_size=3)
    kit_grads = {id(p): p.grad.detach().clone() for p in lm.parameters()}
    lm.zero_grad(set_to_none=True)
    _, losses, _ = learner._update({MID: {k: v.clone() for k, v in batch.items()}})
    assert mine.micro_batches == 3 and mine.loss == pytest.approx(float(losses[MID]), rel=1e-6, abs=1e-7)
    got = [kit_grads[id(p)] for p in learner._params.values() if p.grad is not None]
    want = [p.grad for p in learner._params.values() if p.grad is not None]
    assert len(got) == len(kit_grads) and kit.relative_error(got, want) < 1e-5
