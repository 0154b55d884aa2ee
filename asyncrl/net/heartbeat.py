"""Heartbeats and fatal errors to the hub: the same for every service (generator, reward, learner).

    service loop ──due()?──► Heartbeat(service, name, stats) ──► hub (PeerTable: last seen, stats)
                 ◄── Ack{shutdown, policy_version} ── HubAnswer: the service decides what "shutdown" means
    service dies ──────────► FatalError(service, name, reason) ──► hub, best effort (it may be what is gone);
                              the hub then sets the shutdown flag that every later heartbeat answer carries

`Heartbeats` only builds the message, keeps the clock and reads the answer, so a thread-bound loop
(`send`) and an asyncio loop that sends through its own executor (`message` → `answer`) share it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from asyncrl import records as R

log = logging.getLogger(__name__)

FATAL_REPORT_TIMEOUT_S = 5.0  # a dying process does not wait long for a hub that may be down


class Hub(Protocol):
    """What is needed of the hub connection (asyncrl.net.peer.HubPeer)."""

    timeout_s: float

    def request(self, msg: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class HubAnswer:
    shutdown: bool  # the hub is shutting the run down (a fatal error somewhere, or the launcher asked)
    policy_version: int | None  # the hub's newest policy version (None: it did not say)


class Heartbeats:
    def __init__(self, service: str, name: str, every_s: float = 2.0) -> None:
        self.service, self.name, self.every_s = service, name, every_s
        self._last: float | None = None  # monotonic time of the last heartbeat sent

    def due(self) -> bool:
        return self._last is None or time.monotonic() - self._last >= self.every_s

    def message(self, stats: dict[str, float]) -> R.Heartbeat:
        """The heartbeat to send now (restarts the clock)."""
        self._last = time.monotonic()
        return R.Heartbeat(service=self.service, name=self.name, stats=stats)

    @staticmethod
    def answer(reply: Any) -> HubAnswer:
        info = (reply.info or {}) if isinstance(reply, R.Ack) else {}
        version = info.get("policy_version")
        return HubAnswer(shutdown=bool(info.get("shutdown", False)), policy_version=None if version is None else int(version))

    def send(self, hub: Hub, stats: dict[str, float]) -> HubAnswer:
        return self.answer(hub.request(self.message(stats)))


def report_fatal(hub: Hub, service: str, name: str, error: BaseException) -> None:
    """Tell the hub this process is dying and why; best effort (never raises)."""
    hub.timeout_s = min(hub.timeout_s, FATAL_REPORT_TIMEOUT_S)
    try:
        hub.request(R.FatalError(service=service, name=name, reason=f"{type(error).__name__}: {error}"))
    except Exception:  # noqa: BLE001 - the hub may be the thing that is gone
        log.warning("could not report the fatal error to the hub")


@contextmanager
def fatal_to_hub(hub: Hub, service: str, name: str) -> Iterator[None]:
    """An exception leaving the block is reported to the hub (report_fatal), then re-raised."""
    try:
        yield
    except Exception as e:
        report_fatal(hub, service, name, e)
        raise
