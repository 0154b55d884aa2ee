"""FP8 scale granularity: how far each projection's output moves when its weight and input are e4m3, with one
scale per output channel and per token (what `generator.weights_dtype = "fp8"` does, model/fp8.py) against one
scale per block of `--block` input columns for both (finer: an outlier costs only its own block).

A trained model runs its prompts once; hooks keep every projection's input. For each projection kind (qkv, o_proj,
gate_up, down_proj), over all layers, the relative error of y = x W^T against the exact product of the bf16
operands (summed in fp32), as ||y_q - y|| / ||y||, for: bf16 rounding of y alone (the floor any bf16 engine has),
per-channel x per-token fp8, and per-block fp8. Exact arithmetic on the CPU (the fp8 values' products summed in
fp32, as the tensor cores sum them); no engine and no kernel, only the numbers a kernel would have to reproduce.

    python -m bench.fp8_scales --model models/SmolLM2-135M-Instruct.Q4_1.gguf --blocks 64,128
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict

import torch

from asyncrl.engine.torch.model.fp8 import E4M3, E4M3_MAX, SCALE_FLOOR
from bench.provenance import commit

INPUTS = {"q_proj": "qkv", "o_proj": "o_proj", "gate_proj": "gate_up", "down_proj": "down_proj"}  # one input each
WEIGHTS = {"qkv": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
           "down_proj": ("down_proj",)}


def quantize(t: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """t [rows, k] -> (t8 [rows, k] e4m3 as fp32, scale [rows, k]) with one scale per row and block of `block`
    columns (block >= k: one per row); t ~ t8 * scale, scale = the block's max |t| / 448."""
    rows, k = t.shape
    width = min(block, k)
    pad = (-k) % width
    tf = torch.nn.functional.pad(t.float(), (0, pad)).view(rows, -1, width)  # [rows, blocks, width]
    scale = tf.abs().amax(dim=-1, keepdim=True).clamp(min=SCALE_FLOOR) / E4M3_MAX  # [rows, blocks, 1]
    t8 = (tf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).float()
    full = scale.expand_as(tf)
    return t8.reshape(rows, -1)[:, :k], full.reshape(rows, -1)[:, :k]


def fp8_product(x: torch.Tensor, w: torch.Tensor, block: int) -> torch.Tensor:
    """y [n, out] from x [n, k] and w [out, k] both quantized with `block` (0: per row over the whole k)."""
    k = x.shape[1]
    b = block or k
    x8, sx = quantize(x, b)
    w8, sw = quantize(w, b)
    y = torch.zeros(x.shape[0], w.shape[0])
    for start in range(0, k, b):  # per block: the product of fp8 values, then both blocks' scales
        cols = slice(start, start + b)
        y += (x8[:, cols] @ w8[:, cols].T) * sx[:, start : start + 1] * sw[:, start : start + 1].T
    return y


def captured_inputs(model: torch.nn.Module, ids: list[list[int]]) -> dict[str, list[torch.Tensor]]:
    """{"layers.i.<kind>": [x [tokens, k] per prompt]} from one forward per prompt."""
    seen: dict[str, list[torch.Tensor]] = defaultdict(list)
    hooks = []
    for i, layer in enumerate(model.model.layers):
        for name, kind in INPUTS.items():
            module = getattr(layer.self_attn, name, None) or getattr(layer.mlp, name)
            hooks.append(module.register_forward_hook(
                lambda _m, args, _out, key=f"{i}.{kind}": seen[key].append(args[0][0].detach())))
    with torch.no_grad():
        for row in ids:
            model(torch.tensor([row]))
    for h in hooks:
        h.remove()
    return seen


def errors(model: torch.nn.Module, seen: dict[str, list[torch.Tensor]], blocks: list[int]) -> dict[str, dict]:
    """Per kind: relative error of bf16 rounding, per-channel fp8, and each block size, over all layers."""
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for key, xs in seen.items():
        i, kind = key.split(".", 1)
        layer = model.model.layers[int(i)]
        parent = layer.self_attn if kind in ("qkv", "o_proj") else layer.mlp
        w = torch.cat([getattr(parent, n).weight.detach() for n in WEIGHTS[kind]])  # [out, k]
        x = torch.cat(xs)  # [tokens, k]
        y = x.float() @ w.float().T  # [tokens, out]
        norm = y.square().sum().item()
        sums[kind]["ref"] += norm
        sums[kind]["bf16"] += (y.bfloat16().float() - y).square().sum().item()
        sums[kind]["per_channel"] += (fp8_product(x, w, 0) - y).square().sum().item()
        for b in blocks:
            sums[kind][f"block_{b}"] += (fp8_product(x, w, b) - y).square().sum().item()
    return {kind: {k: round((v / s["ref"]) ** 0.5, 5) for k, v in s.items() if k != "ref"} for kind, s in sums.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fp8_scales", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a model folder or .gguf (model.path)")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--blocks", default="64,128", help="comma list of block widths (input columns per scale)")
    args = p.parse_args(argv)
    blocks = [int(b) for b in args.blocks.split(",")]
    if any(b < 1 for b in blocks):
        p.error(f"--blocks {args.blocks}: widths must be >= 1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncrl.models.config import ModelConfig, resolve_model_path
    from asyncrl.task.arithmetic import make_problem

    path = resolve_model_path(ModelConfig(path=args.model))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    tok = AutoTokenizer.from_pretrained(path)
    rng = random.Random(5)
    texts = [tok.apply_chat_template([{"role": "user", "content": make_problem(rng, 2, "+-*").text}],
                                     tokenize=False, add_generation_prompt=True) for _ in range(args.prompts)]
    ids = [tok(t)["input_ids"] for t in texts]
    seen = captured_inputs(model, ids)
    print(json.dumps({"bench": "fp8_scales", "model": args.model, "prompts": args.prompts,
                      "tokens": sum(len(r) for r in ids), "blocks": blocks,
                      "relative_error": errors(model, seen, blocks), "commit": commit()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
