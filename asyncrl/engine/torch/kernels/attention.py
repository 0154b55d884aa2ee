"""Decode attention over the paged KV cache in Triton: one pass, or split over the context and combined
(`decode_attention` picks), each program a (sequence, kv head) with its GQA heads in one tile and an online
softmax over tiles of the row's context read through its block table (no gather, no padding). At decode the
kernels also rotate the step's own token and write its KV (`NewTokens`), so a decode layer launches no rotary kernel.

Each result reproduces the rounding of the Hugging Face eager code (bf16 of the same fp32 math), and a row's bits
depend on its own context alone, never on the batch (deterministic mode). Launch options and the shared rotary
arithmetic come from `kernels.ops`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.engine.torch.kernels.ops import HAS_TRITON, pdl

_BLOCK_N = 64  # decode attention: tokens per tile
# decode attention: tokens per partial of the split kernel (a multiple of _BLOCK_N). 256: on the H200 (fab375b, 0.5B
# shape, batch 256, contexts 192-512 in a CUDA graph) one pass 0.0177 ms, split by 128 0.0196 ms, by 256 0.0167 ms.
SPLIT_CHUNK = 256
# warps of a decode attention program, one-pass and split partials alike: the warp count changes how a tile's dot
# products are laid out, and with it the bits, and a row of one chunk must get the one-pass kernel's bits from the
# split kernel (deterministic mode). 2 (17.05 us a call) beat 4 (18.22 us) in an 81-variant sweep of chunk x tile x
# warps x stages (H200, 87a48f5, 0.5B shape, contexts 192-528; bench.decode_attention --sweep); at contexts
# 512-1536 the two are within 1 %.
DECODE_WARPS = 2
_SPLIT_PROGRAMS = 4096  # split decode attention: launch at most ~this many programs; more chunks loop
# The decode graphs of a batch with (rows x kv heads) >= the GPU's SM count come in two variants, and a step whose
# longest context is at most this many tokens replays the one-pass one (`decode_attention(single_pass=True)`). With
# that many programs one pass keeps the GPU busy and saves the partials and the combine launch: H200, 0.5B shape,
# batch 256, every row at the same context (a batch decoding in step), bench.decode_attention --uniform:
# context 384 one pass 15.0 us / split 18.2 us, 480: 21.7 / 22.6, 1024: 40.8 / 42.5. Spread contexts favour the split
# (192-576: 16.3 / 15.6), and a longest context above two chunks says the spread can be wide, hence the bound.
SINGLE_PASS_MAX_CONTEXT = 2 * SPLIT_CHUNK


if HAS_TRITON:
    import triton
    import triton.language as tl

    from asyncrl.engine.torch.kernels.ops import dependent_launch, rotate_heads

    @triton.jit
    def _attend_tiles(q, k_cache, v_cache, bt_row, kvh, start, end, ctx, m, l, acc, scale,
                      KV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                      IEEE: tl.constexpr):
        """Online softmax of q [BLOCK_H, D] over tokens [start, end) of one sequence, in tiles of
        BLOCK_N from `start`; folds them into the running (m [BLOCK_H], l [BLOCK_H], acc [BLOCK_H, D])."""
        offs_d = tl.arange(0, D)
        for tile in range(start, end, BLOCK_N):
            offs_n = tile + tl.arange(0, BLOCK_N)
            nmask = offs_n < ctx
            page = tl.load(bt_row + offs_n // PAGE, mask=nmask, other=0).to(tl.int64)
            base = (page * PAGE + offs_n % PAGE) * (KV * D) + kvh * D
            k = tl.load(k_cache + base[:, None] + offs_d[None, :], mask=nmask[:, None], other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.where(nmask[None, :], s * scale, float("-inf"))  # [BLOCK_H, BLOCK_N]
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l = l * alpha + tl.sum(p, axis=1)
            v = tl.load(v_cache + base[:, None] + offs_d[None, :], mask=nmask[:, None], other=0.0)
            if IEEE:
                pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m = m_new
        return m, l, acc

    @triton.jit
    def _query(q_ptr, b, kvh, stride_qn, stride_qh, new_k, new_v, stride_kn, stride_kh, stride_vn, stride_vh, pos_ptr,
               cos_ptr, sin_ptr, slot_ptr, k_cache, v_cache, store, KV: tl.constexpr, GROUP: tl.constexpr,
               D: tl.constexpr, BLOCK_H: tl.constexpr, ROTARY: tl.constexpr):
        """Row b's queries of kv head kvh -> [BLOCK_H, D] (rows past GROUP are 0). ROTARY: q is the projection's
        output, rotated here as `_rotary_store_kernel` does, and when `store` the row's new token's k (rotated) and
        v of this kv head go to its cache slot first, with a barrier, so the tiles that follow read them back."""
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, D)
        hmask = offs_h < GROUP
        heads = kvh * GROUP + offs_h
        if ROTARY:
            HALF: tl.constexpr = D // 2
            pos = tl.load(pos_ptr + b)
            cos = tl.load(cos_ptr + pos * D + offs_d).to(tl.float32)
            sin = tl.load(sin_ptr + pos * D + offs_d).to(tl.float32)
            sign = tl.where(offs_d < HALF, -1.0, 1.0)
            q = rotate_heads(q_ptr, b * stride_qn, stride_qh, heads, offs_d, hmask, cos, sin, sign, HALF, D)
            if store:
                one = tl.arange(0, 2)  # the kv head's row, padded to two (a block needs >= 2 rows here)
                kmask = one < 1
                k = rotate_heads(new_k, b * stride_kn, stride_kh, kvh + one, offs_d, kmask, cos, sin, sign, HALF, D)
                v = tl.load(new_v + b * stride_vn + (kvh + one)[:, None] * stride_vh + offs_d[None, :],
                            mask=kmask[:, None])
                dst = tl.load(slot_ptr + b) * KV * D + (kvh + one)[:, None] * D + offs_d[None, :]
                tl.store(k_cache + dst, k, mask=kmask[:, None])
                tl.store(v_cache + dst, v, mask=kmask[:, None])
                tl.debug_barrier()  # the program's threads load this slot in its last tile
        else:
            q = tl.load(q_ptr + b * stride_qn + heads[:, None] * stride_qh + offs_d[None, :], mask=hmask[:, None],
                        other=0.0)
        return q

    @triton.jit
    def _store_out(out_ptr, out, b, kvh, KV: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
                   BLOCK_H: tl.constexpr):
        offs_h = tl.arange(0, BLOCK_H)
        heads = kvh * GROUP + offs_h
        rows = out_ptr + b * (KV * GROUP * D) + heads[:, None] * D + tl.arange(0, D)[None, :]
        tl.store(rows, out.to(out_ptr.dtype.element_ty), mask=(offs_h < GROUP)[:, None])

    @triton.jit
    def _decode_attention_kernel(q_ptr, k_cache, v_cache, bt_ptr, ctx_ptr, out_ptr, stride_bt, scale,
                                 stride_qn, stride_qh, new_k, new_v, stride_kn, stride_kh, stride_vn, stride_vh,
                                 pos_ptr, cos_ptr, sin_ptr, slot_ptr,
                                 KV: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                                 BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
                                 ROTARY: tl.constexpr, PDL: tl.constexpr):
        """Grid (batch, kv_heads): one program walks its sequence's whole context."""
        dependent_launch(PDL)
        b = tl.program_id(0).to(tl.int64)
        kvh = tl.program_id(1)
        ctx = tl.load(ctx_ptr + b).to(tl.int32)
        q = _query(q_ptr, b, kvh, stride_qn, stride_qh, new_k, new_v, stride_kn, stride_kh, stride_vn, stride_vh,
                   pos_ptr, cos_ptr, sin_ptr, slot_ptr, k_cache, v_cache, True, KV, GROUP, D, BLOCK_H, ROTARY)
        m = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, D], tl.float32)
        m, l, acc = _attend_tiles(q, k_cache, v_cache, bt_ptr + b * stride_bt, kvh, 0, ctx, ctx, m, l, acc, scale,
                                  KV, D, PAGE, BLOCK_N, IEEE)
        _store_out(out_ptr, acc / l[:, None], b, kvh, KV, GROUP, D, BLOCK_H)

    @triton.jit
    def _decode_attention_split_kernel(q_ptr, k_cache, v_cache, bt_ptr, ctx_ptr, ml_ptr, acc_ptr, stride_bt, scale,
                                       num_splits, stride_qn, stride_qh, new_k, new_v, stride_kn, stride_kh,
                                       stride_vn, stride_vh, pos_ptr, cos_ptr, sin_ptr, slot_ptr,
                                       KV: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
                                       PAGE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                                       CHUNK: tl.constexpr, IEEE: tl.constexpr, ROTARY: tl.constexpr,
                                       PDL: tl.constexpr):
        """Grid (batch, kv_heads, programs): program p takes chunks p, p + programs, ... of its row's
        context (none when p >= the row's chunk count) and writes each chunk's partial on its own.
        ROTARY: the program that takes the row's last chunk stores the new token's KV."""
        dependent_launch(PDL)
        b = tl.program_id(0).to(tl.int64)
        kvh = tl.program_id(1)
        ctx = tl.load(ctx_ptr + b).to(tl.int32)
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, D)
        hmask = offs_h < GROUP
        owner = ((ctx - 1) // CHUNK) % tl.num_programs(2) == tl.program_id(2)
        q = _query(q_ptr, b, kvh, stride_qn, stride_qh, new_k, new_v, stride_kn, stride_kh, stride_vn, stride_vh,
                   pos_ptr, cos_ptr, sin_ptr, slot_ptr, k_cache, v_cache, owner, KV, GROUP, D, BLOCK_H, ROTARY)
        for c in range(tl.program_id(2), (ctx + CHUNK - 1) // CHUNK, tl.num_programs(2)):
            m = tl.full([BLOCK_H], float("-inf"), tl.float32)
            l = tl.zeros([BLOCK_H], tl.float32)
            acc = tl.zeros([BLOCK_H, D], tl.float32)
            start = c * CHUNK
            m, l, acc = _attend_tiles(q, k_cache, v_cache, bt_ptr + b * stride_bt, kvh, start,
                                      tl.minimum(start + CHUNK, ctx), ctx, m, l, acc, scale,
                                      KV, D, PAGE, BLOCK_N, IEEE)
            part = (b * KV + kvh) * num_splits + c
            tl.store(ml_ptr + part * 2 * GROUP + offs_h, m, mask=hmask)
            tl.store(ml_ptr + part * 2 * GROUP + GROUP + offs_h, l, mask=hmask)
            tl.store(acc_ptr + (part * GROUP + offs_h)[:, None] * D + offs_d[None, :], acc, mask=hmask[:, None])

    @triton.jit
    def _load_partial(ml_ptr, acc_ptr, part, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr):
        """Partial `part` (a flat (row, kv head, split) index) -> m [BLOCK_H], l [BLOCK_H], acc [BLOCK_H, D]."""
        offs_h = tl.arange(0, BLOCK_H)
        hmask = offs_h < GROUP
        m = tl.load(ml_ptr + part * 2 * GROUP + offs_h, mask=hmask, other=0.0)
        l = tl.load(ml_ptr + part * 2 * GROUP + GROUP + offs_h, mask=hmask, other=1.0)
        acc = tl.load(acc_ptr + (part * GROUP + offs_h)[:, None] * D + tl.arange(0, D)[None, :],
                      mask=hmask[:, None], other=0.0)
        return m, l, acc

    @triton.jit
    def _decode_attention_combine_kernel(ml_ptr, acc_ptr, ctx_ptr, out_ptr, num_splits, KV: tl.constexpr,
                                         GROUP: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr,
                                         CHUNK: tl.constexpr, PDL: tl.constexpr):
        """Grid (batch, kv_heads): folds the row's ceil(ctx / CHUNK) partials in chunk order."""
        dependent_launch(PDL)
        b = tl.program_id(0).to(tl.int64)
        kvh = tl.program_id(1)
        ctx = tl.load(ctx_ptr + b).to(tl.int32)
        first = (b * KV + kvh) * num_splits
        m, l, acc = _load_partial(ml_ptr, acc_ptr, first, GROUP, D, BLOCK_H)
        for c in range(1, (ctx + CHUNK - 1) // CHUNK):  # one chunk: acc / l as the one-pass kernel has them
            m_c, l_c, acc_c = _load_partial(ml_ptr, acc_ptr, first + c, GROUP, D, BLOCK_H)
            m_new = tl.maximum(m, m_c)
            alpha = tl.exp(m - m_new)
            beta = tl.exp(m_c - m_new)
            l = l * alpha + l_c * beta
            acc = acc * alpha[:, None] + acc_c * beta[:, None]
            m = m_new
        _store_out(out_ptr, acc / l[:, None], b, kvh, KV, GROUP, D, BLOCK_H)


@dataclass(frozen=True, slots=True)
class NewTokens:
    """The decode step's own token per row, not yet rotated nor cached: the attention kernels rotate q and k as
    `rotary_store` does and write k, v to `slot_mapping` themselves (one launch fewer per layer). k, v:
    [batch, kv_heads, d] (strided views of the qkv output may do); positions, slot_mapping [batch] int64;
    cos, sin [max_positions, d] tables."""

    k: torch.Tensor
    v: torch.Tensor
    positions: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    slot_mapping: torch.Tensor

    def args(self, q: torch.Tensor) -> tuple:
        """The kernels' (q strides, new k / v with their strides, positions, cos, sin, slots) arguments."""
        assert q.stride(2) == self.k.stride(2) == self.v.stride(2) == 1
        return (q.stride(0), q.stride(1), self.k, self.v, self.k.stride(0), self.k.stride(1), self.v.stride(0),
                self.v.stride(1), self.positions, self.cos, self.sin, self.slot_mapping)


def _query_args(q: torch.Tensor, new: NewTokens | None) -> tuple:
    if new is not None:
        return new.args(q)
    assert q.stride(2) == 1
    return (q.stride(0), q.stride(1), q, q, 0, 0, 0, 0, q, q, q, q)  # unread without ROTARY


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, single_pass: bool = False, new: NewTokens | None = None,
) -> torch.Tensor:
    """q: [batch, heads, d] (last dim contiguous); caches [num_blocks, page, kv_heads, d]; block_tables
    [batch, max_blocks]; context_lens [batch] (>= 1) -> [batch, heads, d].

    new: q and the rows' new tokens as projected (`NewTokens`): rotated and written to the cache inside the
    kernel, bitwise what `rotary_store` then this function compute. Without it, q is rotated and the caches
    already hold every row's context.

    Split over the context when the table is wider than one chunk (max_blocks * page > SPLIT_CHUNK),
    else one pass. The rule reads only the table's width, never the contexts or the batch size, so it
    is fixed for a captured graph; and a row that fits in one chunk gets the same result either way,
    so a row's result never depends on which path the rest of the batch chose.

    single_pass: one pass whatever the width (the caller's choice for a batch of short contexts,
    `SINGLE_PASS_MAX_CONTEXT`); a row longer than one chunk then rounds as the one-pass kernel does,
    which depends on the batch's choice, so deterministic mode never asks for it."""
    if not single_pass and block_tables.shape[1] * k_cache.shape[1] > SPLIT_CHUNK:
        return decode_attention_split(q, k_cache, v_cache, block_tables, context_lens, scale, new=new)
    return decode_attention_single(q, k_cache, v_cache, block_tables, context_lens, scale, new=new)


def decode_attention_single(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, new: NewTokens | None = None,
) -> torch.Tensor:
    """`decode_attention` in one pass: one program per (sequence, kv head) walks the whole context
    in tiles of _BLOCK_N tokens (online softmax, the GQA heads of a kv head in one tile)."""
    batch, heads, d = q.shape
    page, kv = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv
    out = torch.empty((batch, heads, d), dtype=q.dtype, device=q.device)
    _decode_attention_kernel[(batch, kv)](
        q, k_cache, v_cache, block_tables, context_lens, out, block_tables.stride(0), scale, *_query_args(q, new),
        KV=kv, GROUP=group, D=d, PAGE=page, BLOCK_H=_block_h(group), BLOCK_N=_BLOCK_N,
        IEEE=q.dtype == torch.float32, ROTARY=new is not None, num_warps=DECODE_WARPS, num_stages=2, **pdl(q),
    )
    return out


def decode_attention_split(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, chunk: int = SPLIT_CHUNK, *, block_n: int = _BLOCK_N,
    num_warps: int = DECODE_WARPS, num_stages: int = 2, new: NewTokens | None = None,
) -> torch.Tensor:
    """`decode_attention` split over the context (flash-decoding), in two launches. (block_n, num_warps,
    num_stages: the partials kernel's tile and launch; bench.decode_attention --sweep tries others.)

    1. Partials, grid (batch, kv_heads, programs): a row's context is cut into chunks of `chunk`
       tokens; each chunk's softmax over its own tokens (the one-pass kernel's tile loop, started
       at the chunk) goes to fp32 scratch: ml [batch, kv, splits, 2, group] (max m, then sum l)
       and the unnormalised acc [batch, kv, splits, group, d]. splits = ceil(max_blocks * page /
       chunk) comes from the table's width, not from the contexts, so a captured graph is right
       for any contexts it is replayed with; chunks at or past a row's context are not computed
       and their scratch is never read.
    2. Combine, grid (batch, kv_heads): folds the row's ceil(ctx / chunk) partials in chunk order
       and writes acc / l in q's dtype.

    The chunk has a fixed length rather than the row a fixed number of splits so that the chunk
    borders, and with them every rounding, follow from the row's own context alone: not from the
    batch size, the table width or the other rows (deterministic mode needs that). The programs
    per row are capped (about _SPLIT_PROGRAMS in all, so that a wide table of short contexts does
    not launch thousands of idle programs); a program then takes every programs-th chunk, which
    changes who computes a chunk, not what it computes. The scratch comes from torch.empty here:
    under capture, from the graphs' shared pool; 4 * (d + 2) bytes per (row, head, split)."""
    assert chunk % block_n == 0, f"chunk={chunk} must be a multiple of the tile ({block_n})"
    batch, heads, d = q.shape
    page, kv = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv
    splits = triton.cdiv(block_tables.shape[1] * page, chunk)
    programs = min(splits, max(1, _SPLIT_PROGRAMS // (batch * kv)))
    ml = torch.empty((batch, kv, splits, 2, group), dtype=torch.float32, device=q.device)
    acc = torch.empty((batch, kv, splits, group, d), dtype=torch.float32, device=q.device)
    out = torch.empty((batch, heads, d), dtype=q.dtype, device=q.device)
    _decode_attention_split_kernel[(batch, kv, programs)](
        q, k_cache, v_cache, block_tables, context_lens, ml, acc, block_tables.stride(0), scale, splits,
        *_query_args(q, new), KV=kv, GROUP=group, D=d, PAGE=page, BLOCK_H=_block_h(group), BLOCK_N=block_n,
        CHUNK=chunk, IEEE=q.dtype == torch.float32, ROTARY=new is not None, num_warps=num_warps,
        num_stages=num_stages, **pdl(q),
    )
    _decode_attention_combine_kernel[(batch, kv)](
        ml, acc, context_lens, out, splits, KV=kv, GROUP=group, D=d, BLOCK_H=_block_h(group), CHUNK=chunk,
        num_warps=4, **pdl(q),
    )
    return out


def _block_h(group: int) -> int:
    return max(16, triton.next_power_of_2(group))  # tl.dot needs >= 16 rows
