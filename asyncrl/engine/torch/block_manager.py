"""Paged KV bookkeeping: fixed-size blocks, a free list (LIFO, so the touched working set stays
small) and reference counts.

The n samples of a prompt share its full prompt blocks (ref count n). The partly filled last
prompt block cannot be shared (each sample writes its own tokens after the prompt), so samples
1..n-1 get a fresh block that is filled by copying sample 0's after the prefill (copy-on-write at
fork time; no block is ever written while shared). Blocks return to the free list at ref count 0.
"""

from __future__ import annotations

from asyncrl.engine.torch.sequence import Sequence, SequenceGroup


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"kv cache: num_blocks={num_blocks}, block_size={block_size}: both must be >= 1")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.ref_counts = [0] * num_blocks
        self.free = list(range(num_blocks - 1, -1, -1))  # a stack: recently freed blocks are reused first

    @property
    def num_free(self) -> int:
        return len(self.free)

    # ---------------------------------------------------------------- blocks

    def _take(self) -> int:
        block = self.free.pop()
        assert self.ref_counts[block] == 0
        self.ref_counts[block] = 1
        return block

    def _release(self, block: int) -> None:
        assert self.ref_counts[block] > 0, f"block {block} released twice"
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free.append(block)

    # ---------------------------------------------------------------- groups (prefill)

    def blocks_needed(self, group: SequenceGroup) -> int:
        """Blocks a group takes at admission: its prefill tokens, plus one copied partial block for
        each sample after the first."""
        num_tokens = len(group.prefill_token_ids())
        partial = num_tokens % self.block_size != 0
        return blocks_for(num_tokens, self.block_size) + (len(group.seqs) - 1) * partial

    def can_allocate(self, group: SequenceGroup) -> bool:
        return self.blocks_needed(group) <= self.num_free

    def allocate(self, group: SequenceGroup) -> None:
        """Give every sequence of the group its block table; record the copy-on-write pairs."""
        num_tokens = len(group.prefill_token_ids())
        first = group.seqs[0]
        first.block_table = [self._take() for _ in range(blocks_for(num_tokens, self.block_size))]
        num_full = num_tokens // self.block_size
        shared = first.block_table[:num_full]
        group.cow_pairs = []
        for seq in group.seqs[1:]:
            for block in shared:
                self.ref_counts[block] += 1
            seq.block_table = list(shared)
            if num_full < len(first.block_table):
                copy = self._take()
                group.cow_pairs.append((first.block_table[-1], copy))
                seq.block_table.append(copy)

    # ---------------------------------------------------------------- sequences (decode)

    def needs_block(self, seq: Sequence, ahead: int = 0) -> bool:
        """Decode writes the KV of token `num_tokens - 1 + ahead` (ahead = 1: the sequence has a token in
        flight, not yet appended, and the step runs one past it); does its block exist yet?"""
        return len(seq.block_table) * self.block_size < seq.num_tokens + ahead

    def append_slot(self, seq: Sequence, ahead: int = 0) -> None:
        if self.needs_block(seq, ahead):
            seq.block_table.append(self._take())

    def free_seq(self, seq: Sequence) -> None:
        for block in seq.block_table:
            self._release(block)
        seq.block_table = []

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size
