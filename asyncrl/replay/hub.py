"""The replay hub server: one ZeroMQ ROUTER socket served by one thread's loop.

Who talks to it (every peer holds one DEALER, see `asyncrl.net.peer.HubPeer`):

    client/dataset ──SubmitPrompts──►┐                      ┌──Lease◄────── generator ×N (LeaseRequest,
                                     │                      │               credit = free slots)
    generator ──SampleBatch─────────►│    Hub (this loop)   ├──ToScore◄──── reward ×M  (ScoreRequest,
    reward ──ScoredIds──────────────►│  HubCore + Journal   │               credit = free workers)
    learner ──CommitStep/WeightVersion►                     ├──Batch◄────── learner ×K (BatchRequest)
    anyone ──Heartbeat/Stats/FatalError►                    └──Completion─► clients that submitted with watch

What blocks on what: nothing in the hub blocks. Producers never wait (their requests are answered at
once); consumers long-poll: a request for work is parked until work exists or its wait_s (capped by
hub.max_wait_s) passes, then answered empty. Generators get prompts only within the staleness bound
(admission in `HubState`), so samples are at most max_staleness versions old when batched; older
ones are dropped and counted.

The loop is a plain `zmq.Poller` over the socket and the journal's wake-up pipe, not an asyncio loop: the hub
serves one socket and nothing else runs on its thread, and a wait through zmq.asyncio cost ~160 us of Python
a turn (~5 us a sample in `bench.replay`, against ~1 us for the blocking poll). A signal interrupts the poll;
`stop()` (from a signal handler or another thread) ends the loop within one tick.

One turn of the loop: wait for frames, the journal's wake-up or the tick → drain up to `BURST` frames
and handle them → tick (expire leases, time out long polls) or pump parked requests → hand the turn's
log records to the journal's writer thread (`asyncrl.replay.flusher`: write + one fsync for every turn
queued meanwhile) → send the replies whose records are durable. Replies leave only after the log holds
what they acknowledge (leases, work to score and stats excepted: `UNHELD` says why that is safe): each
turn's replies are held under the ticket of its records (and of every record before them) until the writer
thread reports that ticket durable; the loop meanwhile serves the next frames, so the disk's latency
overlaps the hub's work instead of stalling it.

    loop:    drain+handle (turn t) ─ sync → ticket t ─ hold replies(t) ─ drain+handle (t+1) ─ ... ─ send(≤ t)
    writer:                           └► write, fsync ──────────────────► durable = t, wake (pipe) ┘

Trust: with the run's `secret` every connection must authenticate (asyncrl.net.zap: PLAIN on loopback,
CURVE elsewhere) and each request carries its connection's role and name (`Caller`), which HubCore
checks against what the role may send. Without a secret the hub binds loopback only.
"""

from __future__ import annotations

import gc
import logging
import time
from collections import deque
from pathlib import Path
from typing import Any

import zmq

from asyncrl import records as R
from asyncrl import wire
from asyncrl.net import endpoints
from asyncrl.net.credentials import is_local
from asyncrl.observe.prometheus import PrometheusExporter, Sample
from asyncrl.replay.config import BatchConfig, HubConfig
from asyncrl.replay.core import HubCore
from asyncrl.replay.journal import Journal
from asyncrl.replay.roles import Caller
from asyncrl.replay.stats import prometheus_samples
from asyncrl.net.zap import ZapHandler

log = logging.getLogger("asyncrl.replay")

BURST = 1024  # frames handled per loop turn before the log is synced and replies go out
TICK_S = 0.05  # lease expiry and long-poll timeouts run at least this often (and `stop()` is seen)
TICK_MS = int(TICK_S * 1000)
EXPORT_S = 1.0  # Prometheus values are refreshed this often (a scrape reads the last refresh)
LOG_NAME = "replay.log"
# Replies sent without waiting for the log: a Stats changes nothing, a ToScore hands out work the hub does not
# log (a crash re-offers it), and a Lease's grant, if a crash loses it before it is durable, leaves its prompts
# queued in the restarted hub: the lessee's samples are then refused ("not leased") and the prompts leased
# again, so nothing is lost or trained twice; only that generation is wasted. Everything else (acks of
# submitted prompts, samples, scores, commits; batches, whose make-up must survive a crash) waits.
UNHELD = (R.Lease, R.ToScore, R.Stats)
GC_YOUNG = 20_000  # allocations between collections of the youngest generation (see `settle_gc`)
RECV_BUDGET_BYTES = 256 << 20  # frames ZeroMQ may queue per connection before it stops reading from it


