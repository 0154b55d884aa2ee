"""The msgspec path of `decode_packed` (`asyncrl.wire.views`) against its msgpack path: the same PackedSamples
for every frame it accepts, and for every frame it leaves (other forms, broken values) the msgpack path's
answer or error, so what a peer may send and what the hub says about it do not depend on the path."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_wire import samples

from asyncrl import records as R
from asyncrl import wire
from asyncrl.wire import views
from asyncrl.wire.decode import msgpack_packed

pytestmark = pytest.mark.skipif(not views.HAVE_MSGSPEC, reason="msgspec is not installed")


def fields(msg: R.SampleBatch) -> list[tuple]:
    return [(s.prompt_id, s.sample_index, s.min_version, bytes(s.raw), s.finite, s.scoring, s.offset)
            for s in msg.samples]


def outcome(frame: bytes) -> tuple:
    """What decode_packed says (the path it took does not show), and what the msgpack path alone says."""
    def said(f) -> tuple:
        try:
            msg = f(frame)
        except wire.WireError as e:
            return ("error", str(e))
        if isinstance(msg, R.SampleBatch):
            return ("ok", msg.lease_id, fields(msg))
        if isinstance(msg, R.ScoredIds):  # repr: a NaN reward equals itself
            return ("ok", "ScoredIds", [repr((r.prompt_id, r.sample_index, r.reward, r.components, r.status, r.reason))
                                        for r in msg.scores])
        return ("ok", msg)
    return said(wire.decode_packed), said(msgpack_packed)


@settings(max_examples=80, deadline=None)
@given(st.lists(samples(), max_size=5), st.text(max_size=8), st.booleans())
def test_every_single_turn_batch_is_decoded_here_as_by_msgpack(ss, lease_id, broken_logprob):
    if broken_logprob and ss and len(ss[0].logprobs):
        ss[0].logprobs[0] = np.nan  # a datum the hub fails (finite=False), not a frame it refuses
    frame = wire.encode(R.SampleBatch(lease_id=lease_id, samples=ss))
    fast = views.packed(frame)
    assert fast is not None  # every sample our encoder writes for a single-turn Sample takes this path
    assert (fast.lease_id, fields(fast)) == (lease_id, fields(msgpack_packed(frame)))


def frame_of(sample_maps: list, lease_id: object = "L", extra_body: dict | None = None, **envelope) -> bytes:
    return msgpack.packb({"v": R.SCHEMA_VERSION, "t": "SampleBatch", **envelope,
                          "b": {"lease_id": lease_id, "samples": sample_maps, **(extra_body or {})}}, use_bin_type=True)


def base_map() -> dict:
    s = R.Sample(prompt_id="p", sample_index=1, prompt_token_ids=np.arange(3, dtype=np.int32),
                 response_token_ids=np.arange(5, dtype=np.int32), logprobs=-np.ones(5, np.float32),
                 versions=np.zeros(5, np.int32), finish_reason=R.FinishReason.STOP, response_text="hi",
                 timings={"sent": 1.0}, generator="g")
    return msgpack.unpackb(wire.encode(R.SampleBatch(lease_id="L", samples=[s])), raw=False)["b"]["samples"][0]


def ext(code: int, payload: bytes) -> msgpack.ExtType:
    return msgpack.ExtType(code, payload)


def vec(code: int, values: bytes, n: int, ndim: int = 1) -> msgpack.ExtType:
    return ext(1, bytes((code, ndim)) + n.to_bytes(4, "little") + (b"\x01\x00\x00\x00" if ndim == 2 else b"") + values)


BROKEN = {  # one change to a valid sample map -> a frame the msgspec path must leave to msgpack
    "unknown field": lambda m: {**m, "color": "red"},
    "missing field": lambda m: {k: v for k, v in m.items() if k != "logprobs"},
    "negative index": lambda m: {**m, "sample_index": -1},
    "bool index": lambda m: {**m, "sample_index": True},
    "int prompt id": lambda m: {**m, "prompt_id": 7},
    "bad finish reason": lambda m: {**m, "finish_reason": "bored"},
    "float32 token ids": lambda m: {**m, "response_token_ids": vec(2, bytes(20), 5)},
    "int logprobs": lambda m: {**m, "logprobs": vec(1, bytes(20), 5)},
    "2-d prompt": lambda m: {**m, "prompt_token_ids": vec(1, bytes(12), 3, ndim=2)},
    "short logprobs": lambda m: {**m, "logprobs": vec(2, bytes(16), 4)},
    "length lies": lambda m: {**m, "response_token_ids": vec(1, bytes(16), 5)},
    "array ext 9": lambda m: {**m, "response_token_ids": ext(9, m["response_token_ids"].data)},
    "array as bytes": lambda m: {**m, "prompt_token_ids": bytes(18)},
    "runs of 4 for 5 tokens": lambda m: {**m, "versions": ext(2, (4).to_bytes(4, "little") + (1).to_bytes(4, "little")
                                                               + bytes(4) + (4).to_bytes(4, "little"))},
    "runs not covering": lambda m: {**m, "versions": ext(2, (5).to_bytes(4, "little") + (1).to_bytes(4, "little")
                                                          + bytes(4) + (3).to_bytes(4, "little"))},
    "plain versions": lambda m: {**m, "versions": vec(1, bytes(20), 5)},
    "int timing": lambda m: {**m, "timings": {"sent": 2}},
    "nested timing": lambda m: {**m, "timings": {"sent": [[[1.0]]]}},
    "multi-turn": lambda m: {**m, "loss_mask": vec(1, b"\x01\x00\x00\x00" * 5, 5), "env_reward": 0.5},
    "text as int": lambda m: {**m, "response_text": 3},
    "not a map": lambda m: [1, 2],
}


@pytest.mark.parametrize("change", sorted(BROKEN))
def test_a_sample_the_fast_path_cannot_vouch_for_gets_the_msgpack_path_s_answer(change):
    maps = [base_map(), BROKEN[change](base_map())]
    frame = frame_of(maps)
    taken, reference = outcome(frame)
    assert taken == reference
    if change not in ("plain versions", "int timing", "multi-turn"):
        assert taken[0] == "error", taken
    assert views.packed(frame) is None or change in ("plain versions", "int timing")


@pytest.mark.parametrize("frame", [
    frame_of([base_map()], lease_id=5),
    frame_of([base_map()], extra_body={"more": 1}),
    frame_of([base_map()], v=2),
    frame_of([base_map()]) + b"\xc0",  # trailing bytes
    frame_of([base_map()])[:-3],  # truncated
    frame_of([base_map()], t="Ack"),
    msgpack.packb({"v": 1, "t": "SampleBatch", "b": {"lease_id": "L", "samples": [base_map()], "x": b"\x91" * 5000}}),
    b"\x83" + b"\x91" * 200_000,  # nesting far past any recursion limit
])
def test_frames_around_the_samples_are_judged_as_msgpack_judges_them(frame):
    taken, reference = outcome(frame)
    assert taken == reference


def test_without_msgspec_the_msgpack_path_does_everything(monkeypatch):
    frame = frame_of([base_map()])
    monkeypatch.setattr(views, "HAVE_MSGSPEC", False)
    assert views.packed(frame) is None
    assert fields(wire.decode_packed(frame)) == fields(msgpack_packed(frame))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.builds(R.ScoreResult, prompt_id=st.text(max_size=8), sample_index=st.integers(-3, 2**40),
                          reward=st.floats(), components=st.dictionaries(st.text(max_size=4), st.floats(), max_size=3),
                          status=st.sampled_from(list(R.ScoreStatus)), reason=st.text(max_size=8)), max_size=6))
def test_scored_ids_are_decoded_here_as_by_msgpack(results):
    frame = wire.encode(R.ScoredIds(scores=results))
    assert views.packed(frame) is not None
    taken, reference = outcome(frame)
    assert taken == reference


def score_frame(result: dict, **body) -> bytes:
    return msgpack.packb({"v": R.SCHEMA_VERSION, "t": "ScoredIds", "b": {"scores": [result], **body}},
                         use_bin_type=True)


GOOD = {"prompt_id": "p", "sample_index": 0, "reward": 1.0}


@pytest.mark.parametrize("frame", [
    score_frame({**GOOD, "reward": 1}),  # an int reward: a float (both paths convert it)
    score_frame({**GOOD, "reward": True}),
    score_frame({**GOOD, "reward": "1.0"}),
    score_frame({**GOOD, "sample_index": 1.0}),
    score_frame({**GOOD, "sample_index": False}),
    score_frame({**GOOD, "status": "meh"}),
    score_frame({**GOOD, "components": {"a": "x"}}),
    score_frame({**GOOD, "components": {"a": 2}}),
    score_frame({**GOOD, "components": {1: 2.0}}),
    score_frame({**GOOD, "extra": 1}),
    score_frame({"prompt_id": "p", "sample_index": 0}),
    score_frame({**GOOD, "reason": None}),
    score_frame(GOOD, more=1),
    msgpack.packb({"v": R.SCHEMA_VERSION, "t": "ScoredIds", "b": {"scores": {"a": 1}}}),
])
def test_broken_scores_get_the_msgpack_path_s_answer(frame):
    taken, reference = outcome(frame)
    assert taken == reference
