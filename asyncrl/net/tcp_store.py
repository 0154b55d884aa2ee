"""TCP stores (torch.distributed rendezvous) that listen on exactly the address the config names.

`dist.TCPStore(host, port, is_master=True)` listens on every interface whatever `host` says (checked on
torch 2.11 and 2.13: it binds `::`), so anyone who can reach the machine can read and write the store.
`bound_store` binds the listening socket itself (to `address`, loopback by default) and hands it to the
store (`master_listen_fd`); clients connect as usual with `dist.TCPStore(address, port)`.
"""

from __future__ import annotations

import datetime
import socket

import torch.distributed as dist


def bound_store(address: str, port: int, world_size: int, timeout_s: float) -> dist.TCPStore:
    """The server side of a store, listening on `address`:`port` only (port 0: any free port; see `.port`)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(512)
    bound_port = sock.getsockname()[1]
    fd = sock.detach()  # the store owns the listening socket from here on
    return dist.TCPStore(address, bound_port, world_size, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s), master_listen_fd=fd)


def client_store(address: str, port: int, world_size: int, timeout_s: float) -> dist.TCPStore:
    return dist.TCPStore(address, port, world_size, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
