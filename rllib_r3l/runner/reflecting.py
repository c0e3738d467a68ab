"""An Explorer's reflections (paper §4 "Reflect-then-retry", step 2): the reflector's request for an episode,
its report parsed and counted, and the batched call the phases make (the episode loops make one request per
failed episode as it ends: rllib_r3l.runner.pipeline).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List

from rllib_r3l.generation.base import GenerationRequest
from rllib_r3l.runner.reflection import context as reflection_context
from rllib_r3l.runner.reflection import oracle as oracle_lib
from rllib_r3l.runner.reflection import reflect as reflect_lib
from rllib_r3l.trajectory import Trajectory

logger = logging.getLogger("rllib_r3l.runner.explore")


class Reflecting:
    """Mixed into ``Explorer``: uses its ``opts``, ``reflector``/``reflector_chat``, ``chat``, ``template``,
    ``reflection_system``, ``counters`` and ``reflection_stats``."""

    def reflect(self, trajectories: List[Trajectory]) -> List[tuple]:
        """Reflect on each trajectory; returns ``(ParseResult, prompt_ids, GenerationResult)`` per item."""
        if self.opts.reflector == "oracle":  # diagnostic: no prompt, no generation, nothing to train on
            return oracle_lib.oracle_reflections(self, trajectories)
        reqs = [self.reflection_request(t) for t in trajectories]
        reported = [0]

        def finished(n: int) -> None:  # the live progress line counts each report as it finishes
            reported[0] += n
            self.counters["progress_reflections"] += n

        try:
            outs = self.reflector.generate(reqs, temperature=self.reflection_temperature, on_done=finished)
        except Exception:
            self.counters["reflection_generation_errors"] += len(reqs)
            logger.exception("reflection generation failed")
            return [(None, r.prompt_token_ids, None) for r in reqs]
        self.counters["progress_reflections"] += len(outs) - reported[0]  # what the backend did not report
        results = [self.reflection_result(t, r, o) for t, r, o in zip(trajectories, reqs, outs)]
        oracle_lib.log_pivot_quality(self, trajectories, results)  # r3l/pivot_* where the env has an oracle
        return results

    def reflection_request(self, t: Trajectory) -> GenerationRequest:
        """The reflector's request for ``t`` (counted as reflection prompt tokens)."""
        p = self._reflection_prompt(t)
        schema = None
        if self.opts.reflection_structured:
            schema = reflect_lib.report_json_schema(
                max(len(t.actions), 1), failed=not t.success, max_chars=self.opts.reflection_max_chars
            )
        self.counters["prompt_tokens"] += len(p)
        self.counters["prompt_tokens_reflect"] += len(p)
        return GenerationRequest(p, self.opts.max_reflection_tokens, json_schema=schema)

    def reflection_result(self, t: Trajectory, req: GenerationRequest, o: Any) -> tuple:
        """``(ParseResult, prompt_ids, GenerationResult)`` of the report ``o`` on ``t`` (counted, parsed)."""
        self.counters["prompt_tokens_cached_reflect"] += o.cached_prompt_tokens
        self.counters["progress_tokens"] += len(o.token_ids)
        parsed = reflect_lib.parse_report(o.text, len(t.actions))
        if parsed.ok and parsed.report.outcome == reflect_lib.Outcome.SUCCESS and not t.success:
            # the reward says the episode failed: a "success" verdict is a misjudgment, not a report
            self.counters["reflection_contradicts_reward"] += 1
            parsed = reflect_lib.ParseResult(
                reflect_lib.ParseStatus.BAD_OUTCOME, None, "outcome 'success' contradicts the environment's reward"
            )
        self.reflection_stats.add(parsed)
        return (parsed, req.prompt_token_ids, o)

    def _reflection_prompt(self, t: Trajectory) -> List[int]:
        """The episode's own context + a reflection request ("transcript": served from the prefix
        cache), or the episode re-rendered as a log ("log"; also the fallback, counted)."""
        if self.opts.reflection_context == "transcript" and self.reflector_chat is self.chat:
            ids = reflection_context.transcript_prompt(self.chat, t)
            if ids is not None:
                return ids
            self.counters["reflection_transcript_fallbacks"] += 1
        return self.reflector_chat.prompt(self._reflection_messages(t))

    def _reflection_messages(self, t: Trajectory) -> List[Dict[str, str]]:
        return reflect_lib.build_reflection_messages(t, template=self.template, system=self.reflection_system)

    @property
    def reflection_temperature(self) -> float:
        """Reflections sample at ``reflection_temperature`` (paper K.1: 0.7), else at the training one."""
        t = self.opts.reflection_temperature
        return self.opts.temperature if t is None else float(t)


__all__ = ["Reflecting"]
