"""The compact decoder-only LM (Llama / Qwen2 / Qwen3 / Mistral family).

Module names mirror Hugging Face (`model.layers.3.self_attn.q_proj.weight`, `lm_head.weight`), so a
learner's parameter names load one to one. Inputs are packed (no padding): `input_ids` and
`positions` are flat over all sequences of the batch, described by `AttentionMetadata`.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from asyncrl.engine.torch.model.attention import Attention
from asyncrl.engine.torch.model.fp8 import fused_inputs
from asyncrl.precision.fp32_logits import fp32_logits
from asyncrl.engine.torch.model.config import ArchConfig
from asyncrl.engine.torch.model.layers import MLP, RMSNorm, RotaryEmbedding, default_inv_freq
from asyncrl.engine.torch.paged_attention import AttentionMetadata


class LayerCache(Protocol):
    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]: ...


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h, residual, rotary, positions, meta, k_cache, v_cache,
                stream_fp32: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """h: this layer's input delta [num_tokens, hidden]; residual: the stream before it (None in
        layer 0; stream_fp32: start it in fp32). -> (mlp output, stream after attention): the next layer adds
        them in its norm."""
        x, residual = self.input_layernorm.add_forward(h, residual, stream_fp32,
                                                       quantize=fused_inputs(h, self.self_attn.qkv_fp8))
        h = self.self_attn(x, rotary, positions, meta, k_cache, v_cache)
        x, residual = self.post_attention_layernorm.add_forward(h, residual,
                                                                quantize=fused_inputs(h, self.mlp.gate_up_fp8))
        return self.mlp(x), residual


class DecoderModel(nn.Module):
    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        # built without its random init: every weight is loaded over it, and on the meta device `normal_` goes
        # through torch's Python reference ops, whose first use imports torch._dynamo (~1 s of a start-up)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(
            default_inv_freq(cfg.head_dim, cfg.rope_theta), max_positions=cfg.max_position_embeddings
        )
        self.residual_fp32 = False  # the residual stream in fp32 (ModelConfig.residual_fp32); set before graphs

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, kv_cache: LayerCache
    ) -> torch.Tensor:
        h = self.embed_tokens(input_ids)  # [num_tokens, hidden]
        residual = None
        for i, layer in enumerate(self.layers):
            k_cache, v_cache = kv_cache.layer(i)
            h, residual = layer(h, residual, self.rotary_emb, positions, meta, k_cache, v_cache, self.residual_fp32)
        return self.norm.add_forward(h, residual)[0]


class CausalLM(nn.Module):
    def __init__(self, cfg: ArchConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = DecoderModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.logits_fp32 = False  # the lm_head's output kept in fp32 (ModelConfig.logits_fp32)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def fuse_projections(self) -> None:
        """Fuse q/k/v and gate/up into single matmuls (call once the model is on its device)."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, kv_cache: LayerCache
    ) -> torch.Tensor:
        """-> hidden states [num_tokens, hidden]; call `compute_logits` on the rows that are sampled."""
        return self.model(input_ids, positions, meta, kv_cache)

    def compute_logits(self, hidden: torch.Tensor, fp32: bool = True) -> torch.Tensor:
        """hidden: [num_rows, hidden] -> logits [num_rows, vocab] (matmul in the model dtype), as fp32
        unless fp32=False (the fused sampler reads the model dtype and converts on the fly). With
        `logits_fp32` the matmul's fp32 output is never rounded to the model dtype (asyncrl/precision/fp32_logits.py)."""
        if self.logits_fp32:
            return fp32_logits(hidden, self.lm_head.weight)
        logits = self.lm_head(hidden)
        return logits.float() if fp32 else logits
