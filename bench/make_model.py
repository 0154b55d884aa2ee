"""python -m bench.make_model --shape 0.5b --out DIR

A random-initialised Hugging Face folder of a benchmark shape (Qwen2 architecture), with the embedded
model's tokenizer beside it, so launch and the benches can run real model sizes with no model hub.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from asyncrl.task.embedded import embedded_model_path

SHAPES = {  # hidden, layers, heads, kv heads, intermediate
    "0.5b": (896, 24, 14, 2, 4864),
    "1.5b": (1536, 28, 12, 2, 8960),
}


def make_model(shape: str, out: Path) -> Path:
    hidden, layers, heads, kv, inter = SHAPES[shape]
    src = embedded_model_path()
    emb = Qwen2Config.from_pretrained(src)
    cfg = Qwen2Config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, intermediate_size=inter, vocab_size=151936, tie_word_embeddings=True,
                      max_position_embeddings=4096, bos_token_id=emb.bos_token_id, eos_token_id=emb.eos_token_id,
                      pad_token_id=emb.pad_token_id, torch_dtype="bfloat16")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(src) / name, out / name)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    print(make_model(args.shape, Path(args.out)))


if __name__ == "__main__":
    main()
