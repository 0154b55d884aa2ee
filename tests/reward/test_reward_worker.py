"""The reward worker loop against a fake hub peer."""

import asyncio
import threading

from asyncrl.net.peer import HubError
from asyncrl.records import Ack, Heartbeat, RewardSpec, ScoredIds, ScoreRequest, ScoreStatus, ToScore, ToScoreItem
from asyncrl.reward.scorer import Scorer
from asyncrl.reward.worker import RewardWorker
from reward_helpers import config, fn, item, run_worker


class FakePeer:
    """Hands out `items` in chunks of at most the requested size; asks for shutdown once all are scored."""

    def __init__(self, items: list[ToScoreItem]) -> None:
        self.items = list(items)
        self.total = len(items)
        self.scored = []
        self.requests = []
        self.heartbeats = []
        self.threads = set()
        self.refuse = 0  # refuse this many ScoredIds requests

    def request(self, msg):
        self.threads.add(threading.get_ident())
        self.requests.append(type(msg).__name__)
        if isinstance(msg, ScoreRequest):
            assert msg.max_samples >= 1 and msg.worker == "reward-7"
            take, self.items = self.items[: msg.max_samples], self.items[msg.max_samples :]
            return ToScore(items=take)
        if isinstance(msg, ScoredIds):  # scores go back by sample id, without the sample
            if self.refuse:
                self.refuse -= 1
                raise HubError("unknown sample", "ScoredIds")
            self.scored.extend(msg.scores)
            return Ack()
        if isinstance(msg, Heartbeat):
            self.heartbeats.append(msg)
            done = len(self.scored) + msg.stats["rejected"] == self.total
            return Ack(info={"shutdown": done, "policy_version": 0})
        raise AssertionError(f"unexpected {msg}")


def items(n: int) -> list[ToScoreItem]:
    texts = ["85", "58", "oops"]
    return [item(texts[i % 3], RewardSpec(target="85"), f"p{i // 4}", i % 4) for i in range(n)]



def test_worker_scores_everything_concurrently_and_stops_on_shutdown():
    cfg = config({"kind": "task"}, {"kind": "python", "name": "slow", "weight": 0.0, "options": {"function": fn("slow")}},
                 max_inflight=8, heartbeat_s=0.1)
    peer = FakePeer(items(20))
    worker = run_worker(cfg, peer)
    assert len(peer.scored) == 20 and worker.scored == 20 and worker.failed == 0
    assert {(s.prompt_id, s.sample_index) for s in peer.scored} == {(f"p{i // 4}", i % 4) for i in range(20)}
    assert sum(s.reward for s in peer.scored) == 7.0  # "85" at i % 3 == 0
    assert len(peer.threads) == 1  # the peer is used from one thread only
    assert peer.heartbeats[0].service == "reward" and peer.heartbeats[0].name == "reward-7"
    assert set(peer.heartbeats[-1].stats) >= {"scored", "failed", "samples_per_s", "inflight", "pool_restarts"}


def test_failed_samples_are_sent_and_counted():
    cfg = config({"kind": "python", "options": {"function": fn("raises")}}, heartbeat_s=0.1)
    peer = FakePeer(items(3))
    stop = threading.Event()

    async def go():
        scorer = Scorer(cfg)
        worker = RewardWorker(peer, scorer, cfg, "reward-7", wait_s=0.05)
        try:
            await asyncio.wait_for(worker.run(stop), 10)
        finally:
            worker.close()
            await scorer.close()
        return worker
    worker = asyncio.run(go())
    assert worker.failed == 3 and all(s.status is ScoreStatus.FAILED for s in peer.scored)
    assert peer.heartbeats[-1].stats["failed"] == 3.0


def test_refused_batches_are_counted_and_the_worker_goes_on():
    cfg = config({"kind": "task"}, max_inflight=2, heartbeat_s=0.05)
    peer = FakePeer(items(6))
    peer.refuse = 1
    worker = run_worker(cfg, peer)
    assert worker.rejected >= 1 and len(peer.scored) + worker.rejected == 6
