"""DeepSpeed checkpoints are complete (issue 38): the module, the optimizer state as DeepSpeed saves it
(ZeRO 1-3 partitions, fp32 masters, AdamW moments) and the engine's counters go into the learner's
state, and a learner restored from a checkpoint continues bit for bit: the same losses and weights as
the learner that never stopped.

Each check runs in its own process (DeepSpeed leaves a torch.distributed group behind, which must
not leak into the test session): one learner outside Ray per ZeRO stage (gloo, world size 1), and
two gloo processes for the partitioned case (each learner saves and loads its own partition).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests import REPO_ROOT
from tests.learner.deepspeed_checks import result_of, run_python

pytestmark = pytest.mark.slow  # DeepSpeed engines: ~10-60 s per check on 2 shared cores


# stages 1 and 2 write the same checkpoint (the optimizer state in partitions; 2 also splits the gradients,
# which a checkpoint does not hold): 2 is tested, in bf16, where the fp32 masters matter most
@pytest.mark.parametrize("stage, dtype", [(0, "float32"), (2, "bfloat16"), (3, "float32")])
def test_deepspeed_resume_is_bit_exact(stage, dtype, tiny_model_dir, tmp_path):
    """ZeRO stages 0, 2 and 3, one learner (gloo): the restored learner's losses and weights equal the
    uninterrupted learner's bit for bit; restoring the weights alone does not (AdamW moments).
    bf16 weights: DeepSpeed's fp32 masters come from the checkpoint, not from the bf16 weights."""
    pytest.importorskip("deepspeed")
    code = (
        "import json, sys; from tests.learner.deepspeed_checks import deepspeed_resume_check; "
        "print('RESULT ' + json.dumps(deepspeed_resume_check(int(sys.argv[1]), sys.argv[2], sys.argv[3])))"
    )
    r = result_of(run_python(code, str(stage), str(tmp_path / "ckpt"), dtype))
    assert r["losses_b"] == r["losses_a"], r
    assert r["same_weights"], r
    assert r["moved"], r
    # weights alone: the same weights (DeepSpeed's fp32 masters follow the restored module), so the
    # same first loss; then the fresh AdamW moments step elsewhere
    assert r["masters_follow"], r
    assert r["losses_c"][0] == r["losses_a"][0] and not r["module_only_same"], r
    assert r["partitioned"] == (stage > 0) and r["world_size"] == 1
    assert r["plain_restores"] in ((True,) if stage == 3 else (None,)), r
    assert r["global_steps"] == [4, 4]  # the engine's counters come back too


# -- two learners: each saves and loads its own partition ------------------------------------------------
_TWO_RANKS = r"""
import json, os, sys
import torch, torch.distributed as dist
rank, port, ckpt = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE="2")
dist.init_process_group("gloo", rank=rank, world_size=2)
from tests.learner.deepspeed_checks import deepspeed_learner, hand_batches, module_weights, same_tensors, train_once
out = {}
for stage in (2, 3):  # one pair of processes for both stages (their start-up is most of the time)
    a = deepspeed_learner(stage)
    data = hand_batches(a.module["default_policy"].lm.config.vocab_size, 3, seed=10 + rank)  # each learner its shard
    train_once(a, data[0])
    no_snapshot = "optimizer" not in a.get_state()  # partitioned, nobody gathered: weights only (a warning)
    a.prepare_checkpoint()  # collective
    path = os.path.join(ckpt, str(stage))
    if rank == 0:
        a.save_to_path(path)  # RLlib asks only the first learner
    dist.barrier()
    losses_a = [train_once(a, b) for b in data[1:]]
    w_a = module_weights(a)
    b = deepspeed_learner(stage)
    b.restore_from_path(path)  # every learner restores from the same folder
    losses_b = [train_once(b, x) for x in data[1:]]
    out[stage] = {"no_snapshot": no_snapshot, "losses_a": losses_a, "losses_b": losses_b,
                  "same_weights": same_tensors(w_a, module_weights(b))}
print("RESULT " + json.dumps(out))
dist.destroy_process_group()
"""


def test_deepspeed_two_learners_resume_their_partitions_bit_exact(tiny_model_dir, tmp_path):
    """Two gloo learners, ZeRO-2 and ZeRO-3 (optimizer state, and at stage 3 the weights, split in
    halves): prepare_checkpoint gathers both partitions into the first learner's state; both
    learners restore their own from the one checkpoint and continue bit for bit."""
    pytest.importorskip("deepspeed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONPATH=str(REPO_ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _TWO_RANKS, str(r), str(port), str(tmp_path / "ckpt")],
            cwd=str(REPO_ROOT),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    results = []
    for p in procs:
        out, err = p.communicate()  # no wall-clock deadline: a loaded machine is slow, not wrong
        results.append(result_of(subprocess.CompletedProcess(p.args, p.returncode, out, err)))
    for stage in ("2", "3"):
        for r in results:
            assert r[stage]["no_snapshot"], (stage, r)
            assert r[stage]["losses_b"] == r[stage]["losses_a"] and r[stage]["same_weights"], (stage, r)
        assert results[0][stage]["losses_a"] != results[1][stage]["losses_a"]  # each learner trained its own shard


_THROUGH_RAY = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
import ray, torch
from tests.learner.helpers import toy_word_config, train_until_update
from rllib_r3l import R3L

stage, out = int(sys.argv[1]), sys.argv[2]
ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
def weights(a):  # every learner's full weights (at ZeRO-3 each holds a partition: the gathered copy)
    fn = lambda l: {k: v.clone() for k, v in l.get_state(components="rl_module")["rl_module"]["default_policy"].items()}
    return [r.get() for r in a.learner_group.foreach_learner(fn)]
algo = toy_word_config(deepspeed={"stage": stage}).learners(num_learners=2, num_cpus_per_learner=0.5).build_algo()
try:
    train_until_update(algo)
    path = algo.save_to_path(os.path.join(out, "ckpt"))
    n = algo._num_updates
    algo.train()
    ref, n_ref = weights(algo), algo._num_updates
finally:
    algo.stop()
resumed = R3L.from_checkpoint(path)
try:
    assert resumed._num_updates == n
    resumed.train()
    got = weights(resumed)
    full = all(v.numel() > 0 for w in got + ref for v in w.values())  # not empty ZeRO-3 partitions
    same = full and len(got) == len(ref) == 2 and all(a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
                                                      for a, b in zip(got, ref))
    print(json.dumps({"trained_after_ckpt": n_ref == n + 1, "updates": resumed._num_updates == n_ref, "same": same}))
finally:
    resumed.stop()
    ray.shutdown()
"""


@pytest.mark.parametrize(
    "stage", [3]
)  # stage 2 passed too (198 s under load); the partition round trip above covers it
def test_deepspeed_two_learners_resume_through_ray_bit_exact(stage, tmp_path):
    """The whole path a user takes: two DeepSpeed learner actors (ZeRO-2: optimizer state split in
    halves; ZeRO-3: the weights too), ``save_to_path`` (every learner gathers its partition into the
    checkpoint), ``R3L.from_checkpoint`` on new actors: the next iteration's weights on both learners
    equal those of the run that never stopped, bit for bit. In its own process (DeepSpeed leaves a
    torch.distributed group behind)."""
    pytest.importorskip("deepspeed")
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONPATH=str(REPO_ROOT))
    out = subprocess.run(
        [sys.executable, "-c", _THROUGH_RAY, str(stage), str(tmp_path)],
        cwd=str(REPO_ROOT),
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"trained_after_ckpt": True, "updates": True, "same": True}, result
