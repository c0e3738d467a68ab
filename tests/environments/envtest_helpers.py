"""Helpers of the environment tests (real environments, real JVMs)."""

import os
import random

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def java_children():
    """PIDs of live java processes started (directly or not) by this test process."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if "java" in p.name().lower() and p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def random_walk(env, seed, steps, rng_seed=0, avoid=()):
    """Reset to ``seed`` and take ``steps`` random admissible actions (none starting with a word in
    ``avoid``); returns (actions, observations)."""
    rng = random.Random(rng_seed)
    obs, info = env.reset(seed=seed)
    actions, observations = [], [obs]
    for _ in range(steps):
        a = rng.choice([a for a in info["admissible_actions"] if a.split(" ", 1)[0] not in avoid])
        obs, _r, term, trunc, info = env.step(a)
        actions.append(a)
        observations.append(obs)
        if term or trunc:
            break
    return actions, observations
