"""python -m bench.make_model --shape 0.5b|1.5b|7b --out DIR [--device cuda]

A random-initialised Hugging Face folder of a benchmark shape (Qwen2 architecture), with the embedded
model's tokenizer beside it, so launch and the benches can run real model sizes with no model hub.

The weights are drawn tensor by tensor on `--device` (default: cuda when present) straight into bf16 and
written as safetensors shards of at most 4 GB (two shards written while the next is drawn), without building
a Hugging Face model: the 7b shape (7.6 B parameters, 15.2 GB) is a few GPU milliseconds of drawing, then the
copy to the host and the disk's write speed. Initialisation is Hugging Face's for Qwen2: every matrix (the
embedding and the head too) normal with std `initializer_range`, biases 0, norm gains 1. One JSON line:
the folder, parameters, bytes, seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

from asyncrl.task.embedded import embedded_model_path

SHARD_BYTES = 4 << 30


@dataclass(frozen=True, slots=True)
class Shape:
    """A Qwen2 decoder's sizes (the rest is Qwen2's: q/k/v biases, SwiGLU MLP, RMSNorm)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int = 151936
    tied: bool = True  # lm_head shares the embedding
    rope_theta: float = 10000.0
    max_positions: int = 4096


SHAPES = {
    "0.5b": Shape(896, 24, 14, 2, 4864),
    "1.5b": Shape(1536, 28, 12, 2, 8960),
    # Qwen2.5-7B's config.json: 7.62 B parameters (6.53 B in the seven projections), untied head
    "7b": Shape(3584, 28, 28, 4, 18944, vocab=152064, tied=False, rope_theta=1e6, max_positions=32768),
}


def model_config(shape: Shape) -> Qwen2Config:
    emb = Qwen2Config.from_pretrained(embedded_model_path())
    return Qwen2Config(hidden_size=shape.hidden, num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                       num_key_value_heads=shape.kv_heads, intermediate_size=shape.intermediate,
                       vocab_size=shape.vocab, tie_word_embeddings=shape.tied,
                       rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
                       max_position_embeddings=shape.max_positions, bos_token_id=emb.bos_token_id,
                       eos_token_id=emb.eos_token_id, pad_token_id=emb.pad_token_id, dtype="bfloat16")


def tensor_shapes(cfg: Qwen2Config) -> dict[str, torch.Size]:
    """HF name -> shape of every tensor the folder holds (a tied head is not saved), from a meta skeleton."""
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(cfg)
    return {name: p.shape for name, p in skeleton.named_parameters()}  # tied aliases appear once


def draw(name: str, shape: torch.Size, std: float, gen: torch.Generator) -> torch.Tensor:
    """One tensor, HF's Qwen2 init, in bf16 on the generator's device."""
    device = gen.device
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=torch.bfloat16, device=device)
    if name.endswith(".bias"):
        return torch.zeros(shape, dtype=torch.bfloat16, device=device)
    out = torch.empty(shape, dtype=torch.bfloat16, device=device)
    return out.normal_(0.0, std, generator=gen)


def shard_names(shapes: dict[str, torch.Size]) -> list[list[str]]:
    """Tensor names in order, cut into shards of at most SHARD_BYTES (bf16)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = 2 * shape.numel()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def write_weights(cfg: Qwen2Config, out: Path, device: torch.device, seed: int = 0) -> tuple[int, int]:
    """Draw and write every tensor; (parameters, bytes). Shards go to disk on two writer threads while the
    next is drawn (at most three shards, 12 GB, in host memory)."""
    shapes = tensor_shapes(cfg)
    shards = shard_names(shapes)
    gen = torch.Generator(device=device).manual_seed(seed)
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        jobs = []
        for names, file in zip(shards, files):
            host = {n: draw(n, shapes[n], cfg.initializer_range, gen).cpu() for n in names}
            weight_map.update(dict.fromkeys(names, file))
            jobs.append(pool.submit(save_file, host, str(out / file), metadata={"format": "pt"}))
            if len(jobs) > 2:
                jobs.pop(0).result()
        for job in jobs:
            job.result()
    total = sum(2 * s.numel() for s in shapes.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return sum(s.numel() for s in shapes.values()), total


def make_model(shape: str | Shape, out: Path, device: str | torch.device | None = None) -> Path:
    """The folder `out` (created) with config, generation config, weights and the embedded tokenizer."""
    spec = SHAPES[shape] if isinstance(shape, str) else shape
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cfg = model_config(spec)
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(out)
    GenerationConfig.from_model_config(cfg).save_pretrained(out)
    write_weights(cfg, out, device)
    src = Path(embedded_model_path())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, out / name)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default=None, help="where the weights are drawn (default: cuda when present)")
    args = p.parse_args()
    t0 = time.perf_counter()
    out = make_model(args.shape, Path(args.out), args.device)
    seconds = time.perf_counter() - t0
    size = json.loads((out / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
    print(json.dumps({"bench": "make_model", "shape": args.shape, "out": str(out), "params": size // 2,
                      "bytes": size, "seconds": round(seconds, 1)}))


if __name__ == "__main__":
    main()
