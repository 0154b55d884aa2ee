"""Per-token logprobs of response tokens, matching the generator: log_softmax(logits / T) over the full
vocabulary at the sampled token (SGLang's semantics, no top-p / top-k renormalisation; greedy requests
use T = 1).

Packing. Sequences are concatenated into one row with position_ids restarting at 0 per sequence. On GPU
the default attention is variable-length FlashAttention over the pack's boundaries (attention.py): each
sequence attends only to itself at sum(len^2) cost. With `sdpa` / `eager` (the CPU default) Hugging Face
transformers 5.x detects the position restarts (`masking_utils.find_packed_sequence_indices`) and builds
a dense block-diagonal causal mask: exact, at pack^2 cost. tests/learner/test_logprobs.py checks packed
== per-sequence forward for both.

The lm_head and the log-softmax run fused (linear_logprob.py): only response-predicting positions reach
the lm_head, and the fp32 [tokens x vocab] log-softmax never exists.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from asyncrl.learner.linear_logprob import linear_logprob


def head_logprobs(hidden: Tensor, lm_head: nn.Module, targets: Tensor, temperature: Tensor,
                  chunk_tokens: int = 4096, softcap: float | None = None,
                  logits_fp32: bool = False) -> tuple[Tensor, Tensor]:
    """hidden [n, H] (final-norm states at the predicting positions), targets [n], temperature [n]
    -> (logprobs [n] fp32 with grad, entropy [n] fp32 without grad). logits_fp32: ModelConfig.logits_fp32."""
    weight = lm_head.weight  # [V, H]
    if getattr(lm_head, "bias", None) is not None:
        raise ValueError(f"{type(lm_head).__name__} has a bias: the fused logprob supports bias-free lm_heads only")
    return linear_logprob(hidden.to(weight.dtype), weight, targets, temperature, chunk=chunk_tokens, softcap=softcap,
                          fp32=logits_fp32)


def reference_logprobs(model: nn.Module, sequences: list[Tensor], prompt_lens: list[int],
                       temperature: float = 1.0) -> list[Tensor]:
    """Plain per-sequence HF forward, log_softmax(logits / T) at each response token: the ground truth the
    packed path is tested against.  sequences[i] [L_i] -> [L_i - P_i]"""
    out = []
    with torch.no_grad():
        for seq, p in zip(sequences, prompt_lens):
            logits = model(input_ids=seq[None], use_cache=False).logits[0].float()  # [L, V]
            lp = torch.log_softmax(logits / temperature, dim=-1)
            out.append(lp[p - 1:-1].gather(-1, seq[p:, None]).squeeze(-1))
    return out
