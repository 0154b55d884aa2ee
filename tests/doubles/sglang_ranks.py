"""The double's scheduler ranks: one child process per TP rank, as in SGLang (docs/sglang.md).

Each rank joins weight-update groups at `rank_offset + tp_rank` and receives broadcasts into fresh
tensors. They are processes rather than threads because torch registers process groups by name per
process, and the learner side of a test joins the same group name from the test process.

    double HTTP thread ──cmd──► rank process r (Pipe) ──gloo──► learner rank 0 (test process)
                       ◄─reply─

The double sends every command to all ranks before reading any reply, so the ranks meet the learner
concurrently. Every wait has a timeout; a rank that does not answer in time is reported as failed.
"""

from __future__ import annotations

import multiprocessing as mp
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from tests.doubles.process_group import join_group, leave_group

_REPLY_MARGIN_S = 15.0  # covers spawning the rank processes on first use


class FakeRanks:
    def __init__(self, tp_size: int, timeout_s: float) -> None:
        self.tp_size = tp_size
        self.timeout_s = timeout_s
        self._conns: list[Any] = []
        self._procs: list[Any] = []

    def init_group(
        self, *, master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> None:
        self._all(
            "init",
            [
                {
                    "master_address": master_address,
                    "master_port": master_port,
                    "rank": rank_offset + r,
                    "world_size": world_size,
                    "group_name": group_name,
                    "backend": backend,
                    "timeout_s": self.timeout_s,
                }
                for r in range(self.tp_size)
            ],
        )

    def receive(
        self, group_name: str, dtypes: list[torch.dtype], shapes: list[list[int]], flattened: bool
    ) -> list[torch.Tensor]:
        """The tensors of one update as rank 0 received them (all ranks must agree)."""
        kw = {
            "group_name": group_name,
            "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
            "shapes": shapes,
            "flattened": flattened,
            "timeout_s": self.timeout_s,
        }
        per_rank = self._all("recv", [kw] * self.tp_size)
        tensors = [_from_wire(*w) for w in per_rank[0]]
        for other in per_rank[1:]:
            if any(not torch.equal(a, _from_wire(*w)) for a, w in zip(tensors, other, strict=True)):
                raise RuntimeError("TP ranks received different tensors")
        return tensors

    def destroy(self, group_name: str) -> None:
        self._all("destroy", [{"group_name": group_name}] * self.tp_size)

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(("stop", {}))
            except OSError:
                pass
        for p in self._procs:
            p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
        self._conns, self._procs = [], []

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        for r in range(self.tp_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_rank_main, args=(child, r), name=f"sglang-double-rank{r}", daemon=True)
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)

    def _all(self, cmd: str, kwargs: list[dict]) -> list[Any]:
        if not self._procs:
            self._start()
        for conn, kw in zip(self._conns, kwargs, strict=True):
            conn.send((cmd, kw))
        replies = []
        for r, conn in enumerate(self._conns):
            if not conn.poll(self.timeout_s + _REPLY_MARGIN_S):
                self.close()  # replies would be out of step; the next command starts fresh ranks
                raise RuntimeError(f"fake TP rank {r} did not answer {cmd!r} in time")
            status, value = conn.recv()
            replies.append((status, value))
        errors = [v for s, v in replies if s != "ok"]
        if errors:
            raise RuntimeError(errors[0])
        return [v for _, v in replies]


def _rank_main(conn: Any, tp_rank: int) -> None:
    torch.set_num_threads(1)
    groups: dict[str, dist.ProcessGroup] = {}
    while True:
        cmd, kw = conn.recv()
        if cmd == "stop":
            return
        try:
            conn.send(("ok", _handle(groups, cmd, kw)))
        except Exception as e:  # noqa: BLE001  (reported; the double answers success=false)
            conn.send(("error", f"{type(e).__name__}: {e}"))


def _handle(groups: dict[str, dist.ProcessGroup], cmd: str, kw: dict) -> Any:
    if cmd == "init":  # a taken name: torch raises after the rendezvous, as in SGLang
        groups[kw["group_name"]] = join_group(**kw)
        return None
    if cmd == "destroy":
        leave_group(groups.pop(kw["group_name"]))
        return None
    if cmd == "recv":
        return [
            _to_wire(t)
            for t in _receive(groups[kw["group_name"]], **{k: v for k, v in kw.items() if k != "group_name"})
        ]
    raise ValueError(f"unknown command {cmd!r}")


def _receive(
    pg: dist.ProcessGroup, dtypes: list[str], shapes: list[list[int]], flattened: bool, timeout_s: float
) -> list[torch.Tensor]:
    """SGLang's receive (§4.4): one broadcast per tensor in list order, or one uint8 bucket."""
    dts = [getattr(torch, d) for d in dtypes]
    if not flattened:
        tensors = [torch.empty(s, dtype=d) for s, d in zip(shapes, dts, strict=True)]
        works = [dist.broadcast(t, src=0, group=pg, async_op=True) for t in tensors]
    else:
        sizes = [torch.Size(s).numel() * d.itemsize for s, d in zip(shapes, dts, strict=True)]
        bucket = torch.empty(sum(sizes), dtype=torch.uint8)
        works = [dist.broadcast(bucket, src=0, group=pg, async_op=True)]
        tensors, off = [], 0
        for size, s, d in zip(sizes, shapes, dts, strict=True):
            tensors.append(bucket[off : off + size].view(d).reshape(s))
            off += size
    for w in works:
        w.wait(timeout=timedelta(seconds=timeout_s))
    return tensors


def _to_wire(t: torch.Tensor) -> tuple[bytes, str, list[int]]:
    return (
        t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(),
        str(t.dtype).removeprefix("torch."),
        list(t.shape),
    )


def _from_wire(data: bytes, dtype: str, shape: list[int]) -> torch.Tensor:
    dt = getattr(torch, dtype)
    if not data:
        return torch.empty(shape, dtype=dt)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dt).reshape(shape)
