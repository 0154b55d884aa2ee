"""The payload format of the hub's on-disk records (journal segments and snapshots): one msgpack value.

Not a network message: no envelope, no schema check. `asyncrl.replay.log` frames each payload (length +
crc32); the journal logs a mutation as ``[kind, *args]``, and a request that carries records as
``[kind, frame]`` with the network frame (`asyncrl.wire`) embedded as bytes, written from the received
buffer as it is (`log_record_parts`) so the hot path never re-encodes or copies samples.
"""

from __future__ import annotations

from typing import Any

import msgpack

from asyncrl.wire import WireError

_PACKER = msgpack.Packer(use_bin_type=True)


def encode_record(value: Any) -> bytes:
    """Plain data (maps, lists, str, int, float, bool, None, bytes) -> msgpack."""
    return msgpack.packb(value, use_bin_type=True)


def log_record_parts(kind: str, blob: bytes | memoryview) -> list[bytes | memoryview]:
    """``encode_record([kind, blob])`` as pieces whose concatenation is those exact bytes, with `blob`
    itself as the last piece (not copied): how the hub logs a whole network frame."""
    n = len(blob)
    bin_header = (b"\xc4" + n.to_bytes(1, "big") if n < 1 << 8 else b"\xc5" + n.to_bytes(2, "big") if n < 1 << 16
                  else b"\xc6" + n.to_bytes(4, "big"))
    return [_PACKER.pack_array_header(2) + _PACKER.pack(kind) + bin_header, blob]


def decode_record(data: bytes | memoryview) -> Any:
    """Inverse of `encode_record`. Raises WireError for bytes that are not one msgpack value."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:
        raise WireError(f"log record is not msgpack: {type(e).__name__}: {e}") from None
