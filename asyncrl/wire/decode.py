"""Frames -> records: bounded unpacking (`asyncrl.wire.frames`), the envelope, then the record's check.

`decode` builds full records. `decode_packed` is what the hub uses: the same validation, but the
samples of a SampleBatch stay `PackedSample`s whose `raw` are views into the frame, so the arrays the
hub never reads are never built; a SampleBatch of single-turn samples is decoded by msgspec
(`asyncrl.wire.views`), any other frame, or one that path does not accept, by msgpack here. Anything wrong raises `WireError`; nothing here ever unpickles.
"""

from __future__ import annotations

from typing import Any

from asyncrl import records as R
from asyncrl.wire.checks import fail
from asyncrl.wire.envelope import open_envelope
from asyncrl.wire.frames import DEFAULT_MAX_FRAME_BYTES, check_size, unpack_with_spans, unpackb
from asyncrl.wire.sample import pack_samples
from asyncrl.wire.schema import record_check
from asyncrl.wire.views import packed

_SAMPLE_BATCH_FIELDS = frozenset({"lease_id", "samples"})


def decode(frame: bytes | memoryview, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Any:
    """One frame -> record. Raises WireError for anything that is not a valid message."""
    check_size(frame, max_frame_bytes)
    return _validate(unpackb(frame))


def decode_packed(frame: bytes | memoryview, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Any:
    """Like `decode` (same validation), but a SampleBatch's samples come back as `PackedSample`s whose
    `raw` are views into `frame` (keep `frame` immutable while they live). Other messages as `decode`."""
    check_size(frame, max_frame_bytes)
    fast = packed(frame)  # msgspec's decoder where it can decide (nearly every SampleBatch and ScoredIds)
    return fast if fast is not None else msgpack_packed(frame)


def msgpack_packed(frame: bytes | memoryview) -> Any:
    """`decode_packed` of a sized frame by msgpack alone: every frame `asyncrl.wire.views` leaves, and the
    reference that path is tested against."""
    top, view, spans = unpack_with_spans(frame)
    if open_envelope(top) is not R.SampleBatch:
        return _validate(top)
    body = top["b"]
    if type(body) is not dict:
        raise fail("SampleBatch", "SampleBatch", body)
    if body.keys() != _SAMPLE_BATCH_FIELDS:
        return _validate(top)  # generic path words the error
    lease_id, samples = body["lease_id"], body["samples"]
    if type(lease_id) is not str:
        raise fail(("SampleBatch", "lease_id"), "str", lease_id)
    if type(samples) is not list:
        raise fail(("SampleBatch", "samples"), "list", samples)
    assert len(spans) == len(samples), "one span per sample of the last 'samples' key"
    packed = pack_samples(samples, [view[a:b] for a, b in spans], ("SampleBatch", "samples"))
    for ps, (a, _) in zip(packed, spans):
        ps.offset = a  # the journal turns it into where the sample lies on disk (PackedSample.stored)
    return R.SampleBatch(lease_id=lease_id, samples=packed)


def _validate(top: Any) -> Any:
    cls = open_envelope(top)
    return record_check(cls)(top["b"], cls.__name__)
