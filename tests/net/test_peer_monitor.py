"""A hub peer watches its connection's handshake with a ZeroMQ socket monitor only until the first outcome.

Why it matters: monitor events nobody reads fill the monitor's pipe (~2,000 events), and then ZeroMQ's I/O thread
blocks on it, and every socket of the process's context stops moving frames. A peer whose connection fails its
handshake at every reconnect (its address now taken by something that is not a hub) fills it within minutes; in
the suite that stalled every in-process hub of a pytest worker (2026-12-05). The first test shows the hazard with
plain pyzmq, so that it is known to be real here; the others hold the peer to the fix: it connects only when it
first sends (an idle peer never handshakes), and drops its monitor when the hub answers (and, in
tests/replay/test_trust.py, when it refuses)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import zmq

from asyncrl import records as R
from asyncrl.net.peer import HubPeer
from asyncrl.replay.background import BackgroundHub
from asyncrl.replay.config import BatchConfig, HubConfig

pytestmark = pytest.mark.timeout(60)
FAILURES = sum(getattr(zmq, n) for n in ("EVENT_HANDSHAKE_FAILED_NO_DETAIL", "EVENT_HANDSHAKE_FAILED_PROTOCOL",
                                         "EVENT_HANDSHAKE_FAILED_AUTH"))


def not_a_hub(accepted: list[int] | None = None) -> tuple[socket.socket, int]:
    """A loopback TCP listener that accepts and closes every connection (counted in `accepted`): each ZMTP
    handshake with it fails."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)

    def accept() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            if accepted is not None:
                accepted.append(1)
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    return srv, srv.getsockname()[1]


def test_an_unread_monitor_stalls_every_socket_of_its_context():
    ctx = zmq.Context()  # its own context: the stall must not reach the suite's
    srv, port = not_a_hub()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RECONNECT_IVL, 1)  # a failed handshake a millisecond
    monitor = dealer.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | FAILURES | zmq.EVENT_CONNECTED)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    deadline = time.monotonic() + 20
    while monitor.get(zmq.EVENTS) & zmq.POLLIN == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(6)  # nobody reads the monitor
    router, client = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    port2 = router.bind_to_random_port("tcp://127.0.0.1")
    client.connect(f"tcp://127.0.0.1:{port2}")
    client.send(b"ping")
    stalled = not router.poll(2000)
    srv.close()
    for s in (router, client, dealer, monitor):
        s.close(linger=0)
    assert stalled, f"libzmq {zmq.zmq_version()} no longer stalls on a full monitor pipe: this hazard is gone"


def test_a_peer_stops_its_monitor_once_the_hub_answers():
    hub = BackgroundHub(HubConfig(log=False), BatchConfig(prompts_per_step=1, samples_per_prompt=1))
    try:
        with HubPeer(hub.endpoint, "p") as peer:
            assert peer.monitor is None and not peer.connected  # nothing to watch before the first send
            pending = peer.start(R.StatsRequest())
            assert peer.connected and (peer.monitor is not None or peer.handshake_ok)  # watching until the outcome
            assert isinstance(peer.finish(pending), R.Stats)
            assert peer.handshake_ok and peer.monitor is None
            assert isinstance(peer.request(R.StatsRequest()), R.Stats)  # and the connection serves on
    finally:
        hub.stop()


def test_an_idle_peer_never_handshakes_so_its_monitor_cannot_fill():
    """Built and never used, or left idle after a request that failed: no connection is made (the listener sees
    none), so no handshake fails and no monitor event is queued."""
    accepted: list[int] = []
    srv, port = not_a_hub(accepted)
    try:
        idle = HubPeer(f"tcp://127.0.0.1:{port}", "idle", timeout_s=0.3)
        time.sleep(0.5)
        assert accepted == [] and idle.monitor is None and not idle.connected
        with pytest.raises(TimeoutError):  # the listener closes every connection: no reply ever comes
            idle.request(R.StatsRequest())
        assert accepted, "the request did connect"
        assert idle.monitor is None and not idle.connected  # the failed socket was replaced by an unconnected one
        seen = len(accepted)
        time.sleep(0.5)  # ZeroMQ would reconnect every 100 ms if a socket were still connected
        assert len(accepted) == seen
        idle.close()
    finally:
        srv.close()
