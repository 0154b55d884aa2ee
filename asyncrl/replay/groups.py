"""One prompt and the states of its n samples, as the replay hub tracks them (`GroupEntry`).

A group moves through phases (for admission and batching), while each sample moves through
`SampleState`s (for accounting):

    QUEUED --lease--> OUT --all n scored or failed--> READY --batch--> BATCHED --commit--> (forgotten)
                        \\-- an evaluation group, once complete --> (forgotten: its watcher has every sample)
       ^               |                                 \\-> (forgotten: every sample dropped stale)
       \\-- expired / returned (only its still-leased samples go back)    \\-> failed: every sample failed

Failed samples: a group with every sample failed is counted failed and never trained; a group with
some failed samples is trained on its OK samples only (the learner normalises advantages over the
samples it gets). The same holds for samples dropped as stale.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from asyncrl.records import SIGNAL_SPREAD, Prompt, SampleState, ScoredSample
from asyncrl.wire import PackedSample

NEVER_STALE = 1 << 62  # min version of an empty response: nothing in it can be stale


class Phase(enum.Enum):
    QUEUED = "queued"  # in the prompt queue (some samples still to generate)
    OUT = "out"  # leased, or generated and waiting for scores
    READY = "ready"  # every sample scored or failed, at least one OK: waits for a batch
    BATCHED = "batched"  # in a delivered, not yet committed batch


@dataclass(slots=True)
class GroupEntry:
    prompt: Prompt
    phase: Phase = Phase.QUEUED
    lease_id: str = ""  # lease holding it while OUT with samples still leased
    states: list[SampleState] = field(default_factory=list)  # [n]
    samples: list[PackedSample | None] = field(default_factory=list)  # [n], set once generated (wire bytes)
    min_versions: list[int] = field(default_factory=list)  # [n] oldest token version per sample
    scored: list[ScoredSample | None] = field(default_factory=list)  # [n], set once scored
    checked_min: int = -NEVER_STALE  # highest min_version it was pruned against (skips re-scans)
    client: bool = False  # submitted by a client (SubmitPrompts.watch): its failures are counted apart
    evaluate: bool = False  # a held-out evaluation prompt (SubmitPrompts.evaluate): never READY, never batched
    prompt_frame: bytes | None = None  # the prompt's wire encoding, made once for snapshots (prompts never change)
    untouched_image: bytes | None = None  # its snapshot entry, packed once, for as long as it stays as submitted

    @classmethod
    def new(cls, prompt: Prompt, client: bool = False, evaluate: bool = False) -> GroupEntry:
        n = prompt.n
        return cls(
            prompt=prompt,
            client=client or evaluate,
            evaluate=evaluate,
            states=[SampleState.QUEUED] * n,
            samples=[None] * n,
            min_versions=[NEVER_STALE] * n,
            scored=[None] * n,
        )

    def indices(self, state: SampleState) -> list[int]:
        return [i for i, s in enumerate(self.states) if s is state]

    def count(self, state: SampleState) -> int:
        return self.states.count(state)  # C loop; members are distinct values, so == is `is` here

    def is_complete(self) -> bool:
        """Nothing left to generate or score."""
        return self.states.count(SampleState.SCORED) + self.states.count(SampleState.FAILED) == len(self.states)

    def ok_samples(self) -> list[ScoredSample]:
        return [sc for sc, st in zip(self.scored, self.states) if st is SampleState.SCORED and sc is not None]

    def has_signal(self) -> bool:
        """Whether the OK samples' rewards spread by more than SIGNAL_SPREAD (else every advantage is zero)."""
        rewards = [sc.reward for sc in self.ok_samples()]
        return max(rewards) - min(rewards) > SIGNAL_SPREAD
