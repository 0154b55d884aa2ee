"""`make_prompt_source`: the run's task as an endless (or, for a one-pass file, finite) iterator of
`Prompt`s. Deterministic for a given config, so a resumed run can skip to its data cursor.

With `heldout` > 0 (eval.prompts while evaluation is on) the source leaves out the prompts that
`asyncrl.task.heldout.heldout_prompts(cfg, heldout)` returns: arithmetic skips every problem whose text is
held out, jsonl/dataset drop the held-out rows (and every row with the same prompt); reasoning_gym needs
nothing dropped, its held-out problems are drawn from another seed and differ from the training set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import replace

from asyncrl.records import Prompt, RewardSpec, SamplingParams
from asyncrl.task import reasoning_gym
from asyncrl.task.arithmetic import problems
from asyncrl.task.config import TaskConfig
from asyncrl.task.dataset import PromptEncoder, as_messages, dataset_rows
from asyncrl.task.jsonl import cycle_rows, read_rows
from asyncrl.task.prompt_row import PromptRow

Rows = list[tuple[int, PromptRow]]  # (line / row / problem number, row)


def task_sampling(cfg: TaskConfig) -> SamplingParams:
    """The sampling parameters the task config asks for."""
    return SamplingParams(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens)


def make_prompt_source(cfg: TaskConfig, n: int, sampling: SamplingParams | None = None,
                       tokenizer_path: str | None = None, heldout: int = 0) -> Iterator[Prompt]:
    """Prompts with `n` samples each (a JSONL line's own "n" wins); sampling defaults to `task_sampling`.
    `tokenizer_path` (the model folder) is needed for task.chat_template; `heldout` prompts are left out
    (see the module docstring). Every mistake in the task is a ValueError here, not at the first prompt."""
    if n < 1:
        raise ValueError(f"n={n}: samples per prompt must be >= 1")
    if heldout < 0:
        raise ValueError(f"heldout={heldout}: held-out prompts must be >= 0")
    sampling = sampling or task_sampling(cfg)
    if cfg.name == "arithmetic":
        exclude: set[str] = set()
        if heldout:
            from asyncrl.task.heldout import arithmetic_heldout  # heldout imports this module

            exclude = {p.text for p in arithmetic_heldout(cfg, heldout)}
        return _arithmetic(cfg, n, sampling, exclude)
    encoder = task_encoder(cfg, tokenizer_path)
    rows = training_rows(cfg, encoder)
    if heldout and cfg.name != "reasoning_gym":
        from asyncrl.task.heldout import split_rows

        rows = split_rows(cfg, rows, encoder, heldout)[0]
    return cycle_rows(rows, cfg.name, n, sampling, cfg.seed, cfg.shuffle, cfg.repeat)


def training_rows(cfg: TaskConfig, encoder: PromptEncoder | None) -> Rows:
    """Every prompt of a jsonl, dataset or reasoning_gym task, before any is held out."""
    if cfg.name == "reasoning_gym":
        return rg_rows(cfg, reasoning_gym.problems(cfg, cfg.seed, cfg.size), encoder)
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
                                encoder, f"reasoning_gym {p.task} problem {p.index}"))
            for p in items]


def task_encoder(cfg: TaskConfig, tokenizer_path: str | None) -> PromptEncoder | None:
    if not cfg.chat_template:
        return None
    if not tokenizer_path:
        raise ValueError("task.chat_template = true needs the model's tokenizer: pass tokenizer_path (model.path)")
    from asyncrl.task.chat_template import ChatTemplate  # transformers: only when asked for

    return ChatTemplate(tokenizer_path)


def templated(row: PromptRow, encoder: PromptEncoder | None, where: str) -> PromptRow:
    """A text row as the chat template's token ids (rows given as token ids are used as they are)."""
    if encoder is None or row.text is None:
        return row
    return dataclasses.replace(row, text=None, token_ids=tuple(encoder.encode(as_messages(row.text, where))))


def _arithmetic(cfg: TaskConfig, n: int, sampling: SamplingParams, exclude: set[str]) -> Iterator[Prompt]:
    for i, p in enumerate(problems(cfg.seed, cfg.digits, cfg.ops)):
        if p.text in exclude:
            continue
        yield Prompt(prompt_id=f"arithmetic-{cfg.seed}-{i}", n=n, text=p.text, sampling=replace(sampling),
                     reward=RewardSpec(target=p.answer), metadata={"task": "arithmetic"})
