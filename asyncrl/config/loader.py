"""Typed config loading: one TOML file plus ``--set section.key=value`` overrides -> dataclasses.

Every config is a ``@dataclass(kw_only=True, slots=True)`` owned by the component that reads it.
`from_dict` checks unknown keys and value types against the annotations and names the key path,
the value and what is allowed; each dataclass validates its own invariants in ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import enum
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value that is unknown, mistyped or contradicts another; the message names the key."""


def from_dict(cls: type[T], data: dict[str, Any], path: str = "") -> T:
    if not isinstance(data, dict):
        raise ConfigError(f"{path or '<root>'}: expected a table of {cls.__name__} fields, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{path}." if path else ""
        raise ConfigError(f"unknown key {where}{unknown[0]}; allowed keys of {path or 'the run config'}: {sorted(fields)}")
    kwargs = {name: _coerce(hints[name], value, f"{path}.{name}" if path else name) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{path or 'config'}: {e}") from None


def _coerce(tp: Any, value: Any, key: str) -> Any:
    # The wire has its own annotation-driven checker (asyncrl.wire.schema); why the two stay apart is noted there.
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(arg, value, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}={value!r}: expected {tp}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r}: allowed values are {list(allowed)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}={value!r}: expected a list")
        (item,) = typing.get_args(tp)
        return [_coerce(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r}: expected a table")
        _, vt = typing.get_args(tp)
        return {str(k): _coerce(vt, v, f"{key}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise ConfigError(f"{key}={value!r}: allowed values are {[e.value for e in tp]}") from None
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ConfigError(f"{key}={value!r}: expected {tp.__name__}, got {type(value).__name__}")
        return value
    raise ConfigError(f"{key}: unsupported config type {tp}")


def parse_override(item: str) -> tuple[list[str], Any]:
    """'learner.lr=1e-5' -> (['learner', 'lr'], 1e-05). Values are TOML literals; bare words are strings."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {item!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        parts, value = parse_override(item)
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {part} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return data


def load(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    return from_dict(cls, apply_overrides(data, overrides or []))


def to_dict(cfg: Any) -> dict[str, Any]:
    """Dataclass -> plain dict (enums as values), for run.json / logging."""
    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, enum.Enum):
            return v.value
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return plain(cfg)
