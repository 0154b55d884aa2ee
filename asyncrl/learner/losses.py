"""Token-level losses: small pure functions on packed token tensors ([n] = response tokens of a micro-batch).

The loop combines them per token as

    loss_t = w_is_t * pg_t  [+ kl_coef * k3_t]  [+ value_coef * vf_t]
    loss   = sum_t agg_t * loss_t

where `w_is` is the behaviour -> proximal importance weight (`importance_weights`, the rollout correction:
per token, per sample or their geometric mean; masked or truncated), `pg` the clipped surrogate
(`policy_loss`: token- or sequence-level ratio, dual-clip) and `agg` the per-token aggregation weight
(`sample_weights`, one per sample in prepare.py, on its trained tokens), which turns the sum into a token
mean, a per-sequence mean, or a constant-normalised sum over the whole (global, all ranks) mini-batch. Because `agg` already holds the global normaliser,
micro-batches and ranks simply add their sums.

A sequence-level ratio (RLOO) gives every token of a sample the same loss value; with `seq_mean`
aggregation the sample then counts once, as in the RLOO paper. Formulas and choices: docs/algorithms.md.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    from asyncrl.learner.config import LearnerConfig

# Log-ratios are clamped to +-20 before exp (as verl): exp(20) = 4.9e8 stays finite in fp32, so a wild
# ratio cannot turn into inf * 0 = nan in backward. Beyond the bound the ratio has no gradient.
LOG_RATIO_BOUND = 20.0


def policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, seq_lens: Tensor,
                cfg: LearnerConfig, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The configured clipped surrogate per token. logp, old_logp, advantages [n] fp32 (response tokens
    of a packed micro-batch, sequences contiguous), seq_lens [s] int64 with sum(seq_lens) == n, mask [n]
    (MicroBatch.mask: 0 on environment and filler tokens; None: all 1).
    Ratio per token (`ratio_level="token"`) or per sequence ("sequence", over the masked-in tokens), clip
    range [1 - clip_eps_low, 1 + clip_eps_high], dual-clip for negative advantages. Returns (loss [n],
    clipped [n] bool: the token has no gradient because a clip branch was taken). Masked-out tokens still
    get a (finite) loss value: the aggregation weights zero them."""
    if cfg.resolved_ratio_level == "sequence":
        ratio = sequence_ratio(logp, old_logp, seq_lens, mask)
    else:
        ratio = token_ratio(logp, old_logp)
    return clipped_surrogate(ratio, advantages, cfg.clip_eps_low, cfg.resolved_clip_eps_high, cfg.dual_clip)


def token_ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """r_t = exp(logp_t - old_t).  [n] -> [n]"""
    return torch.exp((logp - old_logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))


def sequence_ratio(logp: Tensor, old_logp: Tensor, seq_lens: Tensor, mask: Tensor | None = None) -> Tensor:
    """rho_s = exp(sum_{t in s, mask_t = 1} (logp_t - old_t)), the ratio of the probabilities of the sample's
    policy tokens (an environment's tokens were not sampled from the policy), repeated on each token of its
    sample.  [n], [n], seq_lens [s], mask [n] or None (all 1) -> [n]"""
    log_rho, seq_ids = sequence_sums(logp - old_logp, seq_lens, mask)  # [s], [n]
    return torch.exp(log_rho.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))[seq_ids]


