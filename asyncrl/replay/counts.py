"""Per-state sample counts and transition counters of the replay hub, with the accounting invariant.

Every sample the hub has ever accepted is in exactly one `SampleState`; `SampleCounts` holds how many
are in each, how many times each edge ``a->b`` was taken, and checks after every mutation that

    sum(counts over all states) == samples_submitted      (lost == 0)

The check is O(number of states), so it runs after every mutation of `HubState`.

Samples of client prompts (submitted through `asyncrl.Client`, which watches its completions) move through
the same states and are counted in them, and also apart: `client_submitted`, and `client_failed` for those
that end failed (a reward error on a prompt a user sent is the user's outcome, not a failure of training).
`run_states` is the per-state view a run reports: "failed" holds the run's own failures only, the client's
are under "client_failed"; its values still sum to `submitted`.
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
        (SampleState.SCORED, SampleState.FILTERED),  # group without signal, dropped at the hub (refill)
        (SampleState.DELIVERED, SampleState.TRAINED),
    }
)


_EDGE_NAMES = {edge: f"{edge[0].value}->{edge[1].value}" for edge in EDGES}


class SampleCounts:
    def __init__(self) -> None:
        self.submitted = 0  # samples (prompts x n) ever accepted
        self.by_state: dict[SampleState, int] = {s: 0 for s in SampleState}
        self.transitions: Counter[str] = Counter()
        self.client_submitted = 0  # of `submitted`: samples of client prompts
        self.client_failed = 0  # of by_state[FAILED]: samples of client prompts

    def add(self, n: int, client: bool = False) -> None:
        """`n` new samples enter as queued (of a client prompt when `client`)."""
        self.submitted += n
        self.by_state[SampleState.QUEUED] += n
        if client:
            self.client_submitted += n

    def move(self, src: SampleState, dst: SampleState, n: int = 1, client: bool = False) -> None:
        name = _EDGE_NAMES.get((src, dst))
        assert name is not None, f"illegal sample transition {src} -> {dst}"
        self.by_state[src] -= n
        self.by_state[dst] += n
        self.transitions[name] += n
        if client and dst is SampleState.FAILED:
            self.client_failed += n

    @property
    def lost(self) -> int:
        return self.submitted - sum(self.by_state.values())

    def check(self) -> None:
        assert self.lost == 0, f"sample accounting broken: lost={self.lost} ({self.snapshot()})"
        assert min(self.by_state.values()) >= 0, f"negative state count: {self.snapshot()}"
        assert 0 <= self.client_failed <= self.by_state[SampleState.FAILED], \
            f"client_failed={self.client_failed} outside 0..failed ({self.snapshot()})"
        assert 0 <= self.client_submitted <= self.submitted, \
            f"client_submitted={self.client_submitted} outside 0..submitted={self.submitted}"

    @property
    def run_failed(self) -> int:
        """Failed samples of the run's own prompts (client prompts' failures left out)."""
        return self.by_state[SampleState.FAILED] - self.client_failed

    def snapshot(self) -> dict[str, int]:
        return {s.value: c for s, c in self.by_state.items()}

    def run_states(self) -> dict[str, int]:
        """`snapshot` with the client prompts' failed samples moved from "failed" to "client_failed"."""
        states = self.snapshot()
        states[SampleState.FAILED.value] = self.run_failed
        states["client_failed"] = self.client_failed
        return states
