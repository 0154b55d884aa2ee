"""Paged-KV bookkeeping and scheduling without a model: sharing, copy-on-write, preemption."""

from __future__ import annotations

import pytest

from asyncrl.engine.torch.block_manager import BlockManager
from asyncrl.engine.torch.scheduler import Scheduler
from asyncrl.engine.torch.sequence import Sequence, SequenceGroup
from asyncrl.records import SamplingParams


def group(rid: str, prompt_len: int, n: int) -> SequenceGroup:
    prompt = list(range(prompt_len))
    return SequenceGroup([Sequence(rid, i, prompt, SamplingParams(), i, 0.0) for i in range(n)])


def test_n_samples_share_full_blocks_and_copy_the_partial_one():
    bm = BlockManager(num_blocks=10, block_size=4)
    g = group("a", prompt_len=10, n=3)  # 2 full blocks + 1 partial
    assert bm.blocks_needed(g) == 3 + 2
    bm.allocate(g)
    first, second, third = (s.block_table for s in g.seqs)
    assert second[:2] == third[:2] == first[:2] and len({first[2], second[2], third[2]}) == 3
    assert [bm.ref_counts[b] for b in first] == [3, 3, 1]
    assert g.cow_pairs == [(first[2], second[2]), (first[2], third[2])]
    assert bm.num_free == 5
    for seq in g.seqs:
        bm.free_seq(seq)
    assert bm.num_free == 10 and not any(bm.ref_counts)


def test_block_aligned_prompt_needs_no_copy():
    bm = BlockManager(num_blocks=4, block_size=4)
    g = group("a", prompt_len=8, n=2)
    bm.allocate(g)
    assert g.cow_pairs == [] and g.seqs[0].block_table == g.seqs[1].block_table and bm.num_free == 2
    seq = g.seqs[1]
    seq.output_token_ids.append(3)  # 9 tokens: decode writes position 8, in a new block
    assert bm.needs_block(seq)
    bm.append_slot(seq)
    assert len(seq.block_table) == 3 and bm.slot(seq, 8) == seq.block_table[2] * 4


def test_scheduler_respects_max_running_and_blocks():
    bm = BlockManager(num_blocks=6, block_size=4)
    sched = Scheduler(bm, max_running=3, max_prefill_tokens=100)
    for g in (group("a", 5, 2), group("b", 3, 1), group("c", 3, 1)):
        sched.add(g)
    admitted = sched.schedule_prefill()
    assert [g.request_id for g in admitted] == ["a", "b"]  # c would exceed max_running
    assert sched.num_waiting() == 1 and len(sched.running) == 3


def test_decode_preempts_newest_when_out_of_blocks():
    bm = BlockManager(num_blocks=3, block_size=2)
    sched = Scheduler(bm, max_running=4, max_prefill_tokens=100)
    sched.add(group("a", 2, 1))
    sched.add(group("b", 2, 1))
    sched.schedule_prefill()
    for seq in sched.running:
        seq.output_token_ids.append(7)  # both now need a third slot -> a new block each, 1 free
    decoded = sched.schedule_decode()
    assert [s.request_id for s in decoded] == ["a"] and sched.num_preemptions == 1
    resumed = sched.waiting[0]
    assert resumed.is_resume and resumed.prefill_token_ids() == [0, 1]  # recompute all but the last token


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(num_blocks=0, block_size=16)
