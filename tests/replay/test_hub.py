"""The live hub over loopback: the request/reply contract, long polls, expiry, errors, restart."""

from __future__ import annotations

import threading
import time

import pytest
from replay_fakes import prompt, sample

from asyncrl import records as R
from asyncrl.net.peer import HubError, HubPeer
from asyncrl.replay.config import BatchConfig, HubConfig

pytestmark = pytest.mark.timeout(60)


def run_one_step(peer: HubPeer, n_prompts: int = 2, n: int = 2) -> R.Batch:
    peer.request(R.SubmitPrompts(prompts=[prompt("", n) for _ in range(n_prompts)]))
    lease = peer.request(R.LeaseRequest(generator="g0", max_prompts=n_prompts, wait_s=1.0))
    peer.request(R.SampleBatch(lease_id=lease.lease_id,
                               samples=[sample(p.prompt_id, i) for p in lease.prompts for i in range(p.n)]))
    todo = peer.request(R.ScoreRequest(worker="r0", max_samples=100, wait_s=1.0))
    peer.request(R.ScoredIds(scores=[R.ScoreResult(prompt_id=it.prompt_id, sample_index=it.sample_index, reward=0.5)
                                     for it in todo.items]))
    return peer.request(R.BatchRequest(learner="l0", step=1, wait_s=2.0))


def test_contract_end_to_end_and_accounting(start_hub):
    h = start_hub()
    with HubPeer(h.endpoint, "t") as peer:
        batch = run_one_step(peer)
        assert isinstance(batch, R.Batch) and batch.step == 1 and len(batch.groups) == 2
        assert batch.groups[0].samples[0].reward == 0.5
        assert batch.groups[0].samples[0].sample.logprobs.tolist() == [-0.5] * 4
        again = peer.request(R.BatchRequest(learner="l1", step=1, wait_s=0.0))
        assert [g.prompt.prompt_id for g in again.groups] == [g.prompt.prompt_id for g in batch.groups]
        assert peer.request(R.CommitStep(step=1, policy_version=1)).info == {"committed": 1}
        assert peer.request(R.WeightVersion(version=1)).ok
        hb = peer.request(R.Heartbeat(service="generator", name="g0", stats={"tok_s": 5.0}))
        assert hb.info == {"shutdown": False, "policy_version": 1}
        stats = peer.request(R.StatsRequest()).counters
    acc = stats["accounting"]
    assert acc == {"submitted": 4, "client_submitted": 0, "trained": 4, "dropped_stale": 0, "filtered": 0, "failed": 0,
                   "client_failed": 0, "in_flight": 0, "rejected_frames": 0, "lost": 0}
    assert stats["policy_version"] == 1 and stats["peers"]["g0"]["stats"] == {"tok_s": 5.0}
    assert stats["transitions"]["delivered->trained"] == 4


def test_a_hub_on_a_unix_socket_serves_and_removes_its_file_when_it_stops(tmp_path):
    """A local run's hub listens on ipc://RUN_DIR/replay.sock (launch.unix_sockets): the same contract, and
    no socket file left once it stopped (ZeroMQ leaves it)."""
    from asyncrl.replay.background import BackgroundHub

    path = tmp_path / "replay.sock"
    h = BackgroundHub(HubConfig(), BatchConfig(prompts_per_step=2, samples_per_prompt=2), endpoint=f"ipc://{path}")
    try:
        with HubPeer(h.endpoint, "t") as peer:
            assert isinstance(run_one_step(peer), R.Batch)
        assert path.exists()
    finally:
        h.stop()
    assert not path.exists()


