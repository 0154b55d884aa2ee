"""The paged KV cache: per-layer K and V block tensors.

Layout: k[layer]: [num_blocks, block_size, num_kv_heads, head_dim] (same for v). Token t of a
sequence lives in block `block_table[t // block_size]` at offset `t % block_size`; the flat slot
`block_id * block_size + offset` indexes `k[layer].view(-1, num_kv_heads, head_dim)`.
The tensors are zero-initialised: decode masks unused slots, and masked zeros never produce NaN.
One extra block past `num_blocks` (`scratch_block`) is never handed out: padded decode rows write
and read only there.
"""

from __future__ import annotations

import torch

from asyncrl.engine.torch.model.config import ArchConfig

CPU_RAM_SHARE = 0.1  # the auto-sized KV cache on CPU takes at most this share of the available RAM


def available_ram() -> int | None:
    """Bytes of RAM available to new allocations (Linux: MemAvailable), None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class KVCache:
    def __init__(
        self, cfg: ArchConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        shape = (cfg.num_layers, num_blocks + 1, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [layers, blocks, block_size, kv_heads, head_dim]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.scratch_block = num_blocks

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[index], self.v[index]

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy block src -> dst in every layer (copy-on-write of a shared, partly filled block)."""
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.k.device)
        dst = torch.tensor([d for _, d in pairs], device=self.k.device)
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]

    @staticmethod
    def default_num_blocks(cfg: ArchConfig, block_size: int, dtype: torch.dtype, device: torch.device,
                           max_running: int, max_model_len: int) -> int:
        """Room for `max_running` sequences of min(max_model_len, 2048 CPU / 4096 CUDA) tokens, on CUDA at most
        90 % of the free memory, on CPU at most CPU_RAM_SHARE of the available RAM (the learner, other services
        and other runs live there too: 64 rows of SmolLM2-135M's 2048 tokens in fp32 would be 6 GB)."""
        per_seq = min(max_model_len, 4096 if device.type == "cuda" else 2048)
        wanted = max_running * -(-per_seq // block_size)
        per_block = KVCache.bytes_per_block(cfg, block_size, dtype)
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            wanted = min(wanted, int(0.9 * free) // per_block)
        elif (available := available_ram()) is not None:
            wanted = min(wanted, int(CPU_RAM_SHARE * available) // per_block)
        return max(wanted, 1)

    @staticmethod
    def bytes_per_block(cfg: ArchConfig, block_size: int, dtype: torch.dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * itemsize
