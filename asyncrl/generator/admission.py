"""Prompt admission: whether the engine can take a leased prompt, checked before `engine.add`.

A prompt that no engine could take (empty, token ids outside the vocabulary, prompt + max_new_tokens
past the engine's context or KV cache) must not crash the generator or come back to the queue forever: the worker fails
it at the hub with the reason (`ReturnPrompts(reason=...)`) and goes on. The limits come from
`engine.limits()` (the Engine Protocol); what an engine does not know is left to its own check in `add`,
whose ValueError the worker treats the same way.
"""

from __future__ import annotations

import numpy as np

from asyncrl.engine.protocol import EngineLimits


def why_not(ids: np.ndarray, max_new_tokens: int, limits: EngineLimits) -> str:
    """'' if the engine can take this prompt (`ids`: [prompt_len] int32), else the reason it cannot
    (for the hub and the log)."""
    if len(ids) == 0:
        return "empty prompt: no token ids (and no text to tokenize)"
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (limits.vocab_size is not None and high >= limits.vocab_size):
        bad = low if low < 0 else high
        return f"token id {bad} is outside the vocabulary [0, {limits.vocab_size or 'vocab'})"
    if max_new_tokens < 1:
        return f"max_new_tokens={max_new_tokens}: must be >= 1"
    if limits.max_model_len is not None and len(ids) >= limits.max_model_len:
        return (f"prompt of {len(ids)} tokens leaves no room for a response in the engine's context of "
                f"{limits.max_model_len} tokens: shorten the prompt")
    return ""  # a response longer than the context room is cut there (finish "length"), not refused
