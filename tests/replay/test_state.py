"""HubState: leases, expiry, admission, the staleness drop rule, failures, batches, accounting."""

from __future__ import annotations

import pytest
from replay_fakes import bad, generate_all, ok, packed, prompt, sample, score_all

from asyncrl.records import SampleState as S
from asyncrl.replay.state import HubState


def ready_state(n_prompts: int = 4, n: int = 2, version: int = 0) -> tuple[HubState, list]:
    st = HubState()
    st.submit([prompt(f"p{i}", n) for i in range(n_prompts)])
    lease, ps = st.grant("g", n_prompts, now=0.0, ttl_s=10.0)
    generate_all(st, lease.lease_id, ps, version)
    score_all(st, ps)
    return st, ps


def test_lifecycle_counts_every_state_and_transition():
    st, ps = ready_state(4, n=2)
    assert st.counts.snapshot()["scored"] == 8 and len(st.ready) == 4
    batch = st.form_batch(1, 2)
    assert [g.prompt.prompt_id for g in batch.groups] == ["p0", "p1"]
    assert st.counts.by_state[S.DELIVERED] == 4
    assert st.commit(1) == 1
    assert st.counts.by_state[S.TRAINED] == 4 and st.counts.lost == 0
    t = st.counts.transitions
    assert t["queued->leased"] == 8 and t["leased->generated"] == 8 and t["scored->delivered"] == 4
    assert t["delivered->trained"] == 4
    assert sum(st.counts.by_state.values()) == st.counts.submitted == 8


def test_submit_rejects_duplicate_ids_atomically():
    st = HubState()
    st.submit([prompt("a")])
    with pytest.raises(ValueError, match="prompt_id 'a'"):
        st.submit([prompt("b"), prompt("a")])
    with pytest.raises(ValueError, match="prompt_id 'c'"):
        st.submit([prompt("c"), prompt("c")])
    assert list(st.queue) == ["a"] and st.counts.submitted == 2


def test_prompts_without_id_get_sequential_ids():
    st = HubState()
    assert st.submit([prompt(""), prompt("")]) == ["p1", "p2"]


def test_expired_lease_requeues_at_front_in_order_and_rejects_late_samples():
    st = HubState()
    st.submit([prompt(f"p{i}") for i in range(4)])
    lease, _ = st.grant("g", 2, now=0.0, ttl_s=5.0)
    st.add_samples(lease.lease_id, packed([sample("p0", 0)]))
    assert st.expire(4.9) == 0
    assert st.expire(5.0) == 2
    assert list(st.queue) == ["p0", "p1", "p2", "p3"]
    assert st.counts.by_state[S.GENERATED] == 1 and st.counts.by_state[S.QUEUED] == 7
    late = st.add_samples(lease.lease_id, packed([sample("p0", 1)]))
    assert late.rejected == {"expired_lease": 1}
    assert st.events["rejected_samples"] == 1 and st.counts.lost == 0


def test_releasing_a_prompt_after_partial_generation_only_regenerates_missing_samples():
    st = HubState()
    st.submit([prompt("p0", n=3)])
    lease, _ = st.grant("g", 1, now=0.0, ttl_s=5.0)
    st.add_samples(lease.lease_id, packed([sample("p0", 0)]))
    assert st.return_prompts(lease.lease_id, ["p0"]) == 1
    lease2, _ = st.grant("g", 1, now=1.0, ttl_s=5.0)
    out = st.add_samples(lease2.lease_id, packed([sample("p0", i) for i in range(3)]))
    assert out.rejected == {"duplicate": 1} and len(out.accepted) == 2
    assert len(st.leases) == 0 and st.counts.by_state[S.GENERATED] == 3


def test_duplicates_and_foreign_samples_are_rejected_and_never_double_counted():
    st = HubState()
    st.submit([prompt("a"), prompt("b")])
    la, _ = st.grant("g", 1, now=0.0, ttl_s=5.0)
    lb, _ = st.grant("h", 1, now=0.0, ttl_s=5.0)
    sent = [sample("a", 0), sample("a", 0), sample("b", 0), sample("a", 7), sample("z", 0)]
    out = st.add_samples(la.lease_id, packed(sent))
    assert out.rejected == {"duplicate": 1, "not_in_lease": 1, "bad_index": 1, "unknown_prompt": 1}
    assert st.counts.by_state[S.GENERATED] == 1
    assert st.score([ok("a", 0), ok("a", 0), ok("a", 1)]).rejected == {"not_generated": 2}
    assert st.counts.by_state[S.SCORED] == 1 and st.counts.lost == 0


def test_admission_follows_areal_formula_and_version():
    st = HubState()
    st.submit([prompt(f"p{i}") for i in range(20)])
    assert st.admissible(max_staleness=1, prompts_per_step=2) == 4  # (1 + 0 + 1) * 2
    st.grant("g", 3, now=0.0, ttl_s=5.0)
    assert st.admissible(1, 2) == 1
    st.set_version(2)
    assert st.admissible(1, 2) == 5  # (1 + 2 + 1) * 2 - 3
    assert st.admissible(0, 2) == 3


