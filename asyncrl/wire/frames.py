"""Frame bytes -> plain msgpack values, bounded: size first, structure where it matters, then msgpack.

msgpack unpacks in C; ext values come out as ``slice(code, data)`` (a C-level pair, far cheaper than a
Python hook per array) and are only checked and wrapped where the schema expects an array
(`asyncrl.wire.arrays`). Nothing here knows about records; anything unreadable raises `WireError`.
"""

from __future__ import annotations

from typing import Any

import msgpack

from asyncrl.wire.bounds import bound
from asyncrl.wire.checks import WireError

DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024

Spans = list[tuple[int, int]]  # byte [start, end) of each element of a list inside a frame


def unpackb(data: bytes | memoryview) -> Any:
    try:
        return msgpack.unpackb(data, ext_hook=slice, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises many types for garbage (ValueError, ExtraData, ...)
        raise WireError(f"not msgpack: {type(e).__name__}: {e}") from None


def check_size(frame: bytes | memoryview, max_frame_bytes: int) -> None:
    """Size, then structure (depth, value count) where the frame could build much: before any unpacking."""
    if len(frame) > max_frame_bytes:
        raise WireError(f"frame of {len(frame)} bytes exceeds max_frame_bytes={max_frame_bytes}")
    bound(frame)


def unpack_with_spans(frame: bytes | memoryview) -> tuple[Any, memoryview, Spans]:
    """Unpack a frame (sized and bounded by the caller: `check_size`), noting the byte span of each element of
    the body's (last) "samples" list."""
    spans: Spans = []
    try:
        u = msgpack.Unpacker(ext_hook=slice, raw=False, strict_map_key=True, max_buffer_size=len(frame) + 1)
        u.feed(frame)
        top = {}
        for _ in range(u.read_map_header()):
            key = u.unpack()
            top[key] = _body_with_spans(u, spans) if key == "b" else u.unpack()
        if u.tell() != len(frame):
            raise WireError(f"{len(frame) - u.tell()} bytes of trailing data after the frame")
    except WireError:
        raise
    except Exception as e:  # msgpack raises many types for garbage
        raise WireError(f"not msgpack: {type(e).__name__}: {e}") from None
    return top, memoryview(frame), spans


def _body_with_spans(u: msgpack.Unpacker, spans: Spans) -> Any:
    body = {}
    for _ in range(u.read_map_header()):
        key = u.unpack()
        if key != "samples":
            body[key] = u.unpack()
            continue
        spans.clear()  # a repeated key: the last one wins, as in the dict
        items = []
        for _ in range(u.read_array_header()):
            start = u.tell()
            items.append(u.unpack())
            spans.append((start, u.tell()))
        body[key] = items
    return body
