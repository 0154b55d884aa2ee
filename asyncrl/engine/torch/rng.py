"""Counter-based random numbers for sampling: noise is a pure function of (seed, step, token id).

Sample i of a request draws its k-th token from uniforms keyed by (seed + i, k), so its tokens do
not depend on the batch it ran in, on preemption, on the device, or on what else was in flight.
The generator is a 32-bit integer hash (Wellons' "lowbias32") evaluated with int64 tensor ops
that never overflow, so it is vectorised, identical on CPU and CUDA, and free of per-sequence
generator state (CUDA-graph friendly).
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32), without int64 overflow (split c into 16-bit halves)."""
    lo = x * (c & 0xFFFF)  # < 2**48
    hi = ((x * (c >> 16)) & 0xFFFF) << 16  # < 2**32
    return (lo + hi) & _M32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit hash of int64 values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def row_keys(seeds: torch.Tensor, steps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """seeds, steps: [batch] int64 (seeds in [0, 2**63)) -> two independent 32-bit keys per row."""
    lo, hi = seeds & _M32, (seeds >> 32) & _M32
    k1 = mix32(lo ^ mix32(hi ^ mix32((steps & _M32) ^ _GOLDEN)))
    k2 = mix32(k1 ^ _GOLDEN)
    return k1, k2


def uniform(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """-> [batch, vocab] float32 uniforms in [2**-24, 1 - 2**-24] (never 0 or 1)."""
    k1, k2 = row_keys(seeds, steps)
    cols = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)[None, :]  # [1, vocab]
    x = mix32(mix32(cols ^ k1[:, None]) ^ k2[:, None])  # [batch, vocab]
    return ((x >> 9).float() + 0.5) * (2.0**-23)


def row_uniform(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """-> [batch] float32: each row's one uniform for its step (column 0 of `uniform`), the draw that inverse-CDF
    sampling turns into a token."""
    return uniform(seeds, steps, 1)[:, 0]
