"""Wire format: round trips (property-based), byte-identical splicing, and rejection of bad frames."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl import records as R
from asyncrl import wire

text = st.text(max_size=20)
ints32 = st.integers(-(2**31), 2**31 - 1)
floats = st.floats(allow_nan=False, width=32)
arr_i32 = st.lists(ints32, max_size=40).map(lambda x: np.array(x, np.int32))


@st.composite
def samples(draw) -> R.Sample:
    n = draw(st.integers(0, 40))
    return R.Sample(
        prompt_id=draw(text), sample_index=draw(st.integers(0, 1000)), prompt_token_ids=draw(arr_i32),
        response_token_ids=np.array(draw(st.lists(ints32, min_size=n, max_size=n)), np.int32),
        logprobs=np.array(draw(st.lists(floats, min_size=n, max_size=n)), np.float32),
        versions=np.array(draw(st.lists(st.integers(0, 99), min_size=n, max_size=n)), np.int32),
        finish_reason=draw(st.sampled_from(list(R.FinishReason))), response_text=draw(text),
        timings=draw(st.dictionaries(text, st.floats(allow_nan=False), max_size=3)), generator=draw(text),
    )


@st.composite
def prompts(draw) -> R.Prompt:
    use_text = draw(st.booleans())
    return R.Prompt(
        prompt_id=draw(text), n=draw(st.integers(1, 16)), text=draw(text) if use_text else None,
        token_ids=None if use_text else draw(arr_i32),
        sampling=R.SamplingParams(temperature=draw(st.floats(0, 2)), top_k=draw(st.sampled_from([-1, 1, 50])),
                                  max_new_tokens=draw(st.integers(1, 4096)), stop_token_ids=draw(st.lists(ints32, max_size=3))),
        reward=R.RewardSpec(target=draw(st.none() | text), params={"k": draw(st.integers(-(2**63), 2**63 - 1))}),
        metadata=draw(st.dictionaries(text, st.none() | st.integers(-100, 100) | text, max_size=3)),
    )


def same(a, b) -> None:
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    elif hasattr(a, "__dataclass_fields__"):
        assert type(a) is type(b)
        for f in a.__dataclass_fields__:
            same(getattr(a, f), getattr(b, f))
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    else:
        assert a == b


@settings(max_examples=60, deadline=None)
@given(st.lists(samples(), max_size=4), text)
def test_sample_batch_round_trip(ss, lease_id):
    msg = R.SampleBatch(lease_id=lease_id, samples=ss)
    frame = wire.encode(msg)
    again = wire.decode(frame)
    same(again, msg)
    assert wire.encode(again) == frame
    packed = wire.decode_packed(frame)
    assert [(p.prompt_id, p.sample_index) for p in packed.samples] == [(s.prompt_id, s.sample_index) for s in ss]
    same([p.unpack() for p in packed.samples], ss)
    assert wire.encode(packed) == frame


@settings(max_examples=60, deadline=None)
@given(st.lists(prompts(), max_size=4), st.booleans())
def test_submit_round_trip(ps, watch):
    msg = R.SubmitPrompts(prompts=ps, watch=watch)
    same(wire.decode(wire.encode(msg)), msg)


@settings(max_examples=30, deadline=None)
@given(st.lists(samples(), min_size=1, max_size=3), prompts())
def test_batch_with_spliced_samples_is_byte_identical(ss, p):
    packed = wire.decode_packed(wire.encode(R.SampleBatch(lease_id="L", samples=ss))).samples

    def batch(samples):
        return R.Batch(step=3, policy_version=2, groups=[R.Group(prompt=p, samples=[
            R.ScoredSample(sample=s, reward=0.5, components={"a": 1.0}) for s in samples])])

    assert wire.encode(batch(packed)) == wire.encode(batch(ss))
    same(wire.decode(wire.encode(batch(packed))), batch(ss))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.builds(
    lambda pid, i, text, target, params, finish, env_reward, env_error: R.ToScoreItem(
        prompt_id=pid, sample_index=i, response_text=text, reward=R.RewardSpec(target=target, params=params),
        finish_reason=finish, env_reward=env_reward, env_error=env_error),
    text, st.integers(0, 1000), text, st.none() | text,
    st.dictionaries(text, st.none() | st.integers(-(2**63), 2**63 - 1) | text | st.lists(st.integers(-5, 5), max_size=2),
                    max_size=3),
    st.sampled_from(list(R.FinishReason)), st.none() | st.floats(allow_nan=False), text), max_size=5))
def test_to_score_is_what_the_generic_packing_writes(items):
    """ToScore's body is built straight (`_to_score_body`, one map per item): the same bytes as the generic
    packing of the records, and the same items back."""
    from asyncrl.wire.encode import _default

    msg = R.ToScore(items=items)
    plain = msgpack.packb({"v": R.SCHEMA_VERSION, "t": "ToScore", "b": msg}, default=_default, use_bin_type=True)
    assert wire.encode(msg) == plain
    same(wire.decode(plain), msg)


odd_array = st.builds(
    lambda dtype, n, strided: (np.arange(2 * n).astype(dtype)[::2] if strided else np.arange(n).astype(dtype)),
    st.sampled_from(["<i4", ">i4", "<f4", ">f4", "<i8", "u1", "<f2", "?"]),
    st.sampled_from([0, 1, 2, 3, 10, 62, 63, 16380, 16382, 16400]),  # fixext 8/16, ext 8/16/32 payloads
    st.booleans())


@settings(max_examples=60, deadline=None)
@given(st.lists(samples(), min_size=1, max_size=3), st.lists(odd_array, min_size=4, max_size=4),
       st.sampled_from([None, np.zeros((2, 3), np.int32), np.array(7, np.int32)]))
def test_sample_arrays_are_composed_into_the_bytes_msgpack_would_write(ss, arrays, other):
    """SampleBatch is composed piece by piece (arrays as views behind prebuilt headers): the frame must be
    what msgpack writes for the same records, for any array (byte order, stride, dtype, size, rank)."""
    from asyncrl.wire.encode import _default  # the generic packing every other message uses

    ss[0].prompt_token_ids, ss[0].response_token_ids, ss[0].logprobs, ss[0].versions = arrays
    if other is not None:
        ss[-1].versions = other
    msg = R.SampleBatch(lease_id="L", samples=ss)
    plain = msgpack.packb({"v": R.SCHEMA_VERSION, "t": "SampleBatch", "b": msg}, default=_default,
                          use_bin_type=True)
    assert wire.encode(msg) == plain


@pytest.mark.parametrize("frame, why", [
    (b"", "not msgpack"),
    (msgpack.packb([1, 2]), "envelope"),
    (msgpack.packb({"v": 2, "t": "Ack", "b": {}}), "schema version 2"),
    (msgpack.packb({"v": 1, "t": "Nope", "b": {}}), "unknown message type"),
    (msgpack.packb({"v": 1, "t": "Ack", "b": {"ok": 1}}), "Ack.ok: expected bool"),
    (msgpack.packb({"v": 1, "t": "Ack", "b": {"zz": 1}}), "unknown fields"),
    (msgpack.packb({"v": 1, "t": "CommitStep", "b": {"step": 1}}), "needs field 'policy_version'"),
    (msgpack.packb({"v": 1, "t": "SampleBatch", "b": {"lease_id": "L", "samples": [{"prompt_id": 3}]}}),
     "SampleBatch.samples[0].prompt_id: expected str"),
    (b"cos\nsystem\n(S'echo hi'\ntR.", "not msgpack"),
])
def test_bad_frames_are_rejected_with_a_reason(frame, why):
    with pytest.raises(wire.WireError, match=why.replace("[", r"\[").replace("]", r"\]")):
        wire.decode(frame)
    with pytest.raises(wire.WireError):
        wire.decode_packed(frame)


def test_wrong_array_dtype_and_length_mismatch_are_rejected():
    s = R.Sample(prompt_id="p", sample_index=0, prompt_token_ids=np.zeros(2, np.int32),
                 response_token_ids=np.zeros(3, np.int32), logprobs=np.zeros(2, np.float32),
                 versions=np.zeros(3, np.int32), finish_reason=R.FinishReason.STOP)
    with pytest.raises(wire.WireError, match="3 tokens but 2 logprobs"):
        wire.decode(wire.encode(R.SampleBatch(lease_id="L", samples=[s])))
    s.logprobs = np.zeros(3, np.float64)
    with pytest.raises(wire.WireError, match="expected 1-d float32"):
        wire.decode(wire.encode(R.SampleBatch(lease_id="L", samples=[s])))


def test_oversize_frames_are_refused_before_decoding():
    with pytest.raises(wire.WireError, match="exceeds max_frame_bytes"):
        wire.decode(b"\x00" * 2000, max_frame_bytes=1024)
