"""Static decode inputs and the CUDA graphs that replay one decode step per padded batch size.

    Sequence list ──stage()──▶ pinned host rows ──one H2D copy──▶ static device buffers
                                                                     │ (views [:size])
                    DecodeGraphs.replay(size) ── model ─ lm_head ─ fused sampler ──▶ [2, size] tokens/logprobs

A decode step of `n` sequences runs at the smallest bucket size >= n; rows n..size-1 are padding that
reads and writes only the cache's scratch block. Graphs hold the addresses of the parameters, the KV
cache and these buffers: weights loaded in place (`load_weights` copies into the parameters) keep the
graphs valid, and nothing here is reallocated after capture.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from asyncrl.engine.torch.sequence import Sequence

# ints rows: input id, position, cache slot, context length, seed, step, forced token (-1: sample)
_IDS, _POS, _SLOT, _CTX, _SEED, _STEP, _FORCED = range(7)


def bucket_sizes(max_batch: int) -> list[int]:
    sizes = [1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128] + list(range(160, max_batch + 1, 32))
    return sorted({s for s in sizes if s < max_batch} | {max_batch})


class DecodeBuffers:
    """Host staging and device copies of every per-row decode input."""

    def __init__(self, max_batch: int, max_blocks: int, scratch_block: int, block_size: int, device: torch.device):
        pin = device.type == "cuda"
        self.max_batch, self.block_size = max_batch, block_size
        self.pad = {_IDS: 0, _POS: 0, _SLOT: scratch_block * block_size, _CTX: 1, _SEED: 0, _STEP: 0, _FORCED: -1}
        self.h_ints = torch.zeros((len(self.pad), max_batch), dtype=torch.int64, pin_memory=pin)
        self.h_temps = torch.zeros(max_batch, dtype=torch.float32, pin_memory=pin)
        self.h_tables = torch.full((max_batch, max_blocks), scratch_block, dtype=torch.int64, pin_memory=pin)
        for row, value in self.pad.items():
            self.h_ints[row] = value
        self.ints, self.temps, self.tables = (t.to(device) for t in (self.h_ints, self.h_temps, self.h_tables))
        self.scratch_block, self.width = scratch_block, max_blocks
        self._written: list[tuple[list[int], int]] = []  # per host row: (the table list written there, its length)

    def stage(self, seqs: list[Sequence], size: int) -> None:
        """Write the rows of `seqs` (then padding up to `size`) and copy them to the device. Host time here
        is on the decode step's critical path (the GPU waits for it), so the per-row values are read in one
        pass and written as arrays, and a row's block table is rewritten only where it changed."""
        n, ints, bs = len(seqs), self.h_ints.numpy(), self.block_size
        width = self._write_tables(seqs)
        if n:
            rows = np.array([(s.last_token, s.num_tokens - 1, s.seed, s.num_outputs, s.forced_token) for s in seqs],
                            dtype=np.int64)  # [n, 5]
            pos = rows[:, 1]
            ints[_IDS, :n] = rows[:, 0]
            ints[_POS, :n] = pos
            ints[_SLOT, :n] = self.h_tables.numpy()[np.arange(n), pos // bs] * bs + pos % bs
            ints[_CTX, :n] = pos + 1
            ints[_SEED, :n], ints[_STEP, :n], ints[_FORCED, :n] = rows[:, 2], rows[:, 3], rows[:, 4]
        for row, value in self.pad.items():
            ints[row, n:size] = value
        self.h_temps.numpy()[:n] = [s.sampling.temperature for s in seqs]
        self.h_tables.numpy()[n:size, 0] = self.scratch_block
        del self._written[n:]  # rows past n now hold padding: write them in full when a sequence lands there
        self.ints[:, :size].copy_(self.h_ints[:, :size], non_blocking=True)
        self.temps[:size].copy_(self.h_temps[:size], non_blocking=True)
        self.tables[:size, :width].copy_(self.h_tables[:size, :width], non_blocking=True)
        self.width = width

    def _write_tables(self, seqs: list[Sequence]) -> int:
        """Block tables into the host rows; -> the widest. A row that holds the same table list as last step
        gets only its new blocks (tables grow by appending; a freed or reallocated sequence gets a new list)."""
        tables, written, width = self.h_tables.numpy(), self._written, 1
        for i, seq in enumerate(seqs):
            table, length = seq.block_table, len(seq.block_table)
            before = written[i] if i < len(written) else None
            if before is not None and before[0] is table:
                if before[1] != length:
                    tables[i, before[1]:length] = table[before[1]:]
            else:
                tables[i, :length] = table
            if i < len(written):
                written[i] = (table, length)
            else:
                written.append((table, length))
            width = max(width, length)
        return width

    def views(self, size: int, width: int | None = None) -> dict[str, torch.Tensor]:
        """Rows [:size]; block tables cut to `width` columns (the torch attention gathers every
        column; graphs keep the full width, which the Triton kernel never reads past the context)."""
        ints = self.ints[:, :size]
        return {
            "input_ids": ints[_IDS], "positions": ints[_POS], "slot_mapping": ints[_SLOT],
            "context_lens": ints[_CTX], "seeds": ints[_SEED], "steps": ints[_STEP], "forced": ints[_FORCED],
            "temperatures": self.temps[:size], "block_tables": self.tables[:size, :width],
        }


class DecodeGraphs:
    """One captured graph per bucket size; `step(size)` is the eager decode step being captured and
    must return (logits [size, vocab], sampled [2, size])."""

    def __init__(self, step: Callable[[int], tuple[torch.Tensor, torch.Tensor]], sizes: list[int]) -> None:
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]] = {}
        pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            for size in sorted(sizes, reverse=True):  # largest first: smaller graphs reuse its pool
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):  # warm-up (Triton compiles, cuBLAS picks kernels)
                    step(size)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    outputs = step(size)
                self.graphs[size] = (graph, outputs)
        torch.cuda.synchronize()

    def __contains__(self, size: int) -> bool:
        return size in self.graphs

    def replay(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        graph, outputs = self.graphs[size]
        graph.replay()
        return outputs

