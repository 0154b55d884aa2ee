"""`make_prompt_source`: the run's task as an endless (or, for a one-pass file, finite) iterator of
`Prompt`s. Deterministic for a given config, so a resumed run can skip to its data cursor."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import replace

from asyncrl.records import Prompt, RewardSpec, SamplingParams
from asyncrl.task.arithmetic import problems
from asyncrl.task.config import TaskConfig
from asyncrl.task.dataset import PromptEncoder, as_messages, dataset_rows
from asyncrl.task.jsonl import cycle_rows, read_rows
from asyncrl.task.prompt_row import PromptRow


def task_sampling(cfg: TaskConfig) -> SamplingParams:
    """The sampling parameters the task config asks for."""
    return SamplingParams(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens)


def make_prompt_source(cfg: TaskConfig, n: int, sampling: SamplingParams | None = None,
                       tokenizer_path: str | None = None) -> Iterator[Prompt]:
    """Prompts with `n` samples each (a JSONL line's own "n" wins); sampling defaults to `task_sampling`.
    `tokenizer_path` (the model folder) is needed for task.chat_template."""
    if n < 1:
        raise ValueError(f"n={n}: samples per prompt must be >= 1")
    sampling = sampling or task_sampling(cfg)
    if cfg.name == "arithmetic":
        return _arithmetic(cfg, n, sampling)
    encoder = _encoder(cfg, tokenizer_path)
    if cfg.name == "jsonl":
        rows = [(line, _templated(row, encoder, f"{cfg.path}:{line}")) for line, row in read_rows(cfg.path)]
    else:
        rows = dataset_rows(cfg, encoder)
    return cycle_rows(rows, cfg.name, n, sampling, cfg.seed, cfg.shuffle, cfg.repeat)


def _encoder(cfg: TaskConfig, tokenizer_path: str | None) -> PromptEncoder | None:
    if not cfg.chat_template:
        return None
    if not tokenizer_path:
        raise ValueError("task.chat_template = true needs the model's tokenizer: pass tokenizer_path (model.path)")
    from asyncrl.task.chat_template import ChatTemplate  # transformers: only when asked for

    return ChatTemplate(tokenizer_path)


def _templated(row: PromptRow, encoder: PromptEncoder | None, where: str) -> PromptRow:
    """A text row as the chat template's token ids (rows given as token ids are used as they are)."""
    if encoder is None or row.text is None:
        return row
    return dataclasses.replace(row, text=None, token_ids=tuple(encoder.encode(as_messages(row.text, where))))


def _arithmetic(cfg: TaskConfig, n: int, sampling: SamplingParams) -> Iterator[Prompt]:
    for i, p in enumerate(problems(cfg.seed, cfg.digits, cfg.ops)):
        yield Prompt(prompt_id=f"arithmetic-{cfg.seed}-{i}", n=n, text=p.text, sampling=replace(sampling),
                     reward=RewardSpec(target=p.answer), metadata={"task": "arithmetic"})
