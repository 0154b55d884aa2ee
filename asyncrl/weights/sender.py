"""Learner side of the weight push: `WeightSender` pushes bucketed weights to every joined generator.

One ZeroMQ ROUTER (bound by the learner) carries the control messages; each generator's DEALER connects.
The bytes go by a per-generator transport (broadcast on that generator's own group, or CUDA IPC).

    generator                               learner (rank 0; the only caller of this class)
    WeightJoin(version, device, gpu) ---->  queued; admitted at the next push() / serve_joins()
             <---- WeightGroupInit          host store, build the group (link.py) (both block <= timeout_s)
    Ack(stage=group) ---------------------> member
             <---- WeightBegin(v, mode)     generator pauses its engine, opens the update
             <---- WeightBucket i           then the bucket's bytes (broadcast or IPC) ... per bucket:
    Ack(stage=bucket, i) -----------------> generator loaded bucket i (read as it comes, not waited for)
             <---- WeightEnd(v)             generator closes the update, resumes
    Ack(stage=end, timings) --------------> push() returns a PushReport

Backpressure: at most `window` buckets are in flight. The learner gathers, announces and launches bucket
i+1 while bucket i moves, and before gathering bucket i+window it waits until bucket i's bytes are
delivered (CUDA IPC: until the generator acked it, since it reads the learner's buffer in place). So a
push holds at most `window` buckets of memory on each side, and the transfers run back to back: the
generator posts its side of bucket i+1 before it loads bucket i (receiver.py). A small push (LoRA adapters:
`push(..., gather_first=True)`) is packed whole before WeightBegin instead, so the generators stay paused only
for the transfers and their loads, not for the learner's gather.

The learner blocks only inside push()/serve_joins(), and never longer than `timeout_s` per step. A
generator that times out, errors, or dies is dropped (its group closed, told so if it still listens: it
then rejoins and gets a full push); the others carry on. A push is a full push (every tensor the engine
needs), so a joiner that is behind is synced by the next push() or, sooner, by serve_joins() which the
learner loop calls between steps (a new generator holds off taking prompts until its first update is done).
The one exception is an adapter-only push with LoRA (`push(..., admit=False)`: A and B only, which the
engine applies to the base it keeps): it goes to members only, and joiners get their full push (the base and
the adapters) from serve_joins().

FSDP: every rank iterates the (name, full tensor) stream, because `full_tensor()` is a collective; rank 0
calls push(), the other ranks call `drain()`. For serve_joins(), rank 0 decides (`has_joins()`) and the
learner shares that bool over its own group so every rank knows whether to iterate.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import zmq

from asyncrl import wire

from asyncrl.engine.bucket_layout import BucketLayout
from asyncrl.net import endpoints
from asyncrl.records import Ack, WeightBegin, WeightBucket, WeightEnd, WeightJoin
from asyncrl.weights.bucket import DEFAULT_BUCKET_BYTES, drain, iter_buckets
from asyncrl.weights.cuda_ipc import gpu_uuid
from asyncrl.weights.inbox import Rejections, bound_socket, read_message
from asyncrl.weights.link import start_link
from asyncrl.weights.member import MAX_PENDING_JOINS, Member, check_join, reported_failure, take_ack
from asyncrl.weights.report import PushReport
from asyncrl.weights.transport import Sending
from asyncrl.net.zap import ZapHandler

log = logging.getLogger(__name__)

NamedTensors = Iterable[tuple[str, torch.Tensor]]


@dataclass(kw_only=True, slots=True)
class _InFlight:
    """A bucket announced and launched to `sendings`' members, its bytes perhaps still moving."""

    index: int
    flat: torch.Tensor  # uint8 [nbytes], kept alive until retired
    sendings: list[tuple[Member, Sending]]


