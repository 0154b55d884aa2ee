"""Leases of prompts to generators (`LeaseTable`): which generator holds which prompts until when.

A lease is opened by `HubState.grant`, shrinks as the samples of its prompts arrive or prompts are
returned, and closes when empty. A lease past its deadline is expired by `HubState.expire(now)`: its
still-leased samples go back to the queue. Deadlines are wall-clock seconds (time.time()), so a lease
logged before a restart still expires after it.

Lease ids are unguessable (`L<n>-<16 random hex digits>`): only the generator that was granted a
lease learns its id. The log records each id with its grant, so a replay rebuilds the same ids.
`held_by(generator)` lists the leases of a generator the launcher saw die; the hub returns them at once.
"""

from __future__ import annotations

import secrets
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
        self.issued = 0

    def open(self, generator: str, prompt_ids: list[str], expires_at: float, lease_id: str = "") -> LeaseEntry:
        """A new lease; `lease_id` is given on log replay (else a fresh unguessable id)."""
        self.issued += 1
        lease_id = lease_id or f"L{self.issued}-{secrets.token_hex(8)}"
        entry = LeaseEntry(lease_id, generator, expires_at, dict.fromkeys(prompt_ids))
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

    def held_by(self, generator: str) -> list[LeaseEntry]:
        return [e for e in self.leases.values() if e.generator == generator]

    def overdue(self, now: float) -> list[LeaseEntry]:
        return [e for e in self.leases.values() if e.expires_at <= now]

    def close(self, lease_id: str) -> None:
        self.leases.pop(lease_id, None)

    def __len__(self) -> int:
        return len(self.leases)
