"""Reliability (docs/reliability.md): faults are survived, every loss is counted, bad input gives a
clear error or a counted handling, and a killed run resumes exactly where its checkpoint left off."""

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest

import environments
from rllib_r3l import R3LConfig
from rllib_r3l.batch import build_train_batch, select_trainable
from rllib_r3l.generation.base import GenerationResult
from rllib_r3l.reliability import faults
from rllib_r3l.reliability.faults import fault_plan, wrap_env_factory
from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.runner.explore import Explorer
from rllib_r3l.runner.rollout import EpisodeRunner, EpisodeSpec, RolloutOptions
from rllib_r3l.trajectory import Status
from tests import REPO_ROOT
from tests.hang_guard import HANG_GUARD_S
from tests.scripted import ScriptedBackend, explore_options

ROOT = str(REPO_ROOT)


# ------------------------------------------------------------------------------------------------------
# configuration: fault injection is off by default; bad values name the field
def test_fault_injection_is_off_by_default():
    c = R3LConfig()
    assert fault_plan(c) is None
    assert c.sampling_seed is None and c.runner_failure_retries == 1
    factory = lambda: None  # noqa: E731
    assert wrap_env_factory(factory, c, Counter(), 0) is factory
    c.validate_r3l()


@pytest.mark.parametrize(
    "plan,needle",
    [
        ({"env_raise_prob": 1.5}, "faults.inject['env_raise_prob']: must be a probability"),
        ({"env_rase_prob": 0.1}, "did you mean 'env_raise_prob'"),
        ({"nan_loss_at_updates": [-1]}, "list of integers >= 0"),
        ({"kill_runner_delay_s": -1}, "number >= 0"),
        ("env_raise", "faults.inject: must be a dict"),
    ],
)
def test_invalid_fault_plans_name_the_key(plan, needle):
    with pytest.raises(ValueError) as e:
        faults.inject(R3LConfig(), plan)
    assert needle in str(e.value)


def test_fault_injection_is_a_testing_aid_not_a_config_option():
    with pytest.raises(ValueError, match=r"R3LConfig.fault_injection: this option was removed.*faults.inject"):
        R3LConfig().training(fault_injection={"env_raise_prob": 0.5})
    c = faults.inject(R3LConfig(), {"env_raise_prob": 0.5})
    assert fault_plan(c)["env_raise_prob"] == 0.5 and fault_plan(c.copy())["env_raise_prob"] == 0.5


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("sampling_seed", -1, "sampling_seed: must be None"),
        ("sampling_seed", 1.5, "sampling_seed: must be None"),
        ("runner_failure_retries", -1, "runner_failure_retries: must be an integer >= 0"),
        ("runner_restart_wait_s", -5, "runner_restart_wait_s: must be a number"),
        ("tasks_per_iteration", 0, "tasks_per_iteration: must be an integer >= 1"),
        ("micro_batch_size", 2.5, "micro_batch_size: must be an integer >= 1"),
        ("max_context_tokens", "4096", "max_context_tokens: must be an integer >= 1"),
        ("weight_sync_interval", 0, "weight_sync_interval: must be an integer >= 1"),
        ("top_p", 0, "top_p: must be in (0, 1]"),
        ("evaluation_temperature", -0.1, "evaluation_temperature: must be a number >= 0"),
        ("aux_weight", -1, "aux_weight: must be a number >= 0"),
        ("success_reward", "high", "success_reward: must be a number"),
        ("backend_options", ["x"], "backend_options: must be a dict"),
        ("model_id", "", "model_id: set training(model="),
        ("lr", 0, "lr: must be > 0"),
        # re-probe 9: a missing template file passed --dry-run and the trial failed at its start
        ("reflection_template", "/nonexistent/reflect.txt", "reflection template file not found: '/nonexistent/"),
        ("reflection_template", "Reflect on {task} and {bogus}", "{bogus}"),
    ],
)
def test_invalid_config_values_name_the_field(field, value, needle):
    c = R3LConfig().training(**{field: value})
    with pytest.raises(ValueError) as e:
        c.validate_r3l()
    assert needle in str(e.value) and f"R3LConfig.{field}" in str(e.value)


# ------------------------------------------------------------------------------------------------------
# environments: crashes, bad output, dead JVMs -> counted, episode lost, environment replaced
def _runner(tokenizer, factory, policy=None, max_turns=6, counters=None, backend=None):
    chat = ChatFormat(tokenizer)
    backend = backend or ScriptedBackend(tokenizer, **({"policy": policy} if policy else {}))
    opts = RolloutOptions(max_turns=max_turns, max_response_tokens=16, max_context_tokens=4096, temperature=1.0)
    return EpisodeRunner(backend, chat, factory, opts, counters if counters is not None else Counter()), chat


