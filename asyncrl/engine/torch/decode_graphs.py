"""Static decode inputs and the CUDA graphs that replay one decode step per padded batch size.

    Sequence list ──stage()──▶ pinned StagedRows (two, used in turn) ──one H2D copy──▶ device StagedRows
    DecodeGraphs.replay(size): unpack (input ids of a step run ahead, from `sampled`; block tables)
                               ── model ─ lm_head ─ fused sampler ──▶ `sampled` [2, max_batch] tokens/logprobs

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
from asyncrl.engine.torch.kernels.staging import unpack_rows

# ints rows: input id, position, cache slot, context length, seed, step, forced token (-1: sample), and for a
# step run ahead (`stage(..., src)`) the row of the previous step's samples that holds each row's input id
_ROWS = 8
_IDS, _POS, _SLOT, _CTX, _SEED, _STEP, _FORCED, _SRC = range(_ROWS)


def bucket_sizes(max_batch: int) -> list[int]:
    sizes = [1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128] + list(range(160, max_batch + 1, 32))
    return sorted({s for s in sizes if s < max_batch} | {max_batch})


class StagedRows:
    """Every per-row input of a decode step in one flat int64 buffer, so that a step's inputs cross to the
    device in one copy: the int rows [8, max_batch] | the temperatures (fp32, two to an int64) | the tables'
    width | the block tables packed [size, width]. A pinned host one is the contiguous source of that copy (a
    strided or pageable source would go through a pageable temporary, and the driver may wait for the stream,
    i.e. for the step in flight, to copy it); the device one has the same layout."""

    def __init__(self, max_batch: int, max_blocks: int, device: torch.device, pin: bool = False) -> None:
        self.head = _ROWS * max_batch + (max_batch + 1) // 2 + 1  # int64 words before the packed tables
        self.flat = torch.zeros(self.head + max_batch * max_blocks, dtype=torch.int64, device=device, pin_memory=pin)
        self.ints = self.flat[: _ROWS * max_batch].view(_ROWS, max_batch)
        self.temps = self.flat[_ROWS * max_batch: self.head - 1].view(torch.float32)[:max_batch]
        self.width = self.flat[self.head - 1: self.head]
        self.tables = self.flat[self.head:]

    def used(self, size: int, width: int) -> torch.Tensor:
        """The prefix a step of `size` rows and `width` table columns fills."""
        return self.flat[: self.head + size * width]


class DecodeBuffers:
    """Host staging and device copies of every per-row decode input, and the device buffer of the samples.

    Host side: the block tables in plain memory (rewritten only where they changed), and two pinned
    `StagedRows` used in turn, because with the overlapped decode a step is staged while the previous step,
    and so its H2D copy, may still be queued on the GPU; the rows written now were last copied two steps ago,
    and the engine has waited for that step (at most one step is in flight unwaited). Device side: one
    `StagedRows`, the unpacked block tables and `sampled` (the graphs hold their addresses); each step's copy
    is queued behind the previous step's work, so it never overwrites inputs still being read.

    `sampled` [2, max_batch] float64 receives every decode step's tokens and logprobs (rows [:n]). A step run
    ahead of the host takes its input ids from it in `unpack`, its first operation, before its own sampler
    overwrites it; the previous step's D2H copy of it is queued before that step, so it reads finished values.
    """

    def __init__(self, max_batch: int, max_blocks: int, scratch_block: int, block_size: int, device: torch.device):
        pin = device.type == "cuda"
        self.max_batch, self.block_size = max_batch, block_size
        self.pad = {_IDS: 0, _POS: 0, _SLOT: scratch_block * block_size, _CTX: 1, _SEED: 0, _STEP: 0, _FORCED: -1,
                    _SRC: -1}
        self.h_tables = np.full((max_batch, max_blocks), scratch_block, dtype=np.int64)
        self.pinned = [StagedRows(max_batch, max_blocks, torch.device("cpu"), pin) for _ in range(2)]
        for rows in self.pinned:
            for row, value in self.pad.items():
                rows.ints[row] = value
            rows.width.fill_(1)
            rows.tables[:max_batch].fill_(scratch_block)
        self.turn = 1  # index of the pinned rows staged last
        self.staged = StagedRows(max_batch, max_blocks, device)
        self.staged.flat.copy_(self.pinned[0].flat)
        self.ints, self.temps = self.staged.ints, self.staged.temps
        self.tables = torch.from_numpy(self.h_tables).to(device, copy=True)  # [max_batch, max_blocks], unpacked
        self.sampled = torch.zeros((2, max_batch), dtype=torch.float64, device=device)
        self.scratch_block, self.width = scratch_block, 1
        self._written: list[tuple[list[int], int]] = []  # per host row: (the table list written there, its length)
        self.max_context = 0  # the longest context of the rows staged last

    def stage(self, seqs: list[Sequence], size: int, src: list[int] | None = None) -> None:
        """Write the rows of `seqs` (then padding up to `size`) and copy them to the device. Host time here
        is on the decode step's critical path (the GPU waits for it), so the per-row values are read in one
        pass and written as arrays, and a row's block table is rewritten only where it changed.

        src: rows that run one token ahead: src[i] >= 0 when sequence i has a token in flight (sampled by the
        previous step or by a prefill, not yet appended) in column src[i] of `sampled`; its position and
        sampling step are then one past the host's, and its input id is left for `unpack` to take from `sampled`
        on the device. src[i] = -1: the host's last token, as with src None."""
        self.turn ^= 1
        pinned = self.pinned[self.turn]
        n, ints, bs = len(seqs), pinned.ints.numpy(), self.block_size
        ahead = 0 if src is None else (np.asarray(src, dtype=np.int64) >= 0).astype(np.int64)  # [n] or 0
        width = self._write_tables(seqs)
        self.max_context = 0
        if n:
            rows = np.array([(s.last_token, s.num_tokens - 1, s.seed, s.num_outputs, s.forced_token) for s in seqs],
                            dtype=np.int64)  # [n, 5]
            pos = rows[:, 1] + ahead
            ints[_IDS, :n] = rows[:, 0]
            ints[_POS, :n] = pos
            ints[_SLOT, :n] = self.h_tables[np.arange(n), pos // bs] * bs + pos % bs
            ints[_CTX, :n] = pos + 1
            ints[_SEED, :n], ints[_STEP, :n], ints[_FORCED, :n] = rows[:, 2], rows[:, 3] + ahead, rows[:, 4]
            ints[_SRC, :n] = -1 if src is None else src
            self.max_context = int(pos.max()) + 1
        for row, value in self.pad.items():
            ints[row, n:size] = value
        pinned.temps.numpy()[:n] = [s.sampling.temperature for s in seqs]
        pinned.width[0] = width
        self.h_tables[n:size, 0] = self.scratch_block
        del self._written[n:]  # rows past n now hold padding: write them in full when a sequence lands there
        pinned.tables[: size * width].numpy().reshape(size, width)[:] = self.h_tables[:size, :width]
        self.staged.used(size, width).copy_(pinned.used(size, width), non_blocking=True)  # the step's one H2D copy
        self.width = width

    def unpack(self, size: int) -> None:
        """On the device, rows [:size]: the input ids of a step run ahead (from `sampled`) and the block tables
        (from their packed copy). The decode step's first operation, inside its graph."""
        unpack_rows(self.ints, self.sampled, self.staged.tables, self.staged.width, self.tables, size, _IDS, _SRC,
                    self.width)

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
    """One captured graph per (bucket size, single_pass); `step(size, single_pass=...)` is the eager decode step
    being captured and must return (logits [size, vocab], sampled [2, size]). single_pass: the variant whose
    decode attention never splits a context (`kernels.attention.SINGLE_PASS_MAX_CONTEXT`), captured only for the
    sizes the runner replays it at."""

    def __init__(self, step: Callable[..., tuple[torch.Tensor, torch.Tensor]], keys: list[tuple[int, bool]]) -> None:
        self.graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]] = {}
        pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            for key in sorted(keys, reverse=True):  # largest first: smaller graphs reuse its pool
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                size, single = key
                with torch.cuda.stream(side):  # warm-up (Triton compiles, cuBLAS picks kernels)
                    step(size, single_pass=single)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    outputs = step(size, single_pass=single)
                self.graphs[key] = (graph, outputs)
        torch.cuda.synchronize()

    def __contains__(self, size: int) -> bool:
        return (size, False) in self.graphs

    def replay(self, size: int, single_pass: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        graph, outputs = self.graphs[(size, single_pass)]
        graph.replay()
        return outputs
