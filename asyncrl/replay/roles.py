"""What each role may ask of the hub (`refusal`), checked before any handler runs.

The role comes from the connection's authentication (ZAP `User-Id`, see asyncrl.net.zap); the name from the
connection's `X-Name` metadata. A hub built without a secret (an in-process hub in tests or an
embedding) has no callers to check: `caller` is None and everything is allowed.

    generator  lease, submit samples of its own leases, return its own leases
    reward     take samples to score, send scores
    learner    take batches, commit steps, announce weight versions, shut the run down
    client     submit prompts (and read the completions of its own submissions, pushed to it)
    launcher   submit prompts (the feeder), report dead peers, shut the run down
    everyone   heartbeat, stats; fatal errors from every service (not clients)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asyncrl import records as R
from asyncrl.replay.leases import LeaseTable

ANY = frozenset({"generator", "reward", "learner", "client", "launcher"})

ALLOWED: dict[type, frozenset[str]] = {
    R.SubmitPrompts: frozenset({"client", "launcher"}),
    R.LeaseRequest: frozenset({"generator"}),
    R.SampleBatch: frozenset({"generator"}),
    R.ReturnPrompts: frozenset({"generator"}),
    R.ScoreRequest: frozenset({"reward"}),
    R.ScoredIds: frozenset({"reward"}),
    R.BatchRequest: frozenset({"learner"}),
    R.CommitStep: frozenset({"learner"}),
    R.WeightVersion: frozenset({"learner"}),
    R.Shutdown: frozenset({"launcher", "learner"}),
    R.PeerDown: frozenset({"launcher"}),
    R.FatalError: ANY - {"client"},
    R.Heartbeat: ANY,
    R.StatsRequest: ANY,
}


@dataclass(frozen=True, slots=True)
class Caller:
    role: str
    name: str  # the connection's X-Name ("" when the peer sent none)


def refusal(caller: Caller | None, msg: Any, leases: LeaseTable) -> str:
    """Why `caller` may not send `msg` ("" when it may)."""
    if caller is None:
        return ""
    allowed = ALLOWED.get(type(msg), frozenset())
    if caller.role not in allowed:
        who = " or ".join(sorted(allowed)) or "no peer"
        return f"role {caller.role!r} may not send {type(msg).__name__} (only {who})"
    return _ownership(caller, msg, leases)


def _ownership(caller: Caller, msg: Any, leases: LeaseTable) -> str:
    if isinstance(msg, R.LeaseRequest) and msg.generator != caller.name:
        return f"LeaseRequest.generator={msg.generator[:60]!r} is not this connection's name {caller.name!r}"
    if isinstance(msg, (R.SampleBatch, R.ReturnPrompts)):
        entry = leases.get(msg.lease_id)
        if entry is not None and entry.generator != caller.name:
            return f"lease {msg.lease_id[:60]!r} is held by another generator, not {caller.name!r}"
    return ""
