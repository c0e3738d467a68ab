"""Builders and steps shared by the learner tests (and benchmarks/tests): small hand-made batches, a
learner or an R3L config on the tiny model, and the learner's log-probs under an independent HF model."""

from __future__ import annotations

import os

import pytest
import torch

PROMPT = "You are in room 1 of 3."
CONT = " move right, then go north and open the door"  # several tokens: a robust "weights moved" signal
MID = "default_policy"


def make_learner(**training):
    """A real ``R3LTorchLearner`` on the tiny model, built outside Ray: fp32, micro-batches of 2 rows, no
    token budget, no clipping (the loss tests' hand-computed reference)."""
    import gymnasium as gym
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_r3l import R3LConfig

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    opts = dict(
        model="tiny",
        backend="transformers",
        lr=1e-3,
        weight_decay=0.0,
        mixed_precision="none",
        micro_batch_size=2,
        micro_batch_tokens=None,
        grad_clip=None,
    )
    opts.update(training)
    cfg = R3LConfig().training(**opts)
    space = (gym.spaces.Text(max_length=8), gym.spaces.Text(max_length=8))
    learner = cfg.build_learner(env=None, spaces={"__env__": space, DEFAULT_MODULE_ID: space})
    learner.build()
    return learner


def uneven_batch(vocab: int):
    """Five right-padded rows of different lengths, mixed-sign advantages and one weight of 3."""
    g = torch.Generator().manual_seed(1)
    lens = [23, 9, 17, 30, 12]
    B, T = len(lens), max(lens)
    ids = torch.zeros(B, T, dtype=torch.long)
    att = torch.zeros(B, T, dtype=torch.long)
    loss = torch.zeros(B, T)
    for i, n in enumerate(lens):
        ids[i, :n] = torch.randint(1, vocab, (n,), generator=g)
        att[i, :n] = 1
        loss[i, n // 2 : n] = 1.0
    return {
        "input_ids": ids,
        "attention_mask": att,
        "loss_mask": loss,
        "sampler_logprobs": torch.zeros(B, T),
        "advantages": torch.tensor([1.0, -0.5, 0.25, -1.0, 0.5]),
        "weights": torch.tensor([1.0, 1.0, 3.0, 1.0, 1.0]),
        "on_policy": torch.ones(B),
        "num_loss_tokens": loss.sum(1),
    }


def update_at(learner, timestep: int) -> float:
    """One real ``Learner.update`` (RLlib's path: the lr schedule moves to ``timestep`` after it);
    the lr its optimizer step ran at (``r3l/learner/step_lr``)."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    g = torch.Generator().manual_seed(0)
    B, T = 2, 8
    ids = torch.randint(1, 100, (B, T), generator=g)
    loss = torch.zeros(B, T)
    loss[:, T // 2 :] = 1.0
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones(B, T, dtype=torch.long),
        "loss_mask": loss,
        "sampler_logprobs": torch.zeros(B, T),
        "advantages": torch.tensor([1.0, -1.0]),
        "weights": torch.ones(B),
        "on_policy": torch.ones(B),
        "num_loss_tokens": loss.sum(1),
    }
    mb = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch({k: v.numpy() for k, v in batch.items()})}, env_steps=B)
    r = learner.update(
        batch=mb, timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: timestep}, num_epochs=1, minibatch_size=None
    )
    return float(r["r3l"]["learner"]["step_lr"].peek())


def optimizer_lrs(learner):
    """The lr of every param group of the learner's optimizers."""
    return [g["lr"] for opt in learner._named_optimizers.values() for g in opt.param_groups]


def toy_word_config(**training):
    """The tiny model on ToyWord (target "river"), no reflection, a high lr: an update moves the weights."""
    from rllib_r3l import R3LConfig

    opts = dict(
        model="tiny",
        group_size=8,
        tasks_per_iteration=2,
        backend="transformers",
        reflect=False,
        max_response_tokens=8,
        micro_batch_size=3,
        lr=5e-3,
        weight_decay=0.0,
        num_threads=1,
        sampling_seed=0,
    )  # seeded sampling: "an update within N iterations" cannot flake
    opts.update(training)
    return (
        R3LConfig().environment("r3l/ToyWord", env_config={"fixed_target": "river"}).training(**opts).debugging(seed=0)
    )


def train_until_update(algo, max_iters=4):
    """Train until an iteration updates the learner (its result); the test fails after ``max_iters``."""
    for _ in range(max_iters):
        r = algo.train()
        if r.get("learners", {}).get("default_policy"):
            return r
    pytest.fail("no learner update happened")


def ref_logprobs(state, model_dir, prompt_ids, cont_ids):
    """T=1 log-probs of ``cont`` under an independent HF model holding the learner's weights."""
    from transformers import AutoModelForCausalLM

    from rllib_r3l.learner.rl_module import hf_named_tensors

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if state:
        missing, unexpected = model.load_state_dict(dict(hf_named_tensors(state)), strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=torch.tensor([prompt_ids + cont_ids])).logits[0].float(), -1)
    return [float(lp[len(prompt_ids) - 1 + i, t]) for i, t in enumerate(cont_ids)]
