"""Delivered batches of the replay hub (`BatchBook`): formed once per learner step, kept until committed.

A batch for step s is formed exactly once; until `CommitStep(step >= s)` it stays "delivered" and every
`BatchRequest(step=s)` gets the same object again (a learner resuming from a checkpoint re-trains the
exact batches it lost, nothing is dropped or trained twice). Committed batches are forgotten.
"""

from __future__ import annotations

from asyncrl.records import Batch


class BatchBook:
    def __init__(self) -> None:
        self.delivered: dict[int, Batch] = {}  # step -> batch, not yet committed
        self.prompt_ids: dict[int, list[str]] = {}  # step -> prompts of its groups
        self.last_formed = 0  # highest step formed so far (steps are 1-based)
        self.committed = 0  # highest step committed

    @property
    def next_step(self) -> int:
        return self.last_formed + 1

    def add(self, batch: Batch, prompt_ids: list[str]) -> None:
        assert batch.step == self.next_step, f"batch for step {batch.step}, expected {self.next_step}"
        self.delivered[batch.step] = batch
        self.prompt_ids[batch.step] = prompt_ids
        self.last_formed = batch.step

    def why_not(self, step: int) -> str:
        """'' if `step` is delivered or formable next; else the reason it can never be served."""
        if step in self.delivered or step == self.next_step:
            return ""
        if step <= self.committed:
            return f"step {step} is committed (trained); the next step to request is {self.committed + 1}"
        return f"step {step} is ahead: the next batch the hub can form is for step {self.next_step}"

    def pop_through(self, step: int) -> list[tuple[Batch, list[str]]]:
        """Remove and return the delivered batches of steps <= `step`, oldest first."""
        done = sorted(s for s in self.delivered if s <= step)
        out = [(self.delivered.pop(s), self.prompt_ids.pop(s)) for s in done]
        self.committed = max(self.committed, step)
        return out
