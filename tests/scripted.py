"""A scripted stand-in for the LLM policy/reflector, for tests that need decisions fixed in advance.

It implements the real ``GenerationBackend`` interface and answers with real tokenizer ids, so
everything around it (chat rendering, environments, reflection parsing, retries, masks, advantages)
runs for real. Only the model's *choices* are scripted.
"""

from __future__ import annotations

import json
from typing import Callable, List, Optional

from rllib_r3l.generation.base import GenerationBackend, GenerationRequest, GenerationResult

GUIDE_MARK = "GO-RIGHT-INSTEAD"


def corridor_policy(prompt_text: str, choices: Optional[List[str]]) -> str:
    """Unguided: always 'move left' (else 'take coin'); guided: move right until the coin, take it."""
    last_user = prompt_text.rsplit("user\n", 1)[-1]
    guided = GUIDE_MARK in prompt_text
    if "coin here" in last_user:
        return "take coin"
    if guided:
        return "move right"
    return "move left" if "move left" in last_user else "take coin"


class ScriptedBackend(GenerationBackend):
    name = "scripted"

    def __init__(self, tokenizer, policy: Callable = corridor_policy, pivot: int = 1, outcome: str = "failure") -> None:
        self.tok = tokenizer
        self.policy = policy
        self.pivot = pivot
        self.outcome = outcome
        self.calls: List[List[GenerationRequest]] = []

    def _result(self, text: str) -> GenerationResult:
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
        return GenerationResult(token_ids=ids, logprobs=[-0.5] * len(ids), text=text, finish_reason="stop")

    def generate(self, requests, *, temperature, top_p=1.0, seed=None):
        self.calls.append(list(requests))
        out = []
        for r in requests:
            text = self.tok.decode(r.prompt_token_ids)
            if r.json_schema is not None:  # reflection requests are held to the report schema
                report = {
                    "summary": "The agent kept moving left and took a coin where none was.",
                    "root_cause": "Why did it fail? Because it moved away from the coin.",
                    "outcome": self.outcome,
                    "suggestion": f"{GUIDE_MARK}: move right to find the coin.",
                    "retry_from_step": self.pivot,
                }
                out.append(self._result(json.dumps(report)))
            else:
                out.append(self._result(self.policy(text, r.choices)))
        return out

    def update_weights(self, named_tensors):
        raise NotImplementedError("scripted backend has no weights")

    def score(self, prompt_token_ids, continuation_ids):
        raise NotImplementedError("scripted backend has no weights")
