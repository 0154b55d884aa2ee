"""Multi-turn samples through a live hub: a peer's bad episode fields are a counted frame rejection (the hub
goes on), good ones reach the learner's batch exactly as the generator sent them."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from replay_fakes import prompt, sample

from asyncrl import records as R
from asyncrl import wire
from asyncrl.net.peer import HubError, HubPeer

pytestmark = pytest.mark.timeout(60)


def episode(pid: str, i: int) -> R.Sample:
    s = sample(pid, i, tokens=5)
    s.loss_mask, s.logprobs[1:3] = np.array([1, 0, 0, 1, 1], np.int32), 0.0
    s.turn_rewards, s.env_reward, s.rollout = np.array([1.0, 0.5], np.float32), 1.5, {"turns": 2.0, "tool_calls": 1.0}
    return s


def test_bad_episode_fields_are_a_counted_rejection_and_good_ones_reach_the_batch(start_hub):
    h = start_hub()
    with HubPeer(h.endpoint, "t") as peer:
        peer.request(R.SubmitPrompts(prompts=[prompt("a", 2), prompt("b", 2)]))
        lease = peer.request(R.LeaseRequest(generator="g0", max_prompts=2, wait_s=1.0))
        good = [episode(p.prompt_id, i) for p in lease.prompts for i in range(2)]
        body = msgpack.unpackb(wire.encode(R.SampleBatch(lease_id=lease.lease_id, samples=good)), raw=False)
        mask = body["b"]["samples"][1]["loss_mask"]
        body["b"]["samples"][1]["loss_mask"] = msgpack.ExtType(1, mask.data[:-4] + (7).to_bytes(4, "little"))
        peer.sock.send(msgpack.packb(body, use_bin_type=True))
        with pytest.raises(HubError, match=r"samples\[1\]\.loss_mask: values must be 0 or 1, got 7 at index 4"):
            peer.request(R.StatsRequest())  # the error reply to the bad frame comes first
        assert peer.request(R.StatsRequest()).counters["rejected_frames"] == 1

        assert peer.request(R.SampleBatch(lease_id=lease.lease_id, samples=good)).ok  # the lease was still open
        todo = peer.request(R.ScoreRequest(worker="r0", max_samples=10, wait_s=1.0))
        assert sorted((it.prompt_id, it.sample_index) for it in todo.items) == [(p, i) for p in "ab" for i in range(2)]
        peer.request(R.ScoredIds(scores=[R.ScoreResult(prompt_id=it.prompt_id, sample_index=it.sample_index,
                                                       reward=float(it.sample_index)) for it in todo.items]))
        batch = peer.request(R.BatchRequest(learner="l0", step=1, wait_s=2.0))
        stats = peer.request(R.StatsRequest()).counters
    got = [s.sample for g in batch.groups for s in g.samples]
    assert len(got) == 4
    for s in got:
        assert s.loss_mask.tolist() == [1, 0, 0, 1, 1] and s.loss_mask.dtype == np.int32
        assert s.turn_rewards.tolist() == [1.0, 0.5] and s.env_reward == 1.5 and s.env_error == ""
        assert s.rollout == {"turns": 2.0, "tool_calls": 1.0} and s.logprobs.tolist() == [-0.5, 0, 0, -0.5, -0.5]
    assert stats["accounting"]["rejected_frames"] == 1 and stats["accounting"]["lost"] == 0
