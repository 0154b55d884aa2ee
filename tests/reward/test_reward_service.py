"""services.reward as real processes against a live hub: two workers side by side score one batch."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from asyncrl import records as R
from asyncrl.net.credentials import Credentials, RunSecret
from asyncrl.net.peer import HubPeer
from asyncrl.replay.background import BackgroundHub
from asyncrl.run.rundir import load_config
from tests.doubles.run_dir import launched_run_dir

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(90)


def generated(prompt: R.Prompt, i: int, text: str) -> R.Sample:
    ids = np.array([1, 2], np.int32)
    return R.Sample(prompt_id=prompt.prompt_id, sample_index=i, prompt_token_ids=ids, response_token_ids=ids,
                    logprobs=np.zeros(2, np.float32), versions=np.zeros(2, np.int32),
                    finish_reason=R.FinishReason.STOP, response_text=text, generator="g0")


def test_two_reward_workers_score_a_batch_and_stop_on_sigterm(tmp_path):
    _, endpoints = launched_run_dir(tmp_path, ["reward.heartbeat_s=0.2", "reward.max_inflight=3",
                                               "batch.prompts_per_step=4", "batch.samples_per_prompt=2"])
    cfg = load_config(tmp_path)
    secret = RunSecret.load(tmp_path)
    hub = BackgroundHub(cfg.hub, cfg.batch, endpoint=endpoints["replay"], secret=secret)
    peers = {role: HubPeer(hub.endpoint, name, credentials=Credentials.for_role(secret, role))
             for role, name in (("client", "test"), ("generator", "g0"), ("learner", "l0"))}
    procs = []
    try:
        prompts = [R.Prompt(prompt_id="", n=2, text=f"{i}+1=", reward=R.RewardSpec(target=str(i + 1))) for i in range(4)]
        peers["client"].request(R.SubmitPrompts(prompts=prompts))
        lease = peers["generator"].request(R.LeaseRequest(generator="g0", max_prompts=4, wait_s=1.0))
        answers = {p.text: str(int(p.text[:-3]) + 1) for p in lease.prompts}
        samples = [generated(p, i, answers[p.text] + "<eos>" if i == 0 else "7") for p in lease.prompts for i in range(2)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for name in ("reward-a", "reward-b"):
            cmd = [sys.executable, "-m", "services.reward", "--run-dir", str(tmp_path), "--name", name]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs = [p.stdout.readline() for p in procs]  # each is up (signal handler installed) once it logs
        assert all("serving" in line for line in logs), logs
        peers["generator"].request(R.SampleBatch(lease_id=lease.lease_id, samples=samples))
        batch = peers["learner"].request(R.BatchRequest(learner="l0", step=1, wait_s=30.0))
        assert isinstance(batch, R.Batch), batch
        scored = [s for g in batch.groups for s in g.samples]
        assert len(scored) == 8 and all(s.status is R.ScoreStatus.OK for s in scored)
        assert sorted((s.sample.sample_index, s.reward) for s in scored) == [(0, 1.0)] * 4 + [(1, 0.0)] * 4
        assert all(s.components == {"task": s.reward} for s in scored)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=20)[0] for p in procs]
        for peer in peers.values():
            peer.close()
        hub.stop()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all("stopped" in out for out in outs), outs
