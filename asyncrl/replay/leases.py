"""Leases of prompts to generators (`LeaseTable`): which generator holds which prompts until when.

A lease is opened by `HubState.grant`, shrinks as the samples of its prompts arrive or prompts are
returned, and closes when empty. A lease past its deadline is expired by `HubState.expire(now)`: its
still-leased samples go back to the queue. Deadlines are wall-clock seconds (time.time()), so a lease
logged before a restart still expires after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class LeaseEntry:
    lease_id: str
    generator: str
    expires_at: float  # wall-clock seconds
    prompt_ids: dict[str, None] = field(default_factory=dict)  # prompts with samples still leased, in lease order


class LeaseTable:
    def __init__(self) -> None:
        self.leases: dict[str, LeaseEntry] = {}
        self.issued = 0  # lease ids are "L<issued>": deterministic, so replay rebuilds the same ids

    def open(self, generator: str, prompt_ids: list[str], expires_at: float) -> LeaseEntry:
        self.issued += 1
        entry = LeaseEntry(f"L{self.issued}", generator, expires_at, dict.fromkeys(prompt_ids))
        self.leases[entry.lease_id] = entry
        return entry

    def get(self, lease_id: str) -> LeaseEntry | None:
        return self.leases.get(lease_id)

    def release(self, lease_id: str, prompt_id: str) -> None:
        """`prompt_id` no longer has leased samples under `lease_id`; close the lease when empty."""
        entry = self.leases[lease_id]
        entry.prompt_ids.pop(prompt_id, None)
        if not entry.prompt_ids:
            del self.leases[lease_id]

    def overdue(self, now: float) -> list[LeaseEntry]:
        return [e for e in self.leases.values() if e.expires_at <= now]

    def close(self, lease_id: str) -> None:
        self.leases.pop(lease_id, None)

    def __len__(self) -> int:
        return len(self.leases)
