"""One generator as the learner's WeightSender sees it: its join, its transport, its unread acks.

A member is created when the learner offers it a group (`joining`: `transport` is None and `build` fills
in from the learner's build thread) and becomes live once both its group Ack arrived and the build ended.
`check_join` vets a peer's WeightJoin before anything is built for it; `take_ack` pops the ack a stage
waits for; `reported_failure` reads a failure the generator reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from asyncrl.records import Ack, WeightJoin
from asyncrl.weights.transport import WeightTransport


@dataclass(kw_only=True, slots=True)
class Member:
    name: str
    identity: bytes
    join: WeightJoin
    transport: WeightTransport | None = None  # None while the learner's side of the group is being built
    acks: list[Ack] = field(default_factory=list)
    build: dict[str, Any] = field(default_factory=dict)  # joining: "transport" or "error" once the build ended
    gone: bool = False  # dropped; a build that ends later closes what it made

    def close(self) -> None:
        self.gone = True
        transport, self.transport = self.transport, None
        if transport is not None:
            transport.close()


MAX_PENDING_JOINS = 256
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


def check_join(join: WeightJoin) -> None:
    """ValueError naming what is wrong with a peer's WeightJoin (checked before anything is built)."""
    if not join.generator or len(join.generator) > 128 or not set(join.generator) <= _NAME_CHARS:
        raise ValueError(f"generator name {join.generator[:40]!r}: 1-128 chars of [A-Za-z0-9-_.:]")
    if not 1 <= join.receiving_ranks <= 1024:
        raise ValueError(f"receiving_ranks={join.receiving_ranks}: must be in 1..1024")
    if join.weight_version < 0:
        raise ValueError(f"weight_version={join.weight_version}: must be >= 0")
    if not (join.device == "cpu" or join.device == "cuda" or join.device.startswith("cuda:") and join.device[5:].isdigit()):
        raise ValueError(f"device {join.device[:40]!r}: must be 'cpu', 'cuda' or 'cuda:<index>'")


def take_ack(m: Member, stage: str, version: int, index: int) -> Ack | None:
    """Pop the first ack of `stage` (stale acks of earlier stages are discarded)."""
    while m.acks:
        ack = m.acks.pop(0)
        info = ack.info
        if info.get("stage") == stage and (version < 0 or info.get("version") == version) and info.get("bucket", -1) == index:
            return ack
        if not ack.ok:
            return ack  # a failure at any stage ends this member's update
    return None


def reported_failure(m: Member, default_stage: str) -> str:
    """"<stage>: <error>" of the first failed ack `m` holds, or "" (the ack stays unread)."""
    failed = next((a for a in m.acks if not a.ok), None)
    if failed is None:
        return ""
    return f"{failed.info.get('stage', default_stage)}: {failed.info.get('error', 'failed')}"
