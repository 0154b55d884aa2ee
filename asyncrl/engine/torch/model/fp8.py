"""FP8 rollouts: e4m3 images of the decoder's linear weights, and the matmuls that read them.

`generator.weights_dtype = "fp8"` gives every projection of every layer (q/k/v, o, gate/up, down) an fp8 image
of its weight with one scale per output channel; embeddings, norms and the lm_head stay in the model dtype.
Each matmul quantizes its input per row on the fly (one scale per token, the row's absolute maximum over
448, e4m3's largest value) and runs `torch._scaled_mm`, which multiplies in fp8 on the tensor cores, applies
both scales and writes the model dtype (on CPU, for tests, the same products in fp32):

    y[t, o] = (sum_i x8[t, i] * w8[o, i]) * sx[t] * sw[o]      x ~ x8 * sx (row t),  W ~ w8 * sw (row o)

The model's own weights stay as they are: they are what a weight push writes (`load_weights`, by Hugging Face
name, in place) and what a LoRA merge starts from. `Fp8Weights.refresh` re-quantizes from them after every
update, into the same fp8 buffers, so CUDA graphs captured once keep reading the current version. Memory: the
fp8 images add half the linears' bytes; a decode step reads only them. The quantization is engine-side, one
pass over the linears per push (timed by bench.generation as `fp8_refresh_ms`); a push still carries bf16.

Numerics: per-channel weight and per-token activation scales keep each product's relative error near e4m3's
(2^-4), the sum over the input dimension averages it down; the learner stays bf16, and the remaining
behaviour/proximal mismatch is what `learner.off_policy` corrects (FP8 rollouts default to truncated IS:
docs/algorithms.md). Hopper and later (compute capability >= 8.9) on CUDA; `check_supported` refuses others.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from asyncrl.engine.torch import kernels
from asyncrl.engine.torch.kernels import fp8 as fp8_kernels

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
SCALE_FLOOR = 1e-12  # an all-zero row gets this scale (its fp8 values are 0), never a division by 0
FUSE_INPUTS = True
"""Quantize the inputs of qkv, gate_up and down_proj inside the kernels that make them (`kernels.fp8`: residual
add + RMSNorm, SiLU * up) rather than in a kernel of their own. Read when a forward runs, so CUDA graphs capture
the setting in force at engine start (bench.generation --fp8-fused 0,1 compares both in one process)."""


class Fp8Input(NamedTuple):
    """A matmul input already quantized per row: x8 [n, k] e4m3, scale [n, 1] fp32 (x ~ x8 * scale)."""

    x8: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.x8.shape


def fused_inputs(x: torch.Tensor, image: object) -> bool:
    """Whether the kernel making x (for the projection `image`, an Fp8Linear or None) quantizes it itself."""
    return image is not None and FUSE_INPUTS and kernels.ops.enabled(x) and x.dim() == 2


def check_supported(device: torch.device, dtype: torch.dtype) -> None:
    """Raise a one-line ValueError when fp8 rollouts cannot run on `device` in `dtype`."""
    if dtype != torch.bfloat16:
        raise ValueError(f"generator.weights_dtype='fp8' needs model.dtype='bfloat16' (now {dtype}): the fp8 "
                         "matmul writes bfloat16; set model.dtype = \"bfloat16\" or weights_dtype = \"model\"")
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        name = torch.cuda.get_device_name(device)
        raise ValueError(f"generator.weights_dtype='fp8' on {name} (compute capability "
                         f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))}): fp8 matmuls need 8.9 or "
                         "later (Ada, Hopper); set generator.weights_dtype = \"model\"")


def fp8_weights(model: nn.Module, weights_dtype: str) -> Fp8Weights | None:
    """The fp8 images `weights_dtype` asks for: None for "model", `Fp8Weights` for "fp8" (checked first)."""
    if weights_dtype not in ("model", "fp8"):
        raise ValueError(f"weights_dtype={weights_dtype!r}: allowed values are 'model', 'fp8'")
    if weights_dtype == "model":
        return None
    weight = model.lm_head.weight
    check_supported(weight.device, weight.dtype)
    return Fp8Weights(model)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [n, k] -> (x8 [n, k] e4m3, scale [n, 1] fp32) with x ~ x8 * scale, scale = max|x_row| / 448.
    One Triton kernel on GPU; this torch code on CPU (and as its reference)."""
    if kernels.ops.runs_on(x) and x.is_contiguous():
        return fp8_kernels.quantize_rows_fp8(x)
    return quantize_rows_reference(x)


