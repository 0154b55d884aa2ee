"""A hub peer watches its connection's handshake with a ZeroMQ socket monitor only until the first outcome.

Why it matters: monitor events nobody reads fill the monitor's pipe (~2,000 events), and then ZeroMQ's I/O thread
blocks on it, and every socket of the process's context stops moving frames. A peer whose connection fails its
handshake at every reconnect (its address now taken by something that is not a hub) fills it within minutes; in
the suite that stalled every in-process hub of a pytest worker (2026-12-05). The first test shows the hazard with
plain pyzmq, so that it is known to be real here; the second holds the peer to the fix when the hub answers, and
tests/replay/test_trust.py when it refuses."""

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


def not_a_hub() -> tuple[socket.socket, int]:
    """A loopback TCP listener that accepts and closes every connection: each ZMTP handshake with it fails."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)

    def accept() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
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
            assert peer.monitor is not None  # watching until the first outcome
            assert isinstance(peer.request(R.StatsRequest()), R.Stats)
            assert peer.handshake_ok and peer.monitor is None
            assert isinstance(peer.request(R.StatsRequest()), R.Stats)  # and the connection serves on
    finally:
        hub.stop()
