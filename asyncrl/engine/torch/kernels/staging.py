"""The first kernel of a decode step: unpack the step's staged inputs on the device.

A decode step's per-row inputs cross from the host in one H2D copy of one flat buffer (`DecodeBuffers`):
the int rows, the temperatures, the block tables packed [size, width] for this step's width, and the
width. Inside the captured graph this kernel then, per row,

* takes the input id of a row that runs one token ahead of the host (`src >= 0`) from the previous step's
  samples, still on the device (row 0 of `sampled`, token ids exact in float64), and
* spreads the row's packed table into the [max_batch, max_blocks] tables the attention reads.

Before this kernel the same work was two H2D copies more, a strided device copy and a gather outside the
graph: six stream operations between two replays, each with its own launch gap (~45 us a step, H200).

`unpack_rows_torch` is the portable version (CPU, eager) and the tests' reference.
"""

from __future__ import annotations

import torch

from asyncrl.engine.torch.kernels.ops import HAS_TRITON, runs_on

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _unpack_rows_kernel(ints_ptr, stride_i, sampled_ptr, packed_ptr, width_ptr, tables_ptr, stride_t,
                            IDS: tl.constexpr, SRC: tl.constexpr, BLOCK: tl.constexpr):
        """Program r: row r's input id (from `sampled` when its source row is >= 0) and its block table."""
        r = tl.program_id(0).to(tl.int64)
        src = tl.load(ints_ptr + SRC * stride_i + r)
        if src >= 0:
            token = tl.load(sampled_ptr + src)  # float64 row 0 of the previous step's samples
            tl.store(ints_ptr + IDS * stride_i + r, token.to(tl.int64))
        width = tl.load(width_ptr)
        for c in range(0, width, BLOCK):
            offs = c + tl.arange(0, BLOCK)
            live = offs < width
            block = tl.load(packed_ptr + r * width + offs, mask=live)
            tl.store(tables_ptr + r * stride_t + offs, block, mask=live)


def unpack_rows(ints: torch.Tensor, sampled: torch.Tensor, packed: torch.Tensor, width: torch.Tensor,
                tables: torch.Tensor, size: int, ids_row: int, src_row: int, host_width: int) -> None:
    """Rows [:size]. ints: [rows, max_batch] int64 (row `ids_row` the input ids, updated in place, row `src_row`
    each row's source in `sampled`, -1 for none); sampled: [2, max_batch] float64; packed: the tables
    [size * width] int64; width: [1] int64 on the device; tables: [max_batch, max_blocks] int64, written.
    host_width: the same width on the host (the torch path's shapes; the kernel reads the device one, so a
    captured graph follows each step's width)."""
    if runs_on(ints):
        _unpack_rows_kernel[(size,)](ints, ints.stride(0), sampled, packed, width, tables, tables.stride(0),
                                     IDS=ids_row, SRC=src_row, BLOCK=64, num_warps=1)
        return
    unpack_rows_torch(ints, sampled, packed, tables, size, ids_row, src_row, host_width)


def unpack_rows_torch(ints: torch.Tensor, sampled: torch.Tensor, packed: torch.Tensor, tables: torch.Tensor,
                      size: int, ids_row: int, src_row: int, width: int) -> None:
    """`unpack_rows` in torch ops, with the width given on the host."""
    src = ints[src_row, :size]
    ahead = src >= 0
    ids = ints[ids_row, :size]
    ids.copy_(torch.where(ahead, sampled[0].index_select(0, src.clamp(min=0)).long(), ids))
    tables[:size, :width].copy_(packed[: size * width].view(size, width))
