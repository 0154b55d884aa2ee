"""ShardedPeer against two real hubs (background threads, loopback): every record of a prompt reaches the
shard its id hashes to, leases come from one shard at a time, a step's batch joins both shards' parts and
is re-delivered whole, broadcasts reach both, and stats add up; requests to several shards are all sent before
any reply is awaited, and every reply is read before an error is raised."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl import records as R
from asyncrl.net.hub_shards import HubShard, hub_endpoints, shard_name, shard_of
from asyncrl.net.peer import HubPeer
from asyncrl.net.sharded_peer import ShardedPeer, hub_peer, merge_stats
from asyncrl.replay.background import BackgroundHub
from asyncrl.replay.config import BatchConfig, HubConfig, shard_batch

pytestmark = pytest.mark.timeout(60)
N = 4  # samples per prompt


@pytest.fixture
def shards():
    part = shard_batch(BatchConfig(prompts_per_step=4, samples_per_prompt=N), 2)  # 2 groups per shard and step
    hubs = [BackgroundHub(HubConfig(log=False), part) for _ in range(2)]
    yield hubs
    for h in hubs:
        h.stop()


def ids_on_each_shard(count: int) -> list[str]:
    """`count` prompt ids for each shard, interleaved."""
    by = {0: [], 1: []}
    i = 0
    while min(len(v) for v in by.values()) < count:
        pid = f"q{i}"
        by[shard_of(pid, 2)].append(pid)
        i += 1
    return [pid for pair in zip(by[0][:count], by[1][:count]) for pid in pair]


def sample(pid: str, i: int) -> R.Sample:
    return R.Sample(prompt_id=pid, sample_index=i, prompt_token_ids=np.arange(3, dtype=np.int32),
                    response_token_ids=np.array([5, i], np.int32), logprobs=np.zeros(2, np.float32),
                    versions=np.zeros(2, np.int32), finish_reason=R.FinishReason.LENGTH)


def generate_and_score(peer: ShardedPeer, rounds: int = 8) -> int:
    """Lease (one shard a call), send samples, score them all: like a generator and a reward worker."""
    made = 0
    for _ in range(rounds):
        lease = peer.request(R.LeaseRequest(generator="gen-0", max_prompts=8, wait_s=0.0))
        if lease.prompts:
            assert len({shard_of(p.prompt_id, 2) for p in lease.prompts}) == 1  # one shard's lease
            ack = peer.request(R.SampleBatch(lease_id=lease.lease_id,
                                             samples=[sample(p.prompt_id, i) for p in lease.prompts for i in range(N)]))
            assert ack.ok and ack.info["accepted"] == N * len(lease.prompts)
            made += len(lease.prompts)
        todo = peer.request(R.ScoreRequest(worker="reward-0", max_samples=256, wait_s=0.0))
        if todo.items:
            ack = peer.request(R.ScoredIds(scores=[R.ScoreResult(prompt_id=t.prompt_id, sample_index=t.sample_index,
                                                                 reward=float(t.sample_index)) for t in todo.items]))
            assert ack.ok
    return made


def test_a_prompt_lives_on_the_shard_its_id_hashes_to_and_a_step_joins_both_parts(shards):
    peer = ShardedPeer([h.endpoint for h in shards], "learner-0", timeout_s=10)
    ids = ids_on_each_shard(2)
    ack = peer.request(R.SubmitPrompts(prompts=[R.Prompt(prompt_id=p, n=N, token_ids=np.arange(3, dtype=np.int32))
                                                for p in ids]))
    assert ack.info["prompt_ids"] == ids  # in the order given, though split over two shards
    for k, hub in enumerate(shards):
        with HubPeer(hub.endpoint, "look") as one:
            assert one.request(R.StatsRequest()).counters["queued_prompts"] == 2
    assert generate_and_score(peer) == 4
    batch = peer.request(R.BatchRequest(learner="learner-0", step=1, wait_s=1.0))
    assert isinstance(batch, R.Batch) and batch.step == 1
    got = [g.prompt.prompt_id for g in batch.groups]
    assert sorted(got) == sorted(ids) and [shard_of(p, 2) for p in got] == [0, 0, 1, 1]  # shard order
    again = peer.request(R.BatchRequest(learner="learner-0", step=1, wait_s=1.0))  # a restarted learner
    assert [g.prompt.prompt_id for g in again.groups] == got
    peer.request(R.WeightVersion(version=1))
    peer.request(R.CommitStep(step=1, policy_version=1))
    stats = peer.request(R.StatsRequest()).counters
    assert stats["policy_version"] == 1 and stats["committed_step"] == 1  # both shards heard both
    assert stats["accounting"]["trained"] == 4 * N and stats["accounting"]["lost"] == 0
    assert [s["accounting"]["trained"] for s in stats["shards"]] == [2 * N, 2 * N]
    peer.close()


def test_a_step_waits_for_the_shard_that_is_behind(shards):
    peer = ShardedPeer([h.endpoint for h in shards], "learner-0", timeout_s=10)
    ids = ids_on_each_shard(2)
    on_0 = [p for p in ids if shard_of(p, 2) == 0]
    peer.request(R.SubmitPrompts(prompts=[R.Prompt(prompt_id=p, n=N, token_ids=np.arange(3, dtype=np.int32))
                                          for p in on_0]))
    generate_and_score(peer)
    reply = peer.request(R.BatchRequest(learner="learner-0", step=1, wait_s=0.2))
    assert isinstance(reply, R.Ack) and not reply.ok  # shard 1 has no groups yet: no batch
    rest = [p for p in ids if shard_of(p, 2) == 1]
    peer.request(R.SubmitPrompts(prompts=[R.Prompt(prompt_id=p, n=N, token_ids=np.arange(3, dtype=np.int32))
                                          for p in rest]))
    generate_and_score(peer)
    batch = peer.request(R.BatchRequest(learner="learner-0", step=1, wait_s=1.0))
    assert isinstance(batch, R.Batch) and len(batch.groups) == 4
    peer.close()


def test_prompts_without_ids_get_ids_that_route_their_samples_back(shards):
    peer = ShardedPeer([h.endpoint for h in shards], "client-x", timeout_s=10)
    ack = peer.request(R.SubmitPrompts(prompts=[R.Prompt(prompt_id="", n=N, token_ids=np.arange(3, dtype=np.int32))
                                                for _ in range(6)]))
    ids = ack.info["prompt_ids"]
    assert len(set(ids)) == 6 and all(ids)
    assert generate_and_score(peer) == 6  # every sample reached the shard that queued its prompt
    peer.close()


def test_completions_come_back_from_either_shard(shards):
    peer = ShardedPeer([h.endpoint for h in shards], "client-x", timeout_s=10)
    ids = ids_on_each_shard(1)
    peer.request(R.SubmitPrompts(prompts=[R.Prompt(prompt_id=p, n=N, token_ids=np.arange(3, dtype=np.int32))
                                          for p in ids], watch=True))
    worker = ShardedPeer([h.endpoint for h in shards], "gen-0", timeout_s=10)
    generate_and_score(worker)
    got = set()
    while (msg := peer.receive(timeout_s=2.0)) is not None:
        got.add((msg.scored.sample.prompt_id, msg.scored.sample.sample_index))
        if len(got) == 2 * N:
            break
    assert got == {(p, i) for p in ids for i in range(N)}
    worker.close()
    peer.close()


def test_broadcasts_reach_every_shard_and_answers_merge(shards):
    peer = ShardedPeer([h.endpoint for h in shards], "launcher", timeout_s=10)
    answer = peer.request(R.Heartbeat(service="generator", name="gen-0"))
    assert answer.info == {"shutdown": False, "policy_version": 0}
    with HubPeer(shards[1].endpoint, "look") as one:
        one.request(R.Shutdown(reason="shard 1 only"))
    assert peer.request(R.Heartbeat(service="generator", name="gen-0")).info["shutdown"] is True  # one is enough
    stats = peer.request(R.StatsRequest()).counters
    assert stats["shutdown"] is True and set(stats["peers"]) >= {"gen-0"} and len(stats["shards"]) == 2
    peer.close()


def test_merge_stats_sums_counts_and_takes_the_slowest_shard_s_progress():
    a = {"policy_version": 3, "committed_step": 5, "accounting": {"trained": 10, "lost": 0}, "fatal": ["x"],
         "shutdown": False, "peers": {"g": {"age_s": 1.0}}, "log": {"path": "/a", "bytes": 10}}
    b = {"policy_version": 4, "committed_step": 4, "accounting": {"trained": 7, "lost": 1}, "fatal": [],
         "shutdown": True, "peers": {"g": {"age_s": 2.0}, "h": {"age_s": 0.5}}, "log": {"path": "/b", "bytes": 5}}
    m = merge_stats([a, b])
    assert m["policy_version"] == 3 and m["committed_step"] == 4
    assert m["accounting"] == {"trained": 17, "lost": 1} and m["fatal"] == ["x"] and m["shutdown"] is True
    assert m["peers"] == {"g": {"age_s": 1.0}, "h": {"age_s": 0.5}} and m["log"] == {"path": "/a", "bytes": 15}
    assert a["accounting"] == {"trained": 10, "lost": 0}  # the shards' own are left as they were


def test_names_endpoints_and_config_of_shards(tmp_path):
    assert [shard_name(k, 2) for k in range(2)] == ["replay-0", "replay-1"] and shard_name(0, 1) == "replay"
    run = {"endpoints": {"replay": "tcp://a:1", "replay_shards": ["tcp://a:1", "tcp://a:2"]},
           "metrics_endpoints": {"hub": "m0", "hub-1": "m1"}}
    assert hub_endpoints(run["endpoints"]) == ["tcp://a:1", "tcp://a:2"]
    assert hub_endpoints({"replay": "tcp://a:1"}) == ["tcp://a:1"]  # a run.json of before shards
    one = HubShard.of("replay-1", 2, tmp_path)
    assert one.endpoint(run) == "tcp://a:2" and one.metrics_endpoint(run) == "m1"
    assert one.journal_dir() == tmp_path / "replay-1" and one.journal_dir().is_dir()
    assert HubShard.of("anything", 1, tmp_path).journal_dir() == tmp_path
    with pytest.raises(ValueError, match="'replay-2' is no shard of hub.shards=2: expected one of replay-0, replay-1"):
        HubShard.of("replay-2", 2, tmp_path)
    with pytest.raises(ValueError, match="prompts_per_step=6 is not a multiple of hub.shards=4"):
        shard_batch(BatchConfig(prompts_per_step=6), 4)
    with hub_peer(["tcp://127.0.0.1:9"], "x", timeout_s=1) as single:
        assert isinstance(single, HubPeer)
    assert all(shard_of(f"p{i}", 3) == shard_of(f"p{i}", 3) for i in range(10))
    assert {shard_of(f"p{i}", 2) for i in range(20)} == {0, 1}


class _Recorder:
    """A shard's HubPeer stand-in that logs start/finish and answers an Ack (or raises on finish)."""

    def __init__(self, k: int, log: list, fail: Exception | None = None) -> None:
        self.k, self.log, self.fail = k, log, fail

    def start(self, msg):
        self.log.append(("start", self.k))
        return msg

    def finish(self, pending):
        self.log.append(("finish", self.k))
        if self.fail is not None:
            raise self.fail
        return R.Ack(info={"n": 1})


