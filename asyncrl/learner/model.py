"""The trained module: a Hugging Face causal LM plus an optional scalar value head (PPO critic sharing the
policy's trunk), with a forward over one packed micro-batch.

It is the FSDP2 root, so the lm_head and the value head (root parameters) are unsharded while
`forward` runs the fused logprob computation outside the HF model's own forward. Hugging Face names
stay reachable through `.hf` (weight push, export); the value head lives outside them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import AutoModelForCausalLM

from asyncrl.learner.logprobs import head_logprobs


class PolicyModel(nn.Module):
    def __init__(self, hf: nn.Module, value_head: bool, chunk_tokens: int, logits_fp32: bool = False) -> None:
        """logits_fp32: the lm_head's output in fp32, as the engine's (ModelConfig.logits_fp32)."""
        super().__init__()
        self.hf = hf
        self.chunk_tokens = chunk_tokens
        self.logits_fp32 = logits_fp32
        self.softcap = getattr(hf.config, "final_logit_softcapping", None)
        self._premasked: bool | None = None  # whether the decoder takes a prepared mask mapping (asked once)
        self._no_masks = dict.fromkeys(getattr(hf.config, "layer_types", None) or ["full_attention"])
        self.value_head = nn.Linear(hf.config.hidden_size, 1) if value_head else None
        if self.value_head is not None:
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: Tensor, position_ids: Tensor, gather_idx: Tensor, targets: Tensor,
                temperature: Tensor, cu_seqlens: Tensor | None = None,
                max_seqlen: int = 0) -> tuple[Tensor, Tensor, Tensor | None]:
        """input_ids, position_ids [1, T]; gather_idx, targets, temperature [n]; cu_seqlens [s + 1] int32
        (sequence boundaries of the pack, read by varlen attention) -> (logprobs [n] fp32, entropy [n] fp32
        no grad, values [n] fp32 or None)."""
        varlen = {} if cu_seqlens is None else {
            "cu_seq_lens_q": cu_seqlens, "cu_seq_lens_k": cu_seqlens, "max_length_q": max_seqlen,
            "max_length_k": max_seqlen}
        hidden = self._decode(input_ids, position_ids, varlen)  # [T, H]
        hidden = hidden.index_select(0, gather_idx)  # [n, H]
        logp, entropy = head_logprobs(
            hidden, self.hf.get_output_embeddings(), targets, temperature, self.chunk_tokens, self.softcap,
            self.logits_fp32)
        values = None
        if self.value_head is not None:
            values = self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()  # [n]
        return logp, entropy, values

    def _decode(self, input_ids: Tensor, position_ids: Tensor, varlen: dict) -> Tensor:
        """The decoder's last hidden state [T, H]. A packed call hands decoders that accept a prepared mask
        mapping (Qwen2/3, Gemma 2, ...) one with no masks: the varlen kernel reads the boundaries, and building
        the mask would scan position_ids for packing with a host sync (the GPU then drains at every
        micro-batch). Decoders that do not accept the mapping (Llama: AttributeError on the dict) are asked
        once and then called without it."""
        decoder = self.hf.get_decoder()
        call = dict(input_ids=input_ids, position_ids=position_ids, use_cache=False, **varlen)
        if varlen and self._premasked is not False:
            try:
                out = decoder(**call, attention_mask=self._no_masks)
                self._premasked = True
                return out.last_hidden_state[0]
            except (AttributeError, TypeError):
                if self._premasked:
                    raise
                self._premasked = False
        return decoder(**call).last_hidden_state[0]


def load_hf(path: str, attn_implementation: str) -> nn.Module:
    """fp32 master weights on CPU (moved / sharded by the caller)."""
    try:
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn_implementation)
    except (OSError, ValueError) as e:
        raise ValueError(f"learner: cannot load a causal LM from {path!r}: {e}") from e
    return hf