class Hub:
    def __init__(self, cfg: HubConfig, batch: BatchConfig, run_dir: str | Path | None = None,
                 endpoint: str | None = None, secret: bytes | None = None, metrics_port: int | None = None,
                 filter_uniform: bool = False) -> None:
        """`metrics_port`: serve Prometheus metrics on http://127.0.0.1:PORT/metrics (0: any free port;
        None: no exporter). `filter_uniform`: drop groups without signal for refill (`HubCore`)."""
        endpoint = endpoint or cfg.endpoint
        if secret is None and not is_local(endpoint):
            raise ValueError(f"hub endpoint {endpoint}: binding a non-loopback address needs the run secret "
                             "(CURVE); start the hub through the launcher or bind tcp://127.0.0.1")
        log_path = Path(run_dir) / LOG_NAME if run_dir is not None and cfg.log else None
        self.journal = Journal.open(log_path, cfg.fsync, background=True)
        self.core = HubCore(cfg, batch, self.journal, filter_uniform=filter_uniform)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.zap = ZapHandler(self.ctx, secret) if secret is not None else None
        if self.zap is not None:
            self.zap.secure(self.sock, endpoint)
            self.core.auth = self.zap.counters
        # A flood costs bounded memory: per connection at most RCVHWM queued frames of <= MAXMSGSIZE each.
        self.sock.setsockopt(zmq.MAXMSGSIZE, 2 * cfg.max_frame_bytes)  # beyond: transport drops the peer
        self.sock.setsockopt(zmq.RCVHWM, recv_hwm(cfg.max_frame_bytes))
        self.sock.setsockopt(zmq.SNDHWM, 100_000)
        self.endpoint = endpoints.bind(self.sock, endpoint)
        self.frames = zmq.Poller()  # frames only: nothing is held for the log
        self.frames.register(self.sock, zmq.POLLIN)
        self.frames_or_wake = zmq.Poller()  # ... or replies are held: the writer's wake-up too
        self.frames_or_wake.register(self.sock, zmq.POLLIN)
        flusher = self.journal.flusher
        if flusher is not None:  # a byte on this pipe: more of the log became durable (held replies may go)
            self.frames_or_wake.register(flusher.wake_fd, zmq.POLLIN)
        self.held: deque[tuple[int, list[tuple[list[bytes], Any]]]] = deque()  # (ticket, replies) in turn order
        self._running = True  # until stop(): a stop() before serve() starts must still end it
        self._next_tick = 0.0
        self.unsent = 0  # replies dropped because a peer's queue was full or it was gone
        self.exporter = PrometheusExporter("asyncrl_hub", metrics_port) if metrics_port is not None else None
        self._next_export = 0.0

    def serve(self) -> None:
        """Serve on this thread until `stop()` (at once if it was already called)."""
        log.info("replay hub serving on %s", self.endpoint)
        while self._running:
            # Frames already waiting (ZMQ_EVENTS): no wait, and no poll system call.
            if not self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # with replies held, the writer's wake too
                (self.frames_or_wake if self.held else self.frames).poll(TICK_MS)
            self.turn(time.time())
        self.journal.wait_durable()  # the last turns' replies still go out
        self._flush()

    def turn(self, now: float) -> None:
        """One loop turn: handle what arrived, tick or pump, hand the log to the writer, send durable replies."""
        self._drain(now)
        if now >= self._next_tick:
            self.core.tick(now)
            self._next_tick = now + TICK_S
            self._export(now)
        else:
            self.core.pump(now)
        now_out, held = self._split(self.core.outbox) if self.core.outbox else ([], [])
        self.core.outbox = []
        ticket = self.journal.sync(durable=bool(held))  # a turn whose replies all go now waits for no fsync
        self._send(now_out)
        if held:
            self.held.append((ticket, held))
        self._flush()

    def _split(self, outbox: list[tuple[list[bytes], Any]]) -> tuple[list, list]:
        """(replies to send now, replies to hold): `UNHELD` kinds go now unless an earlier reply to the same
        peer is held (a peer reads its replies in the order of its requests)."""
        if not any(isinstance(msg, UNHELD) for _, msg in outbox):
            return [], outbox
        waiting = {tuple(env) for _, replies in self.held for env, _ in replies}
        now_out, held = [], []
        for env, msg in outbox:
            key = tuple(env)
            if isinstance(msg, UNHELD) and key not in waiting:
                now_out.append((env, msg))
            else:
                held.append((env, msg))
                waiting.add(key)
        return now_out, held

    def stop(self) -> None:
        self._running = False

    def close(self) -> None:
        self._running = False
        if self.exporter is not None:
            self.exporter.close()
        self.journal.close()
        self.sock.close(linger=0)
        if self.zap is not None:
            self.zap.close()
        self.ctx.term()
        endpoints.remove_unix_socket(self.endpoint)  # ZeroMQ leaves the file of an ipc:// endpoint behind

    def _drain(self, now: float) -> None:
        for _ in range(BURST):
            try:
                parts = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.core.handle([p.bytes for p in parts[:-1]], parts[-1], now, self._caller(parts[-1]))

    def _export(self, now: float) -> None:
        if self.exporter is None or now < self._next_export:
            return
        self._next_export = now + EXPORT_S
        samples = prometheus_samples(self.core, now)
        samples.append(Sample("unsent_replies", self.unsent, "counter", doc="replies dropped (peer gone or full)"))
        self.exporter.publish(samples)

    def _caller(self, frame: zmq.Frame) -> Caller | None:
        """The role (ZAP User-Id) and name (X-Name metadata) of the connection that sent `frame`."""
        if self.zap is None:
            return None
        try:
            name = frame.get("X-Name")
        except zmq.ZMQError:  # the peer sent no name
            name = ""
        return Caller(role=frame.get("User-Id"), name=name)

    def _flush(self) -> None:
        """Send the held replies whose tickets are durable, oldest turn first."""
        if not self.held:
            return  # wakes left in the pipe meanwhile only make the next poll with replies held return early
        if self.journal.flusher is not None:
            self.journal.flusher.drain_wakes()  # before reading `durable`: a later advance leaves a byte to poll
        durable = self.journal.durable()
        while self.held and self.held[0][0] <= durable:
            self._send(self.held.popleft()[1])

    def _send(self, outbox: list[tuple[list[bytes], Any]]) -> None:
        for envelope, msg in outbox:
            try:
                self.sock.send_multipart([*envelope, _frame(msg)], zmq.NOBLOCK, copy=False)  # large: no copy
            except zmq.Again:
                self.unsent += 1
            except zmq.ZMQError as e:  # e.g. EHOSTUNREACH for a peer that left
                self.unsent += 1
                log.debug("reply not sent: %s", e)


