"""Data that cannot be right fails that datum with a reason, counted; the state machine goes on."""

from __future__ import annotations

import numpy as np
from replay_fakes import ok, packed, prompt, sample

from asyncrl import records as R
from asyncrl.records import SampleState as S
from asyncrl.replay.state import HubState


def leased(n: int = 2) -> tuple[HubState, str]:
    st = HubState()
    st.submit([prompt("a", n)])
    entry, _ = st.grant("g", 1, now=0.0, ttl_s=60.0)
    return st, entry.lease_id


def test_nan_reward_fails_the_sample_and_never_reaches_a_batch():
    st, lease = leased()
    assert not st.add_samples(lease, packed([sample("a", 0), sample("a", 1)])).rejected
    out = st.score([ok("a", 0, reward=float("nan")),
                    R.ScoreResult(prompt_id="a", sample_index=1, reward=1.0, components={"x": float("inf")})])
    assert out.rejected == {"non_finite_reward": 2}
    assert [s.status for s in out.scored] == [R.ScoreStatus.FAILED] * 2 and "non-finite" in out.scored[0].reason
    assert st.counts.by_state[S.FAILED] == 2 and st.events["groups_failed"] == 1 and not st.ready
    assert st.counts.lost == 0


def test_one_nan_reward_leaves_the_rest_of_the_group_trainable():
    st, lease = leased()
    st.add_samples(lease, packed([sample("a", 0), sample("a", 1)]))
    st.score([ok("a", 0, reward=float("-inf")), ok("a", 1, reward=0.5)])
    batch = st.form_batch(1, 1)
    assert [s.reward for g in batch.groups for s in g.samples] == [0.5]


def test_non_finite_logprobs_fail_the_sample_at_arrival():
    bad = sample("a", 1)
    bad.logprobs = np.array([-0.5, np.nan, -0.5, -0.5], np.float32)
    samples = packed([sample("a", 0), bad])
    assert [p.finite for p in samples] == [True, False]
    st, lease = leased()
    out = st.add_samples(lease, samples)
    assert out.accepted == [("a", 0)] and out.rejected == {"non_finite_logprobs": 1}
    assert st.counts.by_state[S.FAILED] == 1 and not st.leases.leases  # lease closed: nothing left out
    st.score([ok("a", 0)])
    assert list(st.ready) == ["a"] and st.counts.lost == 0


def test_a_group_whose_every_sample_has_nan_logprobs_is_failed_at_arrival():
    st, lease = leased(1)
    bad = sample("a", 0)
    bad.logprobs[:] = np.inf
    st.add_samples(lease, packed([bad]))
    assert st.events["groups_failed"] == 1 and "a" not in st.groups and st.admitted == 0
