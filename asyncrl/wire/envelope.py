"""The envelope every frame is: one msgpack map ``{"v": SCHEMA_VERSION, "t": <type name>, "b": <body>}``.

`MESSAGE_TYPES` lists the records that may travel at the top level of a frame; a record's class name is
its wire name. Bodies are the records' fields (`asyncrl.wire.encode`, `asyncrl.wire.schema`).
"""

from __future__ import annotations

from typing import Any

import msgpack

from asyncrl import records as R
from asyncrl.wire.bounds import bound
from asyncrl.wire.checks import WireError

MESSAGE_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        R.Heartbeat, R.FatalError, R.WeightVersion, R.Stats, R.ErrorReply, R.Ack, R.SubmitPrompts,
        R.LeaseRequest, R.Lease, R.SampleBatch, R.ReturnPrompts, R.ScoreRequest, R.ToScore,
        R.ScoredIds, R.BatchRequest, R.Batch, R.CommitStep, R.StatsRequest, R.Completion,
        R.Shutdown, R.PeerDown, R.Prompt, R.Sample, R.ScoredSample, R.Group, R.WeightJoin, R.WeightGroupInit,
        R.WeightBegin, R.WeightBucket, R.WeightEnd,
    )
}


def wire_name(msg: Any) -> str:
    """The type name a record travels under; TypeError for anything that is not a message type."""
    name = type(msg).__name__
    if MESSAGE_TYPES.get(name) is not type(msg):
        raise TypeError(f"{name} is not a wire message type")
    return name


def open_envelope(top: Any) -> type:
    """An unpacked frame -> the record class its body must be; WireError for a bad envelope."""
    if not isinstance(top, dict) or not {"v", "t", "b"} <= top.keys():
        raise WireError("frame is not a {v, t, b} envelope")
    if top["v"] != R.SCHEMA_VERSION:
        raise WireError(f"schema version {top['v']!r} != {R.SCHEMA_VERSION}")
    cls = MESSAGE_TYPES.get(top["t"]) if isinstance(top["t"], str) else None
    if cls is None:
        raise WireError(f"unknown message type {top['t']!r}")
    return cls


def message_type(frame: bytes | memoryview) -> str:
    """Best-effort type name of a frame, for error replies; '' when unreadable."""
    try:
        bound(frame)
        top = msgpack.unpackb(frame, raw=False, ext_hook=lambda c, d: None)
        return str(top.get("t", ""))[:64] if isinstance(top, dict) else ""
    except Exception:
        return ""
