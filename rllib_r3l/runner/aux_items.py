"""Auxiliary SFT items of a successful retry (paper §4 "Data construction"): the reflection (prompt ->
the policy's own report) and the guided retry, positive items with advantage 1.0 and weight ``aux_weight``.

``AuxItems`` is a part of ``Explorer`` (rllib_r3l.runner.explore): it reads the explorer's ``chat``,
``reflector_chat``, ``opts``, ``counters`` and reflection prompt, and adds items to a ``GroupResult``.
"""

from __future__ import annotations

from typing import Any, List

from rllib_r3l.trajectory import Kind, Segment, Trajectory


class AuxItems:
    """The auxiliary items of :class:`~rllib_r3l.runner.explore.Explorer`."""

    def _add_reflection_item(self, base: Trajectory, group: Any) -> None:
        """One reflection item per reflection, however many of its retries succeed."""
        if base.info.get("reflection_item_added"):
            return
        base.info["reflection_item_added"] = True
        _parsed, prompt_ids, out = base.info["reflection"]
        if out is None:  # an oracle report: the policy did not write it, so it is never trained on
            return
        self._add_aux_item(self._reflection_item(base, prompt_ids, out), group)

    def _add_aux_item(self, item: Trajectory, group: Any) -> None:
        """An auxiliary item joins the batch unless it cannot fit the learner's context (counted):
        a reflection prompt re-renders the whole episode and, with a long report budget, can exceed
        ``max_context_tokens`` in long-horizon tasks."""
        limit = self.opts.max_context_tokens
        if limit is not None and item.num_tokens > limit:
            self.counters[f"{item.kind.value}_items_too_long"] += 1
            return
        group.trajectories.append(item)

    def _reflection_item(self, base: Trajectory, prompt_ids: List[int], out: Any) -> Trajectory:
        """The reflection as a positive item: reflection prompt -> report (auxiliary task, §4).

        The paper's style trains on exactly the ids the policy sampled, with the sampler's log-probs
        (a filtered REINFORCE step on its own sample, paper §4). The structured style trains on the
        report's text in the policy's own tokens, closed like a turn, where vLLM's JSON grammar spelled
        it in tokens the tokenizer would not choose (supervising those spellings teaches token noise;
        docs/benchmarks.md, 'Why these main-job settings and defaults?'). A separate reflector's report
        is always re-encoded in the policy's prompt. A re-encoded item has no sampler log-probs: it is
        no longer the policy's sample."""
        resp_ids, lps = list(out.token_ids), list(out.logprobs)
        canonical = self.chat.encode(out.text) + self.chat.closes_turn([])
        if self.reflector_chat is not self.chat:
            prompt_ids = self.chat.prompt(self._reflection_messages(base))
            resp_ids, lps = canonical, None
        elif self.opts.reflection_style == "paper":
            self.counters["reflection_items_as_sampled"] += 1
        elif resp_ids != canonical:
            resp_ids, lps = canonical, None
            self.counters["reflection_items_retokenized"] += 1
        segs = [Segment("prompt", list(prompt_ids), turn=0), Segment("response", resp_ids, turn=0, logprobs=lps)]
        return Trajectory(
            segments=segs,
            reward=self.opts.success_reward,
            group_id=f"{base.group_id}/reflection/{id(base)}",
            kind=Kind.REFLECTION_SFT,
            success=True,
            num_turns=1,
            fixed_advantage=1.0,
            weight=self.opts.aux_weight,
            seed=base.seed,
            task=base.task,
        )
