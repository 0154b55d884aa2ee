"""reasoning-gym as a task source: a seeded, weighted mix of its procedural datasets (task.tasks), and the
entries behind a prompt, rebuilt for scoring.

The mix follows reasoning-gym's own CompositeDataset: task i of the mix is dataset `name` with seed
`seed + i + 1` and size `size`, and problem `idx` of the mix is problem `idx` of the task that
`Random(seed + idx).choices(weights)` picks. reasoning-gym draws problem `idx` of a dataset from
`Random(dataset seed + idx)`, so the mixes of seeds s and s + 1 are the same problems shifted by one: `mix_seed`
spreads `task.seed` (times a prime past any mix's size, modulo 2**31: some tasks seed numpy, which takes 32 bits)
so that two task seeds give two different sets. A training set is `task.size`
problems under `mix_seed(task.seed)`; held-out problems come from `mix_seed(task.seed, offset)`
(asyncrl.task.heldout). Seed 0 keeps the mixes it always had.

Each problem's reward spec carries its answer as the target and, in params, where the problem came from:
{"rg_task", "rg_config", "rg_seed", "rg_size", "rg_index"} (plain msgpack types, a few dozen bytes plus
the task's options). reasoning-gym datasets are deterministic by seed and index, so `entry(params)`
rebuilds the exact entry (question, answer, metadata) and `score` applies the task's own score_answer,
with no metadata on the wire.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from random import Random
from typing import Any

from asyncrl.task.config import ReasoningGymTask, TaskConfig

_PARAMS = ("rg_task", "rg_config", "rg_seed", "rg_size", "rg_index")


@dataclass(frozen=True, slots=True)
class Problem:
    index: int  # in the mix
    task: str
    question: str
    answer: str | None
    params: dict[str, Any]  # RewardSpec.params
    fields: dict[str, str] = dataclasses.field(default_factory=dict)  # the entry's scalar metadata, as text


SEED_STRIDE = 10_000_019  # a prime past any mix's size plus the held-out offset (1_000_003)


def mix_seed(task_seed: int, offset: int = 0) -> int:
    """The seed of the mix for `task.seed` (offset: the held-out set's, asyncrl.task.heldout). Seeds 0..213 get
    disjoint ranges of reasoning-gym seeds; larger ones wrap modulo 2**31, where two overlap with a chance of
    about 2 * size / 2**31."""
    return (task_seed * SEED_STRIDE) % 2**31 + offset


def problems(cfg: TaskConfig, seed: int, size: int) -> Iterator[Problem]:
    """Problems 0 .. size-1 of the mix of cfg.tasks under `seed`, generated lazily, in order."""
    datasets = [_checked_dataset(t, i, seed + i + 1, size) for i, t in enumerate(cfg.tasks)]
    weights = [t.weight for t in cfg.tasks]
    for idx in range(size):
        pick = 0 if len(datasets) == 1 else Random(seed + idx).choices(range(len(datasets)), weights=weights)[0]
        task = cfg.tasks[pick]
        try:
            item = datasets[pick][idx]
        except Exception as e:  # noqa: BLE001 - a generator that breaks on these options raises anything
            raise ValueError(f"task.tasks[{pick}].config={task.config}: reasoning-gym's {task.name} fails on problem "
                             f"{idx} ({type(e).__name__}: {e})") from None
        params = {"rg_task": task.name, "rg_config": _plain(task.config), "rg_seed": seed + pick + 1,
                  "rg_size": size, "rg_index": idx}
        answer = item.get("answer")
        yield Problem(index=idx, task=task.name, question=str(item["question"]),
                      answer=None if answer is None else str(answer), params=params, fields=_fields(item))


def _fields(item: dict[str, Any]) -> dict[str, str]:
    """An entry's scalar metadata as text (what task.response_prefix may name), e.g. {"expression": "2 - -1"}."""
    meta = item.get("metadata") or {}
    return {str(k): str(v) for k, v in meta.items() if isinstance(v, (str, int, float)) and not isinstance(v, bool)}


def training_problems(cfg: TaskConfig) -> Iterator[Problem]:
    """The task.size problems of the training mix, under mix_seed(task.seed), before any is held out."""
    return problems(cfg, mix_seed(cfg.seed), cfg.size)


def format_prompt(cfg: TaskConfig, question: str) -> str:
    """task.prompt_format with {question} replaced (other braces, e.g. \\boxed{}, are kept as written)."""
    return cfg.prompt_format.replace("{question}", question)


_FIELD = re.compile(r"\{([A-Za-z_]\w*)\}")


def format_response_prefix(cfg: TaskConfig, problem: Problem) -> str:
    """task.response_prefix with {question} and the problem's metadata fields filled in ("" when unset)."""
    values = {**problem.fields, "question": problem.question}

    def fill(m: re.Match[str]) -> str:
        if m.group(1) not in values:
            raise ValueError(f"task.response_prefix={cfg.response_prefix!r} names {{{m.group(1)}}}, which reasoning-gym's "
                             f"{problem.task} problems lack; their fields: {', '.join(sorted(values))}")
        return values[m.group(1)]

    return _FIELD.sub(fill, cfg.response_prefix)


def entry(params: dict[str, Any]) -> dict[str, Any]:
    """The reasoning-gym entry a prompt's reward params name."""
    missing = [k for k in _PARAMS if k not in params]
    if missing:
        raise ValueError(f"reasoning_gym: the prompt's reward params lack {missing[0]!r}; score prompts made by "
                         'task.name = "reasoning_gym" (their params name the task, seed and index)')
    return _entry(str(params["rg_task"]), json.dumps(params["rg_config"], sort_keys=True), int(params["rg_seed"]),
                  int(params["rg_size"]), int(params["rg_index"]))


def score(answer: str | None, params: dict[str, Any], target: str | None = None) -> float:
    """The task's own score_answer of `answer` on the entry `params` name. A target that differs from the
    rebuilt entry's answer means another reasoning-gym version made the prompt: a ValueError."""
    item = entry(params)
    if target is not None and item.get("answer") is not None and str(item["answer"]) != target:
        raise ValueError(f"reasoning_gym: {params['rg_task']} problem {params['rg_index']} rebuilt with answer "
                         f"{str(item['answer'])[:40]!r}, the prompt says {target[:40]!r}: the feeder and the reward "
                         "worker run different reasoning-gym versions")
    dataset = _dataset(str(params["rg_task"]), json.dumps(params["rg_config"], sort_keys=True),
                       int(params["rg_seed"]), int(params["rg_size"]))
    return float(dataset.score_answer(answer, item))


def require_package() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise ValueError('task.name = "reasoning_gym" needs the reasoning-gym package: pip install reasoning-gym') from None
    return reasoning_gym


@lru_cache(maxsize=4096)
def _entry(name: str, config: str, seed: int, size: int, index: int) -> dict[str, Any]:
    return _dataset(name, config, seed, size)[index]


@lru_cache(maxsize=64)
def _dataset(name: str, config: str, seed: int, size: int) -> Any:
    rg = require_package()
    return rg.create_dataset(name, **json.loads(config), seed=seed, size=size)


def _checked_dataset(task: ReasoningGymTask, i: int, seed: int, size: int) -> Any:
    """The dataset of task i, every mistake one ValueError naming task.tasks[i]."""
    rg = require_package()
    registry = rg.factory.DATASETS
    where = f"task.tasks[{i}]"
    if task.name not in registry:
        close = difflib.get_close_matches(task.name, list(registry), n=4, cutoff=0.6)
        hint = f"close matches: {', '.join(close)}" if close else f"{len(registry)} tasks in reasoning_gym.factory.DATASETS"
        raise ValueError(f"{where}.name={task.name!r}: no such reasoning-gym task; {hint}")
    options = {f.name for f in dataclasses.fields(registry[task.name][1])} - {"seed", "size"}
    unknown = sorted(set(task.config) - options)
    if unknown:
        raise ValueError(f"{where}.config.{unknown[0]}: {task.name} has no such option; its options: {', '.join(sorted(options))}")
    try:
        dataset = _dataset(task.name, json.dumps(_plain(task.config), sort_keys=True), seed, size)
        dataset[0]
    except Exception as e:  # noqa: BLE001 - validate() asserts, __init__ raises TypeError, generators IndexError ...
        raise ValueError(f"{where}.config={task.config}: reasoning-gym's {task.name} rejects it "
                         f"({type(e).__name__}: {e})") from None
    return dataset


def _plain(config: dict[str, Any]) -> dict[str, Any]:
    """The options as plain JSON / msgpack data (tuples become lists)."""
    return json.loads(json.dumps(config))
