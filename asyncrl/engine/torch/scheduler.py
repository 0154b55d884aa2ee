"""Continuous batching: which groups to prefill and which sequences to decode in a step.

    add() ──▶ waiting (FIFO of SequenceGroup) ──schedule_prefill──▶ running (Sequence) ──▶ finished
                  ▲                                                     │
                  └──────────── preempted (recomputed later) ◀──────────┘ schedule_decode, out of blocks

* Prefill admits groups in arrival order while the running count (max_running), the free KV blocks
  and the prefill token budget allow; the n samples of a group are admitted together and share one
  prefill. A group that does not fit blocks the queue (no overtaking, so no starvation). Tokens a
  prefix-cache hit supplies are not prefilled and do not count against the budget.
* Decode runs every running sequence. When the next token of some sequence needs a block and none
  is free, the most recently admitted sequences are preempted: their blocks are freed and they go
  back to the front of the queue to be recomputed (their sampled tokens are kept).
* Decode ahead (`schedule_ahead`, the engine's overlapped decode): the rows of a step launched while the
  previous step's tokens are still on the device. It never preempts: when the blocks do not suffice it
  allocates nothing, and the engine waits for the previous step and takes `schedule_decode`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from asyncrl.engine.torch.block_manager import BlockManager
from asyncrl.engine.torch.sequence import Sequence, SequenceGroup, SequenceStatus


class Scheduler:
    def __init__(self, blocks: BlockManager, max_running: int, max_prefill_tokens: int) -> None:
        self.blocks, self.max_running, self.max_prefill_tokens = blocks, max_running, max_prefill_tokens
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, group: SequenceGroup) -> None:
        self.waiting.append(group)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def num_waiting(self) -> int:
        return sum(len(g.seqs) for g in self.waiting)

    # ---------------------------------------------------------------- phases

    def schedule_prefill(self) -> list[SequenceGroup]:
        admitted: list[SequenceGroup] = []
        budget = self.max_prefill_tokens
        while self.waiting:
            group = self.waiting[0]
            num_tokens = len(group.prefill_token_ids()) - self.blocks.block_size * len(self.blocks.hits(group))
            if len(self.running) + len(group.seqs) > self.max_running or not self.blocks.can_allocate(group):
                break
            if admitted and num_tokens > budget:
                break
            self.waiting.popleft()
            self.blocks.allocate(group)
            for seq in group.seqs:
                seq.status = SequenceStatus.RUNNING
            self.running.extend(group.seqs)
            admitted.append(group)
            budget -= num_tokens
        return admitted

    def schedule_decode(self) -> list[Sequence]:
        """Running sequences whose next KV slot is now allocated (preempting the newest if needed)."""
        needing = self._needing_blocks()
        while needing and len(needing) > self.blocks.num_free:
            self._preempt(self.running.pop())
            needing = self._needing_blocks()
        for seq in needing:
            self.blocks.append_slot(seq)
        return list(self.running)

    def schedule_ahead(self, seqs: list[Sequence]) -> bool:
        """Allocate the KV slots of a decode step one token ahead: each of `seqs` has a token in flight (not
        yet appended), so the step writes position `num_tokens`. -> False, allocating nothing, when the free
        blocks do not cover them."""
        return self.schedule_rows(seqs, [1] * len(seqs))

    def schedule_rows(self, seqs: list[Sequence], ahead: list[int]) -> bool:
        """`schedule_ahead` with each sequence's own lookahead (1: a token in flight, 0: none) -> False,
        allocating nothing, when the free blocks do not cover them."""
        needs = self.blocks.needs_block
        # a few rows a step: most have room in their last block
        needing = [(s, a) for s, a in zip(seqs, ahead, strict=True) if needs(s, a)]
        if len(needing) > self.blocks.num_free:
            return False
        for seq, a in needing:
            self.blocks.append_slot(seq, ahead=a)
        return True

    def _needing_blocks(self) -> list[Sequence]:
        needs = self.blocks.needs_block
        return [s for s in self.running if needs(s)]

    def _preempt(self, seq: Sequence) -> None:
        self.blocks.free_seq(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(SequenceGroup([seq], is_resume=True))
        self.num_preemptions += 1

    # ---------------------------------------------------------------- removal

    def finish(self, seq: Sequence) -> None:
        """Release a sequence that just finished (its status is already FINISHED)."""
        self.running.remove(seq)
        self.blocks.free_seq(seq)

    def remove(self, request_ids: Iterable[str] | None) -> list[Sequence]:
        """Take these requests' sequences out of the queue and the running set (all when None)."""
        ids = None if request_ids is None else set(request_ids)

        def hit(seq: Sequence) -> bool:
            return ids is None or seq.request_id in ids

        removed = [s for g in self.waiting for s in g.seqs if hit(s)]
        self.waiting = deque(g for g in self.waiting if not hit(g.seqs[0]))
        for seq in [s for s in self.running if hit(s)]:
            self.running.remove(seq)
            self.blocks.free_seq(seq)
            removed.append(seq)
        return removed
