"""LiveEvaluator against a live hub: a fake generator and scorer serve training and evaluation prompts side by
side; the evaluation's samples come back to it, never reach a batch, and stay out of the run's accounting."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from asyncrl import records as R
from asyncrl.client import Client
from asyncrl.evaluation.config import EvalConfig
from asyncrl.evaluation.live import LiveEvaluator
from asyncrl.evaluation.rounds import Response, round_prompts, summarize
from asyncrl.net.peer import HubPeer
from asyncrl.replay.background import BackgroundHub
from asyncrl.replay.config import BatchConfig, HubConfig

pytestmark = pytest.mark.timeout(60)


def heldout(count: int) -> list[R.Prompt]:
    return [R.Prompt(prompt_id=f"h{i}", n=1, text=f"{i}+{i}=", reward=R.RewardSpec(target=str(2 * i)))
            for i in range(count)]


def answer(text: str, greedy: bool) -> str:
    a, _ = text.rstrip("=").split("+")
    return str(2 * int(a)) if greedy and int(a) % 2 == 0 else "0"  # greedy right on even problems only


def exact(response: str, spec: R.RewardSpec) -> float:
    return float(response == spec.target)


def serve(endpoint: str, stop: threading.Event, batches: list[R.Batch], episodes: bool = False) -> None:
    """A generator, a reward worker and a learner in one loop: every leased prompt answered by `answer`; with
    `episodes`, as two-turn episodes whose greedy ones called a tool once (their stats as a rollout reports them)."""
    with HubPeer(endpoint, "fake") as peer:
        step = 1
        while not stop.is_set():
            lease = peer.request(R.LeaseRequest(generator="g0", max_prompts=16, wait_s=0.05))
            if isinstance(lease, R.Lease) and lease.prompts:
                samples = []
                for p in lease.prompts:
                    greedy = p.sampling.temperature == 0.0
                    for i in range(p.n):
                        text = answer(p.text, greedy)
                        samples.append(R.Sample(
                            prompt_id=p.prompt_id, sample_index=i, prompt_token_ids=np.array([1], np.int32),
                            response_token_ids=np.array([5, 6], np.int32), logprobs=np.zeros(2, np.float32),
                            versions=np.array([3, 3], np.int32), response_text=text,
                            finish_reason=R.FinishReason.STOP,
                            loss_mask=np.array([1, 1], np.int32) if episodes else None,
                            rollout={"turns": 2.0, "tool_calls": float(greedy)} if episodes else {}))
                peer.request(R.SampleBatch(lease_id=lease.lease_id, samples=samples))
            todo = peer.request(R.ScoreRequest(worker="r0", max_samples=100, wait_s=0.0))
            if isinstance(todo, R.ToScore) and todo.items:
                peer.request(R.ScoredIds(scores=[R.ScoreResult(prompt_id=it.prompt_id, sample_index=it.sample_index,
                                                               reward=1.0) for it in todo.items]))
            batch = peer.request(R.BatchRequest(learner="l0", step=step, wait_s=0.0))
            if isinstance(batch, R.Batch):
                batches.append(batch)
                peer.request(R.CommitStep(step=step, policy_version=step))
                step += 1


def test_round_scores_greedy_and_sampled_and_reports_versions():
    cfg = EvalConfig(every=1, prompts=4, k=2)
    prompts = round_prompts(heldout(4), cfg, R.SamplingParams(temperature=0.7, max_new_tokens=8), "t")
    assert [p.prompt_id for p in prompts][:2] == ["t-0-g", "t-0-s"] and prompts[0].sampling.temperature == 0.0
    assert prompts[1].n == 2 and prompts[1].sampling.temperature == 0.7 and prompts[0].metadata["eval"]
    responses = [Response("t-0-g", True, "0", 2, (1, 2)), Response("t-1-g", True, "2", 3, (2, 2)),
                 Response("t-0-s", False, "0", 2, (2, 2)), Response("t-1-s", False, "0", 2, (2, 2))]
    rec = summarize(5, prompts, responses, cfg, exact)
    assert rec["step"] == 5 and rec["pass@1"] == 0.5 and rec["prompts"] == 4  # 2 right of 4; 2 never came
    assert rec["mean@k"] == 1 / 8 and rec["k"] == 2 and rec["missing"] == 2 + 6
    assert rec["pass@k"] == 1 / 4  # prompt 0's sample is right; prompts 2 and 3 never came: not solved
    assert rec["versions"] == [1, 2] and rec["response_tokens"] == 2.5


def test_live_evaluation_comes_back_and_never_trains(tmp_path):
    hub = BackgroundHub(HubConfig(max_staleness=0), BatchConfig(prompts_per_step=2, samples_per_prompt=2))
    stop, batches = threading.Event(), []
    server = threading.Thread(target=serve, args=(hub.endpoint, stop, batches), daemon=True)
    server.start()
    ev = None
    try:
        with HubPeer(hub.endpoint, "feeder") as feeder:  # training prompts, queued ahead of the evaluation
            feeder.request(R.SubmitPrompts(prompts=[R.Prompt(prompt_id=f"t{i}", n=2, text="1+1=") for i in range(20)]))
        ev = LiveEvaluator(EvalConfig(every=1, prompts=6, k=2, timeout_s=20), heldout(6),
                           R.SamplingParams(temperature=1.0, max_new_tokens=4), tmp_path,
                           client_factory=lambda: Client(hub.endpoint, name="eval"), score=exact)
        ev.request(0)
        ev.request(7)  # asked while step 0's round may still run: at most one waits
        records = ev.wait(timeout_s=30)
        assert records and records[-1]["step"] == 7 and records[-1]["missing"] == 0
        assert records[-1]["pass@1"] == pytest.approx(3 / 6) and records[-1]["mean@k"] == pytest.approx(2 / 12)  # "0" is right for 0+0
        assert records[-1]["versions"] == [3, 3]
        lines = [json.loads(x) for x in (tmp_path / "eval.jsonl").read_text().splitlines()]
        assert [r["step"] for r in lines] == [r["step"] for r in records]
        with HubPeer(hub.endpoint, "probe") as probe:
            stats = probe.request(R.StatsRequest()).counters
    finally:
        stop.set()
        server.join(timeout=5)
        if ev is not None:
            ev.close()
        hub.stop()
    trained = {g.prompt.prompt_id for b in batches for g in b.groups}
    assert batches and all(pid.startswith("t") for pid in trained)  # an evaluation prompt never reaches a batch
    assert stats["accounting"]["submitted"] == 40 and stats["accounting"]["lost"] == 0
    assert stats["eval"]["submitted"] == len(records) * 6 * 3 and stats["eval"]["scored"] == stats["eval"]["submitted"]


def test_a_multi_turn_round_reports_turns_and_tool_calls_per_episode(tmp_path):
    """With `decode` (a multi-turn run) each round's record says how many turns and tool calls the held-out
    episodes took: greedy ones, and sampled ones as @k (the tool-call rate the calculator recipe watches)."""
    hub = BackgroundHub(HubConfig(max_staleness=0), BatchConfig(prompts_per_step=2, samples_per_prompt=2))
    stop = threading.Event()
    server = threading.Thread(target=serve, args=(hub.endpoint, stop, [], True), daemon=True)
    server.start()
    ev = LiveEvaluator(EvalConfig(every=1, prompts=4, k=2, timeout_s=20), heldout(4),
                       R.SamplingParams(temperature=1.0, max_new_tokens=4), tmp_path,
                       client_factory=lambda: Client(hub.endpoint, name="eval"), score=exact, decode=str)
    try:
        ev.request(3)
        [record] = ev.wait(timeout_s=30)
    finally:
        stop.set()
        server.join(timeout=5)
        ev.close()
        hub.stop()
    assert record["missing"] == 0 and record["pass@1"] == pytest.approx(2 / 4)
    assert record["tool_calls_mean"] == 1.0 and record["tool_calls_mean@k"] == 0.0
    assert record["turns_mean"] == 2.0 and record["turns_mean@k"] == 2.0 and record["episodes_failed"] == 0.0
    assert json.loads((tmp_path / "eval.jsonl").read_text())["tool_calls_mean"] == 1.0
