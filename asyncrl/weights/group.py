"""A dedicated process group for the weight broadcast, built without the default process group.

One group per generator: the learner (rank 0) plus that generator's receiving rank(s) (rank_offset ..
world_size - 1). A dead generator then only breaks its own group; the others keep receiving.

Who blocks on what (every step has a timeout; the error names the side and what it waited for):

    learner (rank 0)                                   generator (rank r >= 1)
    host_store(address, port=0) -> port   (no wait)
    send WeightGroupInit(port) over ZeroMQ  ------->   connect_store(address, port)    (waits for the store)
    WeightGroup(store, rank=0)                         WeightGroup(store, rank=r)
      gloo: blocks until every rank has connected        (same)
      nccl: returns at once (no communicator yet)        (same)
    ... WeightBucket announced over ZeroMQ FIRST ... ->  (reads it)
    broadcast #1: nccl creates the communicator   <==>  broadcast #1: same; BOTH ranks must be inside
      (blocks until every rank is inside it)             ncclCommInitRank at once, so neither side may wait
                                                         on a ZeroMQ message from the other while in it
    broadcast #k>1: enqueued on NCCL's stream, returns; `wait` polls the work until done or timeout

NCCL creates its communicator lazily at the first collective (SGLang's ranks join the same way: no barrier,
no eager init), and that call blocks the caller until every rank is in it. So the first broadcast runs on
a helper thread (with the caller's CUDA device set in it: a new thread starts on cuda:0) and the caller
waits at most `timeout_s` for it (`WeightGroupError` "... rank r waited ... for the other ranks to enter
the first broadcast"). A communicator whose peer never arrives keeps that helper thread until `close`
aborts the group. Later broadcasts are issued from the caller's thread only, never concurrently with
another collective on the same group.

How it is built (checked on torch 2.11 and 2.13): a `TCPStore` (the learner hosts it, port 0 = any free
port), wrapped in `PrefixStore`s, and the backend class constructed directly: `ProcessGroupGloo(store, rank,
size, timeout=...)` or `ProcessGroupNCCL(store, rank, size, options)`. Collectives go straight to that
backend object (`backend.broadcast([t], opts)`), so nothing is registered in torch.distributed's global
world: no default group is needed or touched, group names never collide, and an FSDP default group with a
bound device is never used as a split source (which `_new_process_group_helper` would try).
The store prefixes are exactly the ones `_new_process_group_helper` uses when called as SGLang's
`init_custom_process_group` calls it (PrefixStore(name) -> "<name>/" -> "<device>/"), so an SGLang
scheduler rank that joins with that helper meets this group in the same store (tests/weights/test_group.py
checks this against the helper over gloo).

Timeouts: gloo enforces the group timeout on every operation. NCCL's watchdog would tear the whole
process down when an operation outlives the group timeout, so the NCCL group timeout is set well above
ours: `wait` gives up after `timeout_s` and `close` aborts this group's communicator only (which unblocks
its stream); the process's default group and every other weight group are untouched.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from asyncrl.net.nccl_env import set_nccl_defaults

BACKENDS = ("gloo", "nccl")
_STORE_DEVICE = {"gloo": "cpu", "nccl": "cuda"}  # first device of torch's BackendConfig for the backend
_NCCL_TIMEOUT_SLACK_S = 300.0
T = TypeVar("T")


def poll(done: Callable[[], bool], timeout_s: float, give_up: Callable[[], bool] | None = None) -> str:
    """Host-side wait for `done()` (a transfer or a copy on the GPU): "" once it is, "stopping" as soon as
    `give_up()`, "timeout" after timeout_s. Sleeps 20 us doubling to 0.5 ms between asks: a bucket takes ~1 ms on
    NVLink, so waking late costs push time, and polling without sleeping costs one core."""
    deadline = time.monotonic() + timeout_s
    pause = 2e-5
    while not done():
        if give_up is not None and give_up():
            return "stopping"
        if time.monotonic() > deadline:
            return "timeout"
        time.sleep(pause)
        pause = min(pause * 2, 5e-4)
    return ""


class WeightGroupError(RuntimeError):
    """A weight group could not be created, or an operation on it failed or timed out."""


def _td(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def host_store(address: str, world_size: int, timeout_s: float, port: int = 0) -> dist.TCPStore:
    """Learner side: start the rendezvous store listening on `address` only (a plain TCPStore listens on
    every interface); returns at once, `.port` is the port it got."""
    from asyncrl.net.tcp_store import bound_store

    return bound_store(address, port, world_size, timeout_s)


def connect_store(address: str, port: int, world_size: int, timeout_s: float) -> dist.TCPStore:
    """Generator side: connect to the learner's store (waits up to `timeout_s` for it)."""
    try:
        return dist.TCPStore(address, port, world_size, is_master=False, timeout=_td(timeout_s), wait_for_workers=False)
    except Exception as e:
        raise WeightGroupError(f"cannot reach the weight store at {address}:{port}: {e}") from e


