"""Evaluation prompts at the hub: leased first and outside admission, forgotten once scored, never in a
batch, counted apart from the run's accounting (HubState), and refused without a watcher (HubCore)."""

from __future__ import annotations

import pytest
from replay_fakes import generate_all, ok, prompt, score_all

from asyncrl import records as R
from asyncrl.records import SampleState as S
from asyncrl.replay.config import BatchConfig, HubConfig
from asyncrl.replay.core import HubCore
from asyncrl.replay.journal import Journal
from asyncrl.replay.state import HubState


def test_eval_prompts_lease_first_and_ignore_admission():
    st = HubState()
    st.submit([prompt(f"t{i}") for i in range(4)])
    assert st.admissible(max_staleness=0, prompts_per_step=2) == 2
    lease, ps = st.grant("g", 2, now=0.0, ttl_s=10.0)  # admission is full now
    assert st.admissible(0, 2) == 0
    st.submit([prompt("e0", n=1), prompt("e1", n=1)], client=True, evaluate=True)
    assert list(st.eval_queue) == ["e0", "e1"] and list(st.queue) == ["t2", "t3"]
    lease2, ps2 = st.grant("g", 3, now=0.0, ttl_s=10.0)  # the core caps training at the admissible share
    assert [p.prompt_id for p in ps2][:2] == ["e0", "e1"]
    assert st.admitted == 3  # t0, t1 and the one training prompt taken after the evaluations


def test_eval_groups_are_forgotten_never_batched_and_counted_apart():
    st = HubState()
    st.submit([prompt(f"t{i}") for i in range(2)])
    st.submit([prompt("e0", n=3)], client=True, evaluate=True)
    lease, ps = st.grant("g", 8, now=0.0, ttl_s=10.0)
    generate_all(st, lease.lease_id, ps)
    out = st.score([ok("e0", i, reward=0.5) for i in range(3)])
    assert len(out.scored) == 3 and all(s.sample.prompt_id == "e0" for s in out.scored)
    assert "e0" not in st.groups and "e0" not in st.ready
    score_all(st, ps[1:])
    batch = st.form_batch(1, 2)
    assert sorted(g.prompt.prompt_id for g in batch.groups) == ["t0", "t1"]
    assert st.counts.submitted == 4 and st.eval_counts.submitted == 3
    assert st.eval_counts.by_state[S.SCORED] == 3 and st.counts.by_state[S.SCORED] == 0
    assert st.events["eval_groups_done"] == 1 and st.events["eval_prompts_submitted"] == 1
    assert st.admitted == 2


def test_expired_eval_prompts_go_back_to_their_own_queue():
    st = HubState()
    st.submit([prompt("t0")])
    st.submit([prompt("e0", n=1)], client=True, evaluate=True)
    st.grant("g", 2, now=0.0, ttl_s=1.0)
    assert st.admitted == 1
    assert st.expire(2.0) == 2
    assert list(st.eval_queue) == ["e0"] and list(st.queue) == ["t0"] and st.admitted == 0


def test_failed_eval_prompts_do_not_count_as_the_runs_failures():
    st = HubState()
    st.submit([prompt("e0", n=2)], client=True, evaluate=True)
    lease, _ = st.grant("g", 1, now=0.0, ttl_s=10.0)
    assert st.fail_prompts(lease.lease_id, ["e0"]) == 1
    assert st.counts.run_failed == 0 and st.eval_counts.by_state[S.FAILED] == 2
    assert st.events["eval_prompts_failed"] == 1 and st.events["eval_groups_failed"] == 1


def core() -> HubCore:
    return HubCore(HubConfig(), BatchConfig(prompts_per_step=2, samples_per_prompt=2), Journal(HubState(), None))


def test_core_refuses_evaluation_without_a_watcher():
    c = core()
    with pytest.raises(ValueError, match="evaluate needs watch"):
        c._submit([b"x"], b"", R.SubmitPrompts(prompts=[prompt("e0", n=1)], evaluate=True), 0.0)


def test_core_leases_evaluations_when_admission_is_full():
    c = core()
    c.journal.submit(b"", R.SubmitPrompts(prompts=[prompt(f"t{i}") for i in range(8)]))
    first = c._try_lease([b"g"], R.LeaseRequest(generator="g", max_prompts=8), 0.0)
    assert first is not None and len(first.prompts) == 4  # (max_staleness 1 + 1) x 2 prompts per step
    assert c._try_lease([b"g"], R.LeaseRequest(generator="g", max_prompts=8), 0.0) is None
    c._submit([b"x"], b"", R.SubmitPrompts(prompts=[prompt("e0", n=1)], watch=True, evaluate=True), 0.0)
    lease = c._try_lease([b"g"], R.LeaseRequest(generator="g", max_prompts=8), 0.0)
    assert lease is not None and [p.prompt_id for p in lease.prompts] == ["e0"]
