"""The paper's reflection prompt (paper §4 and appendix K; ``reflection_style="paper"``).

The authors' reflector is the policy itself under a separate *Reflector* system prompt: it reads a
log of the last attempt (the rules and context, then each step's observation and action, then the
environment's feedback), asks "why" until it reaches the assumption that went wrong, and answers
with a flat JSON object of five fields in a fenced block: a short trajectory summary, the root-cause
analysis, the outcome (``success``, ``success_but_inefficient`` or ``failure``), an improvement
suggestion (null exactly on ``success``) and the 0-based step to retry from. The report is sampled
without a grammar and parsed leniently (``rllib_r3l.runner.reflection.parse`` accepts these field
names). Written for this project in our own words, with the structure and fields of the authors'
prompt. The worked example is ours and told in prose, from a domain none of the environments has, with
no JSON and no step number: a small policy copied a JSON example into its answers (its pivot and its
words), which then described the example, not the episode.

Pure Python.
"""

from __future__ import annotations

PAPER_REFLECTION_SYSTEM = """\
You are a Reflector. You read the log of an agent's last attempt at a task, together with the \
feedback the agent got from the user and the environment, and you diagnose the attempt.

Work like this: for each problem you see, ask "why did this happen?", answer, and ask "why?" again \
until you reach the flawed assumption or the first wrong decision behind it. Then turn that into \
one concrete principle the agent can apply next time, and name the step to retry from: the \
earliest step whose action should change (steps before it are kept; the agent restarts there).

Answer with one JSON object in a ```json fenced block, with exactly these fields:
```json
{
  "trajectory_summary": "<one to three sentences: what the agent did and how it ended>",
  "root_cause_analysis": "<why ...? because ... why ...? because ...> (null only if the attempt was flawless)",
  "trajectory_outcome": "success" | "success_but_inefficient" | "failure",
  "improvement_suggestion": "<what to do differently, as a principle the agent can act on> (null if and only if the outcome is success)",
  "retry_from_step": <integer step number, 0-based> (null if and only if the outcome is success)
}
```

Example of the reasoning (another kind of task, not yours): an agent had to book a train ticket for \
Tuesday and booked one for Monday. Why did it fail? Because it picked the first date offered. Why? Because \
it never compared the offered date with the one in the task. The principle: check every value you submit \
against the task before submitting it. The step to retry from is the one where it chose the date: the \
steps before it were fine."""

# Placeholders as in DEFAULT_REFLECTION_TEMPLATE: {rules} {task} {trajectory} {reward} {num_steps} {max_step}.
PAPER_REFLECTION_TEMPLATE = """\
Here is the log of the last attempt.

## Rules and context
{rules}

Task: {task}

## Steps (numbered 0 to {max_step})
{trajectory}

## Feedback
Final reward: {reward}; {num_steps} steps taken.

Please answer in the specified JSON format; retry_from_step is an integer from 0 to {max_step}."""
