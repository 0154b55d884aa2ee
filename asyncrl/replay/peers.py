"""Liveness of the hub's peers (`PeerTable`): last heartbeat or request per peer name, fatal errors.

Generators, reward workers and learners send `Heartbeat`s; a `FatalError` from any of them is kept and
turns on the shutdown flag that every later heartbeat reply carries, so no peer waits on a dead one.
Soft state: not logged, empty after a hub restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from asyncrl.records import FatalError, Heartbeat


@dataclass(slots=True)
class PeerInfo:
    service: str
    last_seen: float  # wall-clock seconds
    stats: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    requests: int = 0


class PeerTable:
    def __init__(self, max_peers: int = 4096) -> None:
        self.peers: dict[str, PeerInfo] = {}
        self.fatal: list[dict[str, str]] = []
        self.max_peers = max_peers  # memory bound against peers inventing names

    def beat(self, msg: Heartbeat, now: float) -> None:
        peer = self._get(msg.name, msg.service, now)
        if peer is not None:
            peer.stats, peer.info = msg.stats, msg.info

    def touch(self, name: str, service: str, now: float) -> None:
        """A request from `name` counts as a sign of life."""
        peer = self._get(name, service, now)
        if peer is not None:
            peer.requests += 1

    def record_fatal(self, msg: FatalError, now: float) -> None:
        if len(self.fatal) < 100:
            self.fatal.append({"service": msg.service, "name": msg.name, "reason": msg.reason[:2000]})
        self.touch(msg.name, msg.service, now)

    def report(self, now: float) -> dict[str, Any]:
        return {
            name: {"service": p.service, "age_s": round(now - p.last_seen, 3), "requests": p.requests,
                   "stats": p.stats, "info": p.info}
            for name, p in self.peers.items()
        }

    def _get(self, name: str, service: str, now: float) -> PeerInfo | None:
        peer = self.peers.get(name)
        if peer is None:
            if len(self.peers) >= self.max_peers:
                return None
            peer = self.peers[name] = PeerInfo(service=service, last_seen=now)
        peer.last_seen = now
        return peer
