"""Generator side of the weight push: `WeightReceiver` applies the learner's updates to one engine.

The generator loop calls `poll()` between decode steps. With nothing pending it returns None at once.
When an update begins, poll() runs the whole update before returning (the engine is paused meanwhile):

    learner                              WeightReceiver.poll()                       engine
    WeightGroupInit ------------------>  join the group (blocks <= timeout_s), Ack
    WeightBegin(v, mode) ------------->  _update:                                    pause(mode) -> aborted outputs
                                                                                     begin_weight_update()
    WeightBucket + bytes (per bucket) ->   post the transfer at once; load the oldest   load_weights(views)
                                           posted bucket when its bytes are there
                                  <----    Ack(bucket i)
    WeightEnd(v) --------------------->                                              end_weight_update(v)
                                                                                     resume()
                                  <----    Ack(end, timings)   -> UpdateResult(version=v, aborted=[...])

A CUDA IPC bucket is read in place, so the engine's stream is synchronized before its Ack (which waits for
the decode step in flight too), and again after end_weight_update; staged (generator.ipc_staging, cuda_ipc.py)
each bucket is copied out on a side stream first and neither wait happens.

Each wait for the learner has a timeout whose error says what the generator waited for. If the update
fails (learner gone, bad bucket, load error) the engine stays paused with its update session open (its
weights are partly new, so it must not generate), the group is closed, and the receiver joins again: the
learner's next push or serve_joins() is a full push that completes the session. A failed group join (store
unreachable, group name refused, timeout) is answered with Ack(ok=False) and retried: the next WeightJoin
goes out from poll() after a backoff that doubles per consecutive failure (0.5 s .. 30 s) and resets after
a completed update. `ready` says whether the engine holds a complete set of weights; a generator takes
prompts only while it is True.

Who is inside the broadcast when (NCCL): the receiver enters its side of bucket i's broadcast only after
reading that bucket's WeightBucket; the learner announces first and launches after (transport.py), so the
first broadcast, which creates the communicator, has both sides inside it. Frames that are not a readable
learner message are counted in `rejected` and skipped (during an update too).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
import zmq

from asyncrl import wire
from asyncrl.net.credentials import Credentials
from asyncrl.engine.bucket_layout import BucketLayout, unflatten
from asyncrl.engine.protocol import Engine, GenerationOutput
from asyncrl.records import Ack, WeightBegin, WeightBucket, WeightEnd, WeightGroupInit, WeightJoin
from asyncrl.weights.cuda_ipc import IpcTransport, gpu_uuid
from asyncrl.weights.group import WeightGroup, connect_store
from asyncrl.weights.inbox import Rejections, bound_socket, read_message
from asyncrl.weights.transport import BroadcastTransport, BucketLoader, DirectReceiver, Receiving, WeightTransport

log = logging.getLogger(__name__)

_FROM_LEARNER = (WeightGroupInit, WeightBegin, WeightBucket, WeightEnd, Ack)
REJOIN_BACKOFF_S = (0.5, 30.0)  # first retry after a failed join, cap (doubling in between)
RECEIVE_WINDOW = 4  # buckets posted and not yet loaded (a bound; the learner's window decides how many come)


@dataclass(kw_only=True, slots=True)
class UpdateResult:
    """What one poll() that ran an update did."""

    ok: bool
    version: int  # the engine's weight version afterwards
    aborted: list[GenerationOutput] = field(default_factory=list)  # pause('abort'): return these prompts to the hub
    error: str = ""
    timings: dict[str, float] = field(default_factory=dict)  # pause_s, recv_s, load_s, paused_s


class WeightUpdateError(RuntimeError):
    pass


class WeightReceiver:
    def __init__(
        self,
        learner_endpoint: str,
        generator_name: str,
        device: str | torch.device,
        engine: Engine,
        *,
        host: str = "127.0.0.1",
        timeout_s: float = 60.0,
        max_bucket_bytes: int | None = None,
        credentials: Credentials | None = None,
        ipc_staging: bool = False,
    ):
        """host: this generator's address as the learner sees it. max_bucket_bytes: refuse bigger buckets.
        credentials: the run role this receiver proves to the learner's weight socket (None: none asked).
        ipc_staging: on a CUDA IPC link, copy each bucket out on a side stream and never wait for the engine's
        stream (generator.ipc_staging; `_end_update`)."""
        self.name, self.device, self.engine = generator_name, torch.device(device), engine
        self.host, self.timeout_s, self.max_bucket_bytes = host, timeout_s, max_bucket_bytes
        self.ipc_staging = ipc_staging
        self._transport: WeightTransport | None = None
        self._session_open = False  # begin_weight_update() ran and end_weight_update() did not yet
        self._rejoin_at: float | None = None  # monotonic time of the next WeightJoin after a failed join
        self._backoff_s = REJOIN_BACKOFF_S[0]
        self.rejected = Rejections(f"weight receiver {generator_name}")
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        bound_socket(self._sock)
        if credentials is not None:
            credentials.apply(self._sock, generator_name, learner_endpoint)
        self._sock.connect(learner_endpoint)
        self.join()

    @property
    def version(self) -> int:
        return self.engine.weight_version

    @property
    def mid_update(self) -> bool:
        """A failed update left the engine paused inside its weight update (`_update`): no complete version
        until the next update, which the rejoin brings, completes it. The worker does not step meanwhile."""
        return self._session_open

    @property
    def ready(self) -> bool:
        """Joined, and the engine holds one complete weight version (no update half done)."""
        return self._transport is not None and not self._session_open

    def join(self) -> None:
        """Ask the learner for weights (done on start; again after a failed or missed update)."""
        self._send(WeightJoin(generator=self.name, weight_version=self.version, device=str(self.device),
                              host=self.host, gpu_uuid=gpu_uuid(self.device),
                              receiving_ranks=self.engine.receiving_ranks()))

    def poll(self, timeout_s: float = 0.0) -> UpdateResult | None:
        """Handle pending learner messages; runs a whole update if one begins. None when none ran."""
        self._rejoin_if_due()
        wait_ms = int(timeout_s * 1000)
        while self._sock.poll(wait_ms):
            wait_ms = 0
            msg = self._recv_now()
            if isinstance(msg, WeightGroupInit):
                with self._on_device():
                    self._join_group(msg)
            elif isinstance(msg, WeightBegin):
                with self._on_device():
                    return self._update(msg)
            elif isinstance(msg, Ack) and msg.info.get("stage") == "dropped":
                self._on_dropped(str(msg.info.get("error", "")))
            elif msg is not None:
                self.rejected.add("outside_update", f"{type(msg).__name__} outside an update")
        return None

    def close(self) -> None:
        self._close_transport()
        self._sock.close(0)

    def _on_device(self) -> contextlib.AbstractContextManager:
        """This generator's CUDA device is current while it joins and receives, whichever thread polls
        (torch's current device is per thread, and a new thread starts on cuda:0)."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    # ------------------------------------------------------------------ the update (one place)

    def _update(self, begin: WeightBegin) -> UpdateResult:
        """pause -> begin -> per bucket (receive, load, ack) -> end(version) -> resume -> ack."""
        t0 = time.perf_counter()
        timings = {"pause_s": 0.0, "recv_s": 0.0, "load_s": 0.0, "apply_s": 0.0}
        aborted: list[GenerationOutput] = []
        try:
            if self._transport is None:
                raise WeightUpdateError("update began before this generator joined a weight group")
            if not self._session_open:  # else a failed update left it paused and open: complete that one
                aborted = self.engine.pause(begin.pause_mode)
                timings["pause_s"] = time.perf_counter() - t0
                self.engine.begin_weight_update()
                self._session_open = True
            self._receive_buckets(begin.version, timings)
            self._end_update(begin.version, timings)
            self._session_open = False
            self.engine.resume()
        except Exception as e:
            log.warning("weights: %s failed update to v%d: %s", self.name, begin.version, e)
            self._fail(str(e))
            return UpdateResult(ok=False, version=self.version, aborted=aborted, error=str(e), timings=timings)
        timings["paused_s"] = time.perf_counter() - t0
        self._backoff_s = REJOIN_BACKOFF_S[0]
        self._send(Ack(info={"stage": "end", "version": begin.version, **timings}))
        return UpdateResult(ok=True, version=begin.version, aborted=aborted, timings=timings)

    def _receive_buckets(self, version: int, timings: dict[str, float]) -> None:
        """Post each announced bucket's transfer as soon as it is announced (at most RECEIVE_WINDOW posted),
        load the oldest once its bytes are there, ack it; WeightEnd closes the update after the last load."""
        pending: deque[_Posted] = deque()
        index = 0
        while True:
            msg = self._next_message(pending)
            if msg is None:  # the oldest posted bucket is there (or the window is full): load it
                self._finish(pending.popleft(), version, timings)
                continue
            if isinstance(msg, WeightEnd):
                if msg.version != version:
                    raise WeightUpdateError(f"WeightEnd for v{msg.version} inside the update to v{version}")
                while pending:
                    self._finish(pending.popleft(), version, timings)
                return  # _end_update waits for the loads, with what end_weight_update queues behind them
            if not isinstance(msg, WeightBucket) or msg.version != version:
                raise WeightUpdateError(f"expected WeightBucket/WeightEnd of v{version}, got {_describe(msg)}")
            posted = self._post(msg, index, timings)
            if posted is not None:
                pending.append(posted)
            else:
                self._send(Ack(info={"stage": "bucket", "version": version, "bucket": index}))
            index += 1

    def _end_update(self, version: int, timings: dict[str, float]) -> None:
        """end_weight_update (a LoRA engine merges its adapters there, an FP8 one requantizes), then wait for the
        device: every load and that work landed before the Ack (the learner may reuse what was read) and inside
        the paused time (the next decode step would wait for it on the stream anyway). apply_s: the two.
        Staged IPC buckets were copied out before their Acks, so nothing is waited for: the engine resumes while
        its stream still runs the step in flight, the loads and that work, in that order; the paused time is then
        the host's work only, and what the push costs the GPU is not in it."""
        t = time.perf_counter()
        self.engine.end_weight_update(version)
        staged = isinstance(self._transport, IpcTransport) and self._transport.stage
        if self.device.type == "cuda" and not staged:
            torch.cuda.current_stream(self.device).synchronize()
        timings["apply_s"] = time.perf_counter() - t

    def _next_message(self, pending: deque[_Posted]) -> Any:
        """The next learner message, or None once the oldest posted bucket's bytes arrived (or the window is
        full). Waits at most timeout_s with nothing posted."""
        if not pending:
            return self._recv(self.timeout_s)
        if len(pending) >= RECEIVE_WINDOW:
            return None
        deadline = time.monotonic() + self.timeout_s
        pause = 2e-5
        while time.monotonic() < deadline:
            if self._sock.poll(0):
                msg = self._read_one()
                if msg is not None:
                    return msg
            elif pending[0].receiving.ready():
                return None
            else:
                time.sleep(pause)
                pause = min(pause * 2, 5e-4)
        return None  # _finish's wait reports the timeout

    def _post(self, bucket: WeightBucket, index: int, timings: dict[str, float]) -> _Posted | None:
        """Enter this side of the bucket's transfer (None: a DirectReceiver engine received and loaded it)."""
        layout = BucketLayout.of(bucket)
        layout.validate(self.max_bucket_bytes)
        t = time.perf_counter()
        if isinstance(self.engine, DirectReceiver):  # the engine's own ranks receive and load
            self.engine.receive_bucket(bucket)
            timings["load_s"] += time.perf_counter() - t
            return None
        assert self._transport is not None
        receiving = self._transport.post(bucket, self.device)
        timings["recv_s"] += time.perf_counter() - t
        return _Posted(index=index, layout=layout, receiving=receiving)

    def _finish(self, posted: _Posted, version: int, timings: dict[str, float]) -> None:
        """Wait for the bucket's bytes, load them into the engine, ack."""
        assert self._transport is not None
        t = time.perf_counter()
        flat = posted.receiving.result(self.timeout_s)
        t1 = time.perf_counter()
        timings["recv_s"] += t1 - t
        if isinstance(self.engine, BucketLoader):  # it takes the flat buffer and its layout (_post validated it)
            self.engine.load_bucket(flat, posted.layout)
        else:
            self.engine.load_weights(unflatten(flat, posted.layout, validated=True))
        if flat.is_cuda and self._transport.reads_in_place:
            torch.cuda.current_stream(flat.device).synchronize()  # done reading the learner's buffer before the Ack
        del flat  # a received buffer is reused in stream order after the copies that read it
        timings["load_s"] += time.perf_counter() - t1
        self._send(Ack(info={"stage": "bucket", "version": version, "bucket": posted.index}))

    # ------------------------------------------------------------------ membership

    def _join_group(self, init: WeightGroupInit) -> None:
        self._close_transport()
        try:
            self._transport = self._make_transport(init)
        except Exception as e:
            log.warning("weights: %s could not join group %s: %s (joining again in %.1fs)",
                        self.name, init.group_name, e, self._backoff_s)
            self._send(Ack(ok=False, info={"stage": "group", "error": str(e)}))
            self._schedule_rejoin()
            return
        self._send(Ack(info={"stage": "group", "group": init.group_name}))

    def _schedule_rejoin(self) -> None:
        """Join again after a backoff that doubles with each consecutive failure (reset by an update)."""
        self._rejoin_at = time.monotonic() + self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, REJOIN_BACKOFF_S[1])

    def _rejoin_if_due(self) -> None:
        if self._rejoin_at is not None and time.monotonic() >= self._rejoin_at:
            self._rejoin_at = None
            self.join()

    def _make_transport(self, init: WeightGroupInit) -> WeightTransport:
        if isinstance(self.engine, DirectReceiver):
            self.engine.init_weights_group(init)
            return _Direct(self.engine)
        if init.backend == "ipc":
            return IpcTransport(stage=self.ipc_staging)
        if init.world_size != 2 or init.rank_offset != 1:
            raise ValueError(f"group {init.group_name}: one receiving rank expected, got rank_offset={init.rank_offset} world_size={init.world_size}")
        if init.backend == "nccl" and self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        store = connect_store(init.master_address, init.master_port, init.world_size, self.timeout_s)
        group = WeightGroup(store, group_name=init.group_name, rank=init.rank_offset, world_size=init.world_size,
                            backend=init.backend, timeout_s=self.timeout_s)
        return BroadcastTransport(group, self.timeout_s)

    def _fail(self, error: str) -> None:
        try:  # before closing the group, which breaks the learner's transfers: it then reads why
            self._send(Ack(ok=False, info={"stage": "update", "error": error}))
        except zmq.ZMQError:
            pass
        self._close_transport()
        self._schedule_rejoin()

    def _on_dropped(self, reason: str) -> None:
        if self._transport is None:
            return  # already rejoining (the notice answers an Ack(ok=False) we sent)
        log.warning("weights: learner dropped %s (%s); joining again", self.name, reason)
        self._close_transport()
        self.join()

    def _close_transport(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()

    # ------------------------------------------------------------------ messages

    def _send(self, msg: Any) -> None:
        self._sock.send(wire.encode(msg))

    def _recv_now(self) -> Any:
        """One waiting message, or None (nothing waiting, or a bad frame: counted in `rejected`)."""
        got = read_message(self._sock, routed=False, allowed=_FROM_LEARNER, rejections=self.rejected)
        return None if got is None else got[1]

    def _recv(self, timeout_s: float) -> Any:
        """The next readable learner message inside an update; bad frames are counted and skipped."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sock.poll(int(left * 1000)):
                raise WeightUpdateError(f"generator waited {timeout_s:.1f}s for the learner's next WeightBucket/"
                                        "WeightEnd during an update; the learner sent nothing readable")
            msg = self._read_one()
            if msg is not None:
                return msg

    def _read_one(self) -> Any:
        """One waiting message inside an update (None: a bad frame, counted); the learner's drop notice raises."""
        msg = self._recv_now()
        if isinstance(msg, Ack) and msg.info.get("stage") == "dropped":
            raise WeightUpdateError(f"learner dropped this generator: {msg.info.get('error', '')}")
        return msg


@dataclass(kw_only=True, slots=True)
class _Posted:
    """A bucket whose transfer this side entered; loaded once its bytes are there."""

    index: int
    layout: BucketLayout
    receiving: Receiving


class _Direct:
    """Transport stand-in for a DirectReceiver engine: the engine itself is the group member."""

    kind = "direct"
    reads_in_place = False

    def __init__(self, engine: DirectReceiver):
        self.engine = engine

    def start(self, flat: torch.Tensor) -> Any:
        raise NotImplementedError("a DirectReceiver link only receives")

    def post(self, bucket: WeightBucket, device: torch.device) -> Receiving:
        raise NotImplementedError("a DirectReceiver engine receives in receive_bucket()")

    def close(self) -> None:
        self.engine.destroy_weights_group()


def _describe(msg: Any) -> str:
    return type(msg).__name__ if msg is not None else "an unreadable frame"