def test_long_poll_lease_wakes_when_prompts_arrive(start_hub):
    h = start_hub()
    got: list[R.Lease] = []
    with HubPeer(h.endpoint, "gen") as gen, HubPeer(h.endpoint, "client") as client:
        t = threading.Thread(target=lambda: got.append(gen.request(R.LeaseRequest(generator="g", max_prompts=4, wait_s=5.0))))
        t.start()
        time.sleep(0.2)  # let the lease park first (the wake-up itself is tested on a fake clock in test_long_poll.py)
        client.request(R.SubmitPrompts(prompts=[prompt("a")]))
        t.join(10)  # hang guard only: a lease that did not wake would come back empty at wait_s
        assert not t.is_alive() and [p.prompt_id for p in got[0].prompts] == ["a"]
        empty = gen.request(R.LeaseRequest(generator="g", max_prompts=4, wait_s=0.1))
        assert empty.prompts == [] and empty.lease_id == ""
        assert client.request(R.BatchRequest(learner="l", step=1, wait_s=0.1)).info == {"reason": "timeout"}
        assert client.request(R.ScoreRequest(worker="w", max_samples=3, wait_s=0.05)).items == []


def test_admission_bounds_leases_until_the_version_moves(start_hub):
    h = start_hub(HubConfig(max_staleness=0), BatchConfig(prompts_per_step=2, samples_per_prompt=1))
    with HubPeer(h.endpoint, "t") as peer:
        peer.request(R.SubmitPrompts(prompts=[prompt("", 1) for _ in range(5)]))
        first = peer.request(R.LeaseRequest(generator="g", max_prompts=5, wait_s=0.0))
        assert len(first.prompts) == 2  # (0 + 0 + 1) * 2
        assert peer.request(R.LeaseRequest(generator="g", max_prompts=5, wait_s=0.1)).prompts == []
        peer.request(R.WeightVersion(version=1))
        assert len(peer.request(R.LeaseRequest(generator="g", max_prompts=5, wait_s=0.0)).prompts) == 2


def test_expired_lease_goes_back_and_late_samples_are_rejected(start_hub):
    h = start_hub(HubConfig(lease_timeout_s=0.2))
    with HubPeer(h.endpoint, "t") as peer:
        peer.request(R.SubmitPrompts(prompts=[prompt("a")]))
        lease = peer.request(R.LeaseRequest(generator="dead", max_prompts=1, wait_s=0.0))
        time.sleep(0.5)
        again = peer.request(R.LeaseRequest(generator="alive", max_prompts=1, wait_s=1.0))
        assert [p.prompt_id for p in again.prompts] == ["a"] and again.lease_id != lease.lease_id
        late = peer.request(R.SampleBatch(lease_id=lease.lease_id, samples=[sample("a", 0)]))
        assert not late.ok and late.info["rejected"] == {"expired_lease": 1}
        stats = peer.request(R.StatsRequest()).counters
        assert stats["events"]["leases_expired"] == 1 and stats["accounting"]["lost"] == 0


def test_bad_requests_get_error_replies(start_hub):
    h = start_hub(HubConfig(max_queued_prompts=2))
    with HubPeer(h.endpoint, "t") as peer:
        with pytest.raises(HubError, match="max_queued_prompts"):
            peer.request(R.SubmitPrompts(prompts=[prompt() for _ in range(3)]))
        with pytest.raises(HubError, match="step 3 is ahead"):
            peer.request(R.BatchRequest(learner="l", step=3, wait_s=0.0))
        with pytest.raises(HubError, match="not a request the hub serves"):
            peer.request(R.Ack())
        with pytest.raises(HubError, match="max_prompts"):
            peer.request(R.LeaseRequest(generator="g", max_prompts=-1))
        peer.sock.send(b"\xc1")
        with pytest.raises(HubError, match="not msgpack"):
            peer.request(R.StatsRequest())  # the error reply to the garbage frame comes first
        stats = peer.request(R.StatsRequest()).counters
        assert stats["rejected_frames"] == 2 and stats["hub"]["rejected_requests"] >= 3


