"""A task's rows: every prompt of a jsonl, dataset or reasoning_gym task as `PromptRow`s (with the chat
template applied when the task asks for it), before any is held out, and the sampling the task asks for.
The training stream (`source.py`) and the held-out set (`heldout.py`) are both cut from these rows."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import replace

from asyncrl.records import SamplingParams
from asyncrl.task import reasoning_gym
from asyncrl.task.config import TaskConfig
from asyncrl.task.dataset import PromptEncoder, as_messages, dataset_rows
from asyncrl.task.jsonl import read_rows
from asyncrl.task.prompt_row import PromptRow

Rows = list[tuple[int, PromptRow]]  # (line / row / problem number, row)


def task_sampling(cfg: TaskConfig) -> SamplingParams:
    """The sampling parameters the task config asks for."""
    return SamplingParams(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens)


def training_rows(cfg: TaskConfig, encoder: PromptEncoder | None) -> Rows:
    """Every prompt of a jsonl, dataset or reasoning_gym task, before any is held out."""
    if cfg.name == "reasoning_gym":
        return rg_rows(cfg, reasoning_gym.training_problems(cfg), encoder)
    return file_rows(cfg, cfg.path, encoder)


def file_rows(cfg: TaskConfig, path: str, encoder: PromptEncoder | None) -> Rows:
    """The rows of a jsonl or dataset file at `path` (task.path or task.eval_path)."""
    if cfg.name == "jsonl":
        return [(line, templated(row, encoder, f"{path}:{line}")) for line, row in read_rows(path)]
    return dataset_rows(replace(cfg, path=path), encoder)


def rg_rows(cfg: TaskConfig, items: Iterator[reasoning_gym.Problem] | list[reasoning_gym.Problem],
            encoder: PromptEncoder | None) -> Rows:
    return [(p.index, templated(PromptRow(text=reasoning_gym.format_prompt(cfg, p.question), token_ids=None,
                                          target=p.answer, n=None, params=p.params, sampling={},
                                          metadata={"task": "reasoning_gym", "rg_task": p.task}),
                                encoder, f"reasoning_gym {p.task} problem {p.index}",
                                reasoning_gym.format_response_prefix(cfg, p)))
            for p in items]


def task_encoder(cfg: TaskConfig, tokenizer_path: str | None) -> PromptEncoder | None:
    if not cfg.chat_template:
        return None
    if not tokenizer_path:
        raise ValueError("task.chat_template = true needs the model's tokenizer: pass tokenizer_path (model.path)")
    from asyncrl.task.chat_template import ChatTemplate  # transformers: only when asked for

    return ChatTemplate(tokenizer_path, examples=cfg.example_messages)


def templated(row: PromptRow, encoder: PromptEncoder | None, where: str, response_prefix: str = "") -> PromptRow:
    """A text row as the chat template's token ids, the response prefix (task.response_prefix) after the
    generation prompt; without a template the prefix ends the text. Rows given as token ids are used as they are."""
    if row.text is None:
        return row
    if encoder is None:
        return dataclasses.replace(row, text=row.text + response_prefix) if response_prefix else row
    return dataclasses.replace(row, text=None, token_ids=tuple(encoder.encode(as_messages(row.text, where), response_prefix)))
