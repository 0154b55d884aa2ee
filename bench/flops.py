"""The one definition of training FLOPs and MFU used by the benches.

    train FLOPs = 6 * N * tokens  +  6 * layers * (heads * head_dim) * sum_i L_i^2

* N: parameters that take part in a matmul per token: every parameter except an untied input embedding
  (a lookup, no FLOPs); a tied embedding counts once, as the lm_head. 6 = 2 (multiply-add) x 3 (forward,
  backward for activations, backward for weights).
* tokens: input tokens of the packed sequences (prompt + response - 1 per sample), whether or not they
  carry a loss: the forward and backward pass runs over all of them.
* attention: per layer and sequence of length L, QK^T and PV cost 2 * 2 * L^2 * d forward, halved by
  the causal mask, times 3 for forward + backward: 6 * d * L^2 with d = heads * head_dim.
* Recomputation (activation checkpointing, a no-grad proximal pass) is not counted: MFU counts the
  model's FLOPs, not the hardware's.

MFU = train FLOPs / (seconds * peak), peak = the GPU's dense bf16 tensor-core rate from its data sheet.
"""

from __future__ import annotations

import torch

PEAK_BF16 = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12, "L40S": 362e12}


def matmul_params(model: torch.nn.Module) -> int:
    """N above for a Hugging Face causal LM."""
    total = sum(p.numel() for p in model.parameters())
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is embed.weight
    return total if tied else total - embed.weight.numel()


def train_flops(model: torch.nn.Module, seq_lens: list[int]) -> float:
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    d_attn = cfg.num_attention_heads * head_dim
    attn = 6.0 * cfg.num_hidden_layers * d_attn * sum(length * length for length in seq_lens)
    return 6.0 * matmul_params(model) * sum(seq_lens) + attn


def peak_flops(device: torch.device) -> float | None:
    """Dense bf16 peak of the device, or None where unknown (CPU, unlisted GPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)
