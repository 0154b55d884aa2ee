"""`HubPeer`: a synchronous request/reply connection to the replay hub (one ZeroMQ DEALER).

    peer = HubPeer(endpoint, name, timeout_s=30.0)
    reply = peer.request(msg)      # one reply per request; ErrorReply -> HubError; no reply -> TimeoutError
    pending = peer.start(msg)      # or in two halves: send now ...
    reply = peer.finish(pending)   # ... wait later (ShardedPeer overlaps its shards' waits this way)
    peer.close()

Long polls (LeaseRequest, ScoreRequest, BatchRequest) wait up to their `wait_s` on the hub, so a request
waits `timeout_s + wait_s` here. After a timeout the socket is replaced (a late reply must never be taken
for the answer to the next request); within `reconnect_s` of the first attempt the request is sent again
on the new socket (the launcher restarts a dead hub from its log; every hub request is safe to repeat:
a repeat is either answered again or refused with a reason), after that TimeoutError is raised.

Authentication (asyncrl.net.credentials): the socket proves `credentials` (default: the role and key the
launcher put in the environment, `Credentials.from_env()`; none: an unauthenticated hub, e.g. in tests).
A hub refuses a connection whose credentials are wrong at the handshake and never answers on it; a socket
monitor sees that refusal, and a request that waits on such a connection raises `HubRefused` at its next
wait slice instead of timing out (it is never retried: the same credentials are refused again). Unread monitor
events would fill its pipe and then block ZeroMQ's I/O thread, and every socket of the process with it
(tests/net/test_peer_monitor.py), so the monitor lives only while a request can read it: a socket connects (and
starts its monitor) at its first send, not when it is made, so a peer that is built and never used, or is left
idle after a failed request, never handshakes at all; and the monitor is closed at the first outcome (the first
reply, or the refusal).
`reconnect_s` defaults to ASYNCRL_HUB_RECONNECT_S from the launcher, else 0; `give_up()` (a service's stop
flag) ends the retries early, and a wait for a reply after STOPPING_GRACE_S: a service stopping because its
launcher died must not wait out the full timeout for a hub that died with it.

Messages the hub pushes unasked (`Completion`s for clients that
submitted with watch=True) are kept in order and read with `receive()`. Not thread-safe: one per thread.

Whatever arrives on the socket is bounded before it is decoded (ZeroMQ drops a connection whose message
exceeds 2 x max_frame_bytes; `wire.decode` checks size, depth and counts) and any bad frame (several
parts, oversized, not msgpack, too deep, not a valid record, a reply of the wrong type for the request,
a message nobody asked for) is skipped and counted in `rejected` by reason: it never raises to the caller.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from asyncrl import records as R
from asyncrl import wire
from asyncrl.net.credentials import Credentials

log = logging.getLogger("asyncrl.net.peer")
PUSHED = (R.Completion,)  # messages the hub sends without a request
REPLIES: dict[type, tuple[type, ...]] = {  # what answers each request (any other: Ack); ErrorReply always may
    R.LeaseRequest: (R.Lease,), R.ScoreRequest: (R.ToScore,), R.BatchRequest: (R.Batch, R.Ack),
    R.StatsRequest: (R.Stats,)}
_LOG_FIRST = 10  # rejected frames logged by reason: the first few, then every 1000th
ENV_RECONNECT = "ASYNCRL_HUB_RECONNECT_S"
_SLICE_S = 0.1  # a reply is waited for in slices, so that give_up() is seen while waiting
STOPPING_GRACE_S = 2.0  # once give_up(), a reply still in flight is waited for this long (a live hub answers in ms)


class HubError(RuntimeError):
    """The hub answered with an ErrorReply; the message is its reason."""

    def __init__(self, reason: str, request_type: str = "") -> None:
        super().__init__(f"hub rejected {request_type or 'request'}: {reason}")
        self.reason = reason
        self.request_type = request_type


class HubRefused(PermissionError):
    """The hub refused this peer's connection at the handshake (wrong run secret or role, or no credentials
    for a hub that requires them)."""


_HANDSHAKE_FAILURES = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "refused this peer's credentials (a key of another run's secret?)",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "refused the handshake (an authenticated hub and a peer without "
                                         "credentials, or the reverse?)",
}


@dataclass(slots=True)
class Pending:
    """A request sent and not yet answered (HubPeer.start -> HubPeer.finish)."""
    msg: Any
    frame: bytes
    first: float  # monotonic time of the first send: the reconnect window counts from here
    sent: float = 0.0  # this attempt's send
    deadline: float = 0.0  # this attempt's: sent + timeout_s + the request's wait_s
    failed: TimeoutError | None = None  # this attempt found no connection to send on


class HubPeer:
    def __init__(self, endpoint: str, name: str, timeout_s: float = 30.0,
                 max_frame_bytes: int = wire.DEFAULT_MAX_FRAME_BYTES, credentials: Credentials | None = None,
                 reconnect_s: float | None = None) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s}: must be > 0")
        self.endpoint, self.name, self.timeout_s = endpoint, name, timeout_s
        self.max_frame_bytes = max_frame_bytes
        self.credentials = credentials if credentials is not None else Credentials.from_env()
        self.reconnect_s = float(os.environ.get(ENV_RECONNECT, "0")) if reconnect_s is None else reconnect_s
        if self.reconnect_s < 0:
            raise ValueError(f"reconnect_s={self.reconnect_s}: must be >= 0 (0 = fail on the first timeout)")
        self.reconnects = 0
        self.give_up: Callable[[], bool] = lambda: False  # e.g. a service's stop flag: no more retries
        self.ctx = zmq.Context.instance()
        self.pushed: deque[Any] = deque()
        self.rejected: Counter[str] = Counter()  # bad inbound frames by reason (never raised)
        self.monitor: zmq.Socket | None = None
        self.sock = self._socket()

    def _socket(self) -> zmq.Socket:
        """A new DEALER, not yet connected (`_connect` does that at its first send)."""
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, 2 * self.max_frame_bytes)  # beyond: ZeroMQ drops the connection
        if self.credentials is not None:
            self.credentials.apply(sock, self.name, self.endpoint)
        self.connected = self.handshake_ok = False
        return sock

    def _connect(self) -> None:
        """Connect the socket, watching its handshake, when a request first needs it."""
        if self.connected:
            return
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | sum(_HANDSHAKE_FAILURES))
        self.sock.connect(self.endpoint)
        self.connected = True

    def _check_handshake(self) -> None:
        """Raise HubRefused if the hub refused this connection and never accepted it (monitor events so far).
        The first outcome ends the monitoring: events nobody reads pile up in the monitor's pipe, and once it is
        full (~2,000 events: a connection that fails its handshake every reconnect interval fills it within
        minutes) ZeroMQ's I/O thread blocks on it, and with it every socket of the process's context."""
        while self.monitor is not None and self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._accepted()
            elif event in _HANDSHAKE_FAILURES:
                self._stop_monitor()
                role = self.credentials.role if self.credentials is not None else "none"
                raise HubRefused(f"the hub at {self.endpoint} {_HANDSHAKE_FAILURES[event]}; "
                                 f"this peer: {self.name}, role {role}")

    def _accepted(self) -> None:
        """The hub accepted this connection: nothing is left to watch."""
        self.handshake_ok = True
        self._stop_monitor()

    def _stop_monitor(self) -> None:
        if self.monitor is not None:
            self.sock.disable_monitor()
            self.monitor.close(linger=0)
            self.monitor = None

    def _close_socket(self) -> None:
        self._stop_monitor()
        self.sock.close(linger=0)

    def request(self, msg: Any) -> Any:
        """Send `msg`, return the hub's reply record. Raises HubError or TimeoutError."""
        return self.finish(self.start(msg))

    def start(self, msg: Any) -> Pending:
        """Send `msg` and return without waiting; `finish` waits for the reply. One request in flight per
        HubPeer; several HubPeers (ShardedPeer's shards) can each have one, so their waits overlap."""
        pending = Pending(msg=msg, frame=wire.encode(msg), first=time.monotonic())
        self._launch(pending)
        return pending

    def finish(self, pending: Pending) -> Any:
        """The reply to a started request, resent on a new socket within `reconnect_s` of the first send.
        Raises HubError or TimeoutError."""
        while True:
            try:
                if pending.failed is not None:
                    raise pending.failed
                return self._await(pending)
            except TimeoutError:
                if time.monotonic() >= pending.first + self.reconnect_s or self.give_up():
                    raise
                self.reconnects += 1
                self._launch(pending)

    def _launch(self, p: Pending) -> None:
        """(Re)send p's frame with a fresh deadline; a send that finds no connection is kept as p.failed."""
        p.sent = time.monotonic()
        p.deadline = p.sent + self.timeout_s + float(getattr(p.msg, "wait_s", 0.0))
        try:
            self._send(p.msg, p.frame, p.sent, p.deadline)
            p.failed = None
        except TimeoutError as e:
            p.failed = e

    def _await(self, p: Pending) -> Any:
        msg, sent, deadline = p.msg, p.sent, p.deadline
        while True:
            reply = self._recv_until(min(deadline, time.monotonic() + _SLICE_S))
            if reply is None:
                self._check_handshake()
                now = time.monotonic()
                if now < deadline and not self._stopped_waiting(now, sent):
                    continue
                self._replace_socket()
                raise TimeoutError(f"no reply from the hub at {self.endpoint} to {type(msg).__name__} "
                                   f"within {now - sent:.1f}s" + (" (stopping)" if now < deadline else ""))
            if not self.handshake_ok:  # a reply came: the hub accepted this connection
                self._accepted()
            if isinstance(reply, PUSHED):
                self.pushed.append(reply)
                continue
            if isinstance(reply, R.ErrorReply):
                raise HubError(reply.reason, reply.request_type)
            if not isinstance(reply, REPLIES.get(type(msg), (R.Ack,))):
                self.reject("wrong_type", f"{type(reply).__name__} does not answer {type(msg).__name__}")
                continue
            return reply

    def _send(self, msg: Any, frame: bytes, sent: float, deadline: float) -> None:
        """Queue `frame` without blocking: a DEALER with no live connection (refused at the handshake, or never
        made) has nowhere to queue it, and a plain send would then wait forever."""
        self._connect()
        while True:
            try:
                self.sock.send(frame, copy=False, flags=zmq.NOBLOCK)
                return
            except zmq.Again:
                self._check_handshake()
                now = time.monotonic()
                if now >= deadline or self._stopped_waiting(now, sent):
                    self._replace_socket()
                    raise TimeoutError(f"could not send {type(msg).__name__} to the hub at {self.endpoint} within "
                                       f"{now - sent:.1f}s (no connection)") from None
                self.sock.poll(int(_SLICE_S * 1000), zmq.POLLOUT)

    def _replace_socket(self) -> None:
        """A new connection after a request failed: a late reply on the old one is never read."""
        self._close_socket()
        self.sock = self._socket()

    def _stopped_waiting(self, now: float, sent: float) -> bool:
        """The owner is stopping (give_up()) and the request has had its grace."""
        return now - sent >= STOPPING_GRACE_S and self.give_up()

    def receive(self, timeout_s: float = 0.0) -> Any | None:
        """Next message the hub pushed unasked (a Completion), or None after `timeout_s`."""
        if self.pushed:
            return self.pushed.popleft()
        deadline = time.monotonic() + timeout_s
        while (msg := self._recv_until(deadline)) is not None:
            if isinstance(msg, PUSHED):
                return msg
            self.reject("wrong_type", f"{type(msg).__name__} with no request outstanding")
        return None

    def _recv_until(self, deadline: float) -> Any | None:
        """The next well-formed record before `deadline` (bad frames are counted and skipped), else None."""
        while True:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not self.sock.poll(left_ms, zmq.POLLIN):
                return None
            parts = self.sock.recv_multipart(copy=False)
            if len(parts) != 1:
                self.reject("frame_count", f"a message of {len(parts)} frames (the hub sends one)")
                continue
            try:
                return wire.decode(parts[0].buffer, self.max_frame_bytes)
            except Exception as e:  # WireError, or a decoder bug: the frame fails, never the caller
                self.reject(_kind(e), str(e))

    def reject(self, reason: str, detail: str) -> None:
        """Count one bad inbound frame under `reason` (a short fixed word) and log the first few."""
        self.rejected[reason] += 1
        n = self.rejected[reason]
        if n <= _LOG_FIRST or n % 1000 == 0:
            log.warning("%s: rejected a frame from %s (%s, #%d): %s", self.name, self.endpoint, reason, n, detail[:300])

    def close(self) -> None:
        self._close_socket()

    def __enter__(self) -> HubPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _kind(e: Exception) -> str:
    """Short counter name of a decoding failure."""
    text = str(e)[:200]
    if not isinstance(e, wire.WireError):
        return "decoder_error"
    for words, kind in (("exceeds max_frame_bytes", "too_large"), ("not msgpack", "not_msgpack"),
                        ("nests deeper", "too_deep"), ("holds more than", "too_many_values")):
        if words in text:
            return kind
    return "invalid"
