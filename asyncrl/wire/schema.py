"""Record checks built from the records' type annotations: one compiled check per record class.

`record_check(cls)` turns the annotations of a record in `asyncrl.records` into a function that checks
an unpacked body (types, enum values, array dtypes and ranks, required and unknown fields) and builds the
record; anything wrong raises `WireError` naming the path ("SampleBatch.samples[3].logprobs"). Checks are
built once per class and cached; plain scalars of the exact type skip their check (the hot path).

What may travel is deliberately narrow: a union must be ``X | None``, arrays only where `_ARRAY_FIELDS`
(or the Sample check) says, free-form data only in `Any` fields.

Not shared with `asyncrl.config.loader._coerce`, the other annotation-driven checker: the two agree only
on the dispatch over ``typing.get_origin``, and differ in every branch — config accepts `Literal` and
unions of several types (``float | Literal["auto"]``), which a peer's frame must not use, words its
errors after the TOML key and value, and runs once per file, while this module compiles checks for the
hot path, with array fields and depth-bounded `Any`. One owner would widen what a peer may send or slow
this path, and would save the ~15 lines of dispatch only.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

import numpy as np

from asyncrl import records as R
from asyncrl.wire.arrays import array
from asyncrl.wire.checks import (Check, Where, WireError, any_value, dict_of, enum_check, fail, list_of, optional, path,
                                 scalar)
from asyncrl.wire.sample import check_sample

# Array fields outside Sample: (record, field) -> required dtype and rank.
_ARRAY_FIELDS: dict[tuple[type, str], tuple[np.dtype, int]] = {(R.Prompt, "token_ids"): (np.dtype("<i4"), 1)}
_CHECKS: dict[type, Check] = {R.Sample: check_sample}
_MISSING = object()
_SCALARS = (str, int, float, bool)


def record_check(cls: type) -> Check:
    """The check of record class `cls` (built on first use, then cached)."""
    if cls in _CHECKS:
        return _CHECKS[cls]
    # (name, exact type that needs no check or conversion, full check, required)
    fields: list[tuple[str, type | None, Check, bool]] = []
    names: set[str] = set()

    def check(v: Any, where: Where) -> Any:
        if type(v) is not dict:
            raise fail(where, cls.__name__, v)
        if not v.keys() <= names:
            raise WireError(f"{path(where)}: unknown fields {sorted(map(str, v.keys() - names))} for {cls.__name__}")
        kwargs = {}
        for name, exact, field_check, required in fields:
            x = v.get(name, _MISSING)
            if x is _MISSING:
                if required:
                    raise WireError(f"{path(where)}: {cls.__name__} needs field {name!r}")
            elif type(x) is exact:  # hot path: plain scalars are taken as they are
                kwargs[name] = x
            else:
                kwargs[name] = field_check(x, (where, name))
        try:
            return cls(**kwargs)
        except (ValueError, TypeError) as e:
            raise WireError(f"{path(where)}: {e}") from None

    _CHECKS[cls] = check  # registered before recursing (records refer to each other)
    hints = typing.get_type_hints(cls, vars(R))
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        tp = hints[f.name]
        fields.append((f.name, _exact_type(tp), _field_check(tp, cls, f.name), required))
        names.add(f.name)
    if cls in _PLAIN:
        _CHECKS[cls] = _PLAIN[cls](check)
    return _CHECKS[cls]


def _plain_score(generic: Check) -> Check:
    """ScoreResult's check: one per scored sample (a ScoredIds carries hundreds), so a result whose fields all
    have their exact types is built straight away; any other goes to `generic`, which converts or words the
    error (the same rules, the same record)."""
    def check(v: Any, where: Where) -> Any:
        if type(v) is dict and _SCORE_REQUIRED <= v.keys() <= _SCORE_FIELDS:
            pid, idx = v["prompt_id"], v["sample_index"]
            scored = _plain_outcome(v)
            if scored is not None and type(pid) is str and type(idx) is int:
                return R.ScoreResult(prompt_id=pid, sample_index=idx, reward=scored[0], components=scored[1],
                                     status=scored[2], reason=scored[3])
        return generic(v, where)

    return check


def _plain_scored(generic: Check) -> Check:
    """ScoredSample's check (one per sample of a Batch or Completion), as `_plain_score`: the sample by its own
    check, the score's fields taken as they are when their types are exact, else `generic` decides."""
    def check(v: Any, where: Where) -> Any:
        if type(v) is dict and "sample" in v and "reward" in v and v.keys() <= _SCORED_FIELDS:
            scored = _plain_outcome(v)
            if scored is not None:
                return R.ScoredSample(sample=check_sample(v["sample"], (where, "sample")), reward=scored[0],
                                      components=scored[1], status=scored[2], reason=scored[3])
        return generic(v, where)

    return check


def _plain_outcome(v: dict) -> tuple[float, dict[str, float], R.ScoreStatus, str] | None:
    """(reward, components, status, reason) of a score map whose values have their exact types; else None."""
    reward, reason, status = v["reward"], v.get("reason", ""), v.get("status", "ok")
    components = v["components"] if "components" in v else {}  # a new map: it becomes the record's
    if (type(reward) is not float or type(reason) is not str or type(status) is not str
            or status not in _STATUS or type(components) is not dict):
        return None
    for k, x in components.items():
        if type(k) is not str or type(x) is not float:
            return None
    return reward, components, _STATUS[status], reason


_PLAIN: dict[type, Any] = {R.ScoreResult: _plain_score, R.ScoredSample: _plain_scored}  # fast checks around
_STATUS = {s.value: s for s in R.ScoreStatus}
_SCORED_FIELDS = frozenset(f.name for f in dataclasses.fields(R.ScoredSample))
_SCORE_FIELDS = frozenset(f.name for f in dataclasses.fields(R.ScoreResult))
_SCORE_REQUIRED = frozenset(f.name for f in dataclasses.fields(R.ScoreResult)
                            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


def _field_check(tp: Any, owner: type, name: str) -> Check:
    if (owner, name) not in _ARRAY_FIELDS:
        return _check_for(tp)
    arr = array(*_ARRAY_FIELDS[(owner, name)])
    return optional(arr) if _optional_arg(tp) is not None else arr


def _check_for(tp: Any) -> Check:
    inner = _optional_arg(tp)
    if inner is not None:
        return optional(_check_for(inner))
    origin = typing.get_origin(tp)
    if origin is list:
        return list_of(_check_for(typing.get_args(tp)[0]))
    if origin is dict:
        k, v = typing.get_args(tp)
        return dict_of(_check_for(k), _check_for(v))
    if tp is Any:
        return any_value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return enum_check(tp)
    if dataclasses.is_dataclass(tp):
        return record_check(tp)
    if tp in _SCALARS:
        return scalar(tp)
    raise TypeError(f"no wire check for {tp}")


def _optional_arg(tp: Any) -> Any:
    """X for ``X | None``; None for a type that is not a union. Other unions cannot travel."""
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return None
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    assert len(args) == 1, f"unsupported union {tp}"
    return args[0]


def _exact_type(tp: Any) -> type | None:
    """The type a value may have to skip its check: str/int/float/bool fields (also when optional)."""
    tp = _optional_arg(tp) or tp
    return tp if tp in _SCALARS else None