def quantize_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch form of `quantize_rows`.  [n, k] -> ([n, k] e4m3, [n, 1] fp32)"""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=SCALE_FLOOR) / E4M3_MAX  # [n, 1]
    return (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


class Fp8Linear:
    """The fp8 image of one linear weight (a fused one: qkv, gate_up) and its matmul. `source` is the model's
    weight [out, in], kept and read by `refresh`; bias (model dtype) is added after the scaled matmul."""

    def __init__(self, source: torch.Tensor, bias: torch.Tensor | None) -> None:
        out_features, in_features = source.shape
        self.source, self.bias = source, bias
        self.w8 = torch.empty((out_features, in_features), dtype=E4M3, device=source.device)  # [out, in]
        self.w_scale = torch.empty((1, out_features), dtype=torch.float32, device=source.device)  # [1, out]
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Re-quantize from `source`, in place (the buffers a captured graph reads stay where they are)."""
        w8, scale = quantize_rows_reference(self.source)  # [out, in], [out, 1]
        self.w8.copy_(w8)
        self.w_scale.copy_(scale.view(1, -1))

    def __call__(self, x: torch.Tensor | Fp8Input) -> torch.Tensor:
        """x [n, in] in the model dtype, or already quantized -> [n, out] in the model dtype."""
        x8, x_scale = x if isinstance(x, Fp8Input) else quantize_rows(x.reshape(-1, x.shape[-1]))  # [n, in], [n, 1]
        dtype = self.source.dtype
        if x8.is_cuda:  # w8.t() is [in, out] column-major, the layout _scaled_mm's second operand needs
            # the bias (qkv's) is added in the matmul's epilogue, in fp32 before the one rounding to bf16: a
            # separate add cost a kernel, 8.2 against 5.8 us for 0.5B's qkv at 256 rows in a graph (H100, 2.11)
            return torch._scaled_mm(x8, self.w8.t(), scale_a=x_scale, scale_b=self.w_scale, bias=self.bias,
                                    out_dtype=dtype)
        # torch's CPU _scaled_mm takes one scale per tensor only (2.11): the same products, in fp32
        y = (x8.float() @ self.w8.float().t()) * x_scale * self.w_scale
        return (y if self.bias is None else y + self.bias.float()).to(dtype)


def fits(weight: torch.Tensor) -> bool:
    """Whether `_scaled_mm` takes this weight: both dimensions multiples of 16 (else it stays in the model dtype)."""
    return weight.dim() == 2 and weight.shape[0] % 16 == 0 and weight.shape[1] % 16 == 0


class Fp8Weights:
    """Every projection of a fused compact model (`CausalLM.fuse_projections` first) switched to its fp8 image:
    attention's `qkv_fp8` / `o_fp8` and the MLP's `gate_up_fp8` / `down_fp8` attributes, which their forwards
    use when set. A projection whose shape `_scaled_mm` does not take keeps the model dtype (`skipped`)."""

    def __init__(self, model: nn.Module) -> None:
        self.linears: list[Fp8Linear] = []
        self.skipped: list[str] = []
        for i, layer in enumerate(model.model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            assert attn.qkv is not None and mlp.gate_up is not None, "fuse the projections before fp8"
            attn.qkv_fp8 = self._image(f"layers.{i}.qkv", *attn.qkv)
            attn.o_fp8 = self._image(f"layers.{i}.o_proj", attn.o_proj.weight, attn.o_proj.bias)
            mlp.gate_up_fp8 = self._image(f"layers.{i}.gate_up", *mlp.gate_up)
            mlp.down_fp8 = self._image(f"layers.{i}.down_proj", mlp.down_proj.weight, mlp.down_proj.bias)

    def _image(self, name: str, weight: torch.Tensor, bias: torch.Tensor | None) -> Fp8Linear | None:
        if not fits(weight):
            self.skipped.append(name)
            return None
        lin = Fp8Linear(weight, bias)
        self.linears.append(lin)
        return lin

    def refresh(self) -> None:
        """After a weight update: every image from its (updated) model weight."""
        for lin in self.linears:
            lin.refresh()

    @property
    def nbytes(self) -> int:
        return sum(lin.w8.numel() + 4 * lin.w_scale.numel() for lin in self.linears)
