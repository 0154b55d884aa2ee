"""`HubCore`: what the hub does with each request; no sockets (the `Hub` loop feeds it frames).

    frame ──decode/validate──► handler ──► Journal (state + log) ──► reply into `outbox`
                  │ bad                  └─ nothing to give yet ──► parked (long poll) until
                  ▼                                                 work appears or wait_s passes
           ErrorReply + rejected_frames

Long polls: LeaseRequest waits for admissible queued prompts, ScoreRequest for generated samples,
BatchRequest for enough ready groups. `pump(now)` serves parked requests in arrival order after
every burst of messages and every tick; `tick(now)` also expires leases and times out waiters.
Replies are queued in `outbox` and sent by the loop only after the log is synced (group commit).
"""

from __future__ import annotations

import logging
import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asyncrl import records as R
from asyncrl import wire
from asyncrl.replay.config import BatchConfig, HubConfig
from asyncrl.replay.journal import Journal
from asyncrl.replay.peers import PeerTable
from asyncrl.replay.roles import Caller, refusal
from asyncrl.replay.scoring import ScoreDispatch
from asyncrl.replay.stats import hub_stats, rejection_kind

log = logging.getLogger("asyncrl.replay")

Envelope = list[bytes]  # ZeroMQ routing frames of the peer (ROUTER identity, maybe an empty delimiter)


@dataclass(slots=True)
class Parked:
    envelope: Envelope
    msg: Any  # LeaseRequest | ScoreRequest | BatchRequest
    deadline: float


