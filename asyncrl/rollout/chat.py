"""Observations -> the token ids appended to an episode (`ObservationEncoder`).

Token-level observations are appended as they are; text is encoded without special tokens. A message goes
through the model's own chat template, as the *difference* of two renderings, so that what came before is
never rendered or encoded again:

    closing  = what the template writes after an assistant message's content ("<|im_end|>\\n" in ChatML),
               less the stop token the model already sampled (its turn ended on it)
    turn     = render(history + [message], generation prompt) - render(history)
                   ("<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n")
    appended = encode(closing + turn), special tokens in the text recognised as such

`history` is a fixed stand-in conversation (a user and an assistant message), so the templates that add a
default system prompt or treat the first message specially do so in both renderings alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncrl.rollout.environment import Observation

_MARK = "\u2063ASYNCRL\u2063"  # never in a real conversation
_HISTORY = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _MARK}]


class ObservationError(ValueError):
    pass


class ObservationEncoder:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._closing: str | None = None
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_ids = {eos} if isinstance(eos, int) else set(eos or [])

    def encode(self, obs: Any, last_model_token: int | None, vocab_size: int | None) -> np.ndarray:
        """The ids to append for `obs` after a model turn that ended on `last_model_token`."""
        if not isinstance(obs, Observation):
            raise ObservationError(f"an observation must be an Observation, not {type(obs).__name__}")
        given = [x is not None for x in (obs.token_ids, obs.text, obs.message)]
        if sum(given) != 1:
            raise ObservationError("an Observation needs exactly one of token_ids, text, message")
        if obs.token_ids is not None:
            ids = np.asarray(obs.token_ids)
            if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
                raise ObservationError("Observation.token_ids must be a flat list of ints")
        elif obs.text is not None:
            ids = np.asarray(self._encode(_str(obs.text, "text")))
        else:
            ids = np.asarray(self._encode(self._message_text(obs.message, last_model_token)))
        ids = ids.astype(np.int64)
        if vocab_size is not None and ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ObservationError(f"observation token ids must be in [0, {vocab_size})")
        return ids.astype(np.int32)

    def _message_text(self, message: Any, last_model_token: int | None) -> str:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            raise ObservationError("Observation.message must be a dict with str 'role' and 'content'")
        before = self._render(_HISTORY, generation=False)
        after = self._render([*_HISTORY, {"role": message["role"], "content": message["content"]}], generation=True)
        if not after.startswith(before):
            raise ObservationError("the chat template renders earlier messages differently once one is added: "
                                   "use token-level observations with this model")
        return self._closing_text(last_model_token) + after[len(before):]

    def _closing_text(self, last_model_token: int | None) -> str:
        if self._closing is None:
            rendered = self._render(_HISTORY, generation=False)
            self._closing = rendered[rendered.index(_MARK) + len(_MARK):]
        closing = self._closing
        if last_model_token is not None and last_model_token in self.eos_ids:
            stop = self.tokenizer.decode([last_model_token], skip_special_tokens=False)
            if closing.startswith(stop):
                closing = closing[len(stop):]
        return closing

    def _render(self, messages: list[dict[str, str]], generation: bool) -> str:
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ObservationError("message observations need a model with a chat template; send text or token_ids")
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def _str(v: Any, name: str) -> str:
    if not isinstance(v, str):
        raise ObservationError(f"Observation.{name} must be a str, not {type(v).__name__}")
    return v
