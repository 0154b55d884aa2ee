"""The test double's "model": logits that are a pure function of (weights version, prompt, position).

Tests recompute the expected logprob of any generated token with `FakeModel.logprobs`, which is how
they check that the adapter passes the temperature through and stamps the right version. Sampling
follows SGLang's semantics (docs/sglang.md, "Logprobs"): top-k/top-p truncate what can be sampled, but
the reported logprob is `log_softmax(z / T)` over the whole vocabulary; T < 1e-6 is greedy and then
reports `log_softmax(z)`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

GREEDY_T = 1e-6
_EOS_LOGIT = 12.0  # from `stop_after` on, EOS is all but certain at T <= 1


@dataclass(frozen=True, slots=True)
class FakeModel:
    vocab_size: int
    eos_ids: tuple[int, ...]
    stop_after: int  # output position from which EOS dominates; before it, EOS is never sampled

    def logits(self, version: str, prompt: list[int], position: int) -> np.ndarray:
        """[vocab_size] float64, deterministic in its arguments."""
        key = f"{version}|{','.join(map(str, prompt))}|{position}".encode()
        seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
        z = np.random.default_rng(seed).normal(0.0, 2.0, self.vocab_size)
        for eos in self.eos_ids:
            z[eos] = _EOS_LOGIT if position >= self.stop_after else -_EOS_LOGIT
        return z

    def logprobs(self, version: str, prompt: list[int], position: int, temperature: float) -> np.ndarray:
        """[vocab_size]: what SGLang reports for a token sampled at this position."""
        z = self.logits(version, prompt, position)
        return log_softmax(z if temperature < GREEDY_T else z / temperature)

    def sample(
        self, rng: np.random.Generator, version: str, prompt: list[int], position: int, params: dict
    ) -> tuple[int, float]:
        """(token, reported logprob) under params' temperature, top_k and top_p."""
        temperature = float(params.get("temperature", 1.0))
        lp = self.logprobs(version, prompt, position, temperature)
        if temperature < GREEDY_T or params.get("top_k") == 1:
            token = int(np.argmax(lp))
            return token, float(lp[token])
        probs = np.exp(lp)
        order = np.argsort(-probs, kind="stable")
        top_k = int(params.get("top_k", -1))
        keep = order[:top_k] if top_k > 0 else order
        top_p = float(params.get("top_p", 1.0))
        cum = np.cumsum(probs[keep])
        keep = keep[: int(np.searchsorted(cum, top_p * cum[-1])) + 1]
        p = probs[keep] / probs[keep].sum()
        token = int(keep[rng.choice(len(keep), p=p)])
        return token, float(lp[token])


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())
