"""Building blocks of wire validation: the error type, where-paths, and generic value checks.

Checks take ``(value, where)``; `where` is a cheap tuple path, turned into text only for an error
message. `asyncrl.wire.schema` composes these into per-record checks.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any


class WireError(ValueError):
    """A frame that does not decode or does not validate. The message says why."""


# Where a value sits in a frame: a name, or (parent, field name | list index). Built as cheap tuples on
# the hot path and only turned into text ("SampleBatch.samples[3].logprobs") when a check fails.
Where = str | tuple[Any, str | int]
Check = Callable[[Any, Where], Any]


def path(where: Where) -> str:
    parts: list[str] = []
    while isinstance(where, tuple):
        where, seg = where
        parts.append(f"[{seg}]" if isinstance(seg, int) else f".{seg}")
    return where + "".join(reversed(parts))


def fail(where: Where, want: str, got: Any) -> WireError:
    return WireError(f"{path(where)}: expected {want}, got {'ext' if type(got) is slice else type(got).__name__}")


# ------------------------------------------------------------------------------------- generic checks


def scalar(kind: type) -> Check:
    def check(v: Any, where: Where) -> Any:
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            return float(v)
        if kind is int and isinstance(v, bool):
            raise fail(where, "int", v)
        if not isinstance(v, kind):
            raise fail(where, kind.__name__, v)
        return v

    return check


def key(k: Any, where: Where) -> str:
    if not isinstance(k, str):
        raise fail(where, "str key", k)
    return k


MAX_ANY_DEPTH = 16  # nesting allowed inside a free-form field (metadata, info, params)


def any_value(v: Any, where: Where, depth: int = 0) -> Any:
    """A free-form value (an `Any` field): plain msgpack data, nested at most MAX_ANY_DEPTH levels
    (the recursion is bounded by that, never by the sender)."""
    if type(v) is slice:
        raise fail(where, "plain msgpack value", v)
    if isinstance(v, dict | list) and depth >= MAX_ANY_DEPTH:
        raise WireError(f"{path(where)}: nests deeper than {MAX_ANY_DEPTH} levels")
    if isinstance(v, dict):
        return {key(k, where): any_value(x, where, depth + 1) for k, x in v.items()}
    if isinstance(v, list):
        return [any_value(x, where, depth + 1) for x in v]
    return v


def enum_check(kind: type[enum.Enum]) -> Check:
    def check(v: Any, where: Where) -> Any:
        try:
            return kind(v)
        except (ValueError, TypeError):
            raise WireError(f"{path(where)}: {v!r} is not one of {[e.value for e in kind]}") from None

    return check


def optional(inner: Check) -> Check:
    return lambda v, where: None if v is None else inner(v, where)


def list_of(inner: Check) -> Check:
    def check(v: Any, where: Where) -> Any:
        if not isinstance(v, list):
            raise fail(where, "list", v)
        return [inner(x, (where, i)) for i, x in enumerate(v)]

    return check


def dict_of(key_check: Check, val: Check) -> Check:
    def check(v: Any, where: Where) -> Any:
        if not isinstance(v, dict):
            raise fail(where, "map", v)
        return {key_check(k, where): val(x, (where, str(k))) for k, x in v.items()}

    return check
