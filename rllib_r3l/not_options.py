"""Config keys that are no R3L option, and what each door says about them: RLlib options R3L does not read
(an error naming the R3L option that does the job), options that were removed (an error naming the
replacement), and words users reach for that name no option (where what they want lives instead)."""

from __future__ import annotations

from typing import Dict, Optional

# Words a user reaches for that name no option, and where what they want lives instead (every door's
# unknown-key error says so before any "did you mean", which pointed 'training_iteration' at
# 'tasks_per_iteration' and 'greedy' at 'seed').
RUN_LENGTH_WORDS = (
    "iterations",
    "num_iterations",
    "max_iterations",
    "training_iterations",
    "num_iters",
    "n_iters",
    "iters",
    "num_steps",
    "steps",
    "stop",
)
CONCEPT_HINTS = {
    "greedy": "R3L trains by sampling (temperature > 0: a group of identical episodes has no learning signal); "
    "greedy decoding is for evaluation: evaluation_temperature=0 (R3L.evaluate()) or "
    "`rllib-r3l evaluate --greedy`",
    "episodes": "an iteration runs tasks_per_iteration task groups of group_size episodes each (with reflection, "
    "group_size // (1 + retries_per_failure) base episodes and the rest retries)",
}
for _word in ("num_episodes", "n_episodes", "episodes_per_iteration"):
    CONCEPT_HINTS[_word] = CONCEPT_HINTS["episodes"]
RUN_LENGTH_HINT = (
    "how long a run trains is set where it runs, not in the config: `rllib-r3l train --stop "
    "training_iteration=N` (a file's stop:), the main job's --iterations N, or tune.run(stop=...)"
)

# RLlib options that R3L does not read: set to anything but their default, each is an error naming the
# R3L option that does the job (an accepted-then-ignored option silently changes nothing).
UNUSED_RLLIB: Dict[str, str] = {
    "num_epochs": "R3L makes one optimizer step per iteration over the whole batch (the paper's one step "
    "per batch); micro_batch_size / micro_batch_tokens split that step for memory",
    "minibatch_size": "R3L makes one optimizer step over the whole batch; micro_batch_size / "
    "micro_batch_tokens split it into accumulated forward/backward passes",
    "train_batch_size": "R3L's batch is tasks_per_iteration task groups of group_size episodes each",
    "train_batch_size_per_learner": "R3L's batch is tasks_per_iteration task groups of group_size episodes "
    "each, split over the learners",
    "gamma": "R3L scores a whole episode by its reward against its task group (no discounting); "
    "success_reward sets what counts as a success",
    "evaluation_num_env_runners": "R3L evaluates on the training env runners' engines (no second set of "
    "engines); evaluation_interval and evaluation_duration set when and how much",
    "evaluation_parallel_to_training": "R3L.evaluate() runs between iterations, on the training env runners",
    "evaluation_config": "R3L.evaluate() runs on the training env runners with the training config; set "
    "evaluation_temperature, evaluation_duration and env_config.eval_split instead",
    # RLlib's sampling options would be accepted and change nothing (R3L's runners explore task
    # groups of whole text episodes themselves)
    "explore": "R3L always samples its rollouts (temperature, top_p); evaluation_temperature sets R3L.evaluate()'s "
    "sampling and `rllib-r3l evaluate --greedy` decodes greedily",
    "num_envs_per_env_runner": "each env runner runs one environment per episode of its task groups; "
    "tasks_per_iteration and group_size set how many episodes run together",
    "batch_mode": "R3L samples whole episodes (max_turns bounds them)",
    "clip_rewards": "R3L scores each episode against its task group (reward - group mean), so the reward's scale "
    "does not reach the gradient; success_reward sets what counts as a success",
    "sample_timeout_s": "R3L waits for each runner's whole share; a runner that fails is handled by "
    "fault_tolerance() (restart_failed_env_runners) and runner_restart_wait_s",
    "observation_filter": "observations are text, read by the policy as they are",
}

# Options that existed once: a config that still sets one gets an error naming the replacement, so that
# an old config never silently changes meaning.
REMOVED: Dict[str, str] = {
    "aux_tasks": "use aux_items instead: aux_items=[] for aux_tasks=False, or the kinds to add, e.g. "
    "aux_items=['retry_sft'] (the default) or ['reflection_sft', 'retry_sft'] (the paper)",
    "reflector_model": "use reflector='<HF id or local path>' instead (reflector='policy' = the policy reflects)",
    "reflection_outcome": "a failed episode's structured report always states its outcome (held to 'failure' by "
    "the schema, the authors' five-field report); drop the option ('reward' saved ~6 tokens "
    "a report, inside the noise: docs/benchmarks.md)",
    "fault_injection": "fault injection is a testing aid, not a config option: in Python, "
    "rllib_r3l.reliability.faults.inject(config, {...})",
}


def removed_option_error(key: str) -> Optional[str]:
    """The error for a removed option ``key`` (None when ``key`` was never removed)."""
    if key not in REMOVED:
        return None
    return f"R3LConfig.{key}: this option was removed; {REMOVED[key]}"
