"""Token sampling and logprobs for a batch of rows (one row per sequence).

* Greedy (temperature 0): argmax of the logits; logprob = log_softmax(logits).
* Otherwise: logits / T, top-k and top-p mask the tail of the sorted distribution (top-p keeps the
  token that crosses p), then inverse-CDF sampling (`inverse_cdf`) with one counter-based uniform per row
  and step (`asyncrl.engine.torch.rng`).
  logprob = log_softmax(logits / T) over the full vocabulary, without the truncation: the same
  definition as SGLang (docs/sglang.md, "Logprobs"), computed in fp32.
* Forced rows (scoring, `forced >= 0`) take the given token instead of the sampled one; its logprob
  is read from the same log_softmax, so a forced row scores a token exactly as sampling it did.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.engine.torch import rng


@dataclass(kw_only=True, slots=True)
class SamplingBatch:
    temperatures: torch.Tensor  # [batch] float32; 0 = greedy
    top_ps: torch.Tensor  # [batch] float32
    top_ks: torch.Tensor  # [batch] int64; vocab size when off
    seeds: torch.Tensor  # [batch] int64
    steps: torch.Tensor  # [batch] int64: index of the token being sampled within its response
    needs_truncation: bool  # some row has top_p < 1 or top_k < vocab
    forced: torch.Tensor | None = None  # [batch] int64: the token to take instead of sampling; -1 = sample


def sample(logits: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [batch, vocab] fp32 -> (tokens [batch] int64, logprobs [batch] fp32)."""
    greedy = batch.temperatures <= 0.0  # [batch]
    temps = torch.where(greedy, torch.ones_like(batch.temperatures), batch.temperatures)
    scaled = logits / temps[:, None]  # [batch, vocab]
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    masked = mask_top_k_top_p(scaled, batch.top_ks, batch.top_ps) if batch.needs_truncation else scaled
    sampled = inverse_cdf(masked, rng.row_uniform(batch.seeds, batch.steps))
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)  # [batch]
    if batch.forced is not None:
        tokens = torch.where(batch.forced >= 0, batch.forced, tokens)
    logprobs = logprobs_all.gather(-1, tokens[:, None])[:, 0]
    return tokens, logprobs


def inverse_cdf(scaled: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The sampling rule, shared with the fused GPU sampler (`kernels.sampler`): with p = exp(scaled - max)
    (unnormalised) and the row's uniform u, the first token whose running sum of p exceeds u * sum(p); where rounding
    leaves no such token, the last one with p > 0. A token of zero probability (masked to -inf) is never taken.
    scaled: [batch, vocab] fp32; u: [batch] in (0, 1) -> tokens [batch] int64."""
    p = torch.exp(scaled - scaled.max(dim=-1, keepdim=True).values)  # [batch, vocab]
    cdf = p.cumsum(dim=-1)
    target = u * cdf[:, -1]  # [batch]
    first = (cdf <= target[:, None]).sum(dim=-1)  # entries at or below the target come before the token
    ranks = torch.arange(scaled.shape[-1], device=scaled.device)
    last = torch.where(p > 0, ranks, -1).max(dim=-1).values
    return torch.minimum(first, last)


def mask_top_k_top_p(scaled: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p support to -inf. scaled: [batch, vocab]."""
    sorted_logits, order = scaled.sort(dim=-1, descending=True)  # [batch, vocab]
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the strictly better tokens
    ranks = torch.arange(scaled.shape[-1], device=scaled.device)[None, :]
    drop = (ranks >= top_ks[:, None]) | (mass_before > top_ps[:, None])
    drop[:, 0] = False  # the best token always survives
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(scaled).scatter_(-1, order, sorted_logits)
