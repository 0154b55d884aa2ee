"""The reward worker loop: pull generated samples from the hub, score them, send them back.

    hub ──ToScore──► RewardWorker ──► Scorer (inline rules │ threads │ process pool │ http)
     ▲                    │ up to reward.max_inflight samples scored at once
     └──ScoredIds─────────┘  (finished ones are sent every round, in any order, by sample id: the hub
                              keeps each sample; a ToScoreItem carries only its id, text and reward spec)

The worker asks only for as many samples as it has free slots (credit), so the hub never hands it more
than it can score; while samples are in flight it polls without waiting and otherwise long-polls for
up to `wait_s`. Hub calls go through one dedicated thread (the peer is synchronous and not
thread-safe), so the event loop keeps scoring while a call waits. A heartbeat with stats goes out every
`reward.heartbeat_s`; its answer may ask the worker to shut down. Several workers run side by side,
each under its own name.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from asyncrl.net.heartbeat import Heartbeats
from asyncrl.net.peer import HubError
from asyncrl.records import ScoredIds, ScoreRequest, ScoreResult, ScoreStatus
from asyncrl.reward.config import RewardConfig
from asyncrl.reward.scorer import Scorer

log = logging.getLogger(__name__)

_POLL_S = 0.05  # how long to wait for finishing samples before asking the hub for more


class Peer(Protocol):
    def request(self, msg: Any) -> Any: ...


class RewardWorker:
    def __init__(self, peer: Peer, scorer: Scorer, cfg: RewardConfig, name: str, wait_s: float = 1.0) -> None:
        self.peer, self.scorer, self.cfg, self.name, self.wait_s = peer, scorer, cfg, name, wait_s
        self._hub_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-hub")
        self.inflight: set[asyncio.Task[ScoreResult]] = set()
        self.scored = self.failed = self.rejected = 0
        self.beats = Heartbeats("reward", name, cfg.heartbeat_s)
        self._last_beat = (0.0, 0)  # (monotonic time, scored count) at the previous heartbeat, for the rate
        self.shutdown_requested = False

    async def run(self, stop: Any | None = None) -> None:
        """Loop until the hub asks for shutdown or `stop.is_set()`; finished samples are flushed first. A hub
        that stopped with us (the run ended, or the launcher died) is no error: what was in flight is leased
        again when the run resumes."""
        stopping = (lambda: stop.is_set()) if stop is not None else (lambda: False)
        try:
            await self.heartbeat()
            while not self.shutdown_requested and not stopping():
                await self.step()
            await self.drain()
        except TimeoutError as e:
            if not stopping():
                raise
            log.info("%s: stopping without the hub (%s); %d samples in flight are scored again on resume",
                     self.name, e, len(self.inflight))

    async def step(self) -> None:
        free = self.cfg.max_inflight - len(self.inflight)
        if free > 0:
            wait = 0.0 if self.inflight else self.wait_s
            todo = await self._call(ScoreRequest(worker=self.name, max_samples=free, wait_s=wait))
            for item in todo.items:
                self.inflight.add(asyncio.create_task(self.scorer.score(item)))
        if self.inflight:
            done, self.inflight = await asyncio.wait(self.inflight, timeout=_POLL_S, return_when=asyncio.FIRST_COMPLETED)
            await self._send([t.result() for t in done])
        if self.beats.due():
            await self.heartbeat()

    async def _send(self, scored: list[ScoreResult]) -> None:
        if not scored:
            return
        failed = [s for s in scored if s.status is ScoreStatus.FAILED]
        for s in failed[:3]:
            log.warning("sample %s/%d failed: %s", s.prompt_id, s.sample_index, s.reason)
        self.scored += len(scored)
        self.failed += len(failed)
        try:
            await self._call(ScoredIds(scores=scored))
        except HubError as e:  # e.g. the samples were re-leased meanwhile; the hub's state wins
            self.rejected += len(scored)
            log.warning("hub refused %d scored samples: %s", len(scored), e)

    async def drain(self) -> None:
        """Finish and send what is in flight (each sample is bounded by reward.timeout_s)."""
        if self.inflight:
            done, self.inflight = await asyncio.wait(self.inflight)
            await self._send([t.result() for t in done])

    async def heartbeat(self) -> None:
        now, (then, before) = time.monotonic(), self._last_beat
        rate = (self.scored - before) / (now - then) if then else 0.0
        self._last_beat = (now, self.scored)
        stats = {"scored": float(self.scored), "failed": float(self.failed), "samples_per_s": rate,
                 "rejected": float(self.rejected), "inflight": float(len(self.inflight)), "pool_restarts": float(self.scorer.offload.pool_restarts)}
        answer = self.beats.answer(await self._call(self.beats.message(stats)))
        self.shutdown_requested = answer.shutdown

    async def _call(self, msg: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._hub_thread, self.peer.request, msg)

    def close(self) -> None:
        for task in self.inflight:
            task.cancel()
        self._hub_thread.shutdown(wait=False)
