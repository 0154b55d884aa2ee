"""Multi-turn Samples on the wire: the episode fields round-trip exactly, a single-turn Sample's bytes are
what they were before those fields existed, and a peer's bad values are rejected with the field's name."""

from __future__ import annotations

import hashlib

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl import records as R
from asyncrl import wire
from asyncrl.wire.sample import EPISODE_FIELDS, MAX_ENV_ERROR_CHARS

# The ten fields a Sample had before multi-turn episodes, in their wire order.
OLD_FIELDS = ["prompt_id", "sample_index", "prompt_token_ids", "response_token_ids", "logprobs", "versions",
              "finish_reason", "response_text", "timings", "generator"]


def single_turn() -> R.Sample:
    return R.Sample(prompt_id="p", sample_index=1, prompt_token_ids=np.array([5, 6, 7], np.int32),
                    response_token_ids=np.array([8, 9], np.int32), logprobs=np.array([-0.25, -1.5], np.float32),
                    versions=np.array([3, 4], np.int32), finish_reason=R.FinishReason.STOP, response_text="hi",
                    timings={"decode": 0.5}, generator="g0")


def episode(finish: R.FinishReason = R.FinishReason.STOP, error: str = "") -> R.Sample:
    """prompt | model 2 tokens | env 3 tokens | model 2 tokens."""
    return R.Sample(prompt_id="p", sample_index=0, prompt_token_ids=np.array([1, 2], np.int32),
                    response_token_ids=np.array([10, 11, 20, 21, 22, 12, 13], np.int32),
                    logprobs=np.array([-0.5, -0.25, 0, 0, 0, -1.0, -2.0], np.float32),
                    versions=np.array([3, 3, 4, 4, 4, 4, 4], np.int32), finish_reason=finish, response_text="a b",
                    loss_mask=np.array([1, 1, 0, 0, 0, 1, 1], np.int32), turn_rewards=np.array([0.5, 1.0], np.float32),
                    env_reward=None if error else 1.5, env_error=error, rollout={"turns": 2.0, "env_time_s": 0.01})


def frame(*samples: R.Sample) -> bytes:
    return wire.encode(R.SampleBatch(lease_id="L", samples=list(samples)))


def assert_same(a: R.Sample, b: R.Sample) -> None:
    for name in R.Sample.__slots__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray) and x.dtype == y.dtype and np.array_equal(x, y), name
        else:
            assert x == y and type(x) is type(y), name


# ------------------------------------------------------------------ bytes of single-turn samples


def test_a_single_turn_sample_encodes_exactly_as_before_the_episode_fields():
    """The frame of a Sample without episode fields, built by hand from the old ten-field map, and its digest
    as the code before multi-turn episodes wrote it."""
    s = single_turn()
    ext = lambda a: msgpack.ExtType(1, bytes([{np.int32: 1, np.float32: 2}[a.dtype.type], 1])  # noqa: E731
                                    + len(a).to_bytes(4, "little") + a.tobytes())
    body = {n: ext(v) if isinstance(v, np.ndarray) else v for n in OLD_FIELDS for v in [getattr(s, n)]}
    old = msgpack.packb({"v": 1, "t": "SampleBatch", "b": {"lease_id": "L", "samples": [body]}}, use_bin_type=True)
    assert frame(s) == old
    assert hashlib.sha256(old).hexdigest() == GOLDEN_SINGLE_TURN_SHA256
    assert list(msgpack.unpackb(frame(s), raw=False)["b"]["samples"][0]) == OLD_FIELDS


GOLDEN_SINGLE_TURN_SHA256 = "a678f714231b1bf9b995b0008af069ca9be8c3beecf3ce61a1b78163df7bc8d3"  # written by 04bb401


def test_episode_fields_are_left_out_only_at_their_defaults():
    s = single_turn()
    s.loss_mask, s.env_reward = np.ones(2, np.int32), 0.0  # set, though equal to what None would mean
    keys = list(msgpack.unpackb(frame(s), raw=False)["b"]["samples"][0])
    assert keys == OLD_FIELDS + ["loss_mask", "env_reward"]
    assert_same(wire.decode(frame(s)).samples[0], s)
    assert set(EPISODE_FIELDS) == set(R.Sample.__slots__) - set(OLD_FIELDS)


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("s", [episode(), episode(R.FinishReason.ENV_ERROR, "raised: tool timed out"), single_turn()],
                         ids=["episode", "env_error", "single_turn"])
