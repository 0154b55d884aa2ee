"""GeneratorWorker against a fake engine and a fake hub: leasing, grouping, abort, backpressure."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from asyncrl import records as R
from asyncrl.generator.worker import GeneratorWorker
from tests.doubles.worker_fakes import FakeEngine, FakeHub


def prompts(k: int, n: int) -> list[R.Prompt]:
    return [R.Prompt(prompt_id=f"p{i}", n=n, token_ids=np.arange(4, dtype=np.int32)) for i in range(k)]


def worker(engine, hub, max_running=8, weights=None) -> GeneratorWorker:
    return GeneratorWorker(name="g0", engine=engine, hub=hub, tokenizer=None, max_running=max_running,
                           weights=weights, heartbeat_s=0.0, group_size=4)


def test_groups_are_sent_whole_with_their_lease():
    engine, hub = FakeEngine(), FakeHub(prompts(3, n=4))
    w = worker(engine, hub, max_running=8)
    for _ in range(20):
        w.run_once()
    samples = [s for b in hub.sent for s in b.samples]
    assert sorted((s.prompt_id, s.sample_index) for s in samples) == [(f"p{i}", j) for i in range(3) for j in range(4)]
    for batch in hub.sent:  # every group arrives complete in one message
        ids = [s.prompt_id for s in batch.samples]
        assert all(ids.count(p) == 4 for p in set(ids))
    assert all(s.finish_reason == R.FinishReason.STOP and s.generator == "g0" for s in samples)


def test_leases_only_what_fits():
    engine, hub = FakeEngine(), FakeHub(prompts(10, n=4))
    w = worker(engine, hub, max_running=8)
    w.run_once()
    assert hub.lease_sizes[0] == 2  # 8 slots / 4 samples per prompt
    assert len(engine.requests) == 2
    w.run_once()  # nothing finished yet, so no room: no second lease
    assert len(hub.lease_sizes) == 1


def test_behind_hub_version_takes_no_prompts():
    engine, hub = FakeEngine(), FakeHub(prompts(2, n=2), version=3)
    weights = SimpleNamespace(poll=lambda timeout_s=0.0: None, mid_update=False)
    w = worker(engine, hub, weights=weights)
    w.hub_version = 3
    w.run_once()
    assert not engine.requests and not hub.lease_sizes


def test_no_step_while_an_update_is_half_done():
    """A failed update (the learner stopped or dropped us mid-push) leaves the engine inside its weight update;
    stepping it then raised and ended the generator (seen on the H200 when bench.pipeline stopped its learner).
    The worker waits on the weight socket instead, and steps again once an update completes."""
    engine, hub = FakeEngine(), FakeHub(prompts(1, n=2))
    polls: list[float] = []
    weights = SimpleNamespace(poll=lambda timeout_s=0.0: polls.append(timeout_s), mid_update=False)
    w = worker(engine, hub, weights=weights)
    w.run_once()  # leases p0 and steps once
    assert engine.has_work()
    weights.mid_update = True
    engine.step = lambda: (_ for _ in ()).throw(AssertionError("stepped mid-update"))
    w.run_once()
    assert polls[-1] > 0  # it waited on the weight socket
    del engine.step
    weights.mid_update = False
    for _ in range(5):
        w.run_once()
    assert [s.prompt_id for b in hub.sent for s in b.samples] == ["p0", "p0"]


def test_aborted_group_is_returned_not_sent():
    engine, hub = FakeEngine(), FakeHub(prompts(1, n=3))
    w = worker(engine, hub)
    w.run_once()  # leases p0, sample 0 finishes
    aborted = engine.abort()
    w._collect(aborted)
    assert hub.returned == ["p0"]
    assert not hub.sent and not w.groups


def test_shutdown_returns_unfinished_prompts():
    engine, hub = FakeEngine(), FakeHub(prompts(2, n=3))
    w = worker(engine, hub)
    w.run_once()
    w.shutdown()
    assert sorted(hub.returned) == ["p0", "p1"]


def test_run_loops_until_stop_then_returns_unfinished_prompts():
    engine, hub = FakeEngine(), FakeHub(prompts(2, n=3))
    w = worker(engine, hub)
    rounds = iter(range(2))
    w.run(stop=lambda: next(rounds, None) is None)  # two rounds, then stop
    assert len(engine.requests) == 2 and not hub.sent  # sample 2 of each needs a third step
    assert sorted(hub.returned) == ["p0", "p1"] and not w.groups


def test_prompt_token_ids_reach_the_engine_and_the_sample_as_one_int32_array():
    engine, hub = FakeEngine(), FakeHub(prompts(1, n=1))
    w = worker(engine, hub)
    w.run_once()
    sent = hub.sent[0].samples[0]
    ids = engine.requests[0].prompt_token_ids
    assert ids.dtype == np.int32 and sent.prompt_token_ids is ids  # no list round trip in between
    assert sent.response_token_ids.dtype == np.int32 and sent.logprobs.dtype == np.float32
