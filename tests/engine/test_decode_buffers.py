"""DecodeBuffers.stage writes a row's block table only where it changed since the last step: after tables grow,
rows change hands and a sequence gets a new table, every staged row still equals a full write."""

import torch

from asyncrl.engine.torch.decode_graphs import DecodeBuffers
from asyncrl.engine.torch.sequence import Sequence
from asyncrl.records import SamplingParams


def seq(i: int, table: list[int], outputs: int) -> Sequence:
    s = Sequence("r", i, [1, 2, 3], SamplingParams(max_new_tokens=64), i, 0.0)
    for t in range(outputs):
        s.append(t + 5, -1.0, 0, 0.0)
    s.block_table = table
    return s


def check(buf: DecodeBuffers, seqs: list[Sequence]) -> None:
    """What the device buffers hold for each row, once unpacked, equals a full write of it."""
    buf.unpack(len(seqs))
    v = buf.views(len(seqs), buf.width)
    for i, s in enumerate(seqs):
        assert v["block_tables"][i, : len(s.block_table)].tolist() == s.block_table, i
        p = s.num_tokens - 1
        assert v["positions"][i] == p and v["context_lens"][i] == p + 1 and v["input_ids"][i] == s.last_token
        assert v["slot_mapping"][i] == s.block_table[p // 4] * 4 + p % 4
        assert v["forced"][i] == -1 and v["steps"][i] == s.num_outputs


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


def test_pinned_rows_alternate_and_tables_stay_full_writes():
    """Two pinned staging buffers in turn (a step is staged while the previous one's copy may be pending);
    tables grow, rows change hands, and every step's device rows still equal a full write."""
    buf = DecodeBuffers(4, 8, scratch_block=0, block_size=4, device=torch.device("cpu"))
    a, b = seq(0, [10], 0), seq(1, [20, 21], 3)
    turns = []
    for step in range(9):
        rows = [a, b] if step % 4 else [b, a]
        buf.stage(rows, 4)
        turns.append(buf.turn)
        check(buf, rows)
        for s in (a, b):
            s.append(9, -1.0, 0, 0.0)
            if s.num_tokens > 4 * len(s.block_table):
                s.block_table.append(30 + step)
    assert turns == [0, 1] * 4 + [0]


def test_stage_ahead_takes_input_ids_from_the_previous_samples():
    """A step run one token ahead: position, slot, context and sampling step are one past the host's, and the
    input ids come from the previous step's samples (`sampled`, [2, max_batch] float64) at the staged source rows,
    when the step unpacks its inputs; a row staged from the host keeps the host's id."""
    buf = DecodeBuffers(4, 8, scratch_block=0, block_size=4, device=torch.device("cpu"))
    a, b = seq(0, [10, 11], 3), seq(1, [20, 21], 4)  # 6 and 7 tokens: a's next slot is in block 11, b's too
    prev = torch.tensor([[50.0, 61.0, 72.0, 0.0], [-0.5, -1.5, -2.5, 0.0]], dtype=torch.float64)
    buf.sampled.copy_(prev)
    buf.stage([b, a], 2, src=[2, 0])
    buf.unpack(2)
    v = buf.views(2)
    assert v["input_ids"].tolist() == [72, 50]
    assert v["positions"].tolist() == [7, 6] and v["context_lens"].tolist() == [8, 7]
    assert v["slot_mapping"].tolist() == [21 * 4 + 3, 11 * 4 + 2]
    assert v["steps"].tolist() == [5, 4] and v["forced"].tolist() == [-1, -1]
    buf.stage([a], 1)  # a step from the host's tokens again
    buf.unpack(1)
    assert buf.views(1)["input_ids"].tolist() == [a.last_token] and buf.views(1)["positions"].tolist() == [5]


def test_one_copy_carries_every_input():
    """The staged rows, temperatures, width and packed tables reach the device buffer in one copy of a prefix of
    one flat buffer, and padding rows read the scratch block."""
    buf = DecodeBuffers(4, 8, scratch_block=3, block_size=4, device=torch.device("cpu"))
    a = seq(0, [10, 11, 12], 6)
    a.sampling = SamplingParams(max_new_tokens=64, temperature=0.7)
    buf.stage([a], 2)
    staged = buf.staged
    assert staged.width.item() == 3 and buf.width == 3
    assert staged.tables[:4].tolist() == [10, 11, 12, 3]  # [2, 3] packed: row 1 is padding
    assert abs(buf.temps[0].item() - 0.7) < 1e-7
    buf.unpack(2)
    assert buf.tables[0, :3].tolist() == [10, 11, 12] and buf.tables[1, 0].item() == 3
    assert buf.views(2)["slot_mapping"][1].item() == 3 * 4  # padding writes the scratch block
