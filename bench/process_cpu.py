"""CPU seconds of live processes and of their threads by kind, read from /proc (Linux): how `bench.replay`
charges the hub's one core to its loop, ZeroMQ's I/O thread and the journal's threads."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a live process has used (Linux), 0.0 where unknown."""
    try:
        return _stat_cpu(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, IndexError, ValueError):
        return 0.0


def _stat_cpu(stat: str) -> float:
    """User + system CPU seconds in the text of a /proc .../stat file (fields after the command's parenthesis)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of a live process's threads by kind (Linux): `loop` (the main thread: the hub's loop),
    `zmq` (libzmq's I/O threads, named ZMQbg/...), `journal` (the other live threads: the journal's writer);
    threads that already exited (snapshot writers) are not listed."""
    out = {"loop": 0.0, "zmq": 0.0, "journal": 0.0}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        kind = "loop" if int(tid) == pid else "zmq" if comm.startswith("ZMQ") else "journal"
        out[kind] += _stat_cpu(stat)
    return out


def sum_threads(hubs: list, minus: dict[str, float] | None = None) -> dict[str, float]:
    """`thread_cpu_seconds` of every (process, endpoint) in `hubs` added up by kind, less `minus` (a start)."""
    total = {"loop": 0.0, "zmq": 0.0, "journal": 0.0}
    for h, _ in hubs:
        for k, v in thread_cpu_seconds(h.pid).items():
            total[k] += v
    return {k: round(v - (minus or {}).get(k, 0.0), 3) for k, v in total.items()}
