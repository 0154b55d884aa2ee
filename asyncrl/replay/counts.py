"""Per-state sample counts and transition counters of the replay hub, with the accounting invariant.

Every sample the hub has ever accepted is in exactly one `SampleState`; `SampleCounts` holds how many
are in each, how many times each edge ``a->b`` was taken, and checks after every mutation that

    sum(counts over all states) == samples_submitted      (lost == 0)

The check is O(number of states), so it runs after every mutation of `HubState`.
"""

from __future__ import annotations

from collections import Counter

from asyncrl.records import SampleState

# Allowed edges of the sample life cycle (see asyncrl.records).
EDGES: frozenset[tuple[SampleState, SampleState]] = frozenset(
    {
        (SampleState.QUEUED, SampleState.LEASED),
        (SampleState.LEASED, SampleState.QUEUED),  # lease expired or prompts returned
        (SampleState.LEASED, SampleState.GENERATED),
        (SampleState.LEASED, SampleState.FAILED),  # non-finite logprobs, or a prompt the engine cannot take
        (SampleState.GENERATED, SampleState.SCORED),
        (SampleState.GENERATED, SampleState.FAILED),
        (SampleState.SCORED, SampleState.DELIVERED),
        (SampleState.SCORED, SampleState.DROPPED),
        (SampleState.DELIVERED, SampleState.TRAINED),
    }
)


_EDGE_NAMES = {edge: f"{edge[0].value}->{edge[1].value}" for edge in EDGES}


class SampleCounts:
    def __init__(self) -> None:
        self.submitted = 0  # samples (prompts x n) ever accepted
        self.by_state: dict[SampleState, int] = {s: 0 for s in SampleState}
        self.transitions: Counter[str] = Counter()

    def add(self, n: int) -> None:
        """`n` new samples enter as queued."""
        self.submitted += n
        self.by_state[SampleState.QUEUED] += n

    def move(self, src: SampleState, dst: SampleState, n: int = 1) -> None:
        name = _EDGE_NAMES.get((src, dst))
        assert name is not None, f"illegal sample transition {src} -> {dst}"
        self.by_state[src] -= n
        self.by_state[dst] += n
        self.transitions[name] += n

    @property
    def lost(self) -> int:
        return self.submitted - sum(self.by_state.values())

    def check(self) -> None:
        assert self.lost == 0, f"sample accounting broken: lost={self.lost} ({self.snapshot()})"
        assert min(self.by_state.values()) >= 0, f"negative state count: {self.snapshot()}"

    def snapshot(self) -> dict[str, int]:
        return {s.value: c for s, c in self.by_state.items()}
