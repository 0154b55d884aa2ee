"""The torch engine's auto-sized KV cache: room for max_running sequences, bounded by the memory it may take."""

from __future__ import annotations

import torch

from asyncrl.engine.torch import kv_cache
from asyncrl.engine.torch.kv_cache import KVCache
from asyncrl.engine.torch.model.config import ArchConfig

SMOLLM2 = ArchConfig(architecture="LlamaForCausalLM", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                     num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, qkv_bias=False,
                     o_bias=False, mlp_bias=False, qk_norm=False, tie_word_embeddings=True,
                     max_position_embeddings=8192, rope_theta=1e5, eos_token_ids=(2,))


def test_cpu_cache_takes_at_most_its_share_of_the_available_ram(monkeypatch):
    block = KVCache.bytes_per_block(SMOLLM2, 16, torch.float32)
    assert block == 2 * 30 * 16 * 3 * 64 * 4  # 46 KB a token in fp32
    monkeypatch.setattr(kv_cache, "available_ram", lambda: 20 * 2**30)
    capped = KVCache.default_num_blocks(SMOLLM2, 16, torch.float32, torch.device("cpu"), 64, 8192)
    assert capped == int(kv_cache.CPU_RAM_SHARE * 20 * 2**30) // block  # 2 GB, not the 6 GB 64 x 2048 tokens take
    monkeypatch.setattr(kv_cache, "available_ram", lambda: 2**40)  # plenty: the rows' own need is the size
    assert KVCache.default_num_blocks(SMOLLM2, 16, torch.float32, torch.device("cpu"), 64, 8192) == 64 * 2048 // 16
    monkeypatch.setattr(kv_cache, "available_ram", lambda: None)  # unknown: the rows' need, as before
    assert KVCache.default_num_blocks(SMOLLM2, 16, torch.float32, torch.device("cpu"), 4, 100) == 4 * 7


def test_available_ram_reads_this_machine():
    ram = kv_cache.available_ram()
    assert ram is None or ram > 0
