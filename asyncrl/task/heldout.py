"""Held-out prompts for evaluation: `count` deterministic prompts that the training source never yields.

    arithmetic     problems from seed + 1_000_003, distinct by text; the training stream skips those texts
    reasoning_gym  problems from mix_seed(seed, 1_000_003), distinct by question; the training set skips those
                   questions (reasoning-gym repeats problems across seeds)
    jsonl/dataset  the first `count` distinct prompts of task.eval_path, or when that is "" the last
                   `count` distinct prompts of task.path; training drops every row with a held-out prompt

`make_prompt_source(cfg, n, heldout=count)` applies the training side, so both sides come from the
functions here. Held-out prompts have n = 1, prompt ids "eval-<i>", task_sampling(cfg), metadata "question"
(the problem's text before any template; arithmetic and reasoning_gym), and the same
reward spec as training prompts (target, and for reasoning_gym the params that rebuild the entry), which
is what asyncrl.reward.strict.strict_score needs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from asyncrl.records import Prompt
from asyncrl.task import reasoning_gym
from asyncrl.task.arithmetic import Problem, problems
from asyncrl.task.config import TaskConfig
from asyncrl.task.dataset import PromptEncoder
from asyncrl.task.prompt_row import PromptRow
from asyncrl.task.rows import Rows, file_rows, rg_rows, task_encoder, task_sampling, training_rows

HELDOUT_SEED_OFFSET = 1_000_003  # held-out problems are drawn with task.seed + this


def heldout_prompts(cfg: TaskConfig, count: int, tokenizer_path: str | None = None) -> list[Prompt]:
    """`count` held-out prompts of the task (see the module docstring); [] for count 0."""
    if count < 0:
        raise ValueError(f"held-out prompts: count={count} must be >= 0")
    if count == 0:
        return []
    if cfg.name == "arithmetic":
        rows = [PromptRow(text=p.text, token_ids=None, target=p.answer, n=None, params={}, sampling={},
                          metadata={"task": "arithmetic", "question": p.text}) for p in arithmetic_heldout(cfg, count)]
    else:
        encoder = task_encoder(cfg, tokenizer_path)
        if cfg.name == "reasoning_gym":
            held = rg_heldout(cfg, count)
            rows = [dataclasses.replace(row, metadata={**row.metadata, "question": p.question})
                    for p, (_, row) in zip(held, rg_rows(cfg, held, encoder))]
        else:
            rows = [row for _, row in split_rows(cfg, training_rows(cfg, encoder), encoder, count)[1]]
    sampling = task_sampling(cfg)
    return [dataclasses.replace(row.to_prompt(f"eval-{i}", 1, sampling, {"heldout": True}), n=1,
                                sampling=dataclasses.replace(sampling)) for i, row in enumerate(rows)]


def arithmetic_heldout(cfg: TaskConfig, count: int) -> list[Problem]:
    """`count` distinct arithmetic problems drawn with seed + HELDOUT_SEED_OFFSET."""
    space = (10 ** cfg.digits) ** 2 * len(set(cfg.ops))  # distinct (a, op, b)
    if count > space // 2:
        raise ValueError(f"eval.prompts={count}: the arithmetic task with task.digits={cfg.digits} and "
                         f"task.ops={cfg.ops!r} has {space} distinct problems; hold out at most {space // 2}")
    held: dict[str, Problem] = {}
    for p in problems(cfg.seed + HELDOUT_SEED_OFFSET, cfg.digits, cfg.ops):
        held.setdefault(p.text, p)
        if len(held) == count:
            return list(held.values())
    raise AssertionError("unreachable: the arithmetic stream is endless")


def rg_heldout(cfg: TaskConfig, count: int) -> list[reasoning_gym.Problem]:
    """The first `count` reasoning-gym problems from seed + HELDOUT_SEED_OFFSET with distinct questions. They do not
    depend on the training set (task.size): the training source skips them instead, so a held-out score is
    comparable across runs of other sizes (a held-out set cut to what training lacked lost the common, easy
    problems as task.size grew: 0.10 at step 0 for 3,000 training problems, 0.05 for 30,000)."""
    scan = 4 * count + 64  # size of the held-out draw: fixed by count, so the entries rebuild the same
    held, seen = [], set()
    for p in reasoning_gym.problems(cfg, reasoning_gym.mix_seed(cfg.seed, HELDOUT_SEED_OFFSET), scan):
        if p.question not in seen:
            seen.add(p.question)
            held.append(p)
            if len(held) == count:
                return held
    raise ValueError(f"eval.prompts={count}: only {len(held)} of {scan} reasoning-gym problems have distinct "
                     "questions; lower eval.prompts, or give the tasks a wider range in their config")


def rg_training(cfg: TaskConfig, heldout: int) -> list[reasoning_gym.Problem]:
    """The task.size training problems less those whose question is one of the `heldout` held-out ones."""
    exclude = {p.question for p in rg_heldout(cfg, heldout)} if heldout else set()
    train = [p for p in reasoning_gym.training_problems(cfg) if p.question not in exclude]
    if not train:
        raise ValueError(f"eval.prompts={heldout}: every one of the task.size={cfg.size} training problems is a "
                         "held-out question; raise task.size, lower eval.prompts, or widen the tasks' config")
    return train


def split_rows(cfg: TaskConfig, rows: Rows, encoder: PromptEncoder | None, count: int) -> tuple[Rows, Rows]:
    """(training rows, held-out rows) of a jsonl or dataset task."""
    if cfg.eval_path:
        held = _distinct(file_rows(cfg, cfg.eval_path, encoder), count)
        source = f"task.eval_path={cfg.eval_path!r}"
    else:
        held = _distinct(rows[::-1], count)[::-1]
        source = f"task.path={cfg.path!r}"
    if len(held) < count:
        raise ValueError(f"eval.prompts={count}: {source} has only {len(held)} distinct prompts to hold out; "
                         "lower eval.prompts" + ("" if cfg.eval_path else " or give task.eval_path"))
    keys = {_key(row) for _, row in held}
    train = [(i, row) for i, row in rows if _key(row) not in keys]
    if not train:
        raise ValueError(f"eval.prompts={count}: every prompt of task.path={cfg.path!r} is held out; "
                         "lower eval.prompts or give task.eval_path")
    return train, held


def _distinct(rows: Rows, count: int) -> Rows:
    """The first `count` rows with distinct prompts."""
    seen: set[Any] = set()
    out = []
    for i, row in rows:
        if _key(row) not in seen:
            seen.add(_key(row))
            out.append((i, row))
            if len(out) == count:
                break
    return out


def _key(row: PromptRow) -> str | tuple[int, ...]:
    """What makes two prompts the same: their text, or their token ids (chat-templated or given)."""
    return row.text if row.text is not None else row.token_ids  # type: ignore[return-value]
