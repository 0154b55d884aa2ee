"""The inet sockets of a process tree, read from /proc (Linux): who listens where, and who talks to whom.

    with SocketWatch(os.getpid()) as watch:   # samples every `interval_s` on a thread
        ... run something ...
    watch.foreign     # sockets seen with a non-loopback local or peer address (listeners on 0.0.0.0 / :: excluded)
    watch.listening   # {(process name, address)} of every listening socket seen

A sample misses a socket that opens and closes between two samples; what it sees is exact.
"""

from __future__ import annotations

import ipaddress
import os
import threading
from dataclasses import dataclass

TCP_LISTEN = "0A"


@dataclass(frozen=True, order=True)
class Sock:
    process: str  # the process's command line, shortened
    proto: str  # tcp, tcp6, udp, udp6
    listening: bool
    local: str
    remote: str


def _ip(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_addr)
    ip = ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))  # per-word host order
    return getattr(ip, "ipv4_mapped", None) or ip


def _local(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return ip.is_loopback or ip.is_unspecified


def _tree(root: int) -> list[int]:
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    tree, frontier = [root], [root]
    while frontier:
        frontier = [p for p, pp in parent.items() if pp in frontier]
        tree += frontier
    return tree


def _inodes(pid: int) -> set[int]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                out.add(int(link[8:-1]))
    except OSError:
        pass  # gone, or an fd closed while we looked
    return out


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:120].strip()
    except OSError:
        return str(pid)


def sockets(root: int) -> list[Sock]:
    owner = {inode: pid for pid in _tree(root) for inode in _inodes(pid)}
    out = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        with open(f"/proc/net/{proto}") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                inode = int(fields[9])
                if inode not in owner:
                    continue
                (lip, lport), (rip, rport) = (a.split(":") for a in fields[1:3])
                listening = proto.startswith("tcp") and fields[3] == TCP_LISTEN
                out.append(Sock(_name(owner[inode]), proto, listening, f"{_ip(lip)}:{int(lport, 16)}",
                                f"{_ip(rip)}:{int(rport, 16)}"))
    return out


def foreign(sock: Sock) -> bool:
    """A socket that is, or could carry, traffic off this machine's loopback."""
    local, remote = (_ip_of(a) for a in (sock.local, sock.remote))
    if sock.listening:
        return not _local(local)  # a listener on a non-loopback address (0.0.0.0 / :: are reported apart)
    return not (_local(local) and _local(remote))


def _ip_of(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    ip = ipaddress.ip_address(address.rsplit(":", 1)[0])
    return getattr(ip, "ipv4_mapped", None) or ip


class SocketWatch:
    def __init__(self, root: int, interval_s: float = 0.5) -> None:
        self.root, self.interval_s = root, interval_s
        self.seen: set[Sock] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="socket-watch", daemon=True)

    def __enter__(self) -> SocketWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.seen.update(sockets(self.root))

    @property
    def foreign(self) -> list[Sock]:
        return sorted(s for s in self.seen if foreign(s))

    @property
    def listening(self) -> set[tuple[str, str]]:
        return {(s.process, s.local) for s in self.seen if s.listening}
