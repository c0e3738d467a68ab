"""Chat-template rendering as token *segments*, so multi-turn contexts are built by concatenation.

The model's chat template is applied once per message boundary and the difference of the rendered
strings is tokenised on its own. A context is then ``segment_0 + response_0 + segment_1 + ...``:
responses are the sampler's own token ids and are never re-tokenised (paper K.1 full-history
conditioning, issue "trajectories are token-exact").
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

_PLACEHOLDER = "\u2063R3L_ASSISTANT_PLACEHOLDER\u2063"


class ChatFormat:
    """Turns chat messages into token segments with a Hugging Face tokenizer's chat template."""

    def __init__(self, tokenizer: Any) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "the tokenizer has no chat_template; R3L needs an instruct/chat model "
                "(set training(model=...) to a chat model or give the tokenizer a template)"
            )
        self.tok = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.eos_text = tokenizer.eos_token or ""
        self._cache: Dict[tuple, List[int]] = {}

    # -- rendering -----------------------------------------------------------------------------------
    def _render(self, messages: List[Dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> List[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: List[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def _diff(self, before: str, after: str) -> str:
        if not after.startswith(before):
            raise ValueError(
                "the chat template does not render messages as a prefix-stable string; "
                "R3L cannot build token-exact multi-turn contexts with it"
            )
        return after[len(before):]

    # -- segments ------------------------------------------------------------------------------------
    def system(self, text: str) -> List[int]:
        """Tokens of the conversation start with a system message."""
        return self.encode(self._render([{"role": "system", "content": text}], False))

    def user_turn(self, system_text: str, user_text: str, first: bool, guidance: Optional[str] = None) -> List[int]:
        """Tokens that show a user message and open the assistant's reply.

        ``first``: the message follows the system message; otherwise it follows an assistant reply
        that ended with the stop token (the template's text between that stop token and the user
        message is included here, the stop token itself is not: the model generated it).
        ``guidance``: an extra system message placed right before the user message (the retry's
        guidance, paper §4 / authors' code); the result then is the *guided* rendering of the turn.
        """
        sys_msg = {"role": "system", "content": system_text}
        new = ([{"role": "system", "content": guidance}] if guidance is not None else []) + [
            {"role": "user", "content": user_text}
        ]
        if first:
            before = self._render([sys_msg], False)
            return self.encode(self._diff(before, self._render([sys_msg] + new, True)))
        prior = [sys_msg, {"role": "user", "content": "x"}, {"role": "assistant", "content": _PLACEHOLDER}]
        before = self._render(prior, False)
        after = self._render(prior + new, True)
        tail = before.split(_PLACEHOLDER, 1)[1] + self._diff(before, after)
        if self.eos_text and tail.startswith(self.eos_text):
            tail = tail[len(self.eos_text):]
        return self.encode(tail)

    def prompt(self, messages: List[Dict[str, str]]) -> List[int]:
        """A whole one-shot prompt (e.g. the reflection prompt) with the assistant opening."""
        return self.encode(self._render(messages, True))

    def closes_turn(self, response_ids: List[int]) -> List[int]:
        """Tokens to append after a response that did not end on the stop token (truncated)."""
        if response_ids and response_ids[-1] == self.eos_token_id:
            return []
        return [self.eos_token_id] if self.eos_token_id is not None else []
