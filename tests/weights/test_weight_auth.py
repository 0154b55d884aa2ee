"""The learner's weight socket admits only peers that prove a role of the run (issue 14: "no
authentication anywhere"): an unauthenticated peer's frames never reach the sender, a run member's do."""

import time

import pytest
import zmq

from asyncrl.net.credentials import Credentials, RunSecret
from asyncrl.weights.sender import WeightSender


def _send_and_pump(sender: WeightSender, sock: zmq.Socket, rounds: int = 20) -> None:
    for _ in range(rounds):
        try:
            sock.send_multipart([b"not msgpack at all"], zmq.NOBLOCK)  # a refused peer has no pipe to queue on
        except zmq.Again:
            pass
        sender.has_joins()  # pumps the socket
        time.sleep(0.02)


@pytest.mark.timeout(60)
def test_weight_socket_refuses_peers_without_the_run_secret(tmp_path):
    secret = RunSecret.ensure(tmp_path)
    sender = WeightSender("tcp://127.0.0.1:0", secret=secret, timeout_s=5.0)
    ctx = zmq.Context()
    try:
        stranger = ctx.socket(zmq.DEALER)
        stranger.setsockopt(zmq.LINGER, 0)
        stranger.connect(sender.endpoint)
        _send_and_pump(sender, stranger)
        impostor = ctx.socket(zmq.DEALER)  # right mechanism, wrong key
        impostor.setsockopt(zmq.LINGER, 0)
        Credentials(role="generator", key="00" * 32).apply(impostor, "g9", sender.endpoint)
        impostor.connect(sender.endpoint)
        _send_and_pump(sender, impostor)
        assert sender.rejected.total == 0  # nothing either sent got through the handshake
        assert sender.roster.zap.counters["refused"] >= 1

        member = ctx.socket(zmq.DEALER)
        member.setsockopt(zmq.LINGER, 0)
        Credentials.for_role(secret, "generator").apply(member, "g0", sender.endpoint)
        member.connect(sender.endpoint)
        _send_and_pump(sender, member)
        assert sender.rejected.total >= 1  # a run member's frames arrive (and garbage is counted)
    finally:
        ctx.destroy(linger=0)
        sender.close()
