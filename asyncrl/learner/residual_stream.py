"""An fp32 residual stream in the learner's Hugging Face decoder (`model.residual_fp32 = true`).

In bf16/fp16 a Hugging Face decoder layer rounds the stream to the compute dtype at each of its two adds
(`residual + attn_out`, `residual + mlp_out`). With an fp32 stream the layers' GEMMs, attention and norms'
outputs stay in the compute dtype, but the stream they add into does not lose bits: on the random 0.5B shape
the logprobs' distance to the fp32 forward falls from 1.05e-3 to 7.4e-4 in fp16 and from 8.5e-3 to 5.9e-3 in
bf16 (`bench.residual_precision`, H200). The torch engine does the same (`RMSNorm.add_forward`'s stream_fp32),
so both sides drop the same roundings.

Two changes to the unmodified Hugging Face modules, the parameters untouched:

    layer 0      its input (the embedding output, compute dtype) is cast to fp32 by a forward pre-hook; every
                 layer's `residual + delta` is then fp32 by type promotion, and so is its output
    the norms    the stream's norms (each layer's input / post-attention norm and the final norm) round their
                 normalised fp32 values to the weight's dtype, the compute dtype, before the scale, as Hugging
                 Face does for a compute-dtype input; otherwise an fp32 input would make their output fp32 and
                 the next GEMM would meet mixed dtypes

Only decoders whose layers are the plain pre-norm pattern (Llama, Qwen2, Qwen3, Mistral) are supported.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import Tensor, nn

SUPPORTED = ("LlamaDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer", "MistralDecoderLayer")
_NORMS = ("input_layernorm", "post_attention_layernorm")


def install(hf: nn.Module) -> None:
    """Switch `hf` (a Hugging Face causal LM) to an fp32 residual stream, in place."""
    decoder = hf.get_decoder()
    layers = list(decoder.layers)
    unsupported = sorted({type(layer).__name__ for layer in layers} - set(SUPPORTED))
    if unsupported or not layers:
        raise ValueError(f"model.residual_fp32 supports {', '.join(SUPPORTED)} layers, not {unsupported or 'none'}; "
                         "set model.residual_fp32 = false for this model")
    for layer in layers:
        for name in _NORMS:
            _round_to_weight_dtype(getattr(layer, name))
    _round_to_weight_dtype(decoder.norm)
    layers[0].register_forward_pre_hook(_stream_to_fp32, with_kwargs=True)


def _round_to_weight_dtype(norm: nn.Module) -> None:
    eps = getattr(norm, "variance_epsilon", None)
    if eps is None or getattr(norm, "weight", None) is None:
        raise ValueError(f"model.residual_fp32: {type(norm).__name__} is not an RMSNorm with a weight")
    norm.forward = types.MethodType(_rms_norm, norm)


def _rms_norm(self: nn.Module, x: Tensor) -> Tensor:
    """[..., H] of any float dtype -> [..., H] in the weight's dtype, Hugging Face's roundings."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * h.to(self.weight.dtype)


def _stream_to_fp32(_module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    if args:
        return (args[0].float(), *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": kwargs["hidden_states"].float()}
