"""A prompt the engine cannot take is failed at the hub with the reason; the generator keeps going."""

from __future__ import annotations

import numpy as np
import pytest
from test_worker import FakeEngine, FakeHub, worker

from asyncrl import records as R
from asyncrl.engine.protocol import EngineLimits
from asyncrl.generator.admission import why_not
from asyncrl.replay.state import HubState


class LimitedEngine(FakeEngine):
    """Reports limits as the torch engine does; refuses long sampling as a full KV cache would."""

    def limits(self) -> EngineLimits:
        return EngineLimits(vocab_size=100, max_model_len=16)

    def add(self, request) -> None:
        if request.sampling.max_new_tokens > 1000:
            raise ValueError(f"request {request.request_id!r} needs more KV blocks than the cache has")
        super().add(request)


class FailingHub(FakeHub):
    def __init__(self, prompts: list[R.Prompt]) -> None:
        super().__init__(prompts)
        self.failed: dict[str, str] = {}

    def request(self, msg):
        if isinstance(msg, R.ReturnPrompts) and msg.reason:
            self.failed.update(dict.fromkeys(msg.prompt_ids, msg.reason))
            return R.Ack(info={"failed": len(msg.prompt_ids)})
        return super().request(msg)


def bad_and_good() -> list[R.Prompt]:
    def p(pid: str, ids: list[int], max_new: int = 4) -> R.Prompt:
        return R.Prompt(prompt_id=pid, n=2, token_ids=np.array(ids, np.int32),
                        sampling=R.SamplingParams(max_new_tokens=max_new))
    return [p("empty", []), p("oov", [1, 100]), p("negative", [-1]), p("long", list(range(16))),
            p("kv", [1, 2], max_new=5000), p("good", [1, 2, 3])]


def test_unfit_prompts_fail_with_reasons_and_the_good_one_is_generated():
    engine, hub = LimitedEngine(), FailingHub(bad_and_good())
    w = worker(engine, hub, max_running=64)
    for _ in range(10):
        w.run_once()
    assert set(hub.failed) == {"empty", "oov", "negative", "long", "kv"}
    assert "empty" in hub.failed["empty"] and "vocabulary" in hub.failed["oov"] and "KV" in hub.failed["kv"]
    assert "context" in hub.failed["long"]
    assert [r.request_id for r in engine.requests] == ["good"] and set(w.groups) == set()
    assert sorted((s.prompt_id, s.sample_index) for b in hub.sent for s in b.samples) == [("good", 0), ("good", 1)]
    assert w._stats["prompts_failed"] == 5 and w.last_failure


def test_unknown_limits_leave_the_decision_to_the_engine():
    assert why_not(np.array([5, 99999], np.int32), 4, FakeEngine().limits()) == ""  # unknown vocab: the engine's add decides
    assert "max_new_tokens" in why_not(np.array([1], np.int32), 0, EngineLimits(vocab_size=10, max_model_len=8))


def test_the_hub_fails_prompts_returned_with_a_reason_and_refuses_empty_ones():
    st = HubState()
    with pytest.raises(ValueError, match="empty"):
        st.submit([R.Prompt(prompt_id="e", n=2, token_ids=np.zeros(0, np.int32))])
    with pytest.raises(ValueError, match="empty"):
        st.submit([R.Prompt(prompt_id="ok", n=1, text="q"), R.Prompt(prompt_id="e", n=1, text="")])
    assert not st.groups  # all or none
    st.submit([R.Prompt(prompt_id="a", n=2, text="q"), R.Prompt(prompt_id="b", n=2, text="q")])
    entry, _ = st.grant("g", 2, now=0.0, ttl_s=60.0)
    assert st.fail_prompts(entry.lease_id, ["a", "zz"]) == 1
    assert st.counts.by_state[R.SampleState.FAILED] == 2 and st.events["groups_failed"] == 1
    assert "a" not in st.groups and list(st.leases.leases[entry.lease_id].prompt_ids) == ["b"]
    assert st.admitted == 1 and st.counts.lost == 0
