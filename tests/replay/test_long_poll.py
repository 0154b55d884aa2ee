"""HubCore on a fake clock: long polls wake on work or time out at their deadline; leases expire.

HubCore takes `now` on every call (the Hub loop passes time.time()), so these tests step time by hand
and drive it the way the loop does: handle a burst of frames, then pump (or tick, which also expires).
"""

from __future__ import annotations

from typing import Any

from replay_fakes import prompt, sample

from asyncrl import records as R
from asyncrl import wire
from asyncrl.replay.config import BatchConfig, HubConfig
from asyncrl.replay.core import HubCore
from asyncrl.replay.journal import Journal

GEN, CLIENT = [b"gen"], [b"client"]


def make_core(**cfg: Any) -> HubCore:
    return HubCore(HubConfig(**cfg), BatchConfig(prompts_per_step=2, samples_per_prompt=2), Journal.open(None))


def send(core: HubCore, envelope: list[bytes], msg: Any, now: float) -> None:
    """One loop turn without a tick: the frame, then the parked requests that can be served now."""
    core.handle(envelope, wire.encode(msg), now)
    core.pump(now)


def replies(core: HubCore, envelope: list[bytes]) -> list[Any]:
    """Take the replies queued for `envelope` out of the outbox, decoded."""
    mine = [m for env, m in core.outbox if env == envelope]
    core.outbox = [(env, m) for env, m in core.outbox if env != envelope]
    return [wire.decode(m) if isinstance(m, bytes) else m for m in mine]


def test_parked_lease_is_answered_when_prompts_arrive_before_its_deadline():
    core = make_core()
    send(core, GEN, R.LeaseRequest(generator="g", max_prompts=4, wait_s=5.0), now=0.0)
    assert replies(core, GEN) == []  # parked
    send(core, CLIENT, R.SubmitPrompts(prompts=[prompt("a")]), now=0.2)
    [lease] = replies(core, GEN)
    assert [p.prompt_id for p in lease.prompts] == ["a"] and lease.lease_id


def test_waiting_generators_share_the_admissible_prompts_and_one_alone_gets_all():
    core = HubCore(HubConfig(), BatchConfig(prompts_per_step=4, samples_per_prompt=2), Journal.open(None))
    g1, g2 = [b"g1"], [b"g2"]
    send(core, g1, R.LeaseRequest(generator="g1", max_prompts=8, wait_s=5.0), now=0.0)
    send(core, g2, R.LeaseRequest(generator="g2", max_prompts=8, wait_s=5.0), now=0.0)
    send(core, CLIENT, R.SubmitPrompts(prompts=[prompt(p) for p in "abcd"]), now=0.1)
    [l1], [l2] = replies(core, g1), replies(core, g2)
    assert [p.prompt_id for p in l1.prompts] == ["a", "b"] and [p.prompt_id for p in l2.prompts] == ["c", "d"]
    send(core, CLIENT, R.SubmitPrompts(prompts=[prompt(p) for p in "ef"]), now=0.2)
    send(core, g1, R.LeaseRequest(generator="g1", max_prompts=8, wait_s=5.0), now=0.3)  # asks alone
    [l3] = replies(core, g1)
    assert [p.prompt_id for p in l3.prompts] == ["e", "f"]


def test_parked_requests_time_out_at_their_deadline_capped_by_max_wait_s():
    core = make_core(max_wait_s=60.0)
    send(core, GEN, R.LeaseRequest(generator="g", max_prompts=4, wait_s=5.0), now=0.0)
    send(core, [b"r"], R.ScoreRequest(worker="w", max_samples=3, wait_s=1e6), now=0.0)
    core.tick(4.99)
    assert core.outbox == []
    core.tick(5.0)
    [empty] = replies(core, GEN)
    assert empty.prompts == [] and empty.lease_id == ""
    core.tick(59.99)
    assert core.outbox == []
    core.tick(60.0)
    assert [m.items for m in replies(core, [b"r"])] == [[]]


def test_lease_expires_at_its_timeout_and_late_samples_are_rejected():
    core = make_core(lease_timeout_s=0.2)
    send(core, CLIENT, R.SubmitPrompts(prompts=[prompt("a")]), now=0.0)
    send(core, GEN, R.LeaseRequest(generator="dead", max_prompts=1, wait_s=0.0), now=0.0)
    [lease] = replies(core, GEN)
    core.tick(0.19)
    send(core, GEN, R.LeaseRequest(generator="alive", max_prompts=1, wait_s=0.0), now=0.19)
    assert replies(core, GEN)[0].prompts == []  # still leased
    core.tick(0.2)
    send(core, GEN, R.LeaseRequest(generator="alive", max_prompts=1, wait_s=0.0), now=0.2)
    [again] = replies(core, GEN)
    assert [p.prompt_id for p in again.prompts] == ["a"] and again.lease_id != lease.lease_id
    send(core, GEN, R.SampleBatch(lease_id=lease.lease_id, samples=[sample("a", 0)]), now=0.3)
    [late] = replies(core, GEN)
    assert not late.ok and late.info["rejected"] == {"expired_lease": 1}
    assert core.state.events["leases_expired"] == 1
