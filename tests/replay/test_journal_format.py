"""The journal's record payloads: plain msgpack values, and a logged frame written as it arrived."""

from __future__ import annotations

import pytest

from asyncrl import wire
from asyncrl.replay.journal_format import decode_record, encode_record, log_record_parts


def test_log_records_round_trip():
    rec = ["samples", b"\x00\xff", 3, 1.5, {"a": [None, True]}]
    assert decode_record(encode_record(rec)) == rec
    with pytest.raises(wire.WireError):
        decode_record(b"\xc1")


@pytest.mark.parametrize("n", [0, 5, 255, 256, 65535, 65536, 70000])
def test_log_record_parts_are_the_encoded_record(n):
    blob = bytes(range(256)) * (n // 256) + bytes(n % 256)
    parts = log_record_parts("samples", memoryview(blob))
    assert b"".join(parts) == encode_record(["samples", blob]) and parts[-1].obj is blob
