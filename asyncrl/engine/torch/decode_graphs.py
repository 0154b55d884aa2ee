"""Static decode inputs and the CUDA graphs that replay one decode step per padded batch size.

    Sequence list ──stage()──▶ pinned rows (two, used in turn) ──H2D copies──▶ static device buffers
                                                                                │ (views [:size])
    previous step's samples ──gather_input_ids (a step run ahead of the host)──▶│ input ids
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

# ints rows: input id, position, cache slot, context length, seed, step, forced token (-1: sample), and for a
# step run ahead (`stage(..., src)`) the row of the previous step's samples that holds each row's input id
_IDS, _POS, _SLOT, _CTX, _SEED, _STEP, _FORCED, _SRC = range(8)


def bucket_sizes(max_batch: int) -> list[int]:
    sizes = [1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128] + list(range(160, max_batch + 1, 32))
    return sorted({s for s in sizes if s < max_batch} | {max_batch})


class PinnedRows:
    """One pinned copy of a step's inputs, each the contiguous source of one H2D copy: the int rows, the
    temperatures, and the block tables packed [size, width] (a strided or pageable source would go through a
    pageable temporary, and the driver may wait for the stream, i.e. for the step in flight, to copy it)."""

    def __init__(self, max_batch: int, max_blocks: int, pad: dict[int, int], pin: bool):
        self.ints = torch.zeros((len(pad), max_batch), dtype=torch.int64, pin_memory=pin)
        self.temps = torch.zeros(max_batch, dtype=torch.float32, pin_memory=pin)
        self.tables = torch.zeros(max_batch * max_blocks, dtype=torch.int64, pin_memory=pin)
        for row, value in pad.items():
            self.ints[row] = value


class DecodeBuffers:
    """Host staging and device copies of every per-row decode input.

    Host side: the block tables in plain memory (rewritten only where they changed), and two `PinnedRows`
    used in turn, because with the overlapped decode a step is staged while the previous step, and so its H2D
    copy, may still be queued on the GPU; the pinned rows written now were last copied two steps ago, and the
    engine has waited for that step (at most one step is in flight unwaited). Device side: one set of buffers
    (the graphs hold their addresses); each step's copies are queued behind the previous step's work, so
    they never overwrite inputs still being read.
    """

    def __init__(self, max_batch: int, max_blocks: int, scratch_block: int, block_size: int, device: torch.device):
        pin = device.type == "cuda"
        self.max_batch, self.block_size = max_batch, block_size
        self.pad = {_IDS: 0, _POS: 0, _SLOT: scratch_block * block_size, _CTX: 1, _SEED: 0, _STEP: 0, _FORCED: -1,
                    _SRC: 0}
        self.h_tables = np.full((max_batch, max_blocks), scratch_block, dtype=np.int64)
        self.pinned = [PinnedRows(max_batch, max_blocks, self.pad, pin) for _ in range(2)]
        self.turn = 1  # index of the pinned rows staged last
        first = self.pinned[0]
        self.ints, self.temps = first.ints.to(device, copy=True), first.temps.to(device, copy=True)
        self.tables = torch.from_numpy(self.h_tables).to(device, copy=True)  # [max_batch, max_blocks]
        self.packed_tables = first.tables.to(device, copy=True)  # [max_batch * max_blocks]: lands here, then scattered
        self.scratch_block, self.width = scratch_block, max_blocks
        self._written: list[tuple[list[int], int]] = []  # per host row: (the table list written there, its length)

    def stage(self, seqs: list[Sequence], size: int, src: list[int] | None = None) -> None:
        """Write the rows of `seqs` (then padding up to `size`) and copy them to the device. Host time here
        is on the decode step's critical path (the GPU waits for it), so the per-row values are read in one
        pass and written as arrays, and a row's block table is rewritten only where it changed.

        src: the step runs one token ahead: each sequence has a token in flight (sampled by the previous step,
        not yet appended), in row src[i] of that step's samples. Its position and sampling step are then one
        past the host's, and its input id is left for `gather_input_ids` to fill on the device."""
        self.turn ^= 1
        pinned = self.pinned[self.turn]
        n, ints, bs, ahead = len(seqs), pinned.ints.numpy(), self.block_size, int(src is not None)
        width = self._write_tables(seqs)
        if n:
            rows = np.array([(s.last_token, s.num_tokens - 1, s.seed, s.num_outputs, s.forced_token) for s in seqs],
                            dtype=np.int64)  # [n, 5]
            pos = rows[:, 1] + ahead
            ints[_IDS, :n] = rows[:, 0]
            ints[_POS, :n] = pos
            ints[_SLOT, :n] = self.h_tables[np.arange(n), pos // bs] * bs + pos % bs
            ints[_CTX, :n] = pos + 1
            ints[_SEED, :n], ints[_STEP, :n], ints[_FORCED, :n] = rows[:, 2], rows[:, 3] + ahead, rows[:, 4]
            ints[_SRC, :n] = 0 if src is None else src
        for row, value in self.pad.items():
            ints[row, n:size] = value
        pinned.temps.numpy()[:n] = [s.sampling.temperature for s in seqs]
        self.h_tables[n:size, 0] = self.scratch_block
        del self._written[n:]  # rows past n now hold padding: write them in full when a sequence lands there
        packed = pinned.tables[: size * width]
        packed.numpy().reshape(size, width)[:] = self.h_tables[:size, :width]
        self.ints.copy_(pinned.ints, non_blocking=True)  # whole buffers: contiguous (rows past size are unread)
        self.temps.copy_(pinned.temps, non_blocking=True)
        self.packed_tables[: size * width].copy_(packed, non_blocking=True)
        self.tables[:size, :width].copy_(self.packed_tables[: size * width].view(size, width))  # on the device
        self.width = width

    def _write_tables(self, seqs: list[Sequence]) -> int:
        """Block tables into the host rows; -> the widest. A row that holds the same table list as last step
        gets only its new blocks (tables grow by appending; a freed or reallocated sequence gets a new list)."""
        tables, written, width = self.h_tables, self._written, 1
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

    def gather_input_ids(self, prev_tokens: torch.Tensor, n: int) -> None:
        """Input id of rows [:n] = prev_tokens[src] (the staged source rows), on the device: queued after the
        staging copy and before the step. prev_tokens: [prev_size] float64, row 0 of the previous step's
        samples (token ids are exact in float64)."""
        self.ints[_IDS, :n].copy_(prev_tokens.index_select(0, self.ints[_SRC, :n]))

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

