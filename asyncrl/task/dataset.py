"""Prompts from a local table: a parquet file, a JSONL file of objects, or a Hugging Face `datasets`
folder (save_to_disk), with the prompt and answer columns named by task.prompt_key / task.answer_key.

A prompt cell is a string, or a list of chat messages ({"role", "content"}) that needs
task.chat_template = true. The table is read and checked up front (a bad row stops the run at start
with its row number); pyarrow (parquet) and `datasets` (folders) are optional and only imported here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Protocol

from asyncrl.task.config import TaskConfig
from asyncrl.task.jsonl import json_lines
from asyncrl.task.prompt_row import PromptRow

Message = dict[str, str]


class PromptEncoder(Protocol):
    """Turns chat messages into prompt token ids (asyncrl.task.chat_template.ChatTemplate)."""

    def encode(self, messages: list[Message], response_prefix: str = "") -> list[int]: ...


def read_table(cfg: TaskConfig) -> list[dict[str, Any]]:
    """Every row of task.path as a dict of columns."""
    path = Path(cfg.path)
    if not path.exists():
        raise ValueError(f"task.path={cfg.path!r}: not found; give a .parquet or .jsonl file or a datasets folder")
    if path.is_dir():
        rows = _datasets_folder(path, cfg.split)
    elif path.suffix == ".parquet":
        rows = _parquet(path)
    elif path.suffix in (".jsonl", ".json"):
        rows = _jsonl(path)
    else:
        raise ValueError(f"task.path={cfg.path!r}: unknown file type {path.suffix!r}; give .parquet, .jsonl or a datasets folder")
    if not rows:
        raise ValueError(f"task.path={cfg.path!r}: no rows")
    return rows


def dataset_rows(cfg: TaskConfig, encoder: PromptEncoder | None) -> list[tuple[int, PromptRow]]:
    """(row number, PromptRow) per table row; chat prompts are encoded with `encoder` (chat_template)."""
    table = read_table(cfg)
    missing = [k for k in (cfg.prompt_key, cfg.answer_key) if k and k not in table[0]]
    if missing:
        raise ValueError(f"task.{'prompt_key' if missing[0] == cfg.prompt_key else 'answer_key'}={missing[0]!r}: "
                         f"no such column in {cfg.path}; columns: {', '.join(sorted(table[0]))}")
    return [(i, _row(cfg, i, row, encoder)) for i, row in enumerate(table)]


def _row(cfg: TaskConfig, i: int, row: dict[str, Any], encoder: PromptEncoder | None) -> PromptRow:
    where = f"{cfg.path} row {i}"
    prompt = row.get(cfg.prompt_key)
    messages = as_messages(prompt, where)
    if encoder is not None:
        text, ids = None, tuple(encoder.encode(messages))
    elif isinstance(prompt, str):
        text, ids = prompt, None
    else:
        raise ValueError(f"{where}: column {cfg.prompt_key!r} holds chat messages; set task.chat_template = true")
    answer = row.get(cfg.answer_key) if cfg.answer_key else None
    if answer is not None and (isinstance(answer, bool) or not isinstance(answer, (str, int, float))):
        raise ValueError(f"{where}: column {cfg.answer_key!r} holds a {type(answer).__name__}; answers must be strings or numbers")
    return PromptRow(text=text, token_ids=ids, target=None if answer is None else str(answer), n=None,
                     params={}, sampling={}, metadata={"row": i})


def as_messages(prompt: Any, where: str) -> list[Message]:
    """A text prompt as one user message; a list of {"role", "content"} as it is."""
    if isinstance(prompt, str) and prompt:
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt):
        return [{"role": m["role"], "content": m["content"]} for m in prompt]
    raise ValueError(f"{where}: the prompt must be a non-empty string or a list of {{\"role\", \"content\"}} messages, "
                     f"got {str(prompt)[:60]!r}")


def _parquet(path: Path) -> list[dict[str, Any]]:
    if importlib.util.find_spec("pyarrow") is None:
        raise ValueError(f"task.path={str(path)!r}: reading parquet needs pyarrow (pip install pyarrow)")
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for i, obj in json_lines(path):
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{i}: expected a JSON object, got {type(obj).__name__}")
        rows.append(obj)
    return rows


def _datasets_folder(path: Path, split: str) -> list[dict[str, Any]]:
    if importlib.util.find_spec("datasets") is None:
        raise ValueError(f"task.path={str(path)!r} is a folder, read as a Hugging Face datasets folder, which needs "
                         "the datasets package (pip install datasets); or give a .parquet or .jsonl file")
    import datasets

    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        if split not in data:
            raise ValueError(f"task.split={split!r}: {path} has splits {', '.join(data)}; pick one")
        data = data[split]
    return data.to_list()
