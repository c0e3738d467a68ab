"""Beyond one machine, simulated here (issue 38 item 1; docs/scaling.md "Several nodes").

``ray.cluster_utils.Cluster`` starts a head and worker nodes as separate raylets, each with its own
logical resources, on this machine: what a multi-node run does to R3L (placement, the weight sync
across nodes, a node lost mid-iteration, a checkpoint moved to another layout) happens here as it
would across machines; only the network between them is loopback. A user places the env runners
and the learner the way docs/scaling.md describes: custom node resources (``rollout_node`` on the
nodes with generation engines, ``train_node`` on the learner's), requested with
``custom_resources_per_env_runner`` / ``custom_resources_per_learner``.

The cluster: a head (the driver), two rollout nodes, one train node (a second one joins when the
first is removed). The tiny model, ToyCorridor, transformers backend, seeded sampling, one thread.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from tests.hang_guard import HANG_GUARD_S

pytestmark = pytest.mark.slow

ROLLOUT, TRAIN = "rollout_node", "train_node"


@pytest.fixture(scope="module")
def cluster():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    nodes = {
        "rollout_a": c.add_node(num_cpus=1, resources={ROLLOUT: 1}),
        "rollout_b": c.add_node(num_cpus=1, resources={ROLLOUT: 1}),
        "train_a": c.add_node(num_cpus=1, resources={TRAIN: 1}),
    }
    c.wait_for_nodes()
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    try:
        yield c, nodes
    finally:
        ray.shutdown()
        c.shutdown()


def wait_dead(node) -> None:
    """Until the GCS has marked ``node`` dead (``Cluster.remove_node`` returns before that: until then Ray
    may still place actors there, and the node's actor processes may still answer for a moment)."""
    import ray

    started = time.monotonic()
    while any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()):
        assert time.monotonic() - started < HANG_GUARD_S, "hang guard: the removed node is still alive"
        time.sleep(0.5)


def remove_node(c, node) -> None:
    c.remove_node(node, allow_graceful=False)
    wait_dead(node)


def layout_config(**training):
    """Env runner on a rollout node, learner on the train node, as a user would place them."""
    from tests.scripted_rllib import tiny_config

    return (
        tiny_config(sampling_seed=7, num_threads=1, **training)
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5, custom_resources_per_env_runner={ROLLOUT: 1})
        .learners(num_learners=1, num_cpus_per_learner=0.5, custom_resources_per_learner={TRAIN: 1})
        .fault_tolerance(restart_failed_env_runners=True)
    )


def _node_id():
    import ray

    return ray.get_runtime_context().get_node_id()


def runner_nodes(algo):
    return dict(
        algo.env_runner_group.foreach_env_runner(lambda r: (r.worker_index, _node_id()), local_env_runner=False)
    )


def learner_nodes(algo):
    return [r.get() for r in algo.learner_group.foreach_learner(lambda learner: _node_id())]


def learner_weights(algo):
    """The learner's weights under their Hugging Face names (what an engine holds)."""

    def get(learner):
        from rllib_r3l.learner.rl_module import hf_named_tensors

        state = learner.module["default_policy"].unwrapped().state_dict()
        return {k: v.detach().clone() for k, v in hf_named_tensors(state)}

    [w] = [r.get() for r in algo.learner_group.foreach_learner(get)]
    return w


def runner_weights(algo):
    """Each remote runner's generation weights (the transformers backend's model)."""
    return dict(
        algo.env_runner_group.foreach_env_runner(
            lambda r: (r.worker_index, {k: v.detach().clone() for k, v in r.backend.model.state_dict().items()}),
            local_env_runner=False,
        )
    )


def assert_engines_hold_the_learners_weights(algo):
    import torch

    learner = learner_weights(algo)
    runners = runner_weights(algo)
    assert runners
    for idx, engine in runners.items():
        shared = set(engine) & set(learner)
        assert shared == set(learner) - {"lm_head.weight"} or shared == set(learner), idx
        for k in shared:
            assert torch.equal(engine[k], learner[k]), (idx, k)


def _peek(result, *path):
    v = result
    for p in path:
        v = v.get(p, {}) if isinstance(v, dict) else {}
    return v or 0


def test_runner_and_learner_train_on_their_nodes_and_the_engine_holds_the_learners_weights(cluster):
    c, nodes = cluster
    algo = layout_config().build_algo()
    try:
        before = learner_weights(algo)
        results = [algo.train() for _ in range(2)]
        assert algo.iteration == 2 and algo._num_updates >= 1
        assert set(runner_nodes(algo).values()) <= {nodes["rollout_a"].node_id, nodes["rollout_b"].node_id}
        assert learner_nodes(algo) == [nodes["train_a"].node_id]
        after = learner_weights(algo)
        assert any(not (before[k] == after[k]).all() for k in after)  # an update moved the weights
        assert_engines_hold_the_learners_weights(algo)  # synced across nodes, tensor by tensor
        assert all(_peek(r, "env_runners", "num_episodes") > 0 for r in results)
    finally:
        algo.stop()


class NodeRemoval:
    """``faults.maybe_kill_runner``'s interface: removes the node of the runner about to sample, at
    once (``delay_s=0``: the driver then asks a runner whose node is gone; deterministic on a fast
    machine, where the tiny model's sampling can end within any fixed delay) or after ``delay_s``
    unless sampling returned first (the same lock as ``faults.RunnerKill``)."""

    def __init__(self, cluster, node, delay_s: float) -> None:
        self.fired = False
        self._lock = threading.Lock()
        self._finished = False
        self._cluster, self._node = cluster, node
        if delay_s <= 0:
            self._timer = None
            self._remove()
            return
        self._timer = threading.Timer(delay_s, self._remove)
        self._timer.start()

    def _remove(self) -> None:
        with self._lock:
            if not self._finished:
                remove_node(self._cluster, self._node)
                self.fired = True

    def finish(self) -> bool:
        with self._lock:
            self._finished = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join(timeout=HANG_GUARD_S)
        return self.fired