def _frame(msg: Any) -> bytes:
    if isinstance(msg, bytes):
        return msg
    try:
        return wire.encode(msg)
    except (TypeError, ValueError) as e:  # a reply the wire cannot carry is a bug: say so, don't crash
        log.exception("cannot encode %s", type(msg).__name__)
        return wire.encode(R.ErrorReply(reason=f"hub could not encode reply: {e}", request_type=""))


def settle_gc() -> None:
    """Keep the cyclic garbage collector off the hot path: what exists when serving starts (modules, config,
    the resumed state) is frozen out of every later collection, and the youngest generation is collected
    every GC_YOUNG allocations instead of 700. Decoding a SampleBatch allocates ~10 objects per sample
    that refcounting frees at once; at the default threshold they triggered ~5 collections of the whole
    heap per 25k samples (~30 ms each, on the loop). Process-wide, so the hub's own process calls it
    (services/replay.py) before serving; a hub inside another process (tests) leaves that process's GC alone."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG, older, oldest)


def recv_hwm(max_frame_bytes: int) -> int:
    """Receive high-water mark (frames per connection) that keeps queued frames within RECV_BUDGET_BYTES
    (at least 4: peers are request/reply; past the mark ZeroMQ applies TCP backpressure, nothing is lost)."""
    return max(4, min(10_000, RECV_BUDGET_BYTES // (2 * max_frame_bytes)))
