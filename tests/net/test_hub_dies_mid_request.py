"""Talking to a hub that dies with a request in flight: the feeder asks again and keeps feeding (the launcher
restarts the hub; a CI run of the chaos drill failed when the feeder gave up on a request the killed hub
never answered), and a stopping service stops waiting for an answer that will not come."""

from __future__ import annotations

import threading
import time

import zmq

from asyncrl import records as R
from asyncrl import wire
from asyncrl.config.run import RunConfig
from asyncrl.run.feeder import Feeder


class _Hub(threading.Thread):
    """A ROUTER that never answers the first `drop` requests (a hub killed after reading them), then answers
    StatsRequest with an empty queue and SubmitPrompts with an Ack, recording the prompt ids."""

    def __init__(self, drop: int) -> None:
        super().__init__(daemon=True)
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.drop, self.ids, self.done = drop, [], threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            if not self.sock.poll(50):
                continue
            ident, frame = self.sock.recv_multipart()
            msg = wire.decode(frame)
            if self.drop > 0:
                self.drop -= 1
                continue
            if isinstance(msg, R.SubmitPrompts):
                self.ids += [p.prompt_id for p in msg.prompts]
                reply = R.Ack()
            else:
                reply = R.Stats(counters={"queued_prompts": len(self.ids) if len(self.ids) >= 8 else 0})
            self.sock.send_multipart([ident, wire.encode(reply)])
        self.sock.close()


def test_a_request_the_hub_never_answers_is_sent_again_and_feeding_goes_on(tmp_path):
    hub = _Hub(drop=2)
    hub.start()
    cfg = RunConfig()
    cfg.launch.hub_reconnect_s = 60.0
    feeder = Feeder(cfg, [hub.endpoint], tmp_path, poll_s=0.05)
    feeder.request_timeout_s = 0.3  # the default (5 s) keeps the suite waiting for nothing
    feeder.start()
    deadline = time.monotonic() + 30
    while len(hub.ids) < 8 and feeder.error is None and time.monotonic() < deadline:
        time.sleep(0.05)
    feeder.stop()
    hub.done.set()
    assert feeder.error is None, repr(feeder.error)
    assert len(hub.ids) >= 8 and hub.ids[:8] == [f"task-{i}" for i in range(8)]


def test_a_stopping_peer_stops_waiting_for_a_reply_that_never_comes():
    """A service whose launcher died gets SIGTERM while its request to the (also dead) hub is in flight: the
    stop flag ends the wait after the grace, not after the full timeout."""
    from asyncrl.net.peer import HubPeer

    hub = _Hub(drop=1)
    hub.start()
    stopping = threading.Event()
    peer = HubPeer(hub.endpoint, "learner-0", timeout_s=60.0, reconnect_s=60.0)
    peer.give_up = stopping.is_set
    threading.Timer(0.2, stopping.set).start()
    started = time.monotonic()
    try:
        peer.request(R.StatsRequest())
        raise AssertionError("a request nobody answered returned")
    except TimeoutError as e:
        assert "(stopping)" in str(e) and time.monotonic() - started < 60.0
    finally:
        peer.close()
        hub.done.set()