def test_fatal_error_turns_on_shutdown_in_heartbeats(start_hub):
    h = start_hub()
    with HubPeer(h.endpoint, "t") as peer:
        peer.request(R.FatalError(service="reward", name="reward-0", reason="CUDA OOM"))
        assert peer.request(R.Heartbeat(service="generator", name="g0")).info["shutdown"] is True
        assert peer.request(R.StatsRequest()).counters["fatal"][0]["reason"] == "CUDA OOM"


def test_restart_on_the_same_run_dir_keeps_state_and_redelivers(start_hub, tmp_path):
    h = start_hub(run_dir=tmp_path)
    with HubPeer(h.endpoint, "t") as peer:
        batch = run_one_step(peer)
        peer.request(R.SubmitPrompts(prompts=[prompt("queued")]))
        peer.request(R.WeightVersion(version=7))
        before = peer.request(R.StatsRequest()).counters
    h.stop()
    h2 = start_hub(run_dir=tmp_path)
    with HubPeer(h2.endpoint, "t") as peer:
        after = peer.request(R.StatsRequest()).counters
        again = peer.request(R.BatchRequest(learner="l", step=1, wait_s=0.0))
    for key in ("states", "transitions", "events", "policy_version", "queued_prompts", "next_step", "accounting"):
        assert after[key] == before[key], key
    assert [[(s.sample.prompt_id, s.sample.sample_index, s.reward) for s in g.samples] for g in again.groups] == \
        [[(s.sample.prompt_id, s.sample.sample_index, s.reward) for s in g.samples] for g in batch.groups]


def test_scores_by_id_and_watchers_get_the_samples_as_generated(start_hub, tmp_path):
    h = start_hub(run_dir=tmp_path)
    with HubPeer(h.endpoint, "t") as peer:
        peer.request(R.SubmitPrompts(prompts=[prompt("a"), prompt("b")], watch=True))
        lease = peer.request(R.LeaseRequest(generator="g0", max_prompts=2, wait_s=1.0))
        sent = [sample(p.prompt_id, i, tokens=5) for p in lease.prompts for i in range(p.n)]
        for s in sent:
            s.response_text = f"answer {s.prompt_id}/{s.sample_index}"
        peer.request(R.SampleBatch(lease_id=lease.lease_id, samples=sent))
        todo = peer.request(R.ScoreRequest(worker="r0", max_samples=100, wait_s=1.0))
        assert [(it.prompt_id, it.sample_index) for it in todo.items] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
        assert [it.response_text for it in todo.items] == [s.response_text for s in sent]  # text only, no arrays
        ack = peer.request(R.ScoredIds(scores=[R.ScoreResult(prompt_id=it.prompt_id, sample_index=it.sample_index,
                                                             reward=0.25) for it in todo.items]
                                       + [R.ScoreResult(prompt_id="a", sample_index=0, reward=1.0)]))
        assert not ack.ok and ack.info == {"accepted": 4, "rejected": {"not_generated": 1}}
        batch = peer.request(R.BatchRequest(learner="l0", step=1, wait_s=2.0))
        got = [s.sample for g in batch.groups for s in g.samples]
        assert [s.logprobs.tolist() for s in got] == [s.logprobs.tolist() for s in sent]
        assert all(s.reward == 0.25 for g in batch.groups for s in g.samples)
        done = [peer.receive(1.0) for _ in range(4)]
        assert sorted((c.scored.sample.prompt_id, c.scored.sample.sample_index) for c in done) == [
            ("a", 0), ("a", 1), ("b", 0), ("b", 1)]
        before = peer.request(R.StatsRequest()).counters
    h.stop()
    with HubPeer(start_hub(run_dir=tmp_path).endpoint, "t") as peer:  # the log replays scores by id
        after = peer.request(R.StatsRequest()).counters
        again = peer.request(R.BatchRequest(learner="l0", step=1, wait_s=0.0))
    assert after["states"] == before["states"] and after["events"] == before["events"]
    assert [s.sample.versions.tolist() for g in again.groups for s in g.samples] == [s.versions.tolist() for s in sent]
