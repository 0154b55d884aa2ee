"""asyncrl.Client, AsyncClient and the CLI against a live hub, with a fake generator + reward worker."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import numpy as np
import pytest

import asyncrl
from asyncrl import cli
from asyncrl import records as R
from asyncrl.net.peer import HubPeer
from asyncrl.replay.background import BackgroundHub
from asyncrl.replay.config import BatchConfig, HubConfig

pytestmark = pytest.mark.timeout(60)


def fake_worker(endpoint: str, stop: threading.Event) -> None:
    """Generator + reward in one loop: each sample's response is its prompt's token ids, reward = index;
    the reward fails every sample of a prompt whose text is "fail"."""
    with HubPeer(endpoint, "fake-gen") as peer:
        while not stop.is_set():
            lease = peer.request(R.LeaseRequest(generator="fake-gen", max_prompts=8, wait_s=0.1))
            samples = [R.Sample(prompt_id=p.prompt_id, sample_index=i, prompt_token_ids=np.zeros(1, np.int32),
                                response_token_ids=np.array([7, i], np.int32), logprobs=np.zeros(2, np.float32),
                                versions=np.zeros(2, np.int32), finish_reason=R.FinishReason.STOP,
                                response_text=p.text or "tok")
                       for p in lease.prompts for i in range(p.n)]
            if samples:
                peer.request(R.SampleBatch(lease_id=lease.lease_id, samples=samples))
            todo = peer.request(R.ScoreRequest(worker="fake-reward", max_samples=64, wait_s=0.0))
            if todo.items:
                peer.request(R.ScoredIds(scores=[score(it) for it in todo.items]))


def score(it: R.ToScoreItem) -> R.ScoreResult:
    if it.response_text == "fail":
        return R.ScoreResult(prompt_id=it.prompt_id, sample_index=it.sample_index, reward=0.0,
                             status=R.ScoreStatus.FAILED, reason="reward raised: boom")
    return R.ScoreResult(prompt_id=it.prompt_id, sample_index=it.sample_index, reward=float(it.sample_index),
                         components={"target": float(it.reward.target == "4")})


@pytest.fixture
def system(tmp_path):
    hub = BackgroundHub(HubConfig(max_staleness=100), BatchConfig(prompts_per_step=64, samples_per_prompt=2), tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"endpoints": {"replay": hub.endpoint}, "pids": {}}))
    stop = threading.Event()
    worker = threading.Thread(target=fake_worker, args=(hub.endpoint, stop), daemon=True)
    worker.start()
    yield hub, tmp_path
    stop.set()
    worker.join(5)
    hub.stop()


def test_submit_text_tokens_and_dicts_and_get_scored_results(system):
    hub, run_dir = system
    with asyncrl.Client(run_dir=run_dir) as client:
        h_text, h_tok, h_dict = client.submit(
            ["2+2=?", [1, 2, 3], {"prompt": "x", "n": 3, "target": "4", "metadata": {"topic": "math"}}], n=2, reward="4")
        got = h_text.result(timeout_s=10)
        assert [s.sample.sample_index for s in got] == [0, 1] and [s.reward for s in got] == [0.0, 1.0]
        assert got[0].sample.response_text == "2+2=?" and got[0].components == {"target": 1.0}
        assert len(list(h_tok)) == 2
        third = h_dict.result(timeout_s=10)
        assert len(third) == 3 and all(s.status is R.ScoreStatus.OK for s in third)
        stats = client.stats()
    assert stats["accounting"]["submitted"] == 7 and stats["accounting"]["lost"] == 0


def test_failed_client_prompts_are_not_the_runs_failures(system):
    hub, _ = system
    with asyncrl.Client(hub.endpoint) as client:
        bad, good = client.submit(["fail", "fine"], n=2)
        assert {s.status for s in bad.result(timeout_s=10)} == {R.ScoreStatus.FAILED}
        assert len(good.result(timeout_s=10)) == 2
        stats = client.stats()
        acc = stats["accounting"]
        assert (acc["failed"], acc["client_failed"], acc["client_submitted"], acc["submitted"]) == (0, 2, 4, 4)
        assert stats["states"]["failed"] == 0 and stats["states"]["client_failed"] == 2
        assert stats["events"].get("groups_failed", 0) == 0 and stats["events"]["client_groups_failed"] == 1
        assert stats["last_failure"] == ""  # the watchdog never names a client's failure as the run's
        with HubPeer(hub.endpoint, "feeder") as feeder:  # the run's own prompt (no watch) fails as the run's
            feeder.request(R.SubmitPrompts(prompts=[R.Prompt(prompt_id="task-0", n=2, text="fail")]))
            deadline = time.monotonic() + 10
            while client.stats()["accounting"]["failed"] < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        stats = client.stats()
    assert (stats["accounting"]["failed"], stats["accounting"]["client_failed"]) == (2, 2)
    assert stats["last_failure"] == "reward raised: boom" and stats["accounting"]["lost"] == 0


def test_completions_stream_every_sample_once(system):
    hub, _ = system
    with asyncrl.Client(hub.endpoint) as client:
        client.submit([f"p{i}" for i in range(5)], n=2)
        seen = [(s.sample.prompt_id, s.sample.sample_index) for s in client.completions(timeout_s=10)]
    assert len(seen) == 10 and len(set(seen)) == 10


def test_async_client(system):
    hub, _ = system

    async def go() -> list[R.ScoredSample]:
        client = asyncrl.AsyncClient(hub.endpoint)
        (handle,) = await client.submit("hello", n=2)
        out = await client.result(handle, timeout_s=10)
        assert (await client.stats())["accounting"]["lost"] == 0
        await client.close()
        return out

    assert len(asyncio.run(go())) == 2


def test_cli_submit_and_stats(system, tmp_path, capsys):
    hub, run_dir = system
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('"a"\n[5, 6]\n{"text": "b", "n": 1, "target": "4"}\n')
    assert cli.main(["submit", str(prompts), "--run-dir", str(run_dir), "--n", "2", "--timeout", "20"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(lines) == 5 and {x["status"] for x in lines} == {"ok"}
    assert cli.main(["stats", "--endpoint", hub.endpoint]) == 0
    assert json.loads(capsys.readouterr().out)["accounting"]["lost"] == 0


def test_client_needs_exactly_one_address():
    with pytest.raises(ValueError, match="exactly one"):
        asyncrl.Client()
    with pytest.raises(FileNotFoundError, match="replay"):
        asyncrl.Client(run_dir="/nonexistent-run")


def test_task_prompts_get_their_answer_and_unscorable_ones_are_refused_at_submit(system):
    hub, run_dir = system
    (run_dir / "config.json").write_text(json.dumps({"reward": {"components": [{"kind": "task", "name": "task"}]}}))
    with asyncrl.Client(run_dir=run_dir) as client:
        with pytest.raises(ValueError, match=r"prompt 1 \('hello'\) has no reference answer .* pass target="):
            client.submit(["2+2=", "hello"])
        assert client.stats()["accounting"]["submitted"] == 0  # nothing of a refused submit reaches the hub
        (handle,) = client.submit("2+2=", n=2)  # the task's verifier knows the answer: "4"
        assert [s.components for s in handle.result(timeout_s=10)] == [{"target": 1.0}] * 2
        (handle,) = client.submit("hello", target="4")
        assert handle.result(timeout_s=10)[0].components == {"target": 1.0}
        with pytest.raises(ValueError, match="give target= or reward=, not both"):
            client.submit("hello", target="4", reward="4")


def test_a_run_directory_s_secret_wins_over_credentials_the_process_inherited(tmp_path, monkeypatch):
    """A process started by another run (or a launcher inside this one) carries that run's key in its
    environment; a Client given this run's directory proves "client" with this run's secret."""
    from asyncrl.net.credentials import Credentials, RunSecret
    from asyncrl.client import client_credentials

    other = Credentials.for_role(b"\x07" * 32, "launcher")
    for key, value in other.to_env().items():
        monkeypatch.setenv(key, value)
    assert client_credentials(None) is None  # no run directory: the peer takes the environment's
    secret = RunSecret.ensure(tmp_path)
    mine = client_credentials(tmp_path)
    assert mine == Credentials.for_role(secret, "client") and mine.key != other.key
