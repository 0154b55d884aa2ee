"""The prefix cache without a model: chained page keys, hits, LRU eviction of idle pages only, weight updates
forgetting every page, and a randomized run where every hit must serve exactly the tokens it claims."""

from __future__ import annotations

import random

import pytest

from asyncrl.engine.torch.block_manager import BlockManager
from asyncrl.engine.torch.prefix_cache import PrefixCache
from asyncrl.engine.torch.scheduler import Scheduler
from asyncrl.engine.torch.sequence import Sequence, SequenceGroup, SequenceStatus
from asyncrl.records import SamplingParams


def group(rid: str, prompt: list[int], n: int = 1) -> SequenceGroup:
    return SequenceGroup([Sequence(rid, i, prompt, SamplingParams(), i, 0.0) for i in range(n)])


def prefill(bm: BlockManager, g: SequenceGroup) -> None:
    """What a prefill does to the bookkeeping: blocks, the pages registered, the first token appended."""
    bm.allocate(g)
    bm.cache_prefilled([g])
    for seq in g.seqs:
        seq.output_token_ids.append(7)
        bm.append_slot(seq)


def release(bm: BlockManager, g: SequenceGroup) -> None:
    for seq in g.seqs:
        bm.free_seq(seq)


def test_keys_chain_pages_and_weights():
    cache = PrefixCache(block_size=4)
    tokens = list(range(12))
    keys = cache.keys(tokens, 3, [])
    assert len(set(keys)) == 3 and cache.keys(tokens, 3, keys[:1]) == keys  # known keys are reused
    other = cache.keys(tokens[:4] + [99] + tokens[5:], 3, [])
    assert other[0] == keys[0] and other[1] != keys[1] and other[2] != keys[2]  # a change keys out what follows
    assert cache.keys(tokens[4:8] * 2, 2, [])[1] != keys[1]  # same page tokens, another prefix: another key
    cache.new_weights()
    assert not set(cache.keys(tokens, 3, [])) & set(keys)  # new weights: every key new


def test_second_group_hits_full_pages_and_leaves_the_last_token_to_compute():
    bm = BlockManager(num_blocks=8, block_size=4, prefix_cache=True)
    a = group("a", list(range(10)))  # pages 0-3, 4-7 full; 8-9 partial
    prefill(bm, a)
    pages = a.seqs[0].block_table[:2]
    release(bm, a)
    assert bm.num_free == 8 and sorted(bm.cache.idle) == sorted(pages)  # cached, yet counted free
    b = group("b", list(range(10)), n=2)
    assert bm.hits(b) == pages and bm.blocks_needed(b) == 3 + 1  # idle hits still come out of num_free
    bm.allocate(b)
    assert b.num_cached == 8 and b.seqs[0].block_table[:2] == b.seqs[1].block_table[:2] == pages
    assert [bm.ref_counts[p] for p in pages] == [2, 2] and not bm.cache.idle
    exact = group("c", list(range(8)))  # two full pages: the second is recomputed (its last token's logits)
    assert bm.hits(exact) == pages[:1]


def test_eviction_takes_idle_pages_least_recent_first_and_never_a_page_in_use():
    bm = BlockManager(num_blocks=5, block_size=2, prefix_cache=True)
    old, new = group("old", [1, 2, 3, 4, 5]), group("new", [9, 8, 7, 6, 5])  # two full pages and a partial one
    for g in (old, new):
        prefill(bm, g)
        release(bm, g)
    old_head, old_tail = bm.cache.match(bm.cache.keys([1, 2, 3, 4], 2, []))
    assert list(bm.cache.idle)[:2] == [old_tail, old_head] and len(bm.free) == 1  # a chain's tail goes first
    hit = group("hit", [9, 8, 7, 6, 0, 0, 0])  # new's two pages, then two new blocks: the free one, then old's tail
    held = bm.hits(hit)
    bm.allocate(hit)
    assert hit.seqs[0].block_table[:2] == held and bm.cache.evictions == 1 and old_tail in hit.seqs[0].block_table
    assert bm.cache.match(bm.cache.keys([1, 2, 3, 4], 2, [])) == [old_head]  # what stays cached is a prefix
    bm._take()  # old's head, the last idle page
    assert bm.num_free == 0 and all(bm.ref_counts[b] == 1 for b in held) and bm.cache.evictions == 2