def test_injected_env_crash_is_counted_and_the_env_replaced(tokenizer):
    counters: Counter = Counter()
    made, closed = [], []

    def toy():
        env = environments.make("r3l/ToyCorridor", {"num_rooms": 4})
        env.close = lambda env=env: closed.append(env)
        made.append(env)
        return env

    cfg = faults.inject(R3LConfig(), {"env_raise_at_steps": [1]})
    runner, chat = _runner(tokenizer, wrap_env_factory(toy, cfg, counters, 0), counters=counters)
    ex = Explorer(runner, chat, explore_options(group_size=4))
    [group] = ex.explore([11], ["g"])
    assert counters["injected_env_raise"] == 1 and counters["env_errors"] == 1
    assert len(group.lost) == 1 and group.lost[0].status == Status.ENV_ERROR and not group.complete
    crashed = [e for e in made if e in closed]
    assert len(crashed) == 1 and all(w.env is not crashed[0] for w in runner.envs._free)  # closed, never reused
    trajs, counts = select_trainable([group])
    assert trajs == [] and counts["partial_groups"] == 1 and counts["episodes_lost"] == 1
    assert counts["episodes_dropped_with_partial_group"] == len(group.trajectories)


class _BadEnv:
    rules = ""
    max_turns = 4

    def __init__(self, mode):
        self.mode = mode

    def reset(self, seed=None):
        if self.mode == "reset_raises":
            raise RuntimeError("reset failed")
        if self.mode == "reset_obs_not_str":
            return {"room": 1}, {"admissible_actions": ["a"]}
        return "start", {"task": "t", "admissible_actions": ["a", "b"]}

    def step(self, action):
        if self.mode == "step_obs_not_str":
            return None, 0.0, False, False, {}
        if self.mode == "step_info_not_dict":
            return "obs", 0.0, False, False, ["a"]
        if self.mode == "step_reward_nan":
            return "obs", float("nan"), False, False, {}
        if self.mode == "step_reward_not_number":
            return "obs", "lots", False, False, {}
        return "obs", 0.0, False, False, {}

    def close(self):
        pass


@pytest.mark.parametrize(
    "mode",
    [
        "create_raises",
        "reset_raises",
        "reset_obs_not_str",
        "step_obs_not_str",
        "step_info_not_dict",
        "step_reward_nan",
        "step_reward_not_number",
    ],
)
def test_bad_environment_output_is_a_counted_lost_episode(tokenizer, mode):
    def factory():
        if mode == "create_raises":
            raise OSError("JVM did not start")
        return _BadEnv(mode)

    runner, chat = _runner(tokenizer, factory, policy=lambda text, choices: "a")
    ex = Explorer(runner, chat, explore_options(group_size=2, reflect=False))
    [group] = ex.explore([1], ["g"])
    assert len(group.lost) == 2 and group.trajectories == [] and not group.complete
    assert all(t.status == Status.ENV_ERROR and "error" in t.info for t in group.lost)
    assert runner.counters["env_errors"] == 2
    assert runner.counters["env_create_errors"] == (2 if mode == "create_raises" else 0)
    assert select_trainable([group])[1]["episodes_lost"] == 2


@pytest.mark.subprocess
def test_jvm_killed_mid_episode_is_counted_and_a_new_jvm_serves_the_next_episode(tokenizer):
    pytest.importorskip("textworld_express")
    counters: Counter = Counter()
    made = []
    cfg = faults.inject(R3LConfig(), {"env_kill_jvm_at_steps": [1]})
    inner = wrap_env_factory(
        lambda: environments.make("r3l/CoinCollector", {"num_locations": 2, "max_turns": 4}), cfg, counters, 0
    )

    def factory():
        made.append(inner())
        return made[-1]

    runner, _ = _runner(
        tokenizer,
        factory,
        policy=lambda text, choices: sorted(choices or ["look around"])[0],
        counters=counters,
        max_turns=4,
    )
    try:
        [t] = runner.run([EpisodeSpec(seed=1, group_id="g")])
        assert t.status == Status.ENV_ERROR and t.num_turns == 1
        assert counters["injected_env_kill_jvm"] == 1 and counters["env_errors"] == 1
        [t2] = runner.run([EpisodeSpec(seed=1, group_id="g2")])  # a fresh environment and JVM
        assert t2.status in (Status.OK, Status.TRUNCATED) and t2.num_turns >= 1
        assert len(made) == 2 and made[0].env._env is None and made[1].jvm_pid is not None
    finally:
        runner.close()