def test_episode_round_trips_exactly_through_decode_packed_and_splicing(s):
    f = frame(s)
    back = wire.decode(f).samples[0]
    assert_same(back, s)
    assert wire.encode(wire.decode(f)) == f
    packed = wire.decode_packed(f).samples[0]
    assert_same(packed.unpack(), s)
    assert wire.encode(R.SampleBatch(lease_id="L", samples=[packed])) == f
    batch = lambda x: R.Batch(step=1, policy_version=4, groups=[R.Group(  # noqa: E731
        prompt=R.Prompt(prompt_id="p", n=1, text="q"), samples=[R.ScoredSample(sample=x, reward=1.0)])])
    assert wire.encode(batch(packed)) == wire.encode(batch(s))
    assert_same(wire.decode(wire.encode(batch(packed))).groups[0].samples[0].sample, s)


@st.composite
def episodes(draw) -> R.Sample:
    mask = np.array(draw(st.lists(st.sampled_from([0, 1]), max_size=30)), np.int32)
    n, masked = len(mask), draw(st.booleans())
    turns = (int(mask[0] == 1) + int(np.count_nonzero(np.diff(mask) == 1)) if n else 0) if masked else int(n > 0)
    failed = draw(st.booleans())
    return R.Sample(
        prompt_id=draw(st.text(max_size=8)), sample_index=draw(st.integers(0, 99)),
        prompt_token_ids=np.arange(draw(st.integers(0, 5)), dtype=np.int32),
        response_token_ids=np.array(draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n)), np.int32),
        logprobs=np.where(mask == 1, -0.5, 0.0).astype(np.float32), versions=np.full(n, 2, np.int32),
        finish_reason=R.FinishReason.ENV_ERROR if failed else draw(st.sampled_from(list(R.FinishReason))),
        loss_mask=mask if masked else None,
        turn_rewards=draw(st.none() | st.lists(st.floats(-10, 10, width=32), max_size=turns).map(
            lambda r: np.array(r, np.float32))),
        env_reward=draw(st.none() | st.floats(-5, 5)), env_error=draw(st.text(min_size=1, max_size=30)) if failed else "",
        rollout=draw(st.dictionaries(st.text(max_size=6), st.floats(0, 100), max_size=3)))


@settings(max_examples=80, deadline=None)
@given(st.lists(episodes(), min_size=1, max_size=3))
def test_episode_samples_round_trip_property(ss):
    f = frame(*ss)
    for back, s in zip(wire.decode(f).samples, ss):
        assert_same(back, s)
    packed = wire.decode_packed(f).samples
    assert wire.encode(R.SampleBatch(lease_id="L", samples=packed)) == f
    for p, s in zip(packed, ss):
        assert (p.finish_reason, p.env_reward, p.env_error, p.response_text) == (
            s.finish_reason, s.env_reward, s.env_error, s.response_text)


def test_packed_sample_reads_what_scoring_needs_without_the_arrays():
    packed = wire.decode_packed(frame(single_turn(), episode(), episode(R.FinishReason.ENV_ERROR, "bad observation"))).samples
    assert [p.finish_reason for p in packed] == [R.FinishReason.STOP, R.FinishReason.STOP, R.FinishReason.ENV_ERROR]
    assert [p.env_reward for p in packed] == [None, 1.5, None]
    assert [p.env_error for p in packed] == ["", "", "bad observation"]
    assert type(packed[1].finish_reason) is R.FinishReason and type(packed[1].env_reward) is float
    body = msgpack.unpackb(frame(episode()), raw=False)
    body["b"]["samples"][0]["env_reward"] = 2  # an integer from a peer that is not Python: still a float
    p = wire.decode_packed(msgpack.packb(body, use_bin_type=True)).samples[0]
    assert p.env_reward == 2.0 and type(p.env_reward) is float and p.unpack().env_reward == 2.0


# ------------------------------------------------------------------ a peer's bad values


