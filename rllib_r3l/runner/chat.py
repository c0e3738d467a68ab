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
        self.eot_text = self._end_of_turn_text()
        self.eot_token_id = self._single_token(self.eot_text)
        self._cache: Dict[tuple, List[int]] = {}

    def _end_of_turn_text(self) -> str:
        """The special token the template closes an assistant turn with (``<|im_end|>``,
        ``<end_of_turn>``, ``<|eot_id|>``...). It is what a response must stop on, and it need not
        be the tokenizer's EOS (Gemma: EOS ``<eos>``, end of turn ``<end_of_turn>``)."""
        prior = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": _PLACEHOLDER},
        ]
        tail = self._render(prior, False).split(_PLACEHOLDER, 1)[1]
        specials = {str(t) for t in getattr(self.tok, "all_special_tokens", [])}
        specials |= {str(t) for t in (getattr(self.tok, "added_tokens_encoder", None) or {})}
        if self.tok.eos_token:
            specials.add(str(self.tok.eos_token))
        found = [t for t in specials if t and tail.startswith(t)]
        if not found:
            raise ValueError(
                f"the chat template closes an assistant turn with {tail[:20]!r}, not with a special "
                "token; R3L needs one to stop responses and build token-exact contexts "
                "(use a chat model whose template ends turns with a token such as <|im_end|>)"
            )
        return max(found, key=len)

    def _single_token(self, text: str) -> int:
        ids = self.tok.convert_tokens_to_ids(text)
        if not isinstance(ids, int) or ids == self.tok.unk_token_id:
            raise ValueError(f"the chat template's end-of-turn text {text!r} is not a single token of the tokenizer")
        return ids

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
        return after[len(before) :]

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
        if tail.startswith(self.eot_text):  # the response's own stop token closed the turn
            tail = tail[len(self.eot_text) :]
        return self.encode(tail)

    def prompt(self, messages: List[Dict[str, str]]) -> List[int]:
        """A whole one-shot prompt (e.g. the reflection prompt) with the assistant opening."""
        return self.encode(self._render(messages, True))

    def closes_turn(self, response_ids: List[int]) -> List[int]:
        """Tokens to append after a response that did not end on the end-of-turn token (truncated,
        or stopped on another stop token such as an EOS that differs from it)."""
        if response_ids and response_ids[-1] == self.eot_token_id:
            return []
        return [self.eot_token_id]