class _TruncatingBackend(ScriptedBackend):
    def _result(self, text):
        ids = self.tok.encode(text, add_special_tokens=False)  # no stop token: cut at max_tokens
        return GenerationResult(token_ids=ids, logprobs=[-0.5] * len(ids), text=text, finish_reason="length")


def test_over_long_generations_are_recorded_as_truncated(tokenizer):
    backend = _TruncatingBackend(tokenizer, policy=lambda text, choices: "move left")
    runner, _ = _runner(
        tokenizer, lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}), backend=backend, max_turns=3
    )
    [t] = runner.run([EpisodeSpec(seed=11, group_id="g")])
    assert t.num_turns == 3 and t.status == Status.TRUNCATED
    assert runner.counters["truncated_responses"] == 3 and t.info["truncated_turns"] == [0, 1, 2]


def test_zero_variance_group_has_zero_advantage_and_is_left_out_and_empty_sample_is_empty(tokenizer):
    runner, chat = _runner(
        tokenizer,
        lambda: environments.make("r3l/ToyCorridor", {"num_rooms": 4}),
        policy=lambda text, choices: "move left",
        max_turns=3,
    )
    ex = Explorer(runner, chat, explore_options(group_size=4, reflect=False))
    [group] = ex.explore([11], ["g"])
    trajs, _ = select_trainable([group])
    assert len(trajs) == 4 and len({t.reward for t in trajs}) == 1  # all equal: no signal
    kw = dict(
        pad_token_id=0,
        std_normalize=False,
        positive_amplification=True,
        alpha=3.0,
        success_reward=1.0,
        pivotal_credit=True,
        max_length=4096,
    )
    batch, adv = build_train_batch(trajs, **kw)
    assert np.all(adv == 0) and len(batch["input_ids"]) == 0  # counted by the Algorithm as zero_advantage_items
    batch, adv = build_train_batch(trajs, skip_zero_advantage=False, **kw)
    assert len(batch["input_ids"]) == 4 and np.all(batch["advantages"] == 0)
    assert select_trainable([]) == ([], Counter())


# ------------------------------------------------------------------------------------------------------
# with Ray: learner numerical faults, the soak, kill -9 + resume
def _weights(algo):
    module = algo.learner_group._learner.module["default_policy"]
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _optim_state(algo):
    opt = next(iter(algo.learner_group._learner._named_optimizers.values()))
    return {
        i: {k: (v.clone() if hasattr(v, "clone") else v) for k, v in s.items()}
        for i, s in enumerate(opt.state[p] for g in opt.param_groups for p in g["params"])
        if s
    }


def _same(a, b):
    import torch

    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k])
        if hasattr(a[k], "shape")
        else (_same(a[k], b[k]) if isinstance(a[k], dict) else a[k] == b[k])
        for k in a
    )


def _fault(result, *path):
    v = result
    for p in path:
        v = v.get(p, {}) if isinstance(v, dict) else {}
    return 0 if isinstance(v, dict) or v is None or (isinstance(v, float) and math.isnan(v)) else v


@pytest.mark.integration
def test_all_episodes_lost_nan_loss_and_inf_grad_skip_updates_without_corrupting_weights(ray_session):
    import torch

    from tests.scripted_rllib import tiny_config

    # iteration 1: the first step of all 4 episodes (1 task, no reflection) crashes -> an empty batch
    fi = {"env_raise_at_steps": [0, 1, 2, 3], "nan_loss_at_updates": [0], "nan_grad_at_updates": [2]}
    # seeded sampling: "a non-empty batch within 6 iterations" is the same run every time
    algo = faults.inject(tiny_config(reflect=False, tasks_per_iteration=1, sampling_seed=0), fi).build_algo()
    try:
        w0 = _weights(algo)
        r = algo.train()
        assert _fault(r, "r3l", "batch", "empty_batches") == 1 and algo._num_updates == 0
        assert _fault(r, "env_runners", "r3l", "faults", "injected_env_raise") == 4
        assert _fault(r, "env_runners", "r3l", "faults", "episodes_lost") == 4
        assert _fault(r, "r3l", "faults", "episodes_lost") == 4 and _fault(r, "r3l", "faults", "partial_groups") == 1

        def next_update():
            for _ in range(6):
                n = algo._num_updates
                r = algo.train()
                if algo._num_updates > n:
                    return r
            pytest.fail("no non-empty batch in 6 iterations")

        r = next_update()  # update 0: NaN loss -> skipped, weights and (empty) AdamW state untouched
        assert _fault(r, "learners", "r3l", "faults", "injected_nan_loss") == 1
        assert _fault(r, "learners", "r3l", "faults", "nonfinite_updates_skipped") == 1
        assert _same(_weights(algo), w0) and _optim_state(algo) == {}
        next_update()  # update 1: a real step
        w1, s1 = _weights(algo), _optim_state(algo)
        assert not _same(w1, w0) and all(torch.isfinite(v).all() for v in w1.values())
        assert s1 and all(float(s["step"]) == 1 for s in s1.values())
        r = next_update()  # update 2: inf gradient -> skipped; weights and AdamW moments unchanged
        assert _fault(r, "learners", "r3l", "faults", "injected_nan_grad") == 1
        assert _fault(r, "learners", "r3l", "faults", "nonfinite_updates_skipped") == 1
        assert _same(_weights(algo), w1) and _same(_optim_state(algo), s1)
        assert all(torch.isfinite(s["exp_avg"]).all() and torch.isfinite(s["exp_avg_sq"]).all() for s in s1.values())
        assert algo.learner_group._learner._skipped == 2 and algo.learner_group._learner._updates == 1
    finally:
        algo.stop()


