"""Per-token logprobs (and entropy) of response tokens, matching the generator: log_softmax(logits / T)
over the full vocabulary at the sampled token (SGLang's semantics, docs/sglang-api.md section 5; no
top-p / top-k renormalisation; greedy requests use T = 1).

Packing. Sequences are concatenated into one row with position_ids restarting at 0 per sequence and no
attention mask. Hugging Face transformers 5.x (`masking_utils.find_packed_sequence_indices`) detects the
restarts and builds a block-diagonal causal mask for sdpa / eager / flex, and flash-attention 2/3 use the
same position_ids as varlen boundaries; so packing is exact on CPU and GPU (tests/learner/test_logprobs.py
checks packed == per-sequence forward). The mask is dense [T, T] for sdpa/eager: keep micro_batch_tokens
moderate there, or use flash_attention_2 for long contexts.

Chunking. Only the hidden states of positions that predict response tokens reach the lm_head, in chunks
of `chunk_tokens`; with autograd on, each chunk is wrapped in activation checkpointing, so the backward
recomputes its [chunk, vocab] logits instead of keeping them: at most one chunk's fp32 logits exist at once.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


def _chunk_logprobs(hidden: Tensor, weight_module: nn.Module, targets: Tensor, temperature: Tensor,
                    softcap: float | None) -> tuple[Tensor, Tensor]:
    logits = weight_module(hidden).float()  # [c, V] fp32 (lm_head may run in bf16, like SGLang)
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    logits = logits / temperature[:, None]
    lse = torch.logsumexp(logits, dim=-1)  # [c]
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse  # [c]
    with torch.no_grad():
        entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)  # [c]
    return logp, entropy


def chunked_logprobs(hidden: Tensor, lm_head: nn.Module, targets: Tensor, temperature: Tensor,
                     chunk_tokens: int = 1024, softcap: float | None = None) -> tuple[Tensor, Tensor]:
    """hidden [n, H] (final-norm hidden states at the predicting positions), targets [n], temperature [n]
    -> (logprobs [n] fp32 with grad, entropy [n] fp32 without grad)."""
    grad = torch.is_grad_enabled() and hidden.requires_grad
    logps, ents = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        sl = slice(start, start + chunk_tokens)
        args = (hidden[sl], lm_head, targets[sl], temperature[sl], softcap)
        if grad:
            lp, ent = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(*args)
        logps.append(lp)
        ents.append(ent.detach())
    if not logps:  # no tokens: keep the graph connected so backward still reaches every parameter
        empty = lm_head(hidden[:0]).float().sum(-1)
        return empty, empty.detach()
    return torch.cat(logps), torch.cat(ents)


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
