"""`make_prompt_source`: the run's task as an endless (or, for a one-pass file, finite) iterator of
`Prompt`s. Deterministic for a given config, so a resumed run can skip to its data cursor.

With `heldout` > 0 (eval.prompts while evaluation is on) the source leaves out the prompts that
`asyncrl.task.heldout.heldout_prompts(cfg, heldout)` returns: arithmetic skips every problem whose text is
held out, jsonl/dataset drop the held-out rows (and every row with the same prompt), reasoning_gym drops
the training problems whose question is held out (its held-out problems are drawn from another seed).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from asyncrl.records import Prompt, RewardSpec, SamplingParams
from asyncrl.task.arithmetic import problems
from asyncrl.task.config import TaskConfig
from asyncrl.task.heldout import arithmetic_heldout, rg_training, split_rows
from asyncrl.task.jsonl import cycle_rows
from asyncrl.task.rows import rg_rows, task_encoder, task_sampling, training_rows


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
            exclude = {p.text for p in arithmetic_heldout(cfg, heldout)}
        return _arithmetic(cfg, n, sampling, exclude)
    encoder = task_encoder(cfg, tokenizer_path)
    if cfg.name == "reasoning_gym":
        rows = rg_rows(cfg, rg_training(cfg, heldout), encoder)
    else:
        rows = training_rows(cfg, encoder)
        if heldout:
            rows = split_rows(cfg, rows, encoder, heldout)[0]
    return cycle_rows(rows, cfg.name, n, sampling, cfg.seed, cfg.shuffle, cfg.repeat)


def _arithmetic(cfg: TaskConfig, n: int, sampling: SamplingParams, exclude: set[str]) -> Iterator[Prompt]:
    for i, p in enumerate(problems(cfg.seed, cfg.digits, cfg.ops)):
        if p.text in exclude:
            continue
        yield Prompt(prompt_id=f"arithmetic-{cfg.seed}-{i}", n=n, text=p.text, sampling=replace(sampling),
                     reward=RewardSpec(target=p.answer), metadata={"task": "arithmetic"})