def test_requests_to_several_shards_are_all_sent_before_any_reply_is_awaited(shards):
    peer = ShardedPeer([h.endpoint for h in shards], "learner-0", timeout_s=10)
    log: list = []
    for real in peer.peers:  # replaced by recorders: closed, not left connecting
        real.close()
    peer.peers = [_Recorder(0, log), _Recorder(1, log)]
    for msg in (R.CommitStep(step=1, policy_version=1), R.Heartbeat(service="learner", name="learner-0"),
                R.BatchRequest(learner="learner-0", step=1, wait_s=1.0)):
        log.clear()
        peer.request(msg)
        assert log == [("start", 0), ("start", 1), ("finish", 0), ("finish", 1)], type(msg).__name__


def test_a_shard_s_error_is_raised_after_every_other_shard_s_reply_is_read(shards):
    from asyncrl.net.peer import HubError

    peer = ShardedPeer([h.endpoint for h in shards], "learner-0", timeout_s=10)
    log: list = []
    for real in peer.peers:  # replaced by recorders: closed, not left connecting
        real.close()
    peer.peers = [_Recorder(0, log, fail=HubError("refused", "CommitStep")), _Recorder(1, log)]
    with pytest.raises(HubError, match="refused"):
        peer.request(R.CommitStep(step=1, policy_version=1))
    assert log[-1] == ("finish", 1)  # shard 1's reply read: it cannot answer shard 1's next request