class WeightGroup:
    """One standalone process group (learner = rank 0) that broadcasts flat weight buckets."""

    def __init__(self, store: dist.Store, *, group_name: str, rank: int, world_size: int, backend: str, timeout_s: float):
        if backend not in BACKENDS:
            raise ValueError(f"weight group backend {backend!r}: must be one of {BACKENDS}")
        if not 0 <= rank < world_size:
            raise ValueError(f"weight group rank {rank} outside world_size {world_size}")
        self.group_name, self.rank, self.world_size, self.backend = group_name, rank, world_size, backend
        self.timeout_s = timeout_s
        self._connected = False
        self._store = store  # keep the TCPStore (the learner's hosts the server) alive with the group
        prefix = dist.PrefixStore(group_name, store)
        prefix = dist.PrefixStore(f"{_STORE_DEVICE[backend]}/", dist.PrefixStore(f"{group_name}/", prefix))
        try:
            self._pg: Any = _make_backend(backend, prefix, rank, world_size, timeout_s)
        except Exception as e:
            raise WeightGroupError(f"weight group {group_name!r} rank {rank}/{world_size} ({backend}): {e}") from e

    @property
    def connected(self) -> bool:
        """Whether a first broadcast completed its launch (an NCCL communicator exists)."""
        return self._connected

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> Any:
        """Start broadcasting `tensor` from rank `src`; returns the work to pass to `wait`.

        The first call may block until every rank is inside it (NCCL creates its communicator there): it
        runs on a helper thread and gives up after `timeout_s`."""
        pg = self._pg
        if pg is None:
            raise WeightGroupError(f"weight group {self.group_name!r} rank {self.rank}: broadcast on a closed group")
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        try:
            if self._connected:
                return pg.broadcast([tensor], opts)
            work = run_bounded(lambda: pg.broadcast([tensor], opts), self.timeout_s, tensor.device,
                               f"weight group {self.group_name!r} rank {self.rank}/{self.world_size} waited for the "
                               f"other ranks to enter the first broadcast ({self.backend} connects there)")
            self._connected = True
            return work
        except WeightGroupError:
            raise
        except Exception as e:
            raise WeightGroupError(f"weight group {self.group_name!r}: broadcast failed: {e}") from e

    def wait(self, work: Any, timeout_s: float, give_up: Callable[[], bool] | None = None) -> None:
        """Block until `work` is done; WeightGroupError on failure, after `timeout_s`, or as soon as `give_up()`
        (e.g. the learner is stopping: a peer that died with the launcher is not waited for)."""
        why = poll(work.is_completed, timeout_s, give_up)
        if why == "stopping":
            raise WeightGroupError(f"weight group {self.group_name!r} rank {self.rank}: stopping, not waiting")
        if why == "timeout":
            raise WeightGroupError(f"weight group {self.group_name!r} rank {self.rank}/{self.world_size}: broadcast "
                                   f"timed out after {timeout_s:.1f}s (a peer is gone or never posted its side)")
        try:
            work.wait()  # raises the backend's error; on CUDA, orders the current stream after it
        except Exception as e:
            raise WeightGroupError(f"weight group {self.group_name!r}: broadcast failed: {e}") from e

    def close(self) -> None:
        """Abort pending work and release the group without blocking the caller.

        Dropping a gloo group with an operation still pending joins its worker threads, which can take up
        to the group timeout; that happens on a daemon thread instead."""
        pg, self._pg = getattr(self, "_pg", None), None
        store, self._store = getattr(self, "_store", None), None
        if pg is None:
            return
        try:
            pg.abort()
        except Exception:
            pass
        holder = [pg, store]
        threading.Thread(target=holder.clear, name=f"close-{self.group_name}", daemon=True).start()


def run_bounded(fn: Callable[[], T], timeout_s: float, device: torch.device | None, what: str) -> T:
    """Run `fn` on a daemon thread (with `device` current there) and wait at most `timeout_s` for it.

    For calls that block inside a library with no timeout of their own (NCCL communicator creation). On
    timeout the thread is left behind (aborting its group releases it) and WeightGroupError says `what`."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            if device is not None and device.type == "cuda":
                torch.cuda.set_device(device)  # a new thread starts on cuda:0
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
            box["error"] = e

    thread = threading.Thread(target=body, name="weights-bounded", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise WeightGroupError(f"{what}: timed out after {timeout_s:.1f}s")
    if "error" in box:
        raise WeightGroupError(f"{what}: {box['error']}") from box["error"]
    return box["value"]


def _make_backend(backend: str, store: dist.Store, rank: int, world_size: int, timeout_s: float) -> Any:
    if backend == "gloo":
        pg = dist.ProcessGroupGloo(store, rank, world_size, timeout=_td(timeout_s))
    else:
        if not dist.is_nccl_available():
            raise WeightGroupError("this torch build has no NCCL; use backend='gloo'")
        set_nccl_defaults()
        opts = dist.ProcessGroupNCCL.Options()
        opts.is_high_priority_stream = False
        opts._timeout = _td(timeout_s + _NCCL_TIMEOUT_SLACK_S)
        pg = dist.ProcessGroupNCCL(store, rank, world_size, opts)
    if hasattr(pg, "_set_sequence_number_for_group"):
        pg._set_sequence_number_for_group()  # as the helper does, so a helper-built peer stays in step
    return pg
