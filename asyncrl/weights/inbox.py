"""The gate every inbound weight-control frame passes: bounded, decoded, typed, or counted as rejected.

Both weight sockets (the learner's ROUTER in sender.py, each generator's DEALER in receiver.py) read only
through `read_message`. Whatever bytes a peer sends (any number of frames, any sizes, valid msgpack of the
wrong type), the result is either one message of an allowed type or None plus one count in `Rejections`
under a short reason; nothing raises to the caller, so a peer can fail its own datum, never the process.

Memory a flood can take is bounded by the socket options `bound_socket` sets: messages larger than
`max_frame_bytes` make ZeroMQ drop that connection before buffering them, and at most `RCVHWM` messages
queue per peer. Decoding itself (depth, sizes, schema) is wire.decode's, with the same byte limit.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from asyncrl import wire

log = logging.getLogger(__name__)

MAX_CONTROL_FRAME_BYTES = 16 << 20  # a WeightBucket's names/shapes for thousands of tensors fit easily
RCVHWM = 1000
_LOG_FIRST = 20  # log the first few rejections of each reason, then every 1000th


class Rejections:
    """Counts rejected inbound frames by reason (stats: `as_dict()`)."""

    def __init__(self, owner: str):
        self.owner = owner
        self.counts: dict[str, int] = {}

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def add(self, reason: str, detail: str, peer: bytes | None = None) -> None:
        n = self.counts.get(reason, 0) + 1
        self.counts[reason] = n
        if n <= _LOG_FIRST or n % 1000 == 0:
            who = f" from {peer[:32]!r}" if peer is not None else ""
            log.warning("%s: rejected frame%s (%s, #%d): %s", self.owner, who, reason, n, detail[:300])

    def as_dict(self) -> dict[str, int]:
        return dict(self.counts, total=self.total)


def bound_socket(sock: zmq.Socket, max_frame_bytes: int = MAX_CONTROL_FRAME_BYTES) -> None:
    """Bound what a flood can buffer on `sock` (set before bind/connect)."""
    sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
    sock.setsockopt(zmq.RCVHWM, RCVHWM)
    sock.setsockopt(zmq.LINGER, 0)


def read_message(
    sock: zmq.Socket,
    *,
    routed: bool,
    allowed: tuple[type, ...],
    rejections: Rejections,
    max_frame_bytes: int = MAX_CONTROL_FRAME_BYTES,
) -> tuple[bytes | None, Any] | None:
    """Read one waiting message without blocking: (sender identity or None, record), or None when
    nothing was waiting or the message was rejected. routed: a ROUTER socket (identity frame first)."""
    try:
        frames = sock.recv_multipart(zmq.NOBLOCK, copy=True)
    except zmq.Again:
        return None
    identity = frames[0] if routed and frames else None
    body = frames[1:] if routed else frames
    if len(body) != 1:
        rejections.add("frame_count", f"expected one message frame, got {len(body)}", identity)
        return None
    try:
        msg = wire.decode(body[0], max_frame_bytes)
    except wire.WireError as e:
        rejections.add("undecodable", str(e), identity)
        return None
    except Exception as e:  # the decoder's own limits should catch everything; never let one escape
        rejections.add("undecodable", f"{type(e).__name__}: {e}", identity)
        return None
    if not isinstance(msg, allowed):
        rejections.add("unexpected_type", f"{type(msg).__name__} is not one of {[c.__name__ for c in allowed]}", identity)
        return None
    return identity, msg
