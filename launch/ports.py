"""Free TCP ports on this host, picked by binding port 0 (the launcher's own host, or a Ray node's actor)."""

from __future__ import annotations

import socket


def free_ports(addresses: list[str]) -> list[int]:
    """One free port per address, all different: every socket stays bound until all are picked."""
    socks = []
    try:
        for address in addresses:
            s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
            socks.append(s)
            s.bind((address, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str) -> int:
    return free_ports([host])[0]
