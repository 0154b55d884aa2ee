"""Token-level losses: small pure functions on packed token tensors ([n] = response tokens of a micro-batch).

The loop combines them per token as

    loss_t = w_is_t * pg_t  [+ kl_coef * k3_t]  [+ value_coef * vf_t]
    loss   = sum_t agg_t * loss_t

where `w_is` is the behaviour -> proximal importance weight (`importance_weights`), `pg` the clipped
surrogate (`ppo_clip_loss`) and `agg` the per-token aggregation weight (`aggregation_weights`), which
turns the sum into a token mean, a per-sequence mean, or a constant-normalised sum over the whole
(global, all ranks) mini-batch. Because `agg` already holds the global normaliser, micro-batches and
ranks simply add their sums.
"""

from __future__ import annotations

import torch
from torch import Tensor


def ppo_clip_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, eps_low: float,
                  eps_high: float) -> tuple[Tensor, Tensor]:
    """Clipped surrogate with asymmetric range [1 - eps_low, 1 + eps_high] (DAPO clip-higher):
    -min(r A, clip(r) A), r = exp(logp - old_logp). Returns (loss [n], clipped [n] bool: the clipped
    branch was taken, so the token has no gradient)."""
    ratio = torch.exp(logp - old_logp)  # [n]
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    return loss, (clipped < unclipped).detach()


def importance_weights(prox_logp: Tensor, behav_logp: Tensor, mode: str, cap: float) -> tuple[Tensor, Tensor]:
    """Behaviour -> proximal importance weight w = pi_prox / pi_behav per token (no gradient).
    decoupled: tokens with w > cap get weight 0 (dropped, as in decoupled PPO); tis: w truncated to
    min(w, cap); none: 1. Returns (weights [n], dropped [n] bool)."""
    if mode == "none":
        ones = torch.ones_like(behav_logp)
        return ones, torch.zeros_like(behav_logp, dtype=torch.bool)
    w = torch.exp((prox_logp - behav_logp).detach())  # [n]
    if mode == "tis":
        return w.clamp(max=cap), torch.zeros_like(w, dtype=torch.bool)
    if mode == "decoupled":
        dropped = w > cap
        return torch.where(dropped, torch.zeros_like(w), w), dropped
    raise ValueError(f"off_policy={mode!r}: allowed values are 'decoupled', 'tis', 'none'")


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator of KL(pi || pi_ref) per token: exp(ref - logp) - (ref - logp) - 1 (>= 0, unbiased).  [n]"""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 estimator logp - ref (the per-token KL penalty used inside rewards).  [n]"""
    return logp - ref_logp


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip: float) -> tuple[Tensor, Tensor]:
    """Clipped value loss 0.5 * max((V - R)^2, (clip(V, V_old +- clip) - R)^2).
    Returns (loss [n], clipped [n] bool: the clipped term was the larger)."""
    v_clipped = old_values + (values - old_values).clamp(-clip, clip)
    l1 = (values - returns) ** 2
    l2 = (v_clipped - returns) ** 2
    return 0.5 * torch.maximum(l1, l2), (l2 > l1).detach()


def aggregation_weights(seq_lens: Tensor, mode: str, total_tokens: float, total_seqs: float,
                        constant: float = 1.0) -> Tensor:
    """Per-token weights so that sum_t w_t * loss_t is the configured aggregate over the global
    mini-batch. seq_lens [s] response lengths of this micro-batch's sequences -> [sum(seq_lens)]:
      token_mean: 1 / total_tokens                  (DAPO: every token of the batch counts the same)
      seq_mean:   1 / (len_s * total_seqs)           (GRPO: mean per sequence, then over sequences)
      constant:   1 / (constant * total_seqs)        (Dr.GRPO: constant = max response length)"""
    lens = seq_lens.to(torch.float32)
    if mode == "token_mean":
        per_seq = torch.full_like(lens, 1.0 / max(total_tokens, 1.0))
    elif mode == "seq_mean":
        per_seq = 1.0 / (lens.clamp(min=1.0) * max(total_seqs, 1.0))
    elif mode == "constant":
        per_seq = torch.full_like(lens, 1.0 / (constant * max(total_seqs, 1.0)))
    else:
        raise ValueError(f"loss_agg={mode!r}: allowed values are 'token_mean', 'seq_mean', 'constant'")
    return torch.repeat_interleave(per_seq, seq_lens.long())


def aggregate(token_loss: Tensor, weights: Tensor) -> Tensor:
    """sum_t w_t * loss_t (a scalar).  [n], [n] -> []"""
    return (token_loss * weights).sum()
