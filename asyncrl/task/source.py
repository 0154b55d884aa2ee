"""`make_prompt_source`: the run's task as an endless (or, for a one-pass JSONL file, finite) iterator
of `Prompt`s. Deterministic for a given config, so a resumed run can skip to its data cursor."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from asyncrl.records import Prompt, RewardSpec, SamplingParams
from asyncrl.task.arithmetic import problems
from asyncrl.task.config import TaskConfig
from asyncrl.task.jsonl import jsonl_prompts


def task_sampling(cfg: TaskConfig) -> SamplingParams:
    """The sampling parameters the task config asks for."""
    return SamplingParams(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens)


def make_prompt_source(cfg: TaskConfig, n: int, sampling: SamplingParams | None = None) -> Iterator[Prompt]:
    """Prompts with `n` samples each (a JSONL line's own "n" wins); sampling defaults to `task_sampling`."""
    if n < 1:
        raise ValueError(f"n={n}: samples per prompt must be >= 1")
    sampling = sampling or task_sampling(cfg)
    if cfg.name == "jsonl":
        return jsonl_prompts(cfg.path, n, sampling, cfg.seed, cfg.shuffle, cfg.repeat)
    return _arithmetic(cfg, n, sampling)


def _arithmetic(cfg: TaskConfig, n: int, sampling: SamplingParams) -> Iterator[Prompt]:
    for i, p in enumerate(problems(cfg.seed, cfg.digits, cfg.ops)):
        yield Prompt(prompt_id=f"arithmetic-{cfg.seed}-{i}", n=n, text=p.text, sampling=replace(sampling),
                     reward=RewardSpec(target=p.answer), metadata={"task": "arithmetic"})
