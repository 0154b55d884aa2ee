"""The decode step's unpack kernel (`kernels.staging.unpack_rows`) against its torch version: input ids taken from
the previous step's samples where a row has a source, the host's id where it has none, and each row's packed
block table spread into the wide tables, at several widths.

"cpu" runs the kernel in the Triton interpreter and needs TRITON_INTERPRET=1 in the environment of the whole
run (see tests/engine/test_decode_attention_split.py); "cuda" runs it compiled. Without Triton everything skips.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asyncrl.engine.torch.kernels.staging import unpack_rows, unpack_rows_torch

pytestmark = pytest.mark.filterwarnings(  # Triton < 3.7's interpreter under numpy 2.3
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning")

IDS, SRC = 0, 7


@pytest.fixture
def device(triton_device):
    return triton_device


def _inputs(size: int, max_batch: int, width: int, max_blocks: int, seed: int):
    gen = np.random.default_rng(seed)
    ints = torch.from_numpy(gen.integers(0, 1000, (8, max_batch)))
    ints[SRC] = torch.from_numpy(gen.integers(-1, max_batch, max_batch))  # -1: no source, the host's id stays
    sampled = torch.from_numpy(np.stack([gen.integers(0, 150_000, max_batch).astype(np.float64),
                                         -gen.random(max_batch)]))
    packed = torch.from_numpy(gen.integers(0, 5000, size * width))
    tables = torch.full((max_batch, max_blocks), -7, dtype=torch.int64)
    return ints, sampled, packed, tables


@pytest.mark.parametrize("width", [1, 5, 64, 65, 130])
def test_unpack_matches_torch(device, width):
    size, max_batch, max_blocks = 6, 8, 140
    ints, sampled, packed, tables = _inputs(size, max_batch, width, max_blocks, seed=width)
    want_ints, want_tables = ints.clone(), tables.clone()
    unpack_rows_torch(want_ints, sampled, packed, want_tables, size, IDS, SRC, width)
    got = [t.to(device) for t in (ints, sampled, packed, torch.tensor([width]), tables)]
    unpack_rows(got[0], got[1], got[2], got[3], got[4], size, IDS, SRC, width)
    assert torch.equal(got[0].cpu(), want_ints) and torch.equal(got[4].cpu(), want_tables)
    src = ints[SRC, :size]
    assert want_ints[IDS, :size][src >= 0].tolist() == sampled[0, src[src >= 0]].long().tolist()
    assert want_ints[IDS, :size][src < 0].tolist() == ints[IDS, :size][src < 0].tolist()
    assert (want_tables[size:] == -7).all() and (want_tables[:, width:] == -7).all()