def test_a_step_s_parts_long_poll_at_once_and_the_late_shard_completes_it(shards):
    """Both shards' parts are polled with the whole wait_s at once; the part that arrives first is kept while
    the other shard's poll ends empty, and the next request asks only the shard still missing."""
    import threading

    peer = ShardedPeer([h.endpoint for h in shards], "learner-0", timeout_s=10)
    ids = ids_on_each_shard(2)
    on = {k: [p for p in ids if shard_of(p, 2) == k] for k in (0, 1)}
    submit_by(peer, on[0])
    generate_and_score(peer)
    reply = peer.request(R.BatchRequest(learner="learner-0", step=1, wait_s=0.3))
    assert isinstance(reply, R.Ack) and not reply.ok and set(peer._parts[1]) == {0}  # shard 0's part kept
    worker = ShardedPeer([h.endpoint for h in shards], "gen-0", timeout_s=10)
    later = threading.Timer(0.2, lambda: (submit_by(worker, on[1]), generate_and_score(worker)))
    later.start()
    batch = peer.request(R.BatchRequest(learner="learner-0", step=1, wait_s=5.0))
    later.join()
    assert isinstance(batch, R.Batch) and [shard_of(g.prompt.prompt_id, 2) for g in batch.groups] == [0, 0, 1, 1]
    worker.close()
    peer.close()


def submit_by(peer: ShardedPeer, ids: list[str]) -> None:
    peer.request(R.SubmitPrompts(prompts=[R.Prompt(prompt_id=p, n=N, token_ids=np.arange(3, dtype=np.int32)) for p in ids]))
