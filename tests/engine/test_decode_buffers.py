"""DecodeBuffers.stage writes a row's block table only where it changed since the last step: after tables grow,
rows change hands and a sequence gets a new table, every staged row still equals a full write."""

import torch

from asyncrl.engine.torch.decode_graphs import _CTX, _FORCED, _IDS, _POS, _SLOT, DecodeBuffers
from asyncrl.engine.torch.sequence import Sequence
from asyncrl.records import SamplingParams


def seq(i: int, table: list[int], outputs: int) -> Sequence:
    s = Sequence("r", i, [1, 2, 3], SamplingParams(max_new_tokens=64), i, 0.0)
    for t in range(outputs):
        s.append(t + 5, -1.0, 0, 0.0)
    s.block_table = table
    return s


def check(buf: DecodeBuffers, seqs: list[Sequence]) -> None:
    for i, s in enumerate(seqs):
        assert buf.h_tables[i, : len(s.block_table)].tolist() == s.block_table, i
        p = s.num_tokens - 1
        assert buf.h_ints[_POS, i] == p and buf.h_ints[_CTX, i] == p + 1 and buf.h_ints[_IDS, i] == s.last_token
        assert buf.h_ints[_SLOT, i] == s.block_table[p // 4] * 4 + p % 4
        assert buf.h_ints[_FORCED, i] == -1


def test_incremental_tables_equal_full_writes():
    buf = DecodeBuffers(4, 8, scratch_block=0, block_size=4, device=torch.device("cpu"))
    a, b, c = seq(0, [10, 11], 4), seq(1, [20, 21], 3), seq(2, [30], 0)
    buf.stage([a, b, c], 4)
    check(buf, [a, b, c])
    for _ in range(2):  # a and b decode into new blocks (tables grow in place)
        a.append(9, -1.0, 0, 0.0), b.append(9, -1.0, 0, 0.0)
    a.block_table.append(12)
    b.block_table.append(22)
    buf.stage([a, b, c], 4)
    check(buf, [a, b, c])
    b.block_table = [40, 41, 42]  # b was preempted and re-prefilled: a new list of the same length
    buf.stage([c, b], 2)  # a finished: rows change hands
    check(buf, [c, b])
    assert buf.width == 3
