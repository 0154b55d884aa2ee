"""Prefix cache: full KV pages kept after the sequences that computed them let go, found again by the token ids
they hold and the weights that computed them (`BlockManager` asks it; nothing else does).

    key of page i = blake2b(key of page i-1 | weights | token ids of page i)      (page -1: b"")
    a hit         = the longest run of pages 0, 1, ... of a prompt found: the KV of exactly those tokens after
                    exactly that prefix, computed by exactly these weights
    a page's life:  in use (ref count > 0, registered or not) ──last release──▶ idle (registered, LRU order)
                    idle ──hit──▶ in use again;    idle ──a new page finds no free block──▶ evicted

* Only full pages are kept: the last, partly filled page of a sequence is still being written. A page is
  registered after the prefill that computed it and when its sequence releases it (finish, preemption, abort),
  and only when every token of the sequence up to it was computed by the current weights (`Sequence.kv_weights`).
* Weights: `weights` counts this engine's weight updates (not the version number, which a caller may repeat).
  An update keys out every page (the key includes it) and forgets them all: idle pages go back to the free
  list, pages in use are unregistered and freed as usual. A sequence running across the update (pause
  'continue') keeps its KV, the one documented way a running sequence keeps older KV, and never registers a
  page again; a preempted one recomputes its KV under the new weights and may.
* Never evicted: a page in use. Only idle pages are evictable, and a hit takes its pages before any new one.
* A sequence releases its pages last first, so eviction (least recently released first) takes a chain's tail
  before its head, and what stays cached is always a prefix.
* Keys are 128-bit: two different prefixes share a key with probability ~2^-128 per pair.

Used from the engine's thread only.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np


class PrefixCache:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.weights = 0  # which weights computed the KV that may be registered: +1 at every weight update
        self.block_of: dict[bytes, int] = {}  # page key -> block holding that page's KV
        self.key_of: dict[int, bytes] = {}  # registered block -> its key
        self.idle: OrderedDict[int, None] = OrderedDict()  # registered blocks nobody uses, least recent first
        self.evictions = 0

    def keys(self, tokens: list[int], num_pages: int, known: list[bytes]) -> list[bytes]:
        """Keys of the first `num_pages` full pages of `tokens` under the current weights; `known`: keys of a prefix
        of them, computed before (reused, not recomputed). A new list."""
        done = min(len(known), num_pages)
        keys, page = known[:done], self.block_size
        ids = np.asarray(tokens[done * page : num_pages * page], dtype=np.int32)
        weights = self.weights.to_bytes(8, "little")
        prev = keys[-1] if keys else b""
        for i in range(num_pages - done):
            prev = hashlib.blake2b(prev + weights + ids[i * page : (i + 1) * page].tobytes(), digest_size=16).digest()
            keys.append(prev)
        return keys

    def match(self, keys: list[bytes]) -> list[int]:
        """The blocks of the longest run of `keys` cached, from the first."""
        blocks = []
        for key in keys:
            block = self.block_of.get(key)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def register(self, block: int, key: bytes) -> None:
        """Keep `block` (in use, its KV complete) as the page of `key`; a no-op when that page is cached already (a
        second copy stays unregistered) or the block is registered."""
        if key not in self.block_of and block not in self.key_of:
            self.block_of[key] = block
            self.key_of[block] = key

    def park(self, block: int) -> bool:
        """The block's last user let go -> True: it stays cached (idle, most recently used); False: it is free."""
        if block not in self.key_of:
            return False
        self.idle[block] = None
        return True

    def acquire(self, block: int) -> None:
        """A hit on an idle block: it is in use again, not evictable."""
        del self.idle[block]

    def evict(self) -> int:
        """Forget the least recently used idle block -> that block, for a new page."""
        block, _ = self.idle.popitem(last=False)
        del self.block_of[self.key_of.pop(block)]
        self.evictions += 1
        return block

    def new_weights(self) -> list[int]:
        """A weight update: forget every page -> the blocks that were idle, free now."""
        freed = list(self.idle)
        self.idle.clear()
        self.block_of.clear()
        self.key_of.clear()
        self.weights += 1
        return freed