class WeightSender:
    def __init__(
        self,
        endpoint: str,
        *,
        device: str | torch.device = "cpu",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        pause_mode: str = "continue",
        master_address: str = "127.0.0.1",
        timeout_s: float = 60.0,
        secret: bytes | None = None,
        dtype: torch.dtype | None = None,
        window: int = 3,
    ):
        """endpoint: ZeroMQ address to bind ("tcp://127.0.0.1:0" picks a port; see `.endpoint`).
        device: where buckets are packed (the learner's device). master_address: address generators use
        to reach this host's rendezvous stores. secret: the run's secret; with it, a peer that does not
        prove a role of the run (ZAP: PLAIN on loopback, CURVE elsewhere; asyncrl/net/zap.py) cannot connect.
        dtype: floating-point tensors travel cast to it (the generators' model dtype; None: as given).
        window: buckets in flight per push (>= 1; see the module docstring)."""
        if pause_mode not in ("abort", "continue"):
            raise ValueError(f"pause_mode={pause_mode!r}: must be 'abort' or 'continue'")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s}: must be > 0")
        if window < 1:
            raise ValueError(f"window={window}: must be >= 1 (buckets in flight per push)")
        self.dtype, self.window = dtype, window
        self.device = torch.device(device)
        self.bucket_bytes, self.pause_mode = bucket_bytes, pause_mode
        self.master_address, self.timeout_s = master_address, timeout_s
        self._gpu_uuid = gpu_uuid(self.device)
        self._members: dict[str, Member] = {}
        self._joins: dict[str, tuple[bytes, WeightJoin]] = {}
        self._incarnation = secrets.token_hex(4)  # group names never repeat across learner restarts
        self.give_up: Callable[[], bool] = lambda: False  # e.g. the learner's stop flag: waits end at once
        self._group_count = 0
        self.rejected = Rejections("weight sender")
        # An authenticating socket gets a context of its own: ZAP's handler is one per context.
        self._ctx = zmq.Context() if secret is not None else zmq.Context.instance()
        self._zap = ZapHandler(self._ctx, secret) if secret is not None else None
        self._sock = self._ctx.socket(zmq.ROUTER)
        if self._zap is not None:
            self._zap.secure(self._sock, endpoint)
        bound_socket(self._sock)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a vanished peer raises, not drops
        self.endpoint: str = endpoints.bind(self._sock, endpoint)

    # ------------------------------------------------------------------ public

    @property
    def members(self) -> list[str]:
        return sorted(self._members)

    def has_joins(self) -> bool:
        """Whether a generator waits for its first (or a repeated) full push. Never blocks."""
        self._pump(0.0)
        return bool(self._joins)

    def push(self, named_tensors: NamedTensors, version: int, *, admit: bool = True,
             gather_first: bool = False) -> PushReport:
        """Push every tensor to every generator (joiners admitted first); consumes the iterator fully.
        admit=False: to the members only, joiners keep waiting for serve_joins(): a push that does not carry
        the whole model (LoRA adapters only: asyncrl/learner/lora.py) must not be a joiner's first.
        gather_first: pack every bucket before the generators pause (they then wait only for the transfers and
        their own loads), holding the whole push in memory at once: for small pushes (adapters), not models."""
        self._pump(0.0)
        report = PushReport(version=version, generators=[])
        if admit:
            self._admit(report)
        buckets = None
        if gather_first and self._members:
            buckets = list(self._buckets(named_tensors, report))
            named_tensors = ()
        return self._push_to(list(self._members.values()), named_tensors, version, report, buckets)

    def serve_joins(self, named_tensors: Callable[[], NamedTensors], version: int) -> PushReport | None:
        """Admit waiting generators and bring them to `version`. None (iterator never made) when none waits."""
        if not self.has_joins():
            return None
        report = PushReport(version=version, generators=[])
        fresh = self._admit(report)
        behind = [m for m in fresh if m.join.weight_version != version]
        report.generators = [m.name for m in fresh if m.join.weight_version == version]
        return self._push_to(behind, named_tensors(), version, report)

    def wait_for_joins(self, count: int, timeout_s: float) -> int:
        """Block until `count` generators are members or waiting to join (start-up helper)."""
        deadline = time.monotonic() + timeout_s
        while len(self._members.keys() | self._joins.keys()) < count and time.monotonic() < deadline:
            self._pump(0.05)
        return len(self._members.keys() | self._joins.keys())

    def close(self) -> None:
        for m in list(self._members.values()):
            m.close()
        self._members.clear()
        self._sock.close(0)
        if self._zap is not None:
            self._zap.close()
            self._ctx.term()

    # ------------------------------------------------------------------ the push (one place)

    def _push_to(self, members: list[Member], named_tensors: NamedTensors, version: int, report: PushReport,
                 gathered: list[tuple[torch.Tensor, BucketLayout]] | None = None) -> PushReport:
        """begin -> per bucket (gather, announce, launch; at most `window` in flight) -> end; the generators
        pause and resume themselves. `gathered`: the buckets, already packed (push(gather_first=True))."""
        t0 = time.perf_counter() - report.gather_s  # a push's total includes gathering it first
        live = self._send_all(members, WeightBegin(version=version, pause_mode=self.pause_mode), report)
        if not live:
            drain(named_tensors)  # other FSDP ranks iterate too: the collectives inside must still run
            named_tensors, gathered = (), None
        inflight: deque[_InFlight] = deque()
        buckets = iter(gathered) if gathered is not None else self._buckets(named_tensors, report)
        for index, (flat, layout) in enumerate(buckets):
            while len(inflight) >= self.window:
                live = self._retire(inflight.popleft(), live, version, report)
            live, sendings = self._send_bucket(live, index, flat, layout, version, report)
            inflight.append(_InFlight(index=index, flat=flat, sendings=sendings))
            report.buckets, report.bytes = index + 1, report.bytes + layout.nbytes
        while inflight:
            live = self._retire(inflight.popleft(), live, version, report)
        live = self._send_all(live, WeightEnd(version=version), report)
        live = self._await(live, "end", version, report)
        report.generators = sorted(report.generators + [m.name for m in live])
        report.total_s = time.perf_counter() - t0
        for key in ("pause_s", "recv_s", "load_s", "apply_s", "paused_s"):
            setattr(report, key, max((t.get(key, 0.0) for t in report.per_generator.values()), default=0.0))
        return report

    def _buckets(self, named_tensors: NamedTensors, report: PushReport) -> Iterator[tuple[torch.Tensor, BucketLayout]]:
        """The stream packed into buckets in the generators' dtype, the packing timed as report.gather_s."""
        buckets = iter_buckets(named_tensors, self.bucket_bytes, self.device, self.dtype)
        while True:
            t = time.perf_counter()
            item = next(buckets, None)
            report.gather_s += time.perf_counter() - t
            if item is None:
                return
            yield item

    def _send_bucket(self, live: list[Member], index: int, flat: torch.Tensor, layout: BucketLayout, version: int,
                     report: PushReport) -> tuple[list[Member], list[tuple[Member, Sending]]]:
        """announce to every member -> launch every transfer (see transport.py); nothing waits here."""
        t = time.perf_counter()
        announced = []
        for m in live:
            try:
                sending = m.transport.start(flat)
                self._send(m, WeightBucket(version=version, names=layout.names, dtypes=layout.dtypes, shapes=layout.shapes,
                                           offsets=layout.offsets, nbytes=layout.nbytes, ipc_handle=sending.handle))
                announced.append((m, sending))
            except Exception as e:
                self._drop(m, f"bucket {index} announce: {e}", report)
        started = []
        for m, sending in announced:
            try:
                sending.launch()
                started.append((m, sending))
            except Exception as e:
                self._drop(m, f"bucket {index} launch (learner waited for the generator to enter the broadcast): {e}", report)
        report.transfer_s += time.perf_counter() - t
        return [m for m, _ in started], started

    def _retire(self, bucket: _InFlight, live: list[Member], version: int, report: PushReport) -> list[Member]:
        """Wait until the bucket's bytes are delivered to every live member (and, where the generator reads the
        learner's buffer in place, until it acked the bucket); then its buffer may go."""
        t = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        for m, sending in bucket.sendings:
            if m not in live:
                continue
            try:
                sending.wait(max(0.0, deadline - time.monotonic()))
            except Exception as e:
                why = self._reported_failure(m) or f"bucket {bucket.index} transfer (learner waited for the bytes to arrive): {e}"
                self._drop(m, why, report)
                live = [x for x in live if x is not m]
        report.transfer_s += time.perf_counter() - t
        in_place = [m for m in live if m.transport is not None and m.transport.reads_in_place]
        if in_place:
            acked = self._await(in_place, "bucket", version, report, index=bucket.index)
            live = [m for m in live if m not in in_place or m in acked]
        return self._note_bucket_acks(live, report)

    def _reported_failure(self, m: Member, wait_s: float = 0.5) -> str:
        """The error a generator reported for its failed update, if it does within `wait_s` (a generator that
        fails closes its group, so the learner's transfer breaks about when its failure Ack arrives)."""
        deadline = time.monotonic() + wait_s
        while not (why := reported_failure(m, "update")) and time.monotonic() < deadline:
            self._pump(0.02)
        return why

    def _note_bucket_acks(self, live: list[Member], report: PushReport) -> list[Member]:
        """Read the bucket acks that arrived (never waits): a failed one drops its member now rather than at
        the end of the push, and read acks do not pile up towards the flood limit."""
        self._pump(0.0)
        kept = []
        for m in live:
            if m.transport is not None and m.transport.reads_in_place:
                kept.append(m)  # its acks are awaited one by one in _retire
                continue
            why = reported_failure(m, "bucket")
            if why:
                self._drop(m, why, report)
                continue
            m.acks = [a for a in m.acks if a.info.get("stage") != "bucket"]
            kept.append(m)
        return kept

    # ------------------------------------------------------------------ joins

    def _admit(self, report: PushReport) -> list[Member]:
        """Offer a group to every waiting generator and wait (<= timeout_s) until each one is in it.

        The learner's side of each group is built on its own thread (gloo's constructor blocks until the
        generator connects), while this thread reads acks: a generator whose join failed (Ack ok=False,
        stage group) is dropped at once instead of after the timeout."""
        joins, self._joins = list(self._joins.values()), {}
        joining = []
        for identity, join in joins:
            try:
                joining.append(self._offer(identity, join))
            except Exception as e:
                self._refuse(identity, join, e, report)
        for m in joining:
            self._members[m.name] = m  # acks route to it from now on
        return self._await_joined(joining, report)

    def _await_joined(self, joining: list[Member], report: PushReport) -> list[Member]:
        t = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        waiting, acked, done = list(joining), set(), []
        while waiting:
            for m in list(waiting):
                ack = take_ack(m, "group", -1, -1)
                if ack is not None and not ack.ok:
                    waiting.remove(m)
                    self._drop(m, f"join failed on the generator: {ack.info.get('error', 'failed')}", report)
                    continue
                if ack is not None:
                    acked.add(m.name)
                if "error" in m.build:
                    waiting.remove(m)
                    self._drop(m, f"join failed on the learner: {m.build['error']}", report)
                elif "transport" in m.build and m.name in acked:
                    waiting.remove(m)
                    m.transport = m.build["transport"]
                    done.append(m)
            if waiting and time.monotonic() >= deadline:
                for m in waiting:
                    self._drop(m, f"not in its group within {self.timeout_s:.1f}s (learner waited for its group Ack)", report)
                break
            if waiting:
                self._pump(0.02)
        report.ack_s += time.perf_counter() - t
        return done

    def _offer(self, identity: bytes, join: WeightJoin) -> Member:
        """Send WeightGroupInit and start building the learner's side of the link (link.py)."""
        self._group_count += 1
        name = f"asyncrl-weights-{join.generator}-{self._incarnation}-{self._group_count}"
        m = Member(name=join.generator, identity=identity, join=join)
        init = start_link(m, join, name, device=self.device, gpu_uuid=self._gpu_uuid,
                          master_address=self.master_address, timeout_s=self.timeout_s, give_up=lambda: self.give_up())
        self._send_raw(identity, init)
        return m

    def _refuse(self, identity: bytes, join: WeightJoin, error: Exception, report: PushReport) -> None:
        log.warning("weight push: %s could not join: %s", join.generator, error)
        report.dropped[join.generator] = f"join: {error}"
        self._tell_dropped(identity, f"join failed: {error}")

    # ------------------------------------------------------------------ control messages

    def _send(self, m: Member, msg: Any) -> None:
        self._send_raw(m.identity, msg)

    def _send_raw(self, identity: bytes, msg: Any) -> None:
        self._sock.send_multipart([identity, wire.encode(msg)])

    def _send_all(self, live: list[Member], msg: Any, report: PushReport) -> list[Member]:
        ok = []
        for m in live:
            try:
                self._send(m, msg)
                ok.append(m)
            except zmq.ZMQError as e:
                self._drop(m, f"unreachable: {e}", report)
        return ok

    def _pump(self, timeout_s: float) -> None:
        """Read every waiting control message (waits up to timeout_s for the first); bad ones are counted
        in `rejected` and skipped."""
        wait_ms = int(timeout_s * 1000)
        while self._sock.poll(wait_ms):
            wait_ms = 0
            got = read_message(self._sock, routed=True, allowed=(WeightJoin, Ack), rejections=self.rejected)
            if got is not None:
                self._dispatch(*got)

    def _dispatch(self, identity: bytes, msg: Any) -> None:
        if isinstance(msg, WeightJoin):
            self._on_join(identity, msg)
            return
        members = self._members_by_identity(identity)
        if not members:
            self.rejected.add("not_a_member", "Ack from a peer that is not in a weight group", identity)
        for m in members:
            if len(m.acks) >= 64:  # a member acks a handful of stages per push; more is a flood
                self.rejected.add("ack_flood", f"{m.name} has 64 unread acks", identity)
                return
            m.acks.append(msg)

    def _on_join(self, identity: bytes, join: WeightJoin) -> None:
        try:
            check_join(join)
        except ValueError as e:
            self.rejected.add("bad_join", str(e), identity)
            return
        if join.generator not in self._joins and len(self._joins) >= MAX_PENDING_JOINS:
            self.rejected.add("too_many_joins", f"{MAX_PENDING_JOINS} joins already wait", identity)
            return
        old = self._members.pop(join.generator, None)
        if old is not None:  # it restarted, or gave up on an update: its old group is useless
            old.close()
        self._joins[join.generator] = (identity, join)

    def _members_by_identity(self, identity: bytes) -> list[Member]:
        return [m for m in self._members.values() if m.identity == identity]

    def _await(self, live: list[Member], stage: str, version: int, report: PushReport, index: int = -1) -> list[Member]:
        """Wait until each member acks `stage` (a failed or missing ack drops it); returns those that did."""
        t = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        waiting = {m.name: m for m in live}
        done: list[Member] = []
        while waiting:
            for m in list(waiting.values()):
                ack = take_ack(m, stage, version, index)
                if ack is None:
                    continue
                del waiting[m.name]
                if not ack.ok:
                    self._drop(m, f"{stage}: {ack.info.get('error', 'failed')}", report)
                    continue
                done.append(m)
                if stage == "end":
                    report.per_generator[m.name] = {k: float(v) for k, v in ack.info.items()
                                                    if k.endswith("_s") and isinstance(v, int | float)}
            left = deadline - time.monotonic()
            if waiting and (left <= 0 or self.give_up()):
                why = "the learner is stopping" if left > 0 else f"within {self.timeout_s:.1f}s"
                for m in waiting.values():
                    self._drop(m, f"no {stage} ack {why}", report)
                break
            if waiting:
                self._pump(min(left, 0.05))
        report.ack_s += time.perf_counter() - t
        return [m for m in live if m in done]

    def _drop(self, m: Member, reason: str, report: PushReport) -> None:
        log.warning("weight push: dropping %s: %s", m.name, reason)
        report.dropped[m.name] = reason
        if self._members.get(m.name) is m:
            del self._members[m.name]
        m.close()  # aborts this member's group only (NCCL: its communicator; the default group is untouched)
        self._tell_dropped(m.identity, reason)

    def _tell_dropped(self, identity: bytes, reason: str) -> None:
        try:  # a generator that still listens rejoins and gets a full push
            self._send_raw(identity, Ack(ok=False, info={"stage": "dropped", "error": reason}))
        except zmq.ZMQError:
            pass


__all__ = ["PushReport", "WeightSender"]
