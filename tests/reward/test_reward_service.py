"""services.reward as real processes against a live hub: two workers side by side score one batch."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from asyncrl import records as R
from asyncrl.config.batch import BatchConfig
from asyncrl.peer import HubPeer
from asyncrl.replay.background import BackgroundHub
from asyncrl.replay.config import HubConfig

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(90)


def generated(prompt: R.Prompt, i: int, text: str) -> R.Sample:
    ids = np.array([1, 2], np.int32)
    return R.Sample(prompt_id=prompt.prompt_id, sample_index=i, prompt_token_ids=ids, response_token_ids=ids,
                    logprobs=np.zeros(2, np.float32), versions=np.zeros(2, np.int32),
                    finish_reason=R.FinishReason.STOP, response_text=text, generator="g0")


def test_two_reward_workers_score_a_batch_and_stop_on_sigterm():
    hub = BackgroundHub(HubConfig(), BatchConfig(prompts_per_step=4, samples_per_prompt=2))
    peer = HubPeer(hub.endpoint, "test")
    procs = []
    try:
        prompts = [R.Prompt(prompt_id="", n=2, text=f"{i}+1=", reward=R.RewardSpec(target=str(i + 1))) for i in range(4)]
        peer.request(R.SubmitPrompts(prompts=prompts))
        lease = peer.request(R.LeaseRequest(generator="g0", max_prompts=4, wait_s=1.0))
        answers = {p.text: str(int(p.text[:-3]) + 1) for p in lease.prompts}
        samples = [generated(p, i, answers[p.text] + "<eos>" if i == 0 else "7") for p in lease.prompts for i in range(2)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for name in ("reward-a", "reward-b"):
            cmd = [sys.executable, "-m", "services.reward", "--endpoint", hub.endpoint, "--name", name,
                   "--set", "reward.heartbeat_s=0.2", "--set", "reward.max_inflight=3"]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs = [p.stdout.readline() for p in procs]  # each is up (signal handler installed) once it logs
        assert all("serving" in line for line in logs), logs
        peer.request(R.SampleBatch(lease_id=lease.lease_id, samples=samples))
        batch = peer.request(R.BatchRequest(learner="l0", step=1, wait_s=30.0))
        assert isinstance(batch, R.Batch), batch
        scored = [s for g in batch.groups for s in g.samples]
        assert len(scored) == 8 and all(s.status is R.ScoreStatus.OK for s in scored)
        assert sorted((s.sample.sample_index, s.reward) for s in scored) == [(0, 1.0)] * 4 + [(1, 0.0)] * 4
        assert all(s.components == {"task": s.reward} for s in scored)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=20)[0] for p in procs]
        peer.close()
        hub.stop()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all("stopped" in out for out in outs), outs