def bad_episode_frames() -> list[tuple[bytes, str, str]]:
    good = msgpack.unpackb(frame(episode()), raw=False)
    s = good["b"]["samples"][0]
    i4 = lambda v: msgpack.ExtType(1, b"\x01\x01" + len(v).to_bytes(4, "little") + np.array(v, "<i4").tobytes())  # noqa: E731
    f4 = lambda v: msgpack.ExtType(1, b"\x02\x01" + len(v).to_bytes(4, "little") + np.array(v, "<f4").tobytes())  # noqa: E731
    cases = [  # (the bad sample map, the field named, what the message says)
        ({**s, "loss_mask": f4([1, 1, 0, 0, 0, 1, 1])}, "loss_mask", "expected 1-d int32"),
        ({**s, "loss_mask": i4([1, 1, 0])}, "loss_mask", "3 entries for a response of 7 tokens"),
        ({**s, "loss_mask": i4([1, 1, 0, 2, 0, 1, 1])}, "loss_mask", "values must be 0 or 1, got 2 at index 3"),
        ({**s, "loss_mask": i4([1, 1, 0, -1, 0, 1, 1])}, "loss_mask", "values must be 0 or 1, got -1 at index 3"),
        ({**s, "loss_mask": [1, 1, 0, 0, 0, 1, 1]}, "loss_mask", "expected array, got list"),
        ({**s, "turn_rewards": f4([0.5, float("nan")])}, "turn_rewards", "non-finite reward at index 1"),
        ({**s, "turn_rewards": f4([float("inf")])}, "turn_rewards", "non-finite reward at index 0"),
        ({**s, "turn_rewards": f4([1.0, 1.0, 1.0])}, "turn_rewards", "3 rewards but the response has 2 model turns"),
        ({**s, "turn_rewards": i4([1, 1])}, "turn_rewards", "expected 1-d float32"),
        ({**s, "env_reward": "1.5"}, "env_reward", "expected float, got str"),
        ({**s, "env_reward": True}, "env_reward", "expected float, got bool"),
        ({**s, "env_reward": float("nan")}, "env_reward", "nan is not finite"),
        ({**s, "env_reward": float("-inf")}, "env_reward", "-inf is not finite"),
        ({**s, "env_error": 3}, "env_error", "expected str, got int"),
        ({**s, "env_error": "boom"}, "env_error", "'boom' on a sample with finish_reason 'stop'"),
        ({**s, "finish_reason": "env_error", "env_error": "x" * (MAX_ENV_ERROR_CHARS + 1)}, "env_error",
         f"{MAX_ENV_ERROR_CHARS + 1} characters, more than {MAX_ENV_ERROR_CHARS}"),
        ({**s, "rollout": {"turns": "two"}}, "rollout.turns", "expected float, got str"),
        ({**s, "rollout": [1.0]}, "rollout", "expected map, got list"),
    ]
    return [(msgpack.packb({**good, "b": {"lease_id": "L", "samples": [bad]}}, use_bin_type=True), field, why)
            for bad, field, why in cases]


@pytest.mark.parametrize("f, field, why", bad_episode_frames())
def test_bad_episode_fields_are_rejected_by_both_decoders(f, field, why):
    for decode in (wire.decode, wire.decode_packed):
        with pytest.raises(wire.WireError) as e:
            decode(f)
        assert str(e.value).startswith(f"SampleBatch.samples[0].{field}: ") and why in str(e.value), str(e.value)


def test_explicit_nulls_mean_absent():
    body = msgpack.unpackb(frame(single_turn()), raw=False)
    body["b"]["samples"][0].update(loss_mask=None, turn_rewards=None, env_reward=None)
    f = msgpack.packb(body, use_bin_type=True)
    assert_same(wire.decode(f).samples[0], single_turn())
    assert wire.decode_packed(f).samples[0].env_reward is None


def test_turn_rewards_without_a_loss_mask_allow_one_turn():
    s = single_turn()
    s.turn_rewards = np.array([1.0], np.float32)
    assert_same(wire.decode(frame(s)).samples[0], s)
    s.turn_rewards = np.array([1.0, 2.0], np.float32)
    with pytest.raises(wire.WireError, match="2 rewards but the response has 1 model turns"):
        wire.decode(frame(s))
