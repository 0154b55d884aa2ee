"""Binding a ZeroMQ server socket to a configured endpoint; a tcp port of 0 means any free port (so that
two runs on one host never collide), and the endpoint actually bound is what peers are told."""

from __future__ import annotations

import zmq


def bind(sock: zmq.Socket, endpoint: str) -> str:
    """Bind `sock` to `endpoint` ("tcp://host:0": a free port); returns the endpoint actually bound."""
    if endpoint.startswith("tcp://") and endpoint.rsplit(":", 1)[1] == "0":
        endpoint = endpoint.rsplit(":", 1)[0] + ":*"
    sock.bind(endpoint)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)
