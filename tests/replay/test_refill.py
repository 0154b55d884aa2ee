"""Refill (DAPO dynamic sampling at the hub, `learner.filter_refill`): groups without signal leave before a
batch is formed, free their admission slot, are accounted as filtered, and a restart replays the same drop."""

from __future__ import annotations

from replay_fakes import arrive, bad, fingerprint, ok, packed, prompt, sample

from asyncrl import records as R
from asyncrl import wire
from asyncrl.records import SampleState as S
from asyncrl.replay.config import BatchConfig, HubConfig
from asyncrl.replay.core import HubCore
from asyncrl.replay.journal import Journal
from asyncrl.replay.state import HubState

LEARNER, GEN = [b"learner"], [b"gen"]


def scored(st: HubState, rewards: dict[str, list[float | None]]) -> None:
    """Submit, lease, generate and score one group per entry; None scores that sample as failed."""
    st.submit([prompt(pid, n=len(rs)) for pid, rs in rewards.items()])
    lease, ps = st.grant("g", len(rewards), now=0.0, ttl_s=10.0)
    st.add_samples(lease.lease_id, packed([sample(p.prompt_id, i) for p in ps for i in range(p.n)]))
    st.score([bad(pid, i) if r is None else ok(pid, i, reward=r) for pid, rs in rewards.items()
              for i, r in enumerate(rs)])


def test_groups_with_one_reward_leave_and_the_rest_stay_in_order():
    st = HubState()
    scored(st, {"same": [1.0, 1.0, 1.0], "mixed": [1.0, 0.0, 1.0], "zeros": [0.0, 0.0, 0.0],
                "one_ok": [0.5, None, None], "mixed_failed": [0.0, None, 1.0], "within_tol": [0.3, 0.3 + 1e-9, 0.3],
                "just_apart": [0.3, 0.3 + 1e-7, 0.3]})
    admitted = st.admitted
    assert st.filter_uniform() == 4
    assert list(st.ready) == ["mixed", "mixed_failed", "just_apart"]  # the learner's filter keeps the same ones
    assert st.events["groups_filtered"] == 4 and st.admitted == admitted - 4
    assert st.counts.by_state[S.FILTERED] == 10 and st.counts.transitions["scored->filtered"] == 10
    assert st.counts.by_state[S.FAILED] == 3 and st.counts.lost == 0
    assert st.filter_uniform() == 0  # nothing left to drop
    batch = st.form_batch(1, 2)
    assert [len(g.samples) for g in batch.groups] == [3, 2]


def test_the_hub_and_the_learner_draw_the_same_line():
    import torch

    from asyncrl.learner.advantages import dapo_keep_mask

    groups = {"a": [0.3, 0.3 + 1e-9], "b": [0.3, 0.3 + 1e-7], "c": [1.0, 1.0], "d": [0.0, 1.0]}
    st = HubState()
    scored(st, groups)
    st.filter_uniform()
    rewards = torch.tensor([r for rs in groups.values() for r in rs], dtype=torch.float64)
    keep = dapo_keep_mask(rewards, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
    assert list(st.ready) == [g for i, g in enumerate(groups) if keep[2 * i]] == ["b", "d"]


def test_a_restart_replays_the_filter(tmp_path):
    path = tmp_path / "replay.log"
    j = Journal.open(path)
    sub = R.SubmitPrompts(prompts=[prompt(p, n=2) for p in "abc"])
    j.submit(*arrive(sub))
    lease, ps = j.grant("g", 3, now=0.0, ttl_s=10.0)
    sb = R.SampleBatch(lease_id=lease.lease_id, samples=[sample(p.prompt_id, i) for p in ps for i in range(2)])
    j.add_samples(*arrive(sb))
    j.score([ok("a", 0), ok("a", 1, 0.0), ok("b", 0), ok("b", 1), ok("c", 0, 0.0), ok("c", 1)])
    assert j.filter_uniform() == 1 and j.filter_uniform() == 0
    j.form_batch(1, 2)
    live = fingerprint(j.state)
    j.close()
    again = Journal.open(path)
    assert fingerprint(again.state) == live and live["events"]["groups_filtered"] == 1
    again.close()


def test_the_batch_waits_for_groups_with_signal_while_generation_refills():
    """prompts_per_step 2, max_staleness 0: two groups may be admitted. Both come back without signal, so the
    hub drops them at the learner's request, the generator leases two new prompts, and the batch is formed
    from those once they have signal."""
    core = HubCore(HubConfig(max_staleness=0), BatchConfig(prompts_per_step=2, samples_per_prompt=2),
                   Journal.open(None), filter_uniform=True)

    def send(env, msg, now):
        core.handle(env, wire.encode(msg), now)
        core.pump(now)
        mine = [m for e, m in core.outbox if e == env]
        core.outbox = [(e, m) for e, m in core.outbox if e != env]
        return [wire.decode(m) if isinstance(m, bytes) else m for m in mine]

    send([b"feeder"], R.SubmitPrompts(prompts=[prompt(p) for p in "abcd"]), 0.0)

    def generate(rewards: dict[str, tuple[float, float]], now: float) -> None:
        [lease] = send(GEN, R.LeaseRequest(generator="g", max_prompts=8, wait_s=0.0), now)
        assert [p.prompt_id for p in lease.prompts] == list(rewards)
        send(GEN, R.SampleBatch(lease_id=lease.lease_id, samples=[sample(p, i) for p in rewards for i in range(2)]),
             now)
        send([b"w"], R.ScoredIds(scores=[ok(p, i, r) for p, rs in rewards.items()
                                                      for i, r in enumerate(rs)]), now)

    generate({"a": (1.0, 1.0), "b": (0.0, 0.0)}, 0.1)
    assert send(LEARNER, R.BatchRequest(learner="l", step=1, wait_s=30.0), 0.2) == []  # parked: no signal yet
    assert core.state.events["groups_filtered"] == 2
    generate({"c": (1.0, 0.0), "d": (0.0, 1.0)}, 0.3)  # admission let the refill through
    parked = [wire.decode(m) for e, m in core.outbox if e == LEARNER]  # the parked request, answered
    assert len(parked) == 1 and [g.prompt.prompt_id for g in parked[0].groups] == ["c", "d"]
    core.outbox.clear()
    [batch] = send(LEARNER, R.BatchRequest(learner="l", step=1, wait_s=0.0), 0.4)  # a second rank: the same batch
    assert [g.prompt.prompt_id for g in batch.groups] == ["c", "d"]
    stats = send([b"s"], R.StatsRequest(), 0.5)[0].counters
    assert stats["accounting"]["filtered"] == 4 and stats["accounting"]["lost"] == 0


def test_without_refill_the_hub_keeps_every_group():
    core = HubCore(HubConfig(), BatchConfig(prompts_per_step=1, samples_per_prompt=2), Journal.open(None))
    st = core.state
    scored(st, {"same": [1.0, 1.0]})
    assert core._form(1) and st.events["groups_filtered"] == 0