def test_admission_frees_slots_for_failed_and_wholly_stale_groups():
    st = HubState()
    st.submit([prompt("a"), prompt("b")])
    lease, ps = st.grant("g", 2, now=0.0, ttl_s=5.0)
    generate_all(st, lease.lease_id, ps)
    st.score([bad("a", 0), bad("a", 1)])
    assert st.events["groups_failed"] == 1 and st.admitted == 1 and "a" not in st.groups
    st.score([ok("b", 0), ok("b", 1)])
    assert st.prune_stale(min_version=1) == 2
    assert st.events["groups_dropped_stale"] == 1 and st.admitted == 0
    assert st.counts.by_state[S.FAILED] == 2 and st.counts.by_state[S.DROPPED] == 2 and st.counts.lost == 0


def test_partly_failed_group_trains_on_its_ok_samples():
    st = HubState()
    st.submit([prompt("a", n=3)])
    lease, ps = st.grant("g", 1, now=0.0, ttl_s=5.0)
    generate_all(st, lease.lease_id, ps)
    st.score([ok("a", 0), bad("a", 1), ok("a", 2, reward=0.0)])
    batch = st.form_batch(1, 1)
    assert [s.sample.sample_index for s in batch.groups[0].samples] == [0, 2]


def test_stale_drop_uses_oldest_token_version_and_is_reported_in_the_batch():
    st = HubState()
    st.submit([prompt("a", n=2), prompt("b", n=2)])
    lease, _ = st.grant("g", 2, now=0.0, ttl_s=5.0)
    mixed = sample("a", 0, version=3)
    mixed.versions[0] = 1  # partial rollout: first token from version 1
    st.add_samples(lease.lease_id, packed([mixed, sample("a", 1, 3), sample("b", 0, 3), sample("b", 1, 3)]))
    st.score([ok("a", 0), ok("a", 1), ok("b", 0), ok("b", 1)])
    st.set_version(4)
    assert st.prune_stale(min_version=4 - 2) == 1  # max_staleness 2: version 1 < 2 is dropped
    assert st.prune_stale(min_version=2) == 0  # re-checks are no-ops
    batch = st.form_batch(1, 2)
    assert batch.dropped_stale == 1 and batch.policy_version == 4
    assert [len(g.samples) for g in batch.groups] == [1, 2]


def test_batches_are_redelivered_until_committed_then_forgotten():
    st, _ = ready_state(6, n=2)
    b1 = st.form_batch(1, 2)
    b2 = st.form_batch(2, 2)
    assert st.book.delivered[1] is b1 and st.book.why_not(2) == "" and st.book.why_not(3) == ""
    assert "ahead" in st.book.why_not(4)
    assert st.commit(2) == 2 and not st.book.delivered
    assert "committed" in st.book.why_not(1)
    with pytest.raises(ValueError, match="commit step 5"):
        st.commit(5)
    assert st.commit(2) == 0  # idempotent
    assert st.counts.by_state[S.TRAINED] == 8 and b2.step == 2


def test_accepted_plus_running_equals_admitted():
    st, _ = ready_state(4, n=2)
    st.submit([prompt("x")])
    st.grant("g", 1, now=0.0, ttl_s=1.0)
    st.form_batch(1, 2)
    st.commit(1)
    assert st.accepted == 4 and st.running == 1 and st.admitted == 5


def test_client_prompt_failures_are_counted_apart_from_the_runs():
    st = HubState()
    st.submit([prompt("run0"), prompt("run1")])
    st.submit([prompt("cli0"), prompt("cli1")], client=True)
    lease, ps = st.grant("g", 4, now=0.0, ttl_s=5.0)
    generate_all(st, lease.lease_id, ps)
    st.score([bad("run0", 0), ok("run0", 1), ok("run1", 0), ok("run1", 1)])
    st.score([bad("cli0", 0), bad("cli0", 1), ok("cli1", 0), bad("cli1", 1)])
    c = st.counts
    assert c.submitted == 8 and c.client_submitted == 4
    assert c.by_state[S.FAILED] == 4 and c.run_failed == 1 and c.client_failed == 3
    assert st.events["groups_failed"] == 0 and st.events["client_groups_failed"] == 1
    states = c.run_states()
    assert states["failed"] == 1 and states["client_failed"] == 3 and sum(states.values()) == c.submitted
    # a client prompt's OK samples train like the run's own
    batch = st.form_batch(1, 3)
    assert sorted(g.prompt.prompt_id for g in batch.groups) == ["cli1", "run0", "run1"]
    st.commit(1)
    assert c.by_state[S.TRAINED] == 4 and c.client_failed == 3 and c.lost == 0


def test_client_prompts_the_generator_cannot_take_are_the_clients_failures():
    st = HubState()
    st.submit([prompt("run0")])
    st.submit([prompt("cli0", n=3)], client=True)
    lease, _ = st.grant("g", 2, now=0.0, ttl_s=5.0)
    assert st.fail_prompts(lease.lease_id, ["run0", "cli0"]) == 2
    assert st.events["prompts_failed"] == 1 and st.events["client_prompts_failed"] == 1
    assert st.counts.run_failed == 2 and st.counts.client_failed == 3
    assert st.events["groups_failed"] == 1 and st.events["client_groups_failed"] == 1
