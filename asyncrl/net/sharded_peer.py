"""`ShardedPeer`: one peer's connection to a hub split into N shards by prompt id, with HubPeer's calls.

    peer = hub_peer(["tcp://127.0.0.1:5001", "tcp://127.0.0.1:5002"], "generator-0")   # ShardedPeer
    peer = hub_peer(["tcp://127.0.0.1:5001"], "generator-0")                            # a plain HubPeer

Each shard is a whole hub process (`services.replay --name replay-K`) with its own journal, serving the
prompts whose id hashes to it (`shard_of`) and 1/N of every step's groups (`hub.shards`). Every record a
prompt's life produces (its samples, scores, returns) goes to that prompt's shard, so no shard ever sees
another's prompts and each resumes from its own log alone. What a request becomes:

    SubmitPrompts, SampleBatch, ReturnPrompts, ScoredIds   split by prompt id, one request per shard touched
    LeaseRequest, ScoreRequest                              the shards in turn, from a rotating start, without
                                                            waiting; if none has work, one long poll on the next
                                                            (a Lease comes from one shard: its id is that shard's)
    BatchRequest(step)                                      every shard's part of the step (each forms its own
                                                            1/N of the groups and re-delivers it until
                                                            committed); kept here until all N are in, then one
                                                            Batch: the parts' groups in shard order
    WeightVersion, CommitStep, Heartbeat, FatalError,       every shard; the answers merged (a shutdown or fatal
    Shutdown, PeerDown                                      error anywhere is seen by all)
    StatsRequest                                            every shard; counters summed (`merge_stats`), with
                                                            each shard's own under "shards"

Blocking: calls are synchronous, like HubPeer's. A request that goes to several shards (split, broadcast,
stats, a step's parts) is sent to all of them before any reply is awaited (`HubPeer.start` / `finish`), so it
waits about one round trip, or one long poll of `wait_s`, not one per shard; at most `timeout_s` (+ wait_s),
and a shard restarting from its log is retried within `reconnect_s` by that shard's own HubPeer. Lease and
score polls visit the shards in turn (a lease is one shard's; score items are capped by max_samples in total).
Not thread-safe: one per thread.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from collections.abc import Callable, Iterable
from typing import Any

import zmq

from asyncrl import records as R
from asyncrl.net.hub_shards import shard_of
from asyncrl.net.peer import HubPeer, Pending

BROADCAST = (R.WeightVersion, R.CommitStep, R.Heartbeat, R.FatalError, R.Shutdown, R.PeerDown)
# Stats that are one value of the whole run, not a sum over shards: the run is only as far as its slowest shard.
_LOWEST = frozenset({"policy_version", "committed_step", "next_step"})


def hub_peer(endpoints: list[str], name: str, **kw: Any) -> HubPeer | ShardedPeer:
    """A HubPeer for one hub, a ShardedPeer for several (keyword arguments as HubPeer's)."""
    if not endpoints:
        raise ValueError("no replay hub endpoint: run.json lists none")
    return HubPeer(endpoints[0], name, **kw) if len(endpoints) == 1 else ShardedPeer(endpoints, name, **kw)


class ShardedPeer:
    def __init__(self, endpoints: list[str], name: str, **kw: Any) -> None:
        self.endpoints, self.name = list(endpoints), name
        self.peers = [HubPeer(e, name, **kw) for e in self.endpoints]
        self.n = len(self.peers)
        self._turn = 0  # where the next lease / score poll starts
        self._parts: dict[int, dict[int, R.Batch]] = {}  # step -> shard -> its part of the step's batch
        self._ids = f"{name}-{uuid.uuid4().hex[:8]}"  # prefix of ids given to prompts that came without one
        self._seq = 0

    # HubPeer's attributes that callers set or read, applied to every shard
    @property
    def timeout_s(self) -> float:
        return self.peers[0].timeout_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        for p in self.peers:
            p.timeout_s = value

    @property
    def give_up(self) -> Callable[[], bool]:
        return self.peers[0].give_up

    @give_up.setter
    def give_up(self, fn: Callable[[], bool]) -> None:
        for p in self.peers:
            p.give_up = fn

    @property
    def endpoint(self) -> str:
        return ",".join(self.endpoints)

    @property
    def rejected(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.peers:
            for k, v in p.rejected.items():
                out[k] = out.get(k, 0) + v
        return out

    def request(self, msg: Any) -> Any:
        """Send `msg` to the shard(s) it concerns (module doc); HubPeer's errors (HubError, TimeoutError)."""
        if isinstance(msg, BROADCAST):
            return _merge_acks(self._at_once([(k, msg) for k in range(self.n)]))
        if isinstance(msg, R.StatsRequest):
            return R.Stats(counters=merge_stats([r.counters for r in self._at_once([(k, msg) for k in range(self.n)])]))
        if isinstance(msg, (R.LeaseRequest, R.ScoreRequest)):
            return self._poll(msg)
        if isinstance(msg, R.BatchRequest):
            return self._batch(msg)
        if isinstance(msg, R.SubmitPrompts):
            return self._submit(msg)
        if isinstance(msg, R.SampleBatch):
            return self._split(msg, [s.prompt_id for s in msg.samples],
                               lambda keep: R.SampleBatch(lease_id=msg.lease_id, samples=keep(msg.samples)))
        if isinstance(msg, R.ReturnPrompts):
            return self._split(msg, msg.prompt_ids, lambda keep: R.ReturnPrompts(
                lease_id=msg.lease_id, prompt_ids=keep(msg.prompt_ids), reason=msg.reason))
        if isinstance(msg, R.ScoredIds):
            return self._split(msg, [s.prompt_id for s in msg.scores],
                               lambda keep: R.ScoredIds(scores=keep(msg.scores)))
        raise TypeError(f"ShardedPeer cannot route {type(msg).__name__}")

    # ------------------------------------------------------------------ by prompt id

    def _split(self, msg: Any, prompt_ids: list[str], part: Callable[[Callable[[list], list]], Any]) -> R.Ack:
        """One request per shard touched, each with the items (in their order) whose prompt it holds."""
        shard = [shard_of(pid, self.n) for pid in prompt_ids]
        acks = self._at_once([(k, part(lambda items, k=k: [x for x, s in zip(items, shard) if s == k]))
                              for k in sorted(set(shard))])
        return _merge_acks(acks) if acks else R.Ack()

    def _submit(self, msg: R.SubmitPrompts) -> R.Ack:
        """Split by prompt id (a prompt without one gets one here: the shard must follow from it), then the
        ids back in the order given."""
        for p in msg.prompts:
            if not p.prompt_id:
                self._seq += 1
                p.prompt_id = f"{self._ids}-{self._seq}"
        shard = [shard_of(p.prompt_id, self.n) for p in msg.prompts]
        ids: list[str] = [""] * len(msg.prompts)
        wheres = {k: [i for i, s in enumerate(shard) if s == k] for k in sorted(set(shard))}
        acks = self._at_once([(k, R.SubmitPrompts(prompts=[msg.prompts[i] for i in where], watch=msg.watch,
                                                  evaluate=msg.evaluate)) for k, where in wheres.items()])
        for where, ack in zip(wheres.values(), acks):
            for i, pid in zip(where, ack.info.get("prompt_ids", [])):
                ids[i] = pid
        merged = _merge_acks(acks)
        merged.info["prompt_ids"] = ids
        return merged

    # ------------------------------------------------------------------ polls

    def _poll(self, msg: R.LeaseRequest | R.ScoreRequest) -> Any:
        """Leases: the first shard (from a rotating start) that grants one. Scores: items from the shards in
        turn up to max_samples. With nothing anywhere, one long poll of msg.wait_s on the next shard."""
        order = [(self._turn + i) % self.n for i in range(self.n)]
        self._turn = (self._turn + 1) % self.n
        now = replace(msg, wait_s=0.0)
        if isinstance(msg, R.LeaseRequest):
            for k in order:
                lease = self.peers[k].request(now)
                if lease.prompts:
                    return lease
            return self.peers[order[0]].request(msg) if msg.wait_s > 0 else lease
        items: list[R.ToScoreItem] = []
        for k in order:
            left = msg.max_samples - len(items)
            if left <= 0:
                break
            items += self.peers[k].request(replace(now, max_samples=left)).items
        if items or msg.wait_s <= 0:
            return R.ToScore(items=items)
        return self.peers[order[0]].request(msg)

    def _batch(self, msg: R.BatchRequest) -> R.Batch | R.Ack:
        """The step's batch once every shard gave its part (parts already in are not asked for again; a
        shard re-delivers a part until it is committed, so a learner that restarts gets the same batch)."""
        parts = self._parts.setdefault(msg.step, {})
        for step in [s for s in self._parts if s < msg.step]:
            del self._parts[step]
        missing = [k for k in range(self.n) if k not in parts]
        reply: Any = None
        for k, reply in zip(missing, self._at_once([(k, msg) for k in missing])):  # each its own long poll
            if isinstance(reply, R.Batch):
                parts[k] = reply
        if len(parts) < self.n:
            return reply if isinstance(reply, R.Ack) else R.Ack(ok=False, info={"reason": "timeout"})
        del self._parts[msg.step]
        ordered = [parts[k] for k in range(self.n)]
        return R.Batch(step=msg.step, policy_version=min(b.policy_version for b in ordered),
                       groups=[g for b in ordered for g in b.groups],
                       dropped_stale=sum(b.dropped_stale for b in ordered))

    def _at_once(self, requests: list[tuple[int, Any]]) -> list[Any]:
        """Each (shard, request) sent before any reply is awaited, so the shards' round trips and long polls
        overlap; then every reply is read, in order, before the first error (if any) is raised: a reply left
        unread would be taken for the answer to that shard's next request."""
        started: list[tuple[HubPeer, Pending]] = []
        error: BaseException | None = None
        for k, msg in requests:
            try:
                started.append((self.peers[k], self.peers[k].start(msg)))
            except Exception as e:  # noqa: BLE001 - HubRefused at the send; the started ones are still read
                error = e
                break
        replies = []
        for peer, pending in started:
            try:
                replies.append(peer.finish(pending))
            except Exception as e:  # noqa: BLE001 - kept until every started request is answered or failed
                error = error or e
        if error is not None:
            raise error
        return replies

    # ------------------------------------------------------------------ pushed messages

    def receive(self, timeout_s: float = 0.0) -> Any | None:
        """Next message any shard pushed unasked (a Completion), or None after `timeout_s`."""
        for p in self.peers:
            msg = p.receive(0.0)
            if msg is not None:
                return msg
        poller = zmq.Poller()
        for p in self.peers:
            poller.register(p.sock, zmq.POLLIN)
        ready = dict(poller.poll(int(timeout_s * 1000)))
        for p in self.peers:
            if p.sock in ready:
                msg = p.receive(0.0)
                if msg is not None:
                    return msg
        return None

    def reject(self, reason: str, detail: str) -> None:
        self.peers[0].reject(reason, detail)

    def close(self) -> None:
        for p in self.peers:
            p.close()

    def __enter__(self) -> ShardedPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _merge_acks(acks: list[Any]) -> R.Ack:
    """One Ack from the shards': ok if all were; info merged (numbers summed, flags or-ed, the newest policy
    version, dicts merged the same way, lists joined)."""
    info: dict[str, Any] = {}
    for ack in acks:
        if isinstance(ack, R.Ack):
            _merge_into(info, ack.info or {}, newest=("policy_version",))
    return R.Ack(ok=all(getattr(a, "ok", True) for a in acks), info=info)


def merge_stats(shards: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's counters from its shards' `hub_stats`: counts summed, flags or-ed, lists joined, dicts merged
    key by key; policy version and steps the lowest over shards (`_LOWEST`); each peer once; each shard's own
    counters under "shards"."""
    out: dict[str, Any] = {}
    peers: dict[str, Any] = {}  # every peer beats to every shard: one entry per peer, the first shard's
    for s in shards:
        _merge_into(out, {k: v for k, v in s.items() if k != "peers"}, lowest=_LOWEST)
        for name, info in (s.get("peers") or {}).items():
            peers.setdefault(name, info)
    out["peers"] = peers
    out["shards"] = shards
    return out


def _merge_into(out: dict[str, Any], add: dict[str, Any], lowest: Iterable[str] = (),
                newest: Iterable[str] = ()) -> None:
    for key, value in add.items():
        if key not in out:
            out[key] = _copy(value)
            continue
        have = out[key]
        if isinstance(value, bool) or isinstance(have, bool):
            out[key] = bool(have) or bool(value)
        elif isinstance(value, (int, float)) and isinstance(have, (int, float)):
            out[key] = min(have, value) if key in lowest else max(have, value) if key in newest else have + value
        elif isinstance(value, dict) and isinstance(have, dict):
            _merge_into(have, value, lowest, newest)
        elif isinstance(value, list) and isinstance(have, list):
            have.extend(value)
        # anything else (a string, a type that changed between shards): the first shard's stays


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return list(value) if isinstance(value, list) else value
