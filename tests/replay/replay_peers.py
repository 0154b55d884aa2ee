"""Tiny peer processes for the multi-process hub test: `python replay_peers.py ROLE ENDPOINT COUNT`.

generator: leases prompts and sends n samples each until COUNT prompts are done.
scorer: scores until COUNT samples are scored.  learner: trains COUNT steps (batch, version, commit).
Each prints one JSON line with what it did.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from asyncrl import records as R
from asyncrl.net.peer import HubPeer


def sample(pid: str, i: int, version: int) -> R.Sample:
    return R.Sample(prompt_id=pid, sample_index=i, prompt_token_ids=np.arange(5, dtype=np.int32),
                    response_token_ids=np.arange(32, dtype=np.int32), logprobs=np.full(32, -1.0, np.float32),
                    versions=np.full(32, version, np.int32), finish_reason=R.FinishReason.LENGTH)


def generator(peer: HubPeer, count: int) -> dict:
    done = 0
    while done < count:
        lease = peer.request(R.LeaseRequest(generator=peer.name, max_prompts=3, wait_s=0.5))
        samples = [sample(p.prompt_id, i, lease.policy_version) for p in lease.prompts for i in range(p.n)]
        if samples:
            peer.request(R.SampleBatch(lease_id=lease.lease_id, samples=samples))
        done += len(lease.prompts)
    return {"prompts": done}


def scorer(peer: HubPeer, count: int) -> dict:
    done = 0
    while done < count:
        todo = peer.request(R.ScoreRequest(worker=peer.name, max_samples=7, wait_s=0.5))
        if todo.items:
            peer.request(R.ScoredIds(scores=[R.ScoreResult(prompt_id=it.prompt_id, sample_index=it.sample_index,
                                                           reward=float(it.sample_index)) for it in todo.items]))
        done += len(todo.items)
    return {"samples": done}


def learner(peer: HubPeer, count: int) -> dict:
    trained = 0
    for step in range(1, count + 1):
        while not isinstance(batch := peer.request(R.BatchRequest(learner=peer.name, step=step, wait_s=0.5)), R.Batch):
            pass
        trained += sum(len(g.samples) for g in batch.groups)
        peer.request(R.WeightVersion(version=step))
        peer.request(R.CommitStep(step=step, policy_version=step))
    return {"trained": trained}


if __name__ == "__main__":
    role, endpoint, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with HubPeer(endpoint, f"{role}-0", timeout_s=20) as p:
        print(json.dumps({role: {"generator": generator, "scorer": scorer, "learner": learner}[role](p, count)}))
