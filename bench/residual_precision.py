"""How much of the engine-vs-learner logprob gap the residual stream's rounding makes (CPU or GPU).

Drives Hugging Face's own Qwen2 layers by hand on a random model (bench.generation's shapes) and scores the
same tokens three ways in the compute dtype, each against the fp32 forward on the same weights:

    base        Hugging Face's roundings (residual stream in the compute dtype); bitwise HF's own forward
    fp32_res    the residual stream kept fp32: each layer adds into it, the norms read it
    fp32_res_o  also o_proj and down_proj with fp32 outputs (no rounding before the add)

Two implementations that differ only in kernel order disagree by about what each is from fp32, so a variant
that halves the distance to fp32 on both sides about halves the engine-vs-learner gap.

    python -m bench.residual_precision [--dtype float16 --shape 0.5b --seqs 2 --len 192 --prompt 64]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from bench.generation import VOCAB, build_hf, commit


class _Fp32Out(torch.nn.Module):
    """x @ W^T with fp32 accumulation and an fp32 result (what `torch.mm(..., out_dtype=float32)` gives)."""

    def __init__(self, lin: torch.nn.Linear) -> None:
        super().__init__()
        self.lin = lin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.lin.weight.float())


def _norm(ln, r: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Qwen2RMSNorm on a residual of any dtype, result in `dtype` (HF's rounding: normalise in fp32, round, scale)."""
    v = r.float()
    v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + ln.variance_epsilon)
    return ln.weight * v.to(dtype)


@torch.no_grad()
def score(model, ids: torch.Tensor, prompt: int, fp32_residual: bool) -> torch.Tensor:
    """ids [N, L] -> [N, L - prompt] fp32 logprobs of ids[:, prompt:]."""
    m = model.model
    dtype = m.embed_tokens.weight.dtype
    h = m.embed_tokens(ids)  # [N, L, H]
    pos = torch.arange(ids.shape[1], device=ids.device)[None].expand_as(ids)
    cos, sin = m.rotary_emb(h, pos)
    r = h.float() if fp32_residual else h
    for layer in m.layers:
        a, _ = layer.self_attn(hidden_states=_norm(layer.input_layernorm, r, dtype), attention_mask=None,
                               position_embeddings=(cos, sin))
        r = r + a
        r = r + layer.mlp(_norm(layer.post_attention_layernorm, r, dtype))
    logits = model.lm_head(_norm(m.norm, r, dtype)).float()[:, prompt - 1 : -1]  # [N, L - prompt, V]
    return torch.log_softmax(logits, -1).gather(-1, ids[:, prompt:, None])[..., 0]


def _set_fp32_outputs(model, on: bool) -> None:
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if on:
            attn.o_proj, mlp.down_proj = _Fp32Out(attn.o_proj), _Fp32Out(mlp.down_proj)
        else:
            attn.o_proj, mlp.down_proj = attn.o_proj.lin, mlp.down_proj.lin


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    p.add_argument("--shape", default="0.5b")
    p.add_argument("--seqs", type=int, default=2)
    p.add_argument("--len", type=int, default=192, help="tokens per sequence, prompt included")
    p.add_argument("--prompt", type=int, default=64, help="leading tokens not scored")
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    model = build_hf(args.shape, args.len, dtype=getattr(torch, args.dtype), device=device)
    ids = torch.randint(0, VOCAB, (args.seqs, args.len), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        hf = model(ids).logits.float()[:, args.prompt - 1 : -1]
        hf = torch.log_softmax(hf, -1).gather(-1, ids[:, args.prompt:, None])[..., 0]
    runs = {"base": score(model, ids, args.prompt, False), "fp32_res": score(model, ids, args.prompt, True)}
    _set_fp32_outputs(model, True)
    runs["fp32_res_o"] = score(model, ids, args.prompt, True)
    _set_fp32_outputs(model, False)
    ref = score(model.float(), ids, args.prompt, True)
    row = {"bench": "residual_precision", "dtype": args.dtype, "shape": args.shape, "tokens": ref.numel(),
           "base_equals_hf_max_abs": (runs["base"] - hf).abs().max().item()}
    for name, lp in runs.items():
        d = (lp - ref).abs().flatten()
        row[name] = {"mean_vs_fp32": d.mean().item(), "p99_vs_fp32": d.quantile(0.99).item()}
    row.update(device=torch.cuda.get_device_name() if device == "cuda" else "cpu", torch=torch.__version__,
               commit=commit(), seconds=round(time.perf_counter() - t0, 1))
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