def test_a_rollout_node_lost_mid_iteration_its_groups_are_counted_and_resampled_on_another_node(cluster, monkeypatch):
    from rllib_r3l.reliability import faults

    c, nodes = cluster
    algo = layout_config().build_algo()
    armed, lost = [], None
    try:
        algo.train()
        [(rid, node_id)] = runner_nodes(algo).items()
        [lost] = [n for n in (nodes["rollout_a"], nodes["rollout_b"]) if n.node_id == node_id]
        survivor = nodes["rollout_b"] if lost is nodes["rollout_a"] else nodes["rollout_a"]

        def remove_mid_sample(algo_, runner_ids):
            if armed:  # once: the first sampling attempt of iteration 2
                return None
            # as iteration 2's sampling starts, dead to the GCS before the sample call: the call then fails
            # (the actor is restarting) or reaches the restarted process, which refuses (its initial
            # weights): either way one counted failure, a restore and a re-sample
            armed.append(NodeRemoval(c, lost, delay_s=0.0))
            return armed[0]

        monkeypatch.setattr(faults, "maybe_kill_runner", remove_mid_sample)
        r = algo.train()
        assert armed and armed[0].fired
        tasks = algo.config.tasks_per_iteration
        f = lambda *k: _peek(r, "r3l", "faults", *k)  # noqa: E731  (the driver's counts)
        assert f("env_runner_failures") == 1 and f("groups_lost_with_runner") == tasks
        assert f("groups_resampled") == tasks and f("env_runners_restored") >= 1
        # every task group came back, from the runner Ray restarted on the surviving rollout node
        assert _peek(r, "env_runners", "num_groups") == tasks
        assert runner_nodes(algo) == {rid: survivor.node_id}
        assert _peek(r, "env_runners", "r3l", "faults", "episodes_lost") == 0  # nothing else was lost
        assert_engines_hold_the_learners_weights(algo)  # the restarted runner got the learner's weights
    finally:
        algo.stop()
        if armed and armed[0].fired:  # the next tests get a cluster of the same shape (dead to the GCS: removal waited)
            nodes[{v: k for k, v in nodes.items()}[lost]] = c.add_node(num_cpus=1, resources={ROLLOUT: 1})
            c.wait_for_nodes()


def test_the_learners_node_lost_ends_with_a_clear_error_and_the_run_resumes_exactly_on_a_new_node(cluster, tmp_path):
    import torch

    from rllib_r3l import R3L
    from rllib_r3l.errors import LearnerLost

    c, nodes = cluster
    algo = layout_config().build_algo()
    ckpt = tmp_path / "ckpt"
    try:
        algo.train()
        algo.save_to_path(str(ckpt))
        algo.train()  # the reference: iteration 2 on the original layout
        reference = learner_weights(algo)
        c.remove_node(nodes["train_a"], allow_graceful=False)  # not waiting: the run meets it however it comes
        started = time.monotonic()
        with pytest.raises(LearnerLost, match=r"the learner .* died") as e:
            algo.train()
        assert time.monotonic() - started < HANG_GUARD_S
        assert "resume from the last checkpoint" in str(e.value)
    finally:
        try:
            algo.stop()
        except Exception:  # noqa: BLE001  (its learner is gone with the node)
            pass
        if nodes["train_a"] not in c.worker_nodes:  # the next tests get a train node, whatever failed here
            wait_dead(nodes["train_a"])
            nodes["train_a"] = nodes["train_b"] = c.add_node(num_cpus=1, resources={TRAIN: 1})
            c.wait_for_nodes()
    resumed = R3L.from_checkpoint(str(ckpt))
    try:
        assert resumed.iteration == 1
        assert learner_nodes(resumed) == [nodes["train_b"].node_id]
        resumed.train()
        got = learner_weights(resumed)
        assert got.keys() == reference.keys()
        assert all(torch.equal(got[k], reference[k]) for k in got)  # bit for bit
        assert_engines_hold_the_learners_weights(resumed)
    finally:
        resumed.stop()


def test_a_checkpoint_from_the_multi_node_layout_restores_on_one_node(cluster, tmp_path):
    import torch

    from tests.scripted_rllib import tiny_config

    algo = layout_config().build_algo()
    try:
        algo.train()
        saved = learner_weights(algo)
        algo.save_to_path(str(tmp_path / "ckpt"))
    finally:
        algo.stop()
    # everything in the driver's process: no remote runner, a local learner
    local = tiny_config(sampling_seed=7, num_threads=1).build_algo()
    try:
        local.restore_from_path(str(tmp_path / "ckpt"))
        assert local.iteration == 1 and local._num_updates == algo._num_updates
        module = local.learner_group._learner.module["default_policy"].unwrapped()
        from rllib_r3l.learner.rl_module import hf_named_tensors

        restored = dict(hf_named_tensors(module.state_dict()))
        assert all(torch.equal(restored[k], saved[k]) for k in saved)
        opt = next(iter(local.learner_group._learner._named_optimizers.values()))
        steps = {float(s["step"]) for g in opt.param_groups for p in g["params"] for s in [opt.state[p]] if s}
        assert steps == {float(algo._num_updates)}  # AdamW's state came along
        r = local.train()
        assert r["training_iteration"] == 2 and local._num_updates == algo._num_updates + 1
    finally:
        local.stop()
