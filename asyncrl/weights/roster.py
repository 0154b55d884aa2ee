"""Roster: the learner's control channel to the generators, and who is on it.

One ZeroMQ ROUTER, bound by the learner, carries every control message; each generator's DEALER connects
(sender.py has the whole exchange of a push). The roster owns what is not one push's:

    WeightJoin -> queued in `joins` (at most MAX_PENDING_JOINS; a rejoin replaces the member it was)
    admit()    -> WeightGroupInit to each joiner, the learner's side of its link built on a thread (link.py),
                  member once it acked stage "group" and the link stands (<= timeout_s)
    drop()     -> out of `members`, its group closed, told with Ack(stage="dropped") if it still listens (it
                  then joins again and gets a full push)

and the acks: `pump` reads every waiting message into its member's inbox (bad bytes are counted in
`rejected`, never raised; more than 64 unread acks from one member is a flood), `await_acks` waits for one
stage from a set of members, dropping those that fail or stay silent. Nothing here blocks longer than
`timeout_s`, or past `give_up()` (the learner's stop flag). One thread (the learner's rank 0) calls it all.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

import torch
import zmq

from asyncrl import wire
from asyncrl.net import endpoints
from asyncrl.net.zap import ZapHandler
from asyncrl.records import Ack, WeightJoin
from asyncrl.weights.cuda_ipc import gpu_uuid
from asyncrl.weights.inbox import Rejections, bound_socket, read_message
from asyncrl.weights.link import start_link
from asyncrl.weights.member import MAX_PENDING_JOINS, Member, check_join, reported_failure, take_ack
from asyncrl.weights.report import PushReport

log = logging.getLogger(__name__)

MAX_UNREAD_ACKS = 64  # a member acks a handful of stages per push; more is a flood


class Roster:
    def __init__(self, endpoint: str, *, device: torch.device, master_address: str, timeout_s: float,
                 secret: bytes | None) -> None:
        """endpoint: ZeroMQ address to bind ("tcp://127.0.0.1:0" picks a port; see `.endpoint`). master_address:
        the address generators use to reach this host's rendezvous stores. secret: the run's secret; with it, a
        peer that does not prove a role of the run (ZAP: PLAIN on loopback, CURVE elsewhere; asyncrl/net/zap.py)
        cannot connect."""
        self.device, self.master_address, self.timeout_s = device, master_address, timeout_s
        self.members: dict[str, Member] = {}
        self.joins: dict[str, tuple[bytes, WeightJoin]] = {}
        self.rejected = Rejections("weight sender")
        self.give_up: Callable[[], bool] = lambda: False  # e.g. the learner's stop flag: waits end at once
        self._gpu_uuid = gpu_uuid(device)
        self._incarnation = secrets.token_hex(4)  # group names never repeat across learner restarts
        self._group_count = 0
        # An authenticating socket gets a context of its own: ZAP's handler is one per context.
        self._ctx = zmq.Context() if secret is not None else zmq.Context.instance()
        self.zap = ZapHandler(self._ctx, secret) if secret is not None else None
        self.sock = self._ctx.socket(zmq.ROUTER)
        if self.zap is not None:
            self.zap.secure(self.sock, endpoint)
        bound_socket(self.sock)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a vanished peer raises, not drops
        self.endpoint: str = endpoints.bind(self.sock, endpoint)

    def has_joins(self) -> bool:
        """Whether a generator waits to join. Never blocks."""
        self.pump(0.0)
        return bool(self.joins)

    def wait_for(self, count: int, timeout_s: float) -> int:
        """Block until `count` generators are members or waiting to join -> how many are."""
        deadline = time.monotonic() + timeout_s
        while len(self.members.keys() | self.joins.keys()) < count and time.monotonic() < deadline:
            self.pump(0.05)
        return len(self.members.keys() | self.joins.keys())

    def close(self) -> None:
        for m in list(self.members.values()):
            m.close()
        self.members.clear()
        self.sock.close(0)
        if self.zap is not None:
            self.zap.close()
            self._ctx.term()

    # ------------------------------------------------------------------ joins

    def admit(self, report: PushReport) -> list[Member]:
        """Offer a group to every waiting generator and wait (<= timeout_s) until each one is in it.

        The learner's side of each group is built on its own thread (gloo's constructor blocks until the
        generator connects), while this thread reads acks: a generator whose join failed (Ack ok=False,
        stage group) is dropped at once instead of after the timeout."""
        joins, self.joins = list(self.joins.values()), {}
        joining = []
        for identity, join in joins:
            try:
                joining.append(self._offer(identity, join))
            except Exception as e:
                self._refuse(identity, join, e, report)
        for m in joining:
            self.members[m.name] = m  # acks route to it from now on
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
                    self.drop(m, f"join failed on the generator: {ack.info.get('error', 'failed')}", report)
                    continue
                if ack is not None:
                    acked.add(m.name)
                if "error" in m.build:
                    waiting.remove(m)
                    self.drop(m, f"join failed on the learner: {m.build['error']}", report)
                elif "transport" in m.build and m.name in acked:
                    waiting.remove(m)
                    m.transport = m.build["transport"]
                    done.append(m)
            if waiting and time.monotonic() >= deadline:
                for m in waiting:
                    self.drop(m, f"not in its group within {self.timeout_s:.1f}s (learner waited for its group Ack)", report)
                break
            if waiting:
                self.pump(0.02)
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

    # ------------------------------------------------------------------ messages

    def send(self, m: Member, msg: Any) -> None:
        self._send_raw(m.identity, msg)

    def send_all(self, live: list[Member], msg: Any, report: PushReport) -> list[Member]:
        """`msg` to each of `live` -> those it reached (the others are dropped)."""
        ok = []
        for m in live:
            try:
                self.send(m, msg)
                ok.append(m)
            except zmq.ZMQError as e:
                self.drop(m, f"unreachable: {e}", report)
        return ok

    def _send_raw(self, identity: bytes, msg: Any) -> None:
        self.sock.send_multipart([identity, wire.encode(msg)])

    def pump(self, timeout_s: float) -> None:
        """Read every waiting control message (waits up to timeout_s for the first); bad ones are counted
        in `rejected` and skipped."""
        wait_ms = int(timeout_s * 1000)
        while self.sock.poll(wait_ms):
            wait_ms = 0
            got = read_message(self.sock, routed=True, allowed=(WeightJoin, Ack), rejections=self.rejected)
            if got is not None:
                self._dispatch(*got)

    def _dispatch(self, identity: bytes, msg: Any) -> None:
        if isinstance(msg, WeightJoin):
            self._on_join(identity, msg)
            return
        members = [m for m in self.members.values() if m.identity == identity]
        if not members:
            self.rejected.add("not_a_member", "Ack from a peer that is not in a weight group", identity)
        for m in members:
            if len(m.acks) >= MAX_UNREAD_ACKS:
                self.rejected.add("ack_flood", f"{m.name} has {MAX_UNREAD_ACKS} unread acks", identity)
                return
            m.acks.append(msg)

    def _on_join(self, identity: bytes, join: WeightJoin) -> None:
        try:
            check_join(join)
        except ValueError as e:
            self.rejected.add("bad_join", str(e), identity)
            return
        if join.generator not in self.joins and len(self.joins) >= MAX_PENDING_JOINS:
            self.rejected.add("too_many_joins", f"{MAX_PENDING_JOINS} joins already wait", identity)
            return
        old = self.members.pop(join.generator, None)
        if old is not None:  # it restarted, or gave up on an update: its old group is useless
            old.close()
        self.joins[join.generator] = (identity, join)

    # ------------------------------------------------------------------ acks and drops

    def await_acks(self, live: list[Member], stage: str, version: int, report: PushReport,
                   index: int = -1) -> list[Member]:
        """Wait until each member acks `stage` (a failed or missing ack drops it); returns those that did. The
        end stage's timings go to report.per_generator."""
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
                    self.drop(m, f"{stage}: {ack.info.get('error', 'failed')}", report)
                    continue
                done.append(m)
                if stage == "end":
                    report.per_generator[m.name] = {k: float(v) for k, v in ack.info.items()
                                                    if k.endswith("_s") and isinstance(v, int | float)}
            left = deadline - time.monotonic()
            if waiting and (left <= 0 or self.give_up()):
                why = "the learner is stopping" if left > 0 else f"within {self.timeout_s:.1f}s"
                for m in waiting.values():
                    self.drop(m, f"no {stage} ack {why}", report)
                break
            if waiting:
                self.pump(min(left, 0.05))
        report.ack_s += time.perf_counter() - t
        return [m for m in live if m in done]

    def reported_failure(self, m: Member, wait_s: float = 0.5) -> str:
        """The error a generator reported for its failed update, if it does within `wait_s` (a generator that
        fails closes its group, so the learner's transfer breaks about when its failure Ack arrives)."""
        deadline = time.monotonic() + wait_s
        while not (why := reported_failure(m, "update")) and time.monotonic() < deadline:
            self.pump(0.02)
        return why

    def drop(self, m: Member, reason: str, report: PushReport) -> None:
        log.warning("weight push: dropping %s: %s", m.name, reason)
        report.dropped[m.name] = reason
        if self.members.get(m.name) is m:
            del self.members[m.name]
        m.close()  # aborts this member's group only (NCCL: its communicator; the default group is untouched)
        self._tell_dropped(m.identity, reason)

    def _tell_dropped(self, identity: bytes, reason: str) -> None:
        try:  # a generator that still listens rejoins and gets a full push
            self._send_raw(identity, Ack(ok=False, info={"stage": "dropped", "error": reason}))
        except zmq.ZMQError:
            pass
