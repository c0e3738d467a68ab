"""The driver's memory no longer grows with every update: oneDNN's kernel caches are bounded.

On a CPU with bf16, the learner's bf16 matmuls JIT-compile a oneDNN primitive per shape, and oneDNN
and ideep each kept up to 1,024 of them; R3L's shapes change with every batch, so the driver (where
the local learner lives) grew ~17 MB an iteration with the tiny model (docs/reliability.md, "Driver
memory"; ``rllib_r3l/learner/precision.py``). The tests check the structure, not a memory figure:
the capacities are set before the learner's first matmul, and in a real driver after a training
iteration a oneDNN cache holds at most ``KERNEL_CACHE_CAPACITY`` primitives (oneDNN's own verbose
log says which creations were cache hits).
"""

import os
import re
import subprocess
import sys

import pytest

from rllib_r3l.learner.precision import KERNEL_CACHE_CAPACITY, KERNEL_CACHE_ENV_VARS
from tests import REPO_ROOT
from tests.hang_guard import HANG_GUARD_S


def test_the_learner_bounds_the_kernel_caches_when_it_builds(tiny_model_dir, monkeypatch):
    from tests.scripted_rllib import build_learner

    for name in KERNEL_CACHE_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    build_learner()
    assert {n: os.environ.get(n) for n in KERNEL_CACHE_ENV_VARS} == dict.fromkeys(
        KERNEL_CACHE_ENV_VARS, str(KERNEL_CACHE_CAPACITY)
    )


def test_a_users_own_cache_capacity_wins(monkeypatch):
    from rllib_r3l.learner.precision import bound_kernel_caches

    monkeypatch.setenv("LRU_CACHE_CAPACITY", "512")
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    assert bound_kernel_caches() == {
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(KERNEL_CACHE_CAPACITY),
        "LRU_CACHE_CAPACITY": "512",
    }


# The child: a real driver (R3L, local runner, local learner, bf16 learner) trains one iteration, then
# multiplies bf16 matrices of 100 distinct shapes twice. A cache of at most KERNEL_CACHE_CAPACITY
# primitives finds at most that many of the 100 again; the default (1,024) found all 100.
_CHILD = r"""
import ctypes, os, sys
import ray, torch
import rllib_r3l  # noqa: F401
from tests.scripted_rllib import tiny_config

ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
try:
    algo = (tiny_config(sampling_seed=0, mixed_precision="bfloat16", num_threads=1)
            .env_runners(num_env_runners=0).learners(num_learners=0).build_algo())
    algo.train()
    algo.stop()
finally:
    ray.shutdown()
libc = ctypes.CDLL(None)
w = torch.randn(40, 88, dtype=torch.bfloat16)  # a shape the model never multiplies
for phase in (1, 2):
    for m in range(1, 101):
        torch.mm(torch.randn(m, 40, dtype=torch.bfloat16), w)
    libc.fflush(None)  # oneDNN's verbose lines go through C stdio: out before the marker
    print(f"PHASE {phase} DONE", flush=True)
"""


@pytest.mark.integration
def test_a_driver_keeps_a_bounded_number_of_onednn_kernels_after_training(tiny_model_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_CACHE_ENV_VARS}
    env.update(RAY_AUTH_MODE="disabled", ONEDNN_VERBOSE="profile_create", PYTHONPATH=str(REPO_ROOT))
    log = tmp_path / "child.log"
    with open(log, "w") as out:
        rc = subprocess.run(
            [sys.executable, "-c", _CHILD],
            cwd=str(REPO_ROOT),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=HANG_GUARD_S,
        ).returncode
    text = log.read_text()
    assert rc == 0, text[-3000:]
    phase1, phase2 = re.split(r"^PHASE \d DONE$", text, flags=re.M)[:2]  # phase1 starts with the training's
    shape = re.compile(r"create:cache_(hit|miss),cpu,matmul,.*,(\d+)x40:40x88,")
    made = [[m.group(1) for m in shape.finditer(part)] for part in (phase1, phase2)]
    if not made[0]:
        pytest.skip("this CPU runs bf16 matmuls without oneDNN primitives (no verbose creation lines)")
    # one new primitive per shape (M=1 may take another path), more shapes than the bounded cache holds
    assert made[0] == ["miss"] * len(made[0]) and len(made[0]) > KERNEL_CACHE_CAPACITY, made[0]
    assert len(made[1]) == len(made[0])
    # the default caches (1,024 primitives each) found every shape of the first pass again
    assert made[1].count("hit") <= KERNEL_CACHE_CAPACITY, made[1].count("hit")
