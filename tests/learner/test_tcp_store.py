"""The learner's rendezvous store listens on the configured address only (read from /proc/net/tcp)."""

from __future__ import annotations

import sys

import pytest

from asyncrl.net.tcp_store import bound_store, client_store

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net/tcp")


def listening(port: int) -> list[str]:
    """Local addresses (hex, as the kernel writes them) of listening sockets on `port`."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                out.append(local.rsplit(":", 1)[0])
    return out


def test_bound_store_listens_on_loopback_only_and_serves_clients():
    store = bound_store("127.0.0.1", 0, 2, timeout_s=10)
    assert listening(store.port) == ["0100007F"]  # 127.0.0.1, not 0.0.0.0 or ::
    store.set("k", "v")
    assert client_store("127.0.0.1", store.port, 2, timeout_s=10).get("k") == b"v"


def test_weight_rendezvous_store_listens_on_loopback_only():
    from asyncrl.weights.group import host_store

    store = host_store("127.0.0.1", 2, timeout_s=10)
    assert listening(store.port) == ["0100007F"]
