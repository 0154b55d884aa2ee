"""Paged KV bookkeeping: fixed-size blocks, a free list (LIFO, so the touched working set stays
small) and reference counts.

The n samples of a prompt share its full prompt blocks (ref count n). The partly filled last
prompt block cannot be shared (each sample writes its own tokens after the prompt), so samples
1..n-1 get a fresh block that is filled by copying sample 0's after the prefill (copy-on-write at
fork time; no block is ever written while shared). Blocks return to the free list at ref count 0.

With a prefix cache (`prefix_cache.PrefixCache`), a group starts from the cached blocks of its first full
pages (a hit: ref count + 1, no prefill for them), full pages are registered after their prefill and when
their sequence lets go, and a registered block at ref count 0 stays cached (idle) instead of free; idle
blocks count as free (`num_free`) and are evicted, least recently used first, when the free list is empty.
"""

from __future__ import annotations

from asyncrl.engine.torch.prefix_cache import PrefixCache
from asyncrl.engine.torch.sequence import Sequence, SequenceGroup


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_cache: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"kv cache: num_blocks={num_blocks}, block_size={block_size}: both must be >= 1")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.ref_counts = [0] * num_blocks
        self.free = list(range(num_blocks - 1, -1, -1))  # a stack: recently freed blocks are reused first
        self.cache = PrefixCache(block_size) if prefix_cache else None
        self.hit_tokens = 0  # prefill tokens whose KV came from the prefix cache

    @property
    def num_free(self) -> int:
        """Blocks a new page can take: the free ones and the idle cached ones (evicted for it)."""
        return len(self.free) + (len(self.cache.idle) if self.cache else 0)

    def new_weights(self) -> None:
        """A weight update: no cached page may serve KV of the old weights."""
        if self.cache is not None:
            self.free += self.cache.new_weights()

    # ---------------------------------------------------------------- blocks

    def _take(self) -> int:
        block = self.free.pop() if self.free else self.cache.evict()
        assert self.ref_counts[block] == 0
        self.ref_counts[block] = 1
        return block

    def _acquire(self, block: int) -> None:
        """One more user of a cached block (a hit)."""
        if self.ref_counts[block] == 0:
            self.cache.acquire(block)
        self.ref_counts[block] += 1

    def _release(self, block: int) -> None:
        assert self.ref_counts[block] > 0, f"block {block} released twice"
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0 and not (self.cache is not None and self.cache.park(block)):
            self.free.append(block)

    # ---------------------------------------------------------------- groups (prefill)

    def blocks_needed(self, group: SequenceGroup) -> int:
        """Blocks a group takes from `num_free` at admission: its prefill tokens' blocks, minus the cached ones
        it hits that are in use already, plus one copied partial block for each sample after the first."""
        num_tokens = len(group.prefill_token_ids())
        partial = num_tokens % self.block_size != 0
        in_use = sum(self.ref_counts[b] > 0 for b in self.hits(group))
        return blocks_for(num_tokens, self.block_size) - in_use + (len(group.seqs) - 1) * partial

    def can_allocate(self, group: SequenceGroup) -> bool:
        return self.blocks_needed(group) <= self.num_free

    def hits(self, group: SequenceGroup) -> list[int]:
        """The cached blocks of the group's first full pages (none without a prefix cache). At least the last
        prefill token is left to compute: its logits give the first sample."""
        if self.cache is None:
            return []
        computable = (len(group.prefill_token_ids()) - 1) // self.block_size
        return self.cache.match(self._group_keys(group)[:computable])

    def allocate(self, group: SequenceGroup) -> None:
        """Give every sequence of the group its block table (cached blocks first); record the copy-on-write
        pairs and how many tokens the prefill skips (`num_cached`)."""
        num_tokens = len(group.prefill_token_ids())
        first, hits = group.seqs[0], self.hits(group)
        for block in hits:  # before any _take: a hit is never evicted for the group's own new blocks
            self._acquire(block)
        first.block_table = hits + [self._take() for _ in range(blocks_for(num_tokens, self.block_size) - len(hits))]
        group.num_cached = len(hits) * self.block_size
        self.hit_tokens += group.num_cached
        if self.cache is not None:
            for seq in group.seqs:  # no KV of theirs is computed until the prefill has run (`cache_prefilled`)
                seq.kv_weights, seq.page_keys = None, self._group_keys(group)
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
        """Release a sequence's blocks (its KV holds every token but the last), registering its full pages."""
        if seq.block_table:
            self._register(seq, seq.num_tokens - 1)
        for block in reversed(seq.block_table):  # the tail first: the first evicted
            self._release(block)
        seq.block_table = []

    # ---------------------------------------------------------------- prefix cache

    def cache_prefilled(self, groups: list[SequenceGroup]) -> None:
        """After a prefill (queued): the groups' KV is the current weights', and the full pages it computed are
        registered, for requests that come while these still run."""
        if self.cache is None:
            return
        for group in groups:
            for seq in group.seqs:
                seq.kv_weights = self.cache.weights
            self._register(group.seqs[0], len(group.prefill_token_ids()))

    def _register(self, seq: Sequence, num_kv: int) -> None:
        """Register the full pages of the sequence's first `num_kv` tokens (their KV is complete), when the
        current weights computed all of it."""
        cache = self.cache
        if cache is None or seq.kv_weights != cache.weights:
            return
        pages = num_kv // self.block_size
        seq.page_keys = cache.keys(seq.token_ids(), pages, seq.page_keys)
        for block, key in zip(seq.block_table[:pages], seq.page_keys, strict=True):
            cache.register(block, key)

    def _group_keys(self, group: SequenceGroup) -> list[bytes]:
        """Keys of the full pages of the group's prefill tokens, under the current weights (computed once)."""
        weights = self.cache.weights
        if group.page_keys is None or group.page_keys[0] != weights:
            seq, tokens = group.seqs[0], group.prefill_token_ids()
            known = seq.page_keys if seq.kv_weights == weights else []  # a preempted sequence's own pages
            group.page_keys = (weights, self.cache.keys(tokens, len(tokens) // self.block_size, known))
        return group.page_keys[1]

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size
