"""How much of the engine-vs-learner logprob gap the residual stream's rounding makes (CPU or GPU).

Scores the same tokens of a random model (bench.generation's shapes) with Hugging Face's forward three ways in
the compute dtype, each against the fp32 forward on the same weights:

    base        Hugging Face's own roundings (residual stream in the compute dtype)
    fp32_res    the residual stream kept fp32 (`asyncrl.learner.residual_stream`, the learner's model.residual_fp32)
    fp32_res_o  also o_proj and down_proj with fp32 outputs (no rounding before the add; not an option of the
                project, measured to see what it would add)

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

from asyncrl.learner import residual_stream
from bench.generation import VOCAB, build_hf
from bench.provenance import commit


class _Fp32Out(torch.nn.Module):
    """x @ W^T with fp32 accumulation and an fp32 result (what `torch.mm(..., out_dtype=float32)` gives)."""

    def __init__(self, lin: torch.nn.Linear) -> None:
        super().__init__()
        self.lin = lin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.lin.weight.float())


@torch.no_grad()
def score(model, ids: torch.Tensor, prompt: int) -> torch.Tensor:
    """ids [N, L] -> [N, L - prompt] fp32 logprobs of ids[:, prompt:] under one Hugging Face forward."""
    logits = model(ids).logits.float()[:, prompt - 1 : -1]  # [N, L - prompt, V]
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
    runs = {"base": score(model, ids, args.prompt)}
    residual_stream.install(model)
    runs["fp32_res"] = score(model, ids, args.prompt)
    _set_fp32_outputs(model, True)
    runs["fp32_res_o"] = score(model, ids, args.prompt)
    _set_fp32_outputs(model, False)
    ref = score(model.float(), ids, args.prompt)  # the installed fp32 stream changes nothing in fp32
    row = {"bench": "residual_precision", "dtype": args.dtype, "shape": args.shape, "tokens": ref.numel()}
    for name, lp in runs.items():
        d = (lp - ref).abs().flatten()
        row[name] = {"mean_vs_fp32": d.mean().item(), "p99_vs_fp32": d.quantile(0.99).item()}
    row.update(device=torch.cuda.get_device_name() if device == "cuda" else "cpu", torch=torch.__version__,
               commit=commit(), seconds=round(time.perf_counter() - t0, 1))
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