class HubCore:
    def __init__(self, cfg: HubConfig, batch: BatchConfig, journal: Journal, *, filter_uniform: bool = False) -> None:
        """filter_uniform: drop ready groups without signal before forming a batch (refill; the run config's
        `learner.resolved_filter_refill`)."""
        self.cfg, self.batch, self.journal = cfg, batch, journal
        self.filter_uniform = filter_uniform
        self.state = journal.state
        self.dispatch = ScoreDispatch(cfg.score_timeout_s)
        self.dispatch.add(self.state.generated_ids())
        self.peers = PeerTable()
        self.watchers: dict[str, tuple[Envelope, int]] = {}  # prompt_id -> (client, completions left)
        self.parked: dict[type, deque[Parked]] = {R.LeaseRequest: deque(), R.ScoreRequest: deque(),
                                                  R.BatchRequest: deque()}
        self.outbox: list[tuple[Envelope, Any]] = []  # (envelope, record or encoded frame)
        self.batch_frames: dict[int, bytes] = {}  # step -> encoded Batch (re-delivery, several ranks)
        self.counters = {"rejected_frames": 0, "rejected_requests": 0, "internal_errors": 0, "requests": 0,
                         "rejected_sample_batches": 0, "refused_requests": 0}
        self.auth: dict[str, int] | None = None  # connection counters of the hub's ZAP handler, when it has one
        self.last_failure = ""  # reason of the latest sample of the run (not a client's) a reward worker failed
        self.rejected: Counter[str] = Counter()  # rejected frames by `rejection_kind` (a fixed, small set)
        self.shutdown = False
        self.handlers: dict[type, Callable[[Envelope, Any, Any, float], Any]] = {
            R.SubmitPrompts: self._submit, R.LeaseRequest: self._lease, R.SampleBatch: self._samples,
            R.ReturnPrompts: self._return, R.ScoreRequest: self._score_request, R.ScoredIds: self._scored_ids,
            R.BatchRequest: self._batch, R.CommitStep: self._commit, R.WeightVersion: self._version,
            R.Heartbeat: self._heartbeat, R.FatalError: self._fatal, R.Shutdown: self._shutdown,
            R.StatsRequest: self._stats, R.PeerDown: self._peer_down,
        }

    # ------------------------------------------------------------------------------ entry points

    def handle(self, envelope: Envelope, frame: Any, now: float, caller: Caller | None = None) -> None:
        """One request frame (bytes or a zmq.Frame) from the peer behind `envelope`; `caller` is its
        authenticated role and name (None: a hub without authentication, nothing to check)."""
        data = memoryview(frame)  # no copy: stored samples keep views into it (a zmq.Frame is never reused)
        self.counters["requests"] += 1
        try:
            msg = wire.decode_packed(data, self.cfg.max_frame_bytes)
        except Exception as e:  # WireError, or a decoder bug: either way the frame fails, never the hub
            kind = wire.message_type(data) if len(data) <= self.cfg.max_frame_bytes else ""
            reason = str(e) if isinstance(e, wire.WireError) else f"decoder error: {type(e).__name__}: {e}"
            return self._reject_frame(envelope, reason, kind)
        handler = self.handlers.get(type(msg))
        if handler is None:
            return self._reject_frame(envelope, f"{type(msg).__name__} is not a request the hub serves",
                                      type(msg).__name__)
        refused = refusal(caller, msg, self.state.leases)
        if refused:
            return self._refuse(envelope, refused, type(msg).__name__)
        try:
            reply = handler(envelope, data, msg, now)
        except ValueError as e:
            self.counters["rejected_requests"] += 1
            if _worth_logging(self.counters["rejected_requests"]):
                log.warning("rejected request #%d %s: %s", self.counters["rejected_requests"], type(msg).__name__, e)
            reply = R.ErrorReply(reason=str(e), request_type=type(msg).__name__)
        except Exception as e:  # a bug must not take the hub down; it is counted and reported
            self.counters["internal_errors"] += 1
            log.exception("internal error handling %s", type(msg).__name__)
            reply = R.ErrorReply(reason=f"internal error: {type(e).__name__}: {e}", request_type=type(msg).__name__)
        if reply is not None:
            self.outbox.append((envelope, reply))

    def tick(self, now: float) -> None:
        if self.journal.expire(now):
            log.info("expired leases; prompts back in the queue")
        for kind, queue in self.parked.items():
            if any(p.deadline <= now for p in queue):
                for p in queue:
                    if p.deadline <= now:
                        self.outbox.append((p.envelope, self._empty_reply(p.msg)))
                self.parked[kind] = deque(p for p in queue if p.deadline > now)
        self.pump(now)

    def pump(self, now: float) -> None:
        """Serve parked long polls that can be served now, oldest first."""
        for kind, serve in ((R.BatchRequest, self._try_batch), (R.ScoreRequest, self._try_score),
                            (R.LeaseRequest, self._try_lease)):
            queue = self.parked[kind]
            for _ in range(len(queue)):
                p = queue.popleft()
                try:
                    reply = serve(p.envelope, p.msg, now)
                except ValueError as e:
                    self.counters["rejected_requests"] += 1
                    reply = R.ErrorReply(reason=str(e), request_type=type(p.msg).__name__)
                except Exception as e:  # a bug must not take the hub down (as in `handle`)
                    self.counters["internal_errors"] += 1
                    log.exception("internal error serving parked %s", type(p.msg).__name__)
                    reply = R.ErrorReply(reason=f"internal error: {type(e).__name__}", request_type=type(p.msg).__name__)
                if reply is None:
                    queue.append(p)
                else:
                    self.outbox.append((p.envelope, reply))

    # ------------------------------------------------------------------------- prompts and leases

    def _submit(self, env: Envelope, frame: Any, msg: R.SubmitPrompts, now: float) -> R.Ack:
        if msg.evaluate and not msg.watch:
            raise ValueError("SubmitPrompts.evaluate needs watch=true: an evaluation's samples go only to its submitter")
        room = self.cfg.max_queued_prompts - len(self.state.eval_queue if msg.evaluate else self.state.queue)
        if len(msg.prompts) > room:
            raise ValueError(f"hub queue full: {len(msg.prompts)} prompts, room for {room}; retry later "
                             f"or raise hub.max_queued_prompts={self.cfg.max_queued_prompts}")
        too_big = next((p for p in msg.prompts if p.n > self.cfg.max_samples_per_prompt), None)
        if too_big is not None:
            raise ValueError(f"prompt {too_big.prompt_id!r}: n={too_big.n} > hub.max_samples_per_prompt="
                             f"{self.cfg.max_samples_per_prompt}; ask for fewer samples or raise the limit")
        ids = self.journal.submit(frame, msg)
        if msg.watch:
            for p in msg.prompts:
                self.watchers[p.prompt_id] = (env, p.n)
        return R.Ack(info={"prompt_ids": ids})

    def _lease(self, env: Envelope, frame: Any, msg: R.LeaseRequest, now: float) -> R.Lease | None:
        _check_count("LeaseRequest.max_prompts", msg.max_prompts)
        self.peers.touch(msg.generator, "generator", now)
        return self._try_lease(env, msg, now) or self._park(env, msg, now)

    def _try_lease(self, env: Envelope, msg: R.LeaseRequest, now: float) -> R.Lease | None:
        """A fair share: with other generators parked on a lease too, this one gets at most its share of the
        queued admissible prompts (rounded up), so one generator does not take a whole step while the others wait;
        alone, it gets all it asks for."""
        available = min(self.state.admissible(self.cfg.max_staleness, self.batch.prompts_per_step),
                        len(self.state.queue))
        others = {p.msg.generator for p in self.parked[R.LeaseRequest]} - {msg.generator}
        # evaluation prompts are outside admission; `grant` leases them first
        count = min(msg.max_prompts, len(self.state.eval_queue) + -(-available // (1 + len(others))))
        got = self.journal.grant(msg.generator, count, now, self.cfg.lease_timeout_s) if count > 0 else None
        if got is None:
            return None
        entry, prompts = got
        return R.Lease(lease_id=entry.lease_id, prompts=prompts, policy_version=self.state.version,
                       expires_in_s=self.cfg.lease_timeout_s)

    def _samples(self, env: Envelope, frame: Any, msg: R.SampleBatch, now: float) -> R.Ack:
        out = self.journal.add_samples(frame, msg)
        self.dispatch.add(out.accepted)
        if out.rejected:
            self.counters["rejected_sample_batches"] += 1
            if _worth_logging(self.counters["rejected_sample_batches"]):
                log.warning("lease %s: rejected samples %s", msg.lease_id, dict(out.rejected))
        return R.Ack(ok=not out.rejected, info={"accepted": len(out.accepted), "rejected": dict(out.rejected)})

    def _return(self, env: Envelope, frame: Any, msg: R.ReturnPrompts, now: float) -> R.Ack:
        if msg.reason:  # a prompt no engine can take would come back forever: it fails with the reason
            log.warning("lease %s: prompts %s failed: %s", msg.lease_id, msg.prompt_ids[:5], msg.reason[:300])
            return R.Ack(info={"failed": self.journal.fail_prompts(msg.lease_id, msg.prompt_ids)})
        return R.Ack(info={"returned": self.journal.return_prompts(msg.lease_id, msg.prompt_ids)})

    # ---------------------------------------------------------------------------------- scoring

    def _score_request(self, env: Envelope, frame: Any, msg: R.ScoreRequest, now: float) -> R.ToScore | None:
        _check_count("ScoreRequest.max_samples", msg.max_samples)
        self.peers.touch(msg.worker, "reward", now)
        return self._try_score(env, msg, now) or self._park(env, msg, now)

    def _try_score(self, env: Envelope, msg: R.ScoreRequest, now: float) -> R.ToScore | None:
        items = self.dispatch.take(self.state, msg.max_samples, now)
        return R.ToScore(items=items) if items else None

    def _scored_ids(self, env: Envelope, frame: Any, msg: R.ScoredIds, now: float) -> R.Ack:
        results = msg.scores
        failed = [r.reason for r in results
                  if r.status is R.ScoreStatus.FAILED and not self.state.is_client(r.prompt_id)]
        if failed:  # the launcher's watchdog names it when no step is made (a client's failure is not the run's)
            self.last_failure = failed[-1][:300]
        out = self.journal.score(results)
        for scored in out.scored:
            self._notify(scored)
        return R.Ack(ok=not out.rejected, info={"accepted": len(out.accepted), "rejected": dict(out.rejected)})

    def _notify(self, scored: R.ScoredSample) -> None:
        pid = scored.sample.prompt_id
        watch = self.watchers.get(pid)
        if watch is None:
            return
        env, left = watch
        self.outbox.append((env, R.Completion(scored=scored)))
        if left <= 1:
            del self.watchers[pid]
        else:
            self.watchers[pid] = (env, left - 1)

    # ---------------------------------------------------------------------------------- learner

    def _batch(self, env: Envelope, frame: Any, msg: R.BatchRequest, now: float) -> Any:
        self.peers.touch(msg.learner, "learner", now)
        return self._try_batch(env, msg, now) or self._park(env, msg, now)

    def _try_batch(self, env: Envelope, msg: R.BatchRequest, now: float) -> Any:
        book = self.state.book
        why = book.why_not(msg.step)
        if why:
            raise ValueError(why)
        if msg.step not in book.delivered:
            if not self._form(msg.step):
                return None
        frame = self.batch_frames.get(msg.step)
        if frame is None:  # encoded once (the samples spliced in as they arrived), re-sent as it is
            frame = self.batch_frames[msg.step] = wire.encode(book.delivered[msg.step])
        return frame

    def _form(self, step: int) -> bool:
        book = self.state.book
        if book.last_formed - book.committed >= self.cfg.max_uncommitted_steps:
            raise ValueError(f"step {step}: {self.cfg.max_uncommitted_steps} batches delivered and not "
                             "committed; send CommitStep after checkpoints or raise hub.max_uncommitted_steps")
        self.journal.prune_stale(self.state.version - self.cfg.max_staleness)
        if self.filter_uniform:
            self._filter(step)
        if len(self.state.ready) < self.batch.prompts_per_step:
            return False
        self.journal.form_batch(step, self.batch.prompts_per_step)
        return True

    def _filter(self, step: int) -> None:
        """Refill: groups without signal leave (their prompts' slots go back to generation), so the batch of
        `step` waits for groups with signal instead of training on fewer. A task the policy always or never
        solves stalls the run here, so the running total is logged (its first 20 values, then every 1000th)."""
        if self.journal.filter_uniform():
            total = self.state.events["groups_filtered"]
            if _worth_logging(total):
                log.info("step %d: %d groups without signal filtered so far (their rewards did not differ); "
                         "the batch waits for %d groups with signal, %d ready", step, total,
                         self.batch.prompts_per_step, len(self.state.ready))

    def _commit(self, env: Envelope, frame: Any, msg: R.CommitStep, now: float) -> R.Ack:
        n = self.journal.commit(msg.step)
        for step in [s for s in self.batch_frames if s <= msg.step]:
            del self.batch_frames[step]
        return R.Ack(info={"committed": n})

    def _version(self, env: Envelope, frame: Any, msg: R.WeightVersion, now: float) -> R.Ack:
        if msg.version != self.state.version:
            self.journal.set_version(msg.version)
            self.journal.prune_stale(msg.version - self.cfg.max_staleness)
        return R.Ack(info={"policy_version": self.state.version})

    # ---------------------------------------------------------------------------------- control

    def _heartbeat(self, env: Envelope, frame: Any, msg: R.Heartbeat, now: float) -> R.Ack:
        self.peers.beat(msg, now)
        return R.Ack(info={"shutdown": self.shutdown, "policy_version": self.state.version})

    def _fatal(self, env: Envelope, frame: Any, msg: R.FatalError, now: float) -> R.Ack:
        log.error("fatal error from %s %s: %s", msg.service, msg.name, msg.reason)
        self.peers.record_fatal(msg, now)
        self.shutdown = True
        return R.Ack()

    def _shutdown(self, env: Envelope, frame: Any, msg: R.Shutdown, now: float) -> R.Ack:
        log.info("shutdown requested: %s", msg.reason)
        self.shutdown = True
        return R.Ack()

    def _peer_down(self, env: Envelope, frame: Any, msg: R.PeerDown, now: float) -> R.Ack:
        """The launcher saw `msg.name` die: its leases go back to the queue now, not at their timeout."""
        back = sum(self.journal.return_prompts(e.lease_id, list(e.prompt_ids))
                   for e in self.state.leases.held_by(msg.name))
        if back:
            log.info("%s %s is down (%s): %d leased prompts back in the queue", msg.service, msg.name,
                     msg.reason[:200], back)
        return R.Ack(info={"returned": back})

    def _stats(self, env: Envelope, frame: Any, msg: R.StatsRequest, now: float) -> R.Stats:
        counters = hub_stats(self, now)
        counters["last_failure"] = self.last_failure
        if self.auth is not None:
            counters["auth"] = dict(self.auth)
        return R.Stats(counters=counters)

    # ---------------------------------------------------------------------------------- helpers

    def _park(self, env: Envelope, msg: Any, now: float) -> Any:
        wait = min(msg.wait_s, self.cfg.max_wait_s) if math.isfinite(msg.wait_s) else 0.0
        if wait <= 0:
            return self._empty_reply(msg)
        self.parked[type(msg)].append(Parked(env, msg, now + wait))
        return None

    def _empty_reply(self, msg: Any) -> Any:
        if isinstance(msg, R.LeaseRequest):
            return R.Lease(lease_id="", prompts=[], policy_version=self.state.version, expires_in_s=0.0)
        if isinstance(msg, R.ScoreRequest):
            return R.ToScore(items=[])
        return R.Ack(ok=False, info={"reason": "timeout"})

    def _refuse(self, env: Envelope, reason: str, request_type: str) -> None:
        """The caller's role may not send this (or not for this lease): counted, logged, answered."""
        self.counters["refused_requests"] += 1
        if _worth_logging(self.counters["refused_requests"]):
            log.warning("refused request #%d %s: %s", self.counters["refused_requests"], request_type, reason)
        self.outbox.append((env, R.ErrorReply(reason=f"refused: {reason}", request_type=request_type)))

    def _reject_frame(self, env: Envelope, reason: str, request_type: str) -> None:
        self.counters["rejected_frames"] += 1
        self.rejected[rejection_kind(reason)] += 1
        if _worth_logging(self.counters["rejected_frames"]):
            log.warning("rejected frame #%d (%s): %s", self.counters["rejected_frames"], request_type or "?", reason[:300])
        self.outbox.append((env, R.ErrorReply(reason=reason[:500], request_type=request_type)))  # bounded reply


def _worth_logging(count: int) -> bool:
    """Log the first rejections, then every 1000th (a flood of bad frames must not flood the log)."""
    return count <= 20 or count % 1000 == 0


def _check_count(name: str, value: int) -> None:
    if value < 0:
        raise ValueError(f"{name}={value}: must be >= 0 (the work you can take now)")
