"""The hub's `Stats` counters: sample states, transitions, queue depths, accounting, peers.

``accounting`` is the one-look health check: every sample ever submitted is trained, dropped
(stale), failed, or still in a live state; ``lost`` must be 0:

    submitted == trained + dropped_stale + filtered + failed + client_failed + in_flight + lost

(``filtered``: samples of groups without signal that the hub dropped for refill, `learner.filter_refill`.)

Samples of client prompts (`asyncrl.Client`) are trained like the run's own and counted in ``submitted``
(``client_submitted`` of them); those that fail are ``client_failed``, never the run's ``failed``, in
``accounting`` and in ``states`` alike, so a user's bad prompt does not read as a failing run.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any, Protocol

from asyncrl.observe.prometheus import Sample
from asyncrl.records import SampleState
from asyncrl.replay.config import BatchConfig, HubConfig
from asyncrl.replay.journal import Journal
from asyncrl.replay.peers import PeerTable
from asyncrl.replay.state import HubState


class HubView(Protocol):
    """What the counters read from the hub (`asyncrl.replay.core.HubCore` has it; this module does not
    import the core, which imports `rejection_kind` from here)."""

    cfg: HubConfig
    batch: BatchConfig
    journal: Journal
    state: HubState
    peers: PeerTable
    counters: dict[str, int]
    rejected: Counter[str]
    parked: dict[type, deque[Any]]
    watchers: dict[str, Any]
    shutdown: bool
    filter_uniform: bool


def hub_stats(core: HubView, now: float) -> dict[str, Any]:
    st, cfg = core.state, core.cfg
    counts = st.counts
    events = dict(st.events)
    return {
        "states": counts.run_states(),
        "transitions": dict(counts.transitions),
        "events": events,
        "policy_version": st.version,
        "queued_prompts": len(st.queue),
        "leases": len(st.leases),
        "leased_prompts": sum(len(e.prompt_ids) for e in st.leases.leases.values()),
        "awaiting_score": counts.by_state[SampleState.GENERATED],
        "ready_groups": len(st.ready),
        "delivered_batches": len(st.book.delivered),
        "next_step": st.book.next_step,
        "committed_step": st.book.committed,
        "accepted": st.accepted,
        "running": st.running,
        "admissible": st.admissible(cfg.max_staleness, core.batch.prompts_per_step),
        "dropped_stale": events.get("dropped_stale", 0),
        "refill": core.filter_uniform,  # groups without signal are dropped before batches form
        "rejected_frames": core.counters["rejected_frames"],
        "rejected": dict(core.rejected),
        "hub": dict(core.counters),
        "parked": {kind.__name__: len(q) for kind, q in core.parked.items()},
        "watchers": len(core.watchers),
        "shutdown": core.shutdown,
        "fatal": list(core.peers.fatal),
        "peers": core.peers.report(now),
        "log": _log_stats(core),
        "accounting": accounting(core),
        "eval": {"queued_prompts": len(st.eval_queue), **st.eval_counts.snapshot(),
                 "submitted": st.eval_counts.submitted},  # held-out evaluation samples, not the run's
    }


def accounting(core: HubView) -> dict[str, int]:
    counts = core.state.counts
    by = counts.by_state
    return {
        "submitted": counts.submitted,
        "client_submitted": counts.client_submitted,
        "trained": by[SampleState.TRAINED],
        "dropped_stale": by[SampleState.DROPPED],
        "filtered": by[SampleState.FILTERED],
        "failed": counts.run_failed,
        "client_failed": counts.client_failed,
        "in_flight": sum(by[s] for s in (SampleState.QUEUED, SampleState.LEASED, SampleState.GENERATED,
                                         SampleState.SCORED, SampleState.DELIVERED)),
        "rejected_frames": core.counters["rejected_frames"],
        "lost": counts.lost,
    }


_ACCOUNTING_COUNTERS = ("submitted", "client_submitted", "trained", "dropped_stale", "filtered", "failed",
                        "client_failed")  # only grow; in_flight and lost move
_GAUGES = ("policy_version", "queued_prompts", "leases", "ready_groups", "awaiting_score", "committed_step")


def prometheus_samples(core: HubView, now: float) -> list[Sample]:
    """The hub's accounting, request counters (rejected, refused, ...) and queue depths for Prometheus."""
    stats = hub_stats(core, now)
    out = [Sample(f"samples_{k}", v, "counter", doc=f"samples {k} (accounting)") for k, v in stats["accounting"].items()
           if k in _ACCOUNTING_COUNTERS]
    out += [Sample("samples_in_flight", stats["accounting"]["in_flight"], doc="samples in a live state"),
            Sample("samples_lost", stats["accounting"]["lost"], doc="samples unaccounted for (must be 0)")]
    out += [Sample(k, v, "counter", doc=f"hub {k} since the hub process started") for k, v in stats["hub"].items()]
    out += [Sample("rejected_frames_by_kind", v, "counter", (("kind", k),), "rejected frames by reason")
            for k, v in stats["rejected"].items()]
    out += [Sample(k, float(stats[k])) for k in _GAUGES]
    return out


def _log_stats(core: HubView) -> dict[str, Any]:
    w = core.journal.writer
    return {"path": str(w.path), "records": w.records, "bytes": w.bytes} if w is not None else {}


# Rejection reasons by the words that start or mark them (first match wins); the keys are a fixed set,
# so a flood of distinct bad frames cannot grow the counter.
_KINDS = (("exceeds max_frame_bytes", "too_large"), ("not msgpack", "not_msgpack"), ("nests deeper", "too_deep"),
          ("holds more than", "too_many_values"), ("truncated", "truncated"), ("claims", "truncated"),
          ("envelope", "no_envelope"), ("schema version", "schema_version"), ("unknown message type", "unknown_type"),
          ("not a request", "not_a_request"), ("decoder error", "decoder_error"))


def rejection_kind(reason: str) -> str:
    """The counter a rejected frame's reason goes to: one of `_KINDS`' names, else "invalid"."""
    head = reason[:200]
    return next((kind for words, kind in _KINDS if words in head), "invalid")
