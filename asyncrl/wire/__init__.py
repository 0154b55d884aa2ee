"""The wire format: the only code that turns records into network frames and back (callers use `wire.*`).

A frame is one msgpack map ``{"v": SCHEMA_VERSION, "t": <record type name>, "b": <body>}``; bodies are
built from the record dataclasses in `asyncrl.records`, numeric arrays travel as raw little-endian
buffers with dtype and shape. Decoding is bounded before anything is built and checked against the
records' annotations; anything wrong raises `WireError`, and nothing here ever unpickles.

    envelope.py  the {v, t, b} map, the message types         arrays.py  ext type 1: dtype, shape, bytes
    encode.py    records -> frames (splicing stored samples)  decode.py  frames -> records
    frames.py    bytes -> msgpack values, bounded              bounds.py  depth / value-count walk
    schema.py    record checks from annotations               sample.py  Sample's check, PackedSample
    checks.py    WireError, where-paths, generic value checks  views.py   SampleBatch by msgspec (the hub's)
"""

from __future__ import annotations

from asyncrl.wire.checks import WireError
from asyncrl.wire.decode import decode, decode_packed
from asyncrl.wire.encode import encode
from asyncrl.wire.envelope import MESSAGE_TYPES, message_type
from asyncrl.wire.frames import DEFAULT_MAX_FRAME_BYTES
from asyncrl.wire.sample import PackedSample

__all__ = ["DEFAULT_MAX_FRAME_BYTES", "MESSAGE_TYPES", "PackedSample", "WireError", "decode", "decode_packed",
           "encode", "message_type"]
