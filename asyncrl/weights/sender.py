"""Learner side of the weight push: `WeightSender` pushes bucketed weights to every joined generator.

One ZeroMQ ROUTER (bound by the learner) carries the control messages; each generator's DEALER connects.
Who is on it — joins, members, their acks, drops — is the `Roster`'s (roster.py); this module is the push.
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

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from asyncrl.engine.bucket_layout import BucketLayout
from asyncrl.records import WeightBegin, WeightBucket, WeightEnd
from asyncrl.weights.bucket import DEFAULT_BUCKET_BYTES, drain, iter_buckets
from asyncrl.weights.inbox import Rejections
from asyncrl.weights.member import Member, reported_failure
from asyncrl.weights.report import PushReport
from asyncrl.weights.roster import Roster
from asyncrl.weights.transport import Sending

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
        self.bucket_bytes, self.pause_mode, self.timeout_s = bucket_bytes, pause_mode, timeout_s
        self.roster = Roster(endpoint, device=self.device, master_address=master_address, timeout_s=timeout_s,
                             secret=secret)
        self.endpoint: str = self.roster.endpoint

    # ------------------------------------------------------------------ public

    @property
    def members(self) -> list[str]:
        return sorted(self.roster.members)

    @property
    def rejected(self) -> Rejections:
        """Bad control messages, counted by reason (roster.py)."""
        return self.roster.rejected

    @property
    def give_up(self) -> Callable[[], bool]:
        return self.roster.give_up

    @give_up.setter
    def give_up(self, fn: Callable[[], bool]) -> None:
        """e.g. the learner's stop flag: every wait of a push ends at once when it says so."""
        self.roster.give_up = fn

    def has_joins(self) -> bool:
        """Whether a generator waits for its first (or a repeated) full push. Never blocks."""
        return self.roster.has_joins()

    def push(self, named_tensors: NamedTensors, version: int, *, admit: bool = True,
             gather_first: bool = False) -> PushReport:
        """Push every tensor to every generator (joiners admitted first); consumes the iterator fully.
        admit=False: to the members only, joiners keep waiting for serve_joins(): a push that does not carry
        the whole model (LoRA adapters only: asyncrl/learner/lora.py) must not be a joiner's first.
        gather_first: pack every bucket before the generators pause (they then wait only for the transfers and
        their own loads), holding the whole push in memory at once: for small pushes (adapters), not models."""
        self.roster.pump(0.0)
        report = PushReport(version=version, generators=[])
        if admit:
            self.roster.admit(report)
        buckets = None
        if gather_first and self.roster.members:
            buckets = list(self._buckets(named_tensors, report))
            named_tensors = ()
        return self._push_to(list(self.roster.members.values()), named_tensors, version, report, buckets)

    def serve_joins(self, named_tensors: Callable[[], NamedTensors], version: int) -> PushReport | None:
        """Admit waiting generators and bring them to `version`. None (iterator never made) when none waits."""
        if not self.has_joins():
            return None
        report = PushReport(version=version, generators=[])
        fresh = self.roster.admit(report)
        behind = [m for m in fresh if m.join.weight_version != version]
        report.generators = [m.name for m in fresh if m.join.weight_version == version]
        return self._push_to(behind, named_tensors(), version, report)

    def wait_for_joins(self, count: int, timeout_s: float) -> int:
        """Block until `count` generators are members or waiting to join (start-up helper)."""
        return self.roster.wait_for(count, timeout_s)

    def close(self) -> None:
        self.roster.close()

    # ------------------------------------------------------------------ the push (one place)

    def _push_to(self, members: list[Member], named_tensors: NamedTensors, version: int, report: PushReport,
                 gathered: list[tuple[torch.Tensor, BucketLayout]] | None = None) -> PushReport:
        """begin -> per bucket (gather, announce, launch; at most `window` in flight) -> end; the generators
        pause and resume themselves. `gathered`: the buckets, already packed (push(gather_first=True))."""
        t0 = time.perf_counter() - report.gather_s  # a push's total includes gathering it first
        live = self.roster.send_all(members, WeightBegin(version=version, pause_mode=self.pause_mode), report)
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
        live = self.roster.send_all(live, WeightEnd(version=version), report)
        live = self.roster.await_acks(live, "end", version, report)
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
                self.roster.send(m, WeightBucket(version=version, names=layout.names, dtypes=layout.dtypes, shapes=layout.shapes,
                                           offsets=layout.offsets, nbytes=layout.nbytes, ipc_handle=sending.handle))
                announced.append((m, sending))
            except Exception as e:
                self.roster.drop(m, f"bucket {index} announce: {e}", report)
        started = []
        for m, sending in announced:
            try:
                sending.launch()
                started.append((m, sending))
            except Exception as e:
                self.roster.drop(m, f"bucket {index} launch (learner waited for the generator to enter the broadcast): {e}", report)
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
                why = self.roster.reported_failure(m) or f"bucket {bucket.index} transfer (learner waited for the bytes to arrive): {e}"
                self.roster.drop(m, why, report)
                live = [x for x in live if x is not m]
        report.transfer_s += time.perf_counter() - t
        in_place = [m for m in live if m.transport is not None and m.transport.reads_in_place]
        if in_place:
            acked = self.roster.await_acks(in_place, "bucket", version, report, index=bucket.index)
            live = [m for m in live if m not in in_place or m in acked]
        return self._note_bucket_acks(live, report)

    def _note_bucket_acks(self, live: list[Member], report: PushReport) -> list[Member]:
        """Read the bucket acks that arrived (never waits): a failed one drops its member now rather than at
        the end of the push, and read acks do not pile up towards the flood limit."""
        self.roster.pump(0.0)
        kept = []
        for m in live:
            if m.transport is not None and m.transport.reads_in_place:
                kept.append(m)  # its acks are awaited one by one in _retire
                continue
            why = reported_failure(m, "bucket")
            if why:
                self.roster.drop(m, why, report)
                continue
            m.acks = [a for a in m.acks if a.info.get("stage") != "bucket"]
            kept.append(m)
        return kept


__all__ = ["PushReport", "WeightSender"]
