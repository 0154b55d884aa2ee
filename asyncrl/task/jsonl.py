"""Prompts from a JSONL file: one prompt object per line in the format of `asyncrl.task.prompt_row`
({"text" | "token_ids", "target"?, "n"?, "params"?, "sampling"?, "metadata"?}).

The whole file is read and checked up front, so a bad line stops the run at start with its line
number, not hours later. Blank lines are skipped. Each pass over the file may be shuffled (seeded) and
the file may be cycled forever (task.shuffle, task.repeat).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from asyncrl.records import Prompt, SamplingParams
from asyncrl.task.prompt_row import PromptRow, parse_row


def read_rows(path: str | Path) -> list[tuple[int, PromptRow]]:
    """(line number, row) for every non-blank line."""
    try:
        rows = [(i, parse_row(obj, f"{path}:{i}")) for i, obj in json_lines(path)]
    except FileNotFoundError:
        raise ValueError(f"task.path={str(path)!r}: file not found") from None
    if not rows:
        raise ValueError(f"task.path={str(path)!r}: no prompts (the file is empty)")
    return rows


def json_lines(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, decoded value) for every non-blank line of a UTF-8 JSONL file, in order; a line that
    is not JSON is a ValueError that names the file and line."""
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield i, json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not valid JSON ({e.msg} at column {e.colno})") from None


def jsonl_prompts(path: str | Path, n: int, sampling: SamplingParams, seed: int, shuffle: bool, repeat: bool) -> Iterator[Prompt]:
    return cycle_rows(read_rows(path), "jsonl", n, sampling, seed, shuffle, repeat)


def cycle_rows(rows: Sequence[tuple[int, PromptRow]], prefix: str, n: int, sampling: SamplingParams,
               seed: int, shuffle: bool, repeat: bool) -> Iterator[Prompt]:
    """Passes over `rows` (each shuffled when asked); prompt ids are "{prefix}-{epoch}-{line}"."""
    rng = random.Random(seed)
    epoch = 0
    while True:
        order = list(range(len(rows)))
        if shuffle:
            rng.shuffle(order)
        for i in order:
            line, row = rows[i]
            yield row.to_prompt(f"{prefix}-{epoch}-{line}", n, sampling, {"line": line, "epoch": epoch})
        epoch += 1
        if not repeat:
            return