def sequence_sums(values: Tensor, seq_lens: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per-sequence sums of `values` over the policy's tokens (mask > 0) of packed sequences, and each token's
    sequence.  values [n], seq_lens [s], mask [n] or None (all 1) -> (sums [s], seq_ids [n])"""
    seq_ids = torch.repeat_interleave(  # [n]; output_size avoids a device sync
        torch.arange(len(seq_lens), device=values.device), seq_lens.to(values.device), output_size=values.shape[0])
    kept = values if mask is None else torch.where(mask > 0, values, 0.0)  # [n]
    sums = torch.zeros(len(seq_lens), dtype=values.dtype, device=values.device)  # [s]
    return sums.index_add(0, seq_ids, kept), seq_ids


def clipped_surrogate(ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float,
                      dual_clip: float = 0.0) -> tuple[Tensor, Tensor]:
    """-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), then for A < 0 capped at -dual_clip * A (dual-clip,
    Ye et al. 2020; verl's clip_ratio_c; 0: off). Returns (loss [n], clipped [n] bool: either cap taken,
    so the token has no gradient)."""
    unclipped = ratio * advantages  # [n]
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    no_grad = clipped < unclipped
    if dual_clip > 0.0:
        cap = -dual_clip * advantages  # [n] > 0 where A < 0
        capped = (advantages < 0) & (loss > cap)
        loss = torch.where(capped, cap, loss)
        no_grad = no_grad | capped
    return loss, no_grad.detach()


def ppo_clip_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, eps_low: float,
                  eps_high: float, dual_clip: float = 0.0) -> tuple[Tensor, Tensor]:
    """Token-level clipped surrogate with asymmetric range [1 - eps_low, 1 + eps_high] (DAPO
    clip-higher): -min(r A, clip(r) A), r = exp(logp - old_logp). Returns (loss [n], clipped [n] bool)."""
    return clipped_surrogate(token_ratio(logp, old_logp), advantages, eps_low, eps_high, dual_clip)


def importance_weights(prox_logp: Tensor, behav_logp: Tensor, mode: str, cap: float, *, low: float = 0.0,
                       level: str = "token", seq_lens: Tensor | None = None,
                       mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Behaviour -> proximal importance weight w = pi_prox / pi_behav per token (no gradient), taken at `level`
    (`weight_log_ratio`; seq_lens [s] and mask [n] needed above token level).
    decoupled: masked IS, weight 0 where w leaves [low, cap] (above cap only when low is 0: decoupled PPO's
    drop); tis: w truncated to min(w, cap); none: 1. Returns (weights [n], dropped [n] bool)."""
    if mode == "none":
        ones = torch.ones_like(behav_logp)
        return ones, torch.zeros_like(behav_logp, dtype=torch.bool)
    w = torch.exp(weight_log_ratio(prox_logp, behav_logp, level, seq_lens, mask))  # [n]
    if mode == "tis":
        return w.clamp(max=cap), torch.zeros_like(w, dtype=torch.bool)
    if mode == "decoupled":
        dropped = (w > cap) | (w < low)
        return torch.where(dropped, torch.zeros_like(w), w), dropped
    raise ValueError(f"off_policy={mode!r}: allowed values are 'decoupled', 'tis', 'none'")


def weight_log_ratio(prox_logp: Tensor, behav_logp: Tensor, level: str, seq_lens: Tensor | None = None,
                     mask: Tensor | None = None) -> Tensor:
    """log w of each token (detached). token: log pi_prox(t) - log pi_behav(t); sequence: the sum of those
    over the sample's policy tokens (mask > 0); geometric: their mean. A sample's value repeats on its tokens;
    above token level it is bounded to +-LOG_RATIO_BOUND (w stays finite).  [n], [n] -> [n]"""
    log_w = (prox_logp - behav_logp).detach()  # [n]
    if level == "token":
        return log_w
    if level not in ("sequence", "geometric"):
        raise ValueError(f"correction.level={level!r}: allowed values are 'token', 'sequence', 'geometric'")
    assert seq_lens is not None, "a sequence-level weight needs the packed sequences' lengths"
    sums, seq_ids = sequence_sums(log_w, seq_lens, mask)  # [s], [n]
    if level == "geometric":
        counts, _ = sequence_sums(torch.ones_like(log_w), seq_lens, mask)  # [s] policy tokens per sample
        sums = sums / counts.clamp(min=1.0)
    return sums.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)[seq_ids]


