"""Where a reflection reads the episode from (paper §4 "Reflect-then-retry").

- ``"log"``: a fresh prompt that re-renders the episode as a numbered log (``reflect.
  build_reflection_messages``; the authors' layout). The engine computes all of it.
- ``"transcript"``: the episode's own context, exactly the tokens the policy saw and wrote, then a
  reflection request as the next user turn. The engine's prefix cache already holds that context
  (it was the last turn's prompt), so only the request and the report are computed; a reflection
  item trained on it shares the episode's prefix in the learner too (``share_prefixes``).

Steps are the policy's replies in order, numbered from 0, as in the log.
"""

from __future__ import annotations

from typing import List, Optional

from rllib_r3l.runner.chat import ChatFormat
from rllib_r3l.runner.reflection.reflect import _format_reward
from rllib_r3l.trajectory import Trajectory

CONTEXTS = ("log", "transcript")

# Written for this project. Placeholders: {final} {reward} {num_steps} {max_step}.
TRANSCRIPT_REQUEST = """\
The episode is over.{final} Final reward: {reward}.

Now step out of your role as the agent and review the attempt above: {num_steps} steps, your \
replies numbered 0 to {max_step} in order.
1. Summarise briefly what happened.
2. Find the root cause: "Why did X happen? Because Y. Why Y? Because Z." up to the first decision \
that went wrong (or, for a good attempt, what made it work).
3. Judge the outcome: "success" (done, nothing important to improve), "success_but_inefficient" \
(done, with wasted steps) or "failure" (not done).
4. Unless it is "success", give one concrete suggestion and the step to retry from: the earliest \
step whose action should change, an integer from 0 to {max_step}.

Answer with exactly one JSON object with the fields "summary", "root_cause", "outcome", \
"suggestion" (null on success) and "retry_from_step" (null on success)."""


def transcript_prompt(chat: ChatFormat, traj: Trajectory) -> Optional[List[int]]:
    """The episode's context followed by the reflection request, as token ids; None when the
    episode has no reply to review (the caller falls back to the log)."""
    if not traj.actions or not traj.segments or traj.segments[-1].role != "response" or traj.has_guidance():
        return None
    last = traj.segments[-1].token_ids
    final = traj.observations[len(traj.actions)] if len(traj.observations) > len(traj.actions) else ""
    k = len(traj.actions)
    request = TRANSCRIPT_REQUEST.format(
        final=f" After your last action the environment said:\n{str(final).strip()}\n" if str(final).strip() else "",
        reward=_format_reward(traj.reward, traj.success, traj.status),
        num_steps=k,
        max_step=k - 1,
    )
    system_text = str(traj.info.get("system_text", ""))
    return traj.token_ids + chat.closes_turn(last) + chat.user_turn(system_text, request, first=False)
