"""Prompts from a JSONL file: one {"text" | "token_ids", "target", "n"?, "params"?, "metadata"?} per line.

The whole file is read and checked up front, so a bad line stops the run at start with its line
number, not hours later. Blank lines are skipped. Each pass over the file may be shuffled (seeded) and
the file may be cycled forever (task.shuffle, task.repeat).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from asyncrl.records import Prompt, RewardSpec, SamplingParams

_KEYS = {"text", "token_ids", "target", "n", "params", "metadata"}


@dataclass(frozen=True, slots=True)
class JsonlRow:
    line: int
    text: str | None
    token_ids: tuple[int, ...] | None
    target: str | None
    n: int | None
    params: dict[str, Any]
    metadata: dict[str, Any]


def read_rows(path: str | Path) -> list[JsonlRow]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ValueError(f"task.path={str(path)!r}: file not found") from None
    rows = [_parse(path, i, line) for i, line in enumerate(lines, 1) if line.strip()]
    if not rows:
        raise ValueError(f"task.path={str(path)!r}: no prompts (the file is empty)")
    return rows


def _parse(path: str | Path, lineno: int, line: str) -> JsonlRow:
    where = f"{path}:{lineno}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - _KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; allowed keys: {sorted(_KEYS)}")
    text, ids = obj.get("text"), obj.get("token_ids")
    if (text is None) == (ids is None):
        raise ValueError(f'{where}: give exactly one of "text" or "token_ids"')
    if text is not None and not isinstance(text, str):
        raise ValueError(f'{where}: "text" must be a string')
    if ids is not None and (not isinstance(ids, list) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids)):
        raise ValueError(f'{where}: "token_ids" must be a non-empty list of non-negative integers')
    target = obj.get("target")
    if target is not None and not isinstance(target, (str, int, float)):
        raise ValueError(f'{where}: "target" must be a string or a number')
    n = obj.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise ValueError(f'{where}: "n" must be an integer >= 1, got {n!r}')
    for key in ("params", "metadata"):
        if not isinstance(obj.get(key, {}), dict):
            raise ValueError(f'{where}: "{key}" must be an object')
    return JsonlRow(line=lineno, text=text, token_ids=tuple(ids) if ids else None,
                    target=None if target is None else str(target), n=n,
                    params=obj.get("params", {}), metadata=obj.get("metadata", {}))


def jsonl_prompts(path: str | Path, n: int, sampling: SamplingParams, seed: int, shuffle: bool, repeat: bool) -> Iterator[Prompt]:
    rows = read_rows(path)
    rng = random.Random(seed)
    epoch = 0
    while True:
        order = list(range(len(rows)))
        if shuffle:
            rng.shuffle(order)
        for i in order:
            yield _prompt(rows[i], epoch, n, sampling)
        epoch += 1
        if not repeat:
            return


def _prompt(row: JsonlRow, epoch: int, n: int, sampling: SamplingParams) -> Prompt:
    return Prompt(
        prompt_id=f"jsonl-{epoch}-{row.line}",
        n=row.n or n,
        text=row.text,
        token_ids=None if row.token_ids is None else np.asarray(row.token_ids, dtype=np.int32),
        sampling=replace(sampling),
        reward=RewardSpec(target=row.target, params=dict(row.params)),
        metadata={**row.metadata, "line": row.line, "epoch": epoch},
    )