def test_weight_update_forgets_every_page_and_a_running_sequence_registers_none():
    bm = BlockManager(num_blocks=8, block_size=4, prefix_cache=True)
    done, running = group("done", list(range(9))), group("running", list(range(20, 29)))
    prefill(bm, done)
    prefill(bm, running)
    release(bm, done)
    bm.new_weights()
    assert not bm.cache.idle and not bm.cache.block_of and bm.num_free == 8 - 3
    assert bm.hits(group("again", list(range(9)))) == [] and bm.hits(group("r", list(range(20, 29)))) == []
    seq = running.seqs[0]
    seq.output_token_ids += [1, 2, 3, 4, 5]  # decoded on across the update: its KV mixes two weights
    bm.append_slot(seq)
    bm.free_seq(seq)
    assert not bm.cache.block_of and bm.num_free == 8


def test_blocks_whose_prefill_never_ran_are_not_registered():
    bm = BlockManager(num_blocks=4, block_size=4, prefix_cache=True)
    g = group("a", list(range(9)))
    bm.allocate(g)  # then the prefill fails, or the request is removed before it runs
    release(bm, g)
    assert not bm.cache.block_of and len(bm.free) == 4


def test_randomized_hits_serve_exactly_their_pages():
    """Groups from a few shared prefixes are admitted, decoded, preempted and finished at random under a small
    budget; every block records the tokens its KV would hold. A hit must find exactly the tokens asked for."""
    rnd = random.Random(0)
    page = 4
    bm = BlockManager(num_blocks=24, block_size=page, prefix_cache=True)
    sched = Scheduler(bm, max_running=6, max_prefill_tokens=64)
    written: dict[int, tuple] = {}  # block -> (tokens before its page, its page's tokens)
    stems = [[rnd.randrange(50) for _ in range(10)] for _ in range(3)]
    hits = 0
    for step in range(400):
        if rnd.random() < 0.3:
            stem = rnd.choice(stems)
            tail = [rnd.randrange(50) for _ in range(rnd.randrange(8))]
            sched.add(group(f"g{step}", stem + tail, n=rnd.choice([1, 2])))
        for g in sched.schedule_prefill():
            tokens, table = g.prefill_token_ids(), g.seqs[0].block_table
            for i, block in enumerate(table[: g.num_cached // page]):  # served by the cache
                assert written[block] == (tuple(tokens[: i * page]), tuple(tokens[i * page : (i + 1) * page]))
            for i, block in enumerate(table[g.num_cached // page :], start=g.num_cached // page):
                written[block] = (tuple(tokens[: i * page]), tuple(tokens[i * page : (i + 1) * page]))
            for src, dst in g.cow_pairs:
                written[dst] = written[src]
            hits += g.num_cached
            bm.cache_prefilled([g])
            for seq in [] if g.is_resume else g.seqs:  # a fresh group samples its first token at prefill
                seq.output_token_ids.append(rnd.randrange(50))
        for seq in sched.schedule_decode():  # writes the KV of its last token, then samples one more
            pos = seq.num_tokens - 1
            block = seq.block_table[pos // page]
            if pos % page == 0:
                written[block] = (tuple(seq.token_ids()[:pos]), ())
            written[block] = (written[block][0], written[block][1] + (seq.token_ids()[pos],))
            seq.output_token_ids.append(rnd.randrange(50))
            if rnd.random() < 0.1:
                seq.status = SequenceStatus.FINISHED
                sched.finish(seq)
        in_use = {b for b in range(bm.num_blocks) if bm.ref_counts[b]}
        assert not in_use & set(bm.free) and not in_use & set(bm.cache.idle) and not set(bm.free) & set(bm.cache.idle)
        assert len(in_use) + len(bm.free) + len(bm.cache.idle) == bm.num_blocks
    assert hits > 0 and bm.cache.evictions > 0 and sched.num_preemptions > 0


def test_prefix_cache_off_keeps_nothing():
    bm = BlockManager(num_blocks=4, block_size=4)
    g = group("a", list(range(9)))
    prefill(bm, g)
    release(bm, g)
    assert bm.cache is None and bm.hits(group("b", list(range(9)))) == [] and len(bm.free) == 4


@pytest.mark.parametrize("n", [1, 3])
def test_blocks_needed_counts_hits_in_use_as_free(n):
    bm = BlockManager(num_blocks=10, block_size=4, prefix_cache=True)
    a = group("a", list(range(9)))
    prefill(bm, a)  # a runs: its two full pages are in use
    b = group("b", list(range(9)), n=n)
    assert bm.hits(b) == a.seqs[0].block_table[:2]
    assert bm.blocks_needed(b) == 3 - 2 + (n - 1)  # only the partial page (and its copies) is new
