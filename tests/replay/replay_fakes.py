"""Small builders shared by the replay tests: prompts, samples, a state fingerprint, a scripted run."""

from __future__ import annotations

from typing import Any

import numpy as np

from asyncrl import records as R
from asyncrl import wire
from asyncrl.replay.journal import Journal
from asyncrl.replay.state import HubState, ScoreResult


def prompt(pid: str = "", n: int = 2, text: str = "q") -> R.Prompt:
    return R.Prompt(prompt_id=pid, n=n, text=text)


def sample(pid: str, i: int, version: int = 0, tokens: int = 4) -> R.Sample:
    return R.Sample(
        prompt_id=pid, sample_index=i, prompt_token_ids=np.arange(3, dtype=np.int32),
        response_token_ids=np.arange(tokens, dtype=np.int32), logprobs=np.full(tokens, -0.5, np.float32),
        versions=np.full(tokens, version, np.int32), finish_reason=R.FinishReason.STOP,
    )


def packed(samples: list[R.Sample]) -> list[wire.PackedSample]:
    """Samples as the hub's core takes them: a generator's SampleBatch, encoded, then decoded as the hub does."""
    return arrive(R.SampleBatch(lease_id="", samples=samples))[1].samples


def arrive(msg: Any) -> tuple[bytes, Any]:
    """A message as the hub receives it: its frame and `wire.decode_packed` of it (what `Journal` takes)."""
    frame = wire.encode(msg)
    return frame, wire.decode_packed(frame)


def ok(pid: str, i: int, reward: float = 1.0) -> ScoreResult:
    return ScoreResult(prompt_id=pid, sample_index=i, reward=reward)


def bad(pid: str, i: int) -> ScoreResult:
    return ScoreResult(prompt_id=pid, sample_index=i, reward=0.0, status=R.ScoreStatus.FAILED, reason="boom")


def generate_all(state: HubState, lease_id: str, prompts: list[R.Prompt], version: int = 0) -> None:
    out = state.add_samples(lease_id, packed([sample(p.prompt_id, i, version) for p in prompts for i in range(p.n)]))
    assert not out.rejected, out.rejected


def score_all(state: HubState, prompts: list[R.Prompt]) -> None:
    out = state.score([ok(p.prompt_id, i) for p in prompts for i in range(p.n)])
    assert not out.rejected, out.rejected


def fingerprint(st: HubState) -> dict[str, Any]:
    """Everything that must survive a restart, as plain data."""
    return {
        "queue": list(st.queue),
        "leases": {k: (e.generator, e.expires_at, list(e.prompt_ids)) for k, e in st.leases.leases.items()},
        "issued": st.leases.issued,
        "groups": {k: (g.phase.value, [s.value for s in g.states], g.lease_id) for k, g in st.groups.items()},
        "ready": list(st.ready),
        "delivered": {s: [[(x.sample.prompt_id, x.sample.sample_index, x.reward) for x in g.samples]
                          for g in b.groups] for s, b in st.book.delivered.items()},
        "book": (st.book.last_formed, st.book.committed),
        "counts": st.counts.snapshot(), "transitions": dict(st.counts.transitions),
        "client": (st.counts.client_submitted, st.counts.client_failed, sorted(k for k, g in st.groups.items() if g.client)),
        "events": dict(st.events), "version": st.version, "admitted": st.admitted,
        "pending_dropped": st.pending_dropped, "seq": st.prompts_seq,
        "eval": (list(st.eval_queue), st.eval_counts.snapshot(), dict(st.eval_counts.transitions),
                 sorted(k for k, g in st.groups.items() if g.evaluate)),
    }


def scripted_run(j: Journal) -> None:
    """A run touching every logged mutation: submit, grant, samples (with rejects), return, expire,
    score (with failures), version, prune, form, commit; then a client's prompts (one fails wholly, one
    stays ready with a failed sample)."""
    sub = R.SubmitPrompts(prompts=[prompt("", n=2, text=f"q{i}") for i in range(6)])
    j.submit(*arrive(sub))
    lease, ps = j.grant("g0", 3, now=100.0, ttl_s=10.0)
    sb = R.SampleBatch(lease_id=lease.lease_id, samples=[sample(p.prompt_id, i) for p in ps[:2] for i in range(2)]
                       + [sample(ps[2].prompt_id, 0), sample(ps[0].prompt_id, 0)])
    j.add_samples(*arrive(sb))
    j.return_prompts(lease.lease_id, [ps[2].prompt_id])
    lease2, ps2 = j.grant("g1", 2, now=101.0, ttl_s=5.0)
    j.expire(200.0)
    j.score([ok(ps[0].prompt_id, 0), ok(ps[0].prompt_id, 1), bad(ps[1].prompt_id, 0), ok(ps[1].prompt_id, 1)])
    j.set_version(3)
    j.prune_stale(1)
    lease3, ps3 = j.grant("g2", 4, now=300.0, ttl_s=50.0)
    sb3 = R.SampleBatch(lease_id=lease3.lease_id, samples=[sample(p.prompt_id, i, version=3) for p in ps3 for i in range(2)])
    j.add_samples(*arrive(sb3))
    j.score([ok(p.prompt_id, i) for p in ps3 for i in range(2)])
    j.form_batch(1, 2)
    j.form_batch(2, 2)
    j.commit(1)
    csub = R.SubmitPrompts(prompts=[prompt("c0", n=2), prompt("c1", n=2)], watch=True)
    j.submit(*arrive(csub))
    lease4, ps4 = j.grant("g3", 2, now=400.0, ttl_s=50.0)
    sb4 = R.SampleBatch(lease_id=lease4.lease_id, samples=[sample(p.prompt_id, i, version=3) for p in ps4 for i in range(2)])
    j.add_samples(*arrive(sb4))
    j.score([bad("c0", 0), bad("c0", 1), ok("c1", 0), bad("c1", 1)])
    esub = R.SubmitPrompts(prompts=[prompt(f"e{i}", n=1) for i in range(3)], watch=True, evaluate=True)
    j.submit(*arrive(esub))
    lease5, ps5 = j.grant("g4", 2, now=500.0, ttl_s=50.0)  # e0, e1: evaluation prompts go first
    sb5 = R.SampleBatch(lease_id=lease5.lease_id, samples=[sample(p.prompt_id, 0, version=3) for p in ps5])
    j.add_samples(*arrive(sb5))
    j.score([ok(ps5[0].prompt_id, 0)])  # e0 done and forgotten; e1 waits for its score, e2 stays queued
