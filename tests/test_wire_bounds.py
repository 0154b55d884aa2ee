"""Decoding is bounded before anything is built: depth, value counts, truncation; no recursion on peer data."""

from __future__ import annotations

import functools
import random

import msgpack
import numpy as np
import pytest

from asyncrl import records as R
from asyncrl import wire
from asyncrl.wire.bounds import check_bounds


def nested(depth: int) -> list:
    return functools.reduce(lambda a, _: [a], range(depth), [])


def heartbeat_frame(info: object) -> bytes:
    return msgpack.packb({"v": R.SCHEMA_VERSION, "t": "Heartbeat", "b": {"service": "g", "name": "n", "info": {"x": info}}})


def test_a_heartbeat_nested_500_deep_is_a_wire_error_not_a_recursion_error():
    frame = heartbeat_frame(nested(500))
    assert len(frame) < 600
    with pytest.raises(wire.WireError, match="nests deeper"):
        wire.decode(frame)
    with pytest.raises(wire.WireError, match="nests deeper"):
        wire.decode_packed(frame)


def test_free_form_fields_keep_reasonable_nesting():
    msg = wire.decode(heartbeat_frame(nested(10)))
    assert msg.info["x"] == nested(10)


def test_check_bounds_counts_depth_and_values_without_building():
    with pytest.raises(wire.WireError, match="nests deeper than 8"):
        check_bounds(msgpack.packb(nested(9)), max_depth=8)
    check_bounds(msgpack.packb(nested(7)), max_depth=8)
    empties = b"\xdd" + (100_000).to_bytes(4, "big") + b"\x80" * 100_000  # 100k empty maps, 100 KB
    with pytest.raises(wire.WireError, match="more than 1000 values"):
        check_bounds(empties, max_objects=1000)
    with pytest.raises(wire.WireError, match="claims"):
        check_bounds(b"\xdd\xff\xff\xff\xff\xc0")  # 4G values announced in 1 byte
    with pytest.raises(wire.WireError, match="truncated"):
        check_bounds(b"\xc6\x00\x00\x10\x00abc")  # bin of 4096 bytes, 3 present
    with pytest.raises(wire.WireError, match="not msgpack"):
        check_bounds(b"\x91\xc1")


def test_check_bounds_accepts_every_real_message_and_agrees_with_msgpack():
    s = R.Sample(prompt_id="p", sample_index=0, prompt_token_ids=np.arange(3, dtype=np.int32),
                 response_token_ids=np.arange(4, dtype=np.int32), logprobs=np.zeros(4, np.float32),
                 versions=np.zeros(4, np.int32), finish_reason=R.FinishReason.STOP, timings={"a": 1.5})
    for msg in (R.SampleBatch(lease_id="L", samples=[s, s]), R.Heartbeat(service="g", name="n", info={"k": [1, -2.5, None]}),
                R.SubmitPrompts(prompts=[R.Prompt(prompt_id="a", n=2, token_ids=np.arange(9, dtype=np.int32))])):
        check_bounds(wire.encode(msg))
    rng = random.Random(0)
    for _ in range(300):  # random values of every msgpack kind: never a false alarm
        value = [rng.choice([0, -1, 2**40, -2**40, 1.5, "x" * rng.randrange(300), b"y" * rng.randrange(70000),
                             msgpack.ExtType(1, b"z" * rng.randrange(300)), {"k": None}, [True, False]])
                 for _ in range(rng.randrange(20))]
        check_bounds(msgpack.packb(value, use_bin_type=True))


def test_large_frames_are_walked_before_unpacking():
    # 2 MB of empty maps would build ~150 MB of dicts; the walk refuses it before msgpack sees it
    empties = b"\xdd" + (2_000_000).to_bytes(4, "big") + b"\x80" * 2_000_000
    frame = b"\x83\xa1v" + msgpack.packb(R.SCHEMA_VERSION) + b"\xa1t\xa9Heartbeat\xa1b" + empties
    with pytest.raises(wire.WireError, match="more than"):
        wire.decode(frame)