def kl_k3(logp: Tensor, ref_logp: Tensor, clamp: float = 10.0) -> Tensor:
    """k3 estimator of KL(pi || pi_ref) per token: exp(ref - logp) - (ref - logp) - 1 (>= 0, unbiased),
    clamped to [-clamp, clamp] as verl does (0: no clamp). With the clamp on, d = ref - logp is first
    bounded to [-(clamp + 1), ln(clamp + 1) + 1], where k3 already exceeds `clamp`: the value is the same,
    exp stays finite and clamped tokens get a zero (not nan) gradient.  [n] -> [n]"""
    d = ref_logp - logp
    if clamp <= 0.0:
        return torch.exp(d) - d - 1.0
    d = d.clamp(-(clamp + 1.0), math.log(clamp + 1.0) + 1.0)
    return (torch.exp(d) - d - 1.0).clamp(-clamp, clamp)


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 estimator logp - ref (the per-token KL penalty used inside rewards).  [n]"""
    return logp - ref_logp


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip: float) -> tuple[Tensor, Tensor]:
    """Clipped value loss 0.5 * max((V - R)^2, (clip(V, V_old +- clip) - R)^2).
    Returns (loss [n], clipped [n] bool: the clipped term was the larger). V is clamped between the
    bounds (not V_old + clamp(V - V_old), which differs from an in-range V by an ulp and would count it)."""
    v_clipped = torch.clamp(values, old_values - clip, old_values + clip)  # [n]
    l1 = (values - returns) ** 2
    l2 = (v_clipped - returns) ** 2
    return 0.5 * torch.maximum(l1, l2), (l2 > l1).detach()


def sample_weights(lens: Tensor, mode: str, total_tokens: float, total_seqs: float, constant: float = 1.0) -> Tensor:
    """Per-sample weight of each trained token so that sum_t w_t * loss_t is the configured aggregate over the
    global mini-batch. lens [s] trained tokens of each sample (the policy's; every token of a single-turn one):
      token_mean: 1 / total_tokens                  (DAPO: every token of the batch counts the same)
      seq_mean:   1 / (len_s * total_seqs)           (GRPO: mean per sequence, then over sequences)
      constant:   1 / (constant * total_seqs)        (Dr.GRPO: constant = max response length)
    total_tokens counts trained tokens too.  [s] -> [s] float32"""
    lens = lens.to(torch.float32)
    if mode == "token_mean":
        return torch.full_like(lens, 1.0 / max(total_tokens, 1.0))
    if mode == "seq_mean":
        return 1.0 / (lens.clamp(min=1.0) * max(total_seqs, 1.0))
    if mode == "constant":
        return torch.full_like(lens, 1.0 / (constant * max(total_seqs, 1.0)))
    raise ValueError(f"loss_agg={mode!r}: allowed values are 'token_mean', 'seq_mean', 'constant'")


def aggregation_weights(seq_lens: Tensor, mode: str, total_tokens: float, total_seqs: float,
                        constant: float = 1.0, trained_lens: Tensor | None = None) -> Tensor:
    """`sample_weights` repeated on each sequence's response tokens: seq_lens [s] response lengths ->
    [sum(seq_lens)]; trained_lens [s] the policy's tokens of each sequence (None: seq_lens). The caller zeroes
    the untrained tokens' weights (mask). On the host it repeats with numpy: torch's CPU repeat_interleave goes
    through its OpenMP pool, and between GPU steps on a 16-core host (or on a busy machine) that took ~7.5 ms a
    call instead of ~0.07."""
    per_seq = sample_weights(seq_lens if trained_lens is None else trained_lens, mode, total_tokens, total_seqs,
                             constant)  # [s]
    if per_seq.device.type == "cpu":
        return torch.from_numpy(np.repeat(per_seq.numpy(), seq_lens.numpy()))
    return torch.repeat_interleave(per_seq, seq_lens.long())


def aggregate(token_loss: Tensor, weights: Tensor) -> Tensor:
    """sum_t w_t * loss_t (a scalar).  [n], [n] -> []"""
    return (token_loss * weights).sum()
