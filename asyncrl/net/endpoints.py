"""Binding a ZeroMQ server socket to a configured endpoint; a tcp port of 0 means any free port (so that
two runs on one host never collide), and the endpoint actually bound is what peers are told.

`unix_endpoint` names a Unix-socket endpoint (ipc://) in the run directory: what a run whose services all
live on one host uses for its hub. The kernel moves a frame between two processes through a Unix socket
for less CPU than through TCP on loopback (`bench.replay --transport`: docs/benchmarks.md), and the socket
file has the run directory's permissions."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import zmq

UNIX_PATH_MAX = 107  # bytes of a Unix socket's path (sockaddr_un.sun_path is 108 with its terminating NUL)


def bind(sock: zmq.Socket, endpoint: str) -> str:
    """Bind `sock` to `endpoint` ("tcp://host:0": a free port); returns the endpoint actually bound."""
    if endpoint.startswith("tcp://") and endpoint.rsplit(":", 1)[1] == "0":
        endpoint = endpoint.rsplit(":", 1)[0] + ":*"
    sock.bind(endpoint)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def unix_endpoint(run_dir: str | Path, name: str) -> str | None:
    """ipc://RUN_DIR/NAME.sock (an absolute path, so every process resolves it alike), or None where a Unix socket
    cannot live there: a path too long for one, or a file system that refuses them (some network file systems);
    the caller then stays on TCP. Tried by binding a socket of another name in that directory once (a hub that
    is still serving on NAME.sock is never touched)."""
    path = os.path.abspath(os.path.join(run_dir, f"{name}.sock"))
    if len(path.encode()) > UNIX_PATH_MAX:
        return None
    probe_path = os.path.join(os.path.dirname(path), f".{os.getpid()}")  # no longer than NAME.sock
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.bind(probe_path)
    except OSError:
        return None
    finally:
        probe.close()
        if os.path.exists(probe_path):
            os.unlink(probe_path)
    return f"ipc://{path}"


def remove_unix_socket(endpoint: str) -> None:
    """Remove the socket file of an ipc:// endpoint this process bound and has closed (nothing for other kinds)."""
    if endpoint.startswith("ipc://"):
        try:
            os.unlink(endpoint[len("ipc://"):])
        except FileNotFoundError:
            pass