def _load_soak():
    spec = importlib.util.spec_from_file_location("soak", os.path.join(ROOT, "scripts", "soak.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.integration
@pytest.mark.subprocess
def test_short_soak_env_crashes_jvm_kills_runner_kill_and_nans_are_survived_and_counted(ray_session):
    soak = _load_soak()
    args = soak.parse_args(
        [
            "--iterations",
            "3",
            "--env-crash-prob",
            "0",
            "--jvm-kill-prob",
            "0",
            "--bad-obs-prob",
            "0",
            "--runner-kill-every",
            "0",
            "--nan-every",
            "0",
            "--engine-death-prob",
            "0",
        ]
    )
    # fixed schedules: env faults in the first turn of a runner process (iteration 1, and again in
    # the re-sample after the runner restart in iteration 2), iteration 3 clean; first update NaN
    schedule = {
        "env_raise_at_steps": [0],
        "env_kill_jvm_at_steps": [1],
        "env_bad_observation_at_steps": [3],
        "kill_runner_at_iterations": [2],
        "nan_loss_at_updates": [0],
    }
    rows, failures, totals = soak.run_soak(args, log=print, fault_overrides=schedule)
    print(soak.format_table(rows, failures, totals, args))
    assert failures == [] and totals["iterations_completed"] == 3
    injected = {name: n for name, n, _s, _note in rows}
    assert injected["env runner ray.kill mid-sample"] == 1 and totals["env_runners_restored"] >= 1
    assert totals["groups_resampled"] == totals["groups_lost_with_runner"] > 0
    for name in ("JVM SIGKILLed mid-episode", "environment crash (env.step raises)", "non-string observation"):
        assert injected[name] == 2, name  # iteration 1 and the re-sample in iteration 2
    assert totals["env_errors"] == 6 == totals["driver_episodes_lost"] and totals["empty_batches"] >= 2
    # NaN handling is tested in depth above; here: if iteration 3 trained, its NaN update was skipped
    assert totals["nonfinite_updates_skipped"] == injected["NaN loss"]
    assert all(survived == n for _name, n, survived, _note in rows)


@pytest.mark.integration
def test_short_soak_engine_death_in_a_remote_runner_is_rebuilt_and_its_losses_counted(ray_session):
    soak = _load_soak()
    args = soak.parse_args(
        [
            "--iterations",
            "2",
            "--env-crash-prob",
            "0",
            "--jvm-kill-prob",
            "0",
            "--bad-obs-prob",
            "0",
            "--runner-kill-every",
            "0",
            "--nan-every",
            "0",
            "--engine-death-prob",
            "0",
        ]
    )
    rows, failures, totals = soak.run_soak(args, log=print, fault_overrides={"engine_death_at_calls": [2]})
    print(soak.format_table(rows, failures, totals, args))
    assert failures == [] and totals["iterations_completed"] == 2
    assert totals["inj_engine_death"] == 1 == totals["engine_rebuilds"]
    assert totals["runner_episodes_lost"] == totals["driver_episodes_lost"] > 0
    assert totals["rss_end_mb"] > 0


# kill -9 of the driver after a checkpoint, resume: the same weights as an uninterrupted run
CHILD = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
import ray, torch
ray.init(address=sys.argv[1], log_to_driver=False)
from tests.scripted_rllib import resume_config
out = sys.argv[2]
algo = resume_config().build_algo()
algo.train()
algo.save_to_path(os.path.join(out, "ckpt"))
n2 = algo._num_updates
algo.train()
module = algo.learner_group._learner.module["default_policy"]
torch.save({k: v.detach().clone() for k, v in module.state_dict().items()}, os.path.join(out, "weights2.pt"))
json.dump({"updates_at_ckpt": n2, "updates_after": algo._num_updates}, open(os.path.join(out, "ready.tmp"), "w"))
os.rename(os.path.join(out, "ready.tmp"), os.path.join(out, "ready.json"))
while True:
    algo.train()  # SIGKILLed in here
"""


@pytest.mark.integration
@pytest.mark.subprocess
def test_driver_killed_after_checkpoint_resumes_exactly(ray_session, tmp_path):
    import torch

    from rllib_r3l import R3L

    env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONPATH=ROOT)
    log = open(tmp_path / "child.log", "w")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, ray_session.get_runtime_context().gcs_address, str(tmp_path)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        # wait for the two iterations however long they take; fail only if the child exits without
        # them (HANG_GUARD_S stops a hung child, it is no speed limit)
        started = time.monotonic()
        tail = lambda: (tmp_path / "child.log").read_text()[-3000:]  # noqa: E731
        while not (tmp_path / "ready.json").exists():
            assert child.poll() is None, tail()
            assert time.monotonic() - started < HANG_GUARD_S, "hang guard: child alive but stuck\n" + tail()
            time.sleep(0.5)
        time.sleep(1.0)  # into iteration 3 (the kill may land anywhere after the checkpoint)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=HANG_GUARD_S)  # SIGKILL cannot be ignored: a hang guard only
        log.close()
    assert child.returncode == -signal.SIGKILL
    info = json.loads((tmp_path / "ready.json").read_text())
    assert info["updates_after"] == info["updates_at_ckpt"] + 1 >= 2  # both iterations trained: a meaningful test

    algo = R3L.from_checkpoint(str(tmp_path / "ckpt"))
    try:
        assert algo.iteration == 1 and algo._num_updates == info["updates_at_ckpt"]
        assert algo.config.sampling_seed == 7 and algo.config.lr == 1e-4 and algo.config.num_env_runners == 1
        steps = {float(s["step"]) for s in _optim_state(algo).values()}
        assert steps == {float(info["updates_at_ckpt"])}  # AdamW state restored
        r = algo.train()
        assert r["training_iteration"] == 2
        ref = torch.load(tmp_path / "weights2.pt")
        assert _same(_weights(algo), ref)
    finally:
        algo.stop()


@pytest.mark.integration
def test_a_runner_ray_restarted_unseen_refuses_its_initial_weights_and_the_iteration_repeats_exactly(ray_session):
    """A runner whose node dies between iterations is restarted by Ray (max_restarts); a sample call sent
    after that goes to the new process, which holds the initial weights and task RNG, with no error for
    RLlib to see. It must refuse, be counted, restored and re-sampled: iteration 2
    then equals an uninterrupted run's, bit for bit."""
    import ray

    from tests.scripted_rllib import resume_config

    def config():
        return resume_config().fault_tolerance(restart_failed_env_runners=True)

    reference = config().build_algo()
    try:
        reference.train()
        reference.train()
        expected = _weights(reference)
    finally:
        reference.stop()

    algo = config().build_algo()
    try:
        algo.train()
        [rid] = algo.env_runner_group.healthy_worker_ids()
        actor = algo.env_runner_group._worker_manager._actors[rid]
        ray.kill(actor, no_restart=False)  # the process dies; Ray restarts it, RLlib is not told
        started = time.monotonic()
        while True:  # until the new process answers (calls to a restarting actor fail fast)
            assert time.monotonic() - started < HANG_GUARD_S, "hang guard: the runner was not restarted"
            try:
                state = ray.get(actor.get_state.remote(), timeout=HANG_GUARD_S)
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.RayActorError):
                time.sleep(0.2)
                continue
            if state["num_groups_sampled"] == 0:
                break  # the fresh process (the old one, before the kill landed, has sampled)
            time.sleep(0.2)
        assert rid in algo.env_runner_group.healthy_worker_ids()  # RLlib never saw the failure
        r = algo.train()
        f = r["r3l"]["faults"]
        tasks = algo.config.tasks_per_iteration
        assert f["env_runner_failures"] == 1 and f["groups_lost_with_runner"] == tasks
        assert f["groups_resampled"] == tasks and f["env_runners_restored"] == 1
        assert f["env_runners_restarted_unseen"] == 1
        assert r["env_runners"]["num_groups"] == tasks
        assert _same(_weights(algo), expected)  # restored weights and RNG: the same samples, the same update
    finally:
        algo.stop()
