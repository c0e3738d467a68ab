"""DeepSpeed checks run in a process of their own (DeepSpeed leaves a torch.distributed group behind, which
must not leak into the test session): their bodies, the learners and batches they train, and how the tests
start them and read their result."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from tests import REPO_ROOT
from tests.learner.helpers import CONT, PROMPT, ref_logprobs, toy_word_config, train_until_update


def hand_batches(vocab: int, n: int, seed: int = 0):
    """``n`` small hand-made training batches (different tokens, lengths and advantages)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        lens = torch.randint(6, 20, (4,), generator=g).tolist()
        B, T = len(lens), max(lens)
        ids = torch.zeros(B, T, dtype=torch.long)
        att = torch.zeros(B, T, dtype=torch.long)
        loss = torch.zeros(B, T)
        for i, k in enumerate(lens):
            ids[i, :k] = torch.randint(1, vocab, (k,), generator=g)
            att[i, :k] = 1
            loss[i, k // 2 : k] = 1.0
        out.append(
            {
                "input_ids": ids,
                "attention_mask": att,
                "loss_mask": loss,
                "sampler_logprobs": torch.zeros(B, T),
                "advantages": torch.randn(B, generator=g),
                "weights": torch.ones(B),
                "on_policy": torch.ones(B),
                "num_loss_tokens": loss.sum(1),
            }
        )
    return out


def train_once(learner, batch) -> float:
    """One real ``Learner.update`` (RLlib's path: batch conversion, lr schedule); its loss."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    n = len(batch["input_ids"])
    mb = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch({k: v.numpy() for k, v in batch.items()})}, env_steps=n)
    r = learner.update(batch=mb, timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: n}, num_epochs=1, minibatch_size=None)
    return float(r[DEFAULT_MODULE_ID]["total_loss"].peek())


def module_weights(learner):
    """The full module weights (gathered under ZeRO-3: the learner's CPU copy)."""
    state = learner.get_state(components="rl_module")["rl_module"]["default_policy"]
    return {k: torch.as_tensor(v).clone() for k, v in state.items()}


def same_tensors(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def deepspeed_learner(stage: int, dtype: str = "float32"):
    from tests.scripted_rllib import build_learner

    return build_learner(
        deepspeed={"stage": stage},
        micro_batch_size=2,
        mixed_precision="none",
        grad_clip=1.0,
        num_threads=1,
        model_dtype=dtype,
    )


def deepspeed_resume_check(stage: int, ckpt: str, dtype: str = "float32") -> dict:
    """k = 2 steps, checkpoint (save_to_path), m = 2 more; a fresh learner restored from the
    checkpoint trains the same m batches. Also a fresh learner restored from the module's folder
    alone (RLlib's ``component="rl_module"``): the same weights, fresh AdamW moments."""
    a = deepspeed_learner(stage, dtype)
    data = hand_batches(a.module["default_policy"].lm.config.vocab_size, 4)
    for b in data[:2]:
        train_once(a, b)
    a.save_to_path(ckpt)
    w_k = module_weights(a)
    losses_a = [train_once(a, b) for b in data[2:]]
    w_a = module_weights(a)

    b = deepspeed_learner(stage, dtype)
    b.restore_from_path(ckpt)
    losses_b = [train_once(b, x) for x in data[2:]]

    c = deepspeed_learner(stage, dtype)
    c.restore_from_path(os.path.join(ckpt, "rl_module"), component="rl_module")
    # a zero-advantage batch: zero gradients, so AdamW's step leaves DeepSpeed's fp32 masters
    # where they are and copies them into the module: they must be the restored weights
    train_once(c, dict(data[2], advantages=torch.zeros_like(data[2]["advantages"])))
    masters_follow = same_tensors(module_weights(c), w_k)
    losses_c = [train_once(c, x) for x in data[2:]]

    plain_restores = None
    if stage == 3:  # a ZeRO checkpoint into the plain torch learner: the (gathered) weights, fresh moments
        from tests.scripted_rllib import build_learner

        plain = build_learner(micro_batch_size=2, mixed_precision="none", grad_clip=1.0, num_threads=1)
        plain.restore_from_path(ckpt)  # a warning about the optimizer state, no error
        plain_restores = same_tensors(module_weights(plain), w_k)

    entry = a.get_state()["optimizer"]["__deepspeed__"]["default_policy"]
    return {
        "plain_restores": plain_restores,
        "losses_a": losses_a,
        "losses_b": losses_b,
        "losses_c": losses_c,
        "same_weights": same_tensors(w_a, module_weights(b)),
        "moved": not same_tensors(w_a, w_k),
        "masters_follow": masters_follow,
        "module_only_same": same_tensors(w_a, module_weights(c)),
        "partitioned": entry["partitioned"],
        "world_size": entry["world_size"],
        "global_steps": [a._engines["default_policy"].global_steps, b._engines["default_policy"].global_steps],
    }


def run_python(code: str, *args: str, timeout=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=str(REPO_ROOT),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def result_of(out: subprocess.CompletedProcess) -> dict:
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert out.returncode == 0 and lines, (out.stdout[-2000:], out.stderr[-4000:])
    return json.loads(lines[-1][7:])


def deepspeed_zero3_check(tmp: str) -> None:
    """Body of the DeepSpeed test; runs in its own process (it leaves a one-process
    torch.distributed group behind, which must not leak into the test session)."""
    import ray

    from rllib_r3l.models import load_tokenizer, resolve_model

    tiny_model_dir = resolve_model("tiny")
    tiny_tokenizer = load_tokenizer(tiny_model_dir)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    algo = toy_word_config(deepspeed={"stage": 3}).build_algo()
    restored = None
    try:
        train_until_update(algo)
        full = algo.learner_group.get_state()["learner"]
        assert "__deepspeed__" in full["optimizer"]  # complete checkpoints (issue 38)
        state = full["rl_module"]["default_policy"]
        assert all(v.numel() > 0 for v in state.values())  # gathered, not ZeRO-3 partitions
        prompt = tiny_tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
        cont = tiny_tokenizer(CONT, add_special_tokens=False)["input_ids"]
        ref = ref_logprobs(state, tiny_model_dir, prompt, cont)
        init = ref_logprobs({}, tiny_model_dir, prompt, cont)
        assert max(abs(a - b) for a, b in zip(ref, init)) > 1e-4
        got = algo.env_runner_group.local_env_runner.backend.score(prompt, cont)
        assert max(abs(a - b) for a, b in zip(got, ref)) < 1e-3
        # resume through the Algorithm (R3L.from_checkpoint): the next iteration is the same, bit for bit
        from rllib_r3l import R3L

        path = algo.save_to_path(os.path.join(tmp, "ckpt"))
        n = algo._num_updates
        algo.train()
        assert algo._num_updates == n + 1  # the iteration after the checkpoint trained
        restored = R3L.from_checkpoint(path)
        restored.train()
        assert restored._num_updates == n + 1
        after, again = (a.learner_group.get_state()["learner"]["rl_module"]["default_policy"] for a in (algo, restored))
        assert after.keys() == again.keys() and all(torch.equal(after[k], again[k]) for k in after)
    finally:
        algo.stop()
        if restored is not None:
            restored.stop()
        ray.shutdown()
