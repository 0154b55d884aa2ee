"""A tiny Llama-architecture GGUF written with the `gguf` package: F32, F16, Q8_0 and Q4_1 tensors, a
byte-level BPE tokenizer ("gpt2", as SmolLM2's) with a ChatML chat template, no output.weight (tied)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import quantize

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, CONTEXT = 64, 128, 2, 4, 2, 128
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Byte-level spellings: printable ASCII is itself, space is "Ġ", newline "Ċ".
CHARS = [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ"]
MERGES = ["Ġ t", "h e", "Ġt he"]
TOKENS = SPECIAL + CHARS + [m.replace(" ", "") for m in MERGES]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
BOS, EOS = 1, 2


def write_tiny_gguf(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "llama")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(TOKENS))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(TOKENS)
    w.add_token_types([TokenType.CONTROL] * len(SPECIAL) + [TokenType.NORMAL] * (len(TOKENS) - len(SPECIAL)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    def normal(*shape: int) -> np.ndarray:  # numpy shape is torch's [out, in]
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    kv = KV_HEADS * HIDDEN // HEADS
    w.add_tensor("token_embd.weight", normal(len(TOKENS), HIDDEN))
    w.add_tensor("output_norm.weight", 1 + normal(HIDDEN) * 0.1)
    for i in range(LAYERS):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", 1 + normal(HIDDEN) * 0.1)
        w.add_tensor(b + "ffn_norm.weight", 1 + normal(HIDDEN) * 0.1)
        w.add_tensor(b + "attn_q.weight", normal(HIDDEN, HIDDEN).astype(np.float16))
        w.add_tensor(b + "attn_k.weight", normal(kv, HIDDEN).astype(np.float16))
        w.add_tensor(b + "attn_v.weight", normal(kv, HIDDEN))
        _quantized(w, b + "attn_output.weight", normal(HIDDEN, HIDDEN), GGMLQuantizationType.Q8_0)
        _quantized(w, b + "ffn_gate.weight", normal(FFN, HIDDEN), GGMLQuantizationType.Q4_1)
        w.add_tensor(b + "ffn_up.weight", normal(FFN, HIDDEN))
        _quantized(w, b + "ffn_down.weight", normal(HIDDEN, FFN), GGMLQuantizationType.Q4_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _quantized(w: GGUFWriter, name: str, data: np.ndarray, qtype: GGMLQuantizationType) -> None:
    w.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)
