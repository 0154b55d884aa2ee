"""Config of the prompt source (the task the run trains on)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

_OPS = "+-"
_NAMES = ("arithmetic", "jsonl", "dataset", "reasoning_gym")
_EXAMPLE_ROLES = ("system", "user", "assistant", "tool")
_PATH_HELP = {"jsonl": "a JSONL file of prompts",
              "dataset": "a .parquet or .jsonl file, or a Hugging Face datasets folder"}


@dataclass(kw_only=True, slots=True)
class ReasoningGymTask:
    """One reasoning-gym task of a mix: `tasks = [{name = "gsm_symbolic", weight = 1}]`."""

    name: str
    """A reasoning-gym dataset name, e.g. "basic_arithmetic", "gsm_symbolic"."""
    weight: float = 1.0
    """Relative share of this task's problems in the mix (> 0)."""
    config: dict[str, Any] = field(default_factory=dict)
    """The dataset's own options (its config dataclass), e.g. {min_digits = 1, max_digits = 2}; seed and size
    come from task.seed and task.size."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("task.tasks: a task has an empty name; give a reasoning-gym dataset name")
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) or not (
                math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"task.tasks {self.name!r}: weight={self.weight!r} must be a finite number > 0")
        self.weight = float(self.weight)
        own = sorted({"seed", "size"} & set(self.config))
        if own:
            raise ValueError(f"task.tasks {self.name!r}: config.{own[0]} is set by task.{own[0]}; remove it from the task's config")


@dataclass(kw_only=True, slots=True)
class TaskConfig:
    name: str = "arithmetic"
    """"arithmetic" (the embedded synthetic task), "jsonl" (prompt objects from `path`, the format of
    asyncrl.task.prompt_row), "dataset" (a table at `path` whose columns `prompt_key`, `answer_key` hold
    prompt and answer) or "reasoning_gym" (a weighted mix of reasoning-gym `tasks`; needs the reasoning-gym
    package)."""
    path: str = ""
    """jsonl: the prompt file. dataset: a .parquet file (needs pyarrow), a .jsonl file of objects, or a
    folder written by Hugging Face `datasets` save_to_disk (needs the `datasets` package)."""
    prompt_key: str = "prompt"
    """dataset: the column holding each prompt, a string or a list of chat messages {"role", "content"}."""
    answer_key: str = "answer"
    """dataset: the column holding the reference answer; "" for a dataset without answers."""
    split: str = "train"
    """dataset: the split to read when the `datasets` folder holds several."""
    eval_path: str = ""
    """jsonl, dataset: held-out prompts (the same format as `path`) for evaluation; "" holds out the last
    eval.prompts rows of `path` instead. Training skips every prompt whose text is held out."""
    tasks: list[ReasoningGymTask] = field(default_factory=list)
    """reasoning_gym: the mix, a list of {name, weight, config}, e.g. [{name = "basic_arithmetic", weight = 1,
    config = {min_terms = 2, max_terms = 2}}]."""
    size: int = 3000
    """reasoning_gym: problems in the training set (generated once, deterministically from `seed`, then cycled
    like a JSONL file by `shuffle` and `repeat`)."""
    prompt_format: str = "{question}"
    """reasoning_gym: the prompt text; "{question}" is replaced by the problem (other braces are kept as
    written), e.g. "{question}\\nGive the final answer as a number."."""
    response_prefix: str = ""
    """reasoning_gym: text the response starts with, written into the prompt after the chat template's
    generation prompt (an assistant prefill); "{question}" and the problem's own metadata fields are filled in,
    e.g. "{expression} =" for basic_arithmetic, so the model answers after an exact copy of the problem instead of
    copying it itself. The model's tokens begin after it: rewards and the held-out check see only those. A field
    the problem lacks is an error naming the fields it has, before any process starts. "" = none."""
    chat_template: bool = False
    """jsonl, dataset, reasoning_gym: wrap each text prompt as one user message and apply the tokenizer's own chat
    template (with the generation prompt); prompts then travel as token ids."""
    example_messages: list[dict[str, str]] = field(default_factory=list)
    """With chat_template = true: chat messages put before every prompt's own, a worked exchange that shows the
    model the format (few-shot as earlier turns), e.g. [{role = "user", content = "Calculate 412 * 307."},
    {role = "assistant", content = "<tool_call>...</tool_call>"}, {role = "tool", content =
    "<tool_response>126484</tool_response>"}, {role = "assistant", content = "126484"}]. Roles: system, user,
    assistant, tool; the last is the assistant's. They are part of the prompt, so the held-out evaluation sees
    them too and no token of theirs is trained. [] = none."""
    max_new_tokens: int = 8
    """Response length cap (arithmetic answers take at most digits + 2 tokens with the sign and EOS)."""
    temperature: float = 1.0
    """Sampling temperature of rollouts."""
    seed: int = 0
    """Seed of the prompt generator and of the shuffle (arithmetic and reasoning_gym draw held-out problems
    with seed + 1_000_003)."""
    digits: int = 2
    """Arithmetic: operands have 1 .. `digits` digits (the difficulty dial)."""
    ops: str = "+-"
    """Arithmetic: operators to draw from, a subset of "+-"."""
    shuffle: bool = True
    """JSONL, dataset, reasoning_gym: shuffle the prompts every pass (seeded by `seed`); false keeps their order."""
    repeat: bool = True
    """JSONL, dataset, reasoning_gym: cycle through the prompts forever; false stops after one pass."""

    def __post_init__(self) -> None:
        if self.name not in _NAMES:
            raise ValueError(f"task.name={self.name!r}: allowed values are {', '.join(map(repr, _NAMES))}")
        self.tasks = [_rg_task(t) for t in self.tasks]
        if self.name == "reasoning_gym":
            self._check_reasoning_gym()
        elif self.tasks:
            raise ValueError(f'task.tasks is set but task.name = "{self.name}"; set task.name = "reasoning_gym" or drop task.tasks')
        if self.prompt_format != "{question}" and self.name != "reasoning_gym":
            raise ValueError(f'task.prompt_format applies to task.name = "reasoning_gym" only (task.name = "{self.name}"); '
                             'remove it')
        if self.response_prefix and self.name != "reasoning_gym":
            raise ValueError(f'task.response_prefix applies to task.name = "reasoning_gym" only (task.name = "{self.name}"); '
                             'remove it')
        if self.eval_path and self.name not in ("jsonl", "dataset"):
            raise ValueError(f'task.eval_path applies to jsonl and dataset tasks (task.name = "{self.name}" holds out '
                             "problems by seed); remove it")
        if self.name in ("jsonl", "dataset") and not self.path:
            raise ValueError(f'task.name = "{self.name}" needs task.path: {_PATH_HELP[self.name]}')
        if self.name == "dataset" and not self.prompt_key:
            raise ValueError('task.prompt_key is empty: name the dataset column that holds the prompts')
        if self.name == "arithmetic" and self.chat_template:
            raise ValueError("task.chat_template = true needs a jsonl or dataset task (or reasoning_gym): the arithmetic task's prompts "
                             "are written for the embedded tokenizer; set task.chat_template = false")
        self._check_example_messages()
        if self.max_new_tokens < 1:
            raise ValueError(f"task.max_new_tokens={self.max_new_tokens}: must be >= 1")
        if not self.temperature >= 0.0:
            raise ValueError(f"task.temperature={self.temperature}: must be >= 0 (0 = greedy)")
        if not 1 <= self.digits <= 9:
            raise ValueError(f"task.digits={self.digits}: must be in 1..9 (operand length in digits)")
        if not self.ops or any(op not in _OPS for op in self.ops):
            raise ValueError(f'task.ops={self.ops!r}: give a non-empty subset of "{_OPS}"')

    def _check_example_messages(self) -> None:
        if not self.example_messages:
            return
        if not self.chat_template:
            raise ValueError("task.example_messages needs task.chat_template = true (they are chat turns); set it or "
                             "remove the examples")
        for i, m in enumerate(self.example_messages):
            if not isinstance(m, dict) or set(m) != {"role", "content"} or not all(
                    isinstance(v, str) for v in m.values()):
                raise ValueError(f"task.example_messages[{i}]: want {{role = \"...\", content = \"...\"}} (two strings, "
                                 f"nothing else), got {str(m)[:80]!r}")
            if m["role"] not in _EXAMPLE_ROLES:
                raise ValueError(f"task.example_messages[{i}].role={m['role']!r}: allowed roles are "
                                 f"{', '.join(map(repr, _EXAMPLE_ROLES))}")
        last = self.example_messages[-1]["role"]
        if last != "assistant":
            raise ValueError(f"task.example_messages ends with a {last!r} message; end the examples with the "
                             "assistant's reply (the prompt's own user message comes next)")

    def _check_reasoning_gym(self) -> None:
        if not self.tasks:
            raise ValueError('task.name = "reasoning_gym" needs task.tasks, e.g. tasks = [{name = "gsm_symbolic", weight = 1}]')
        names = [t.name for t in self.tasks]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ValueError(f"task.tasks names {dup!r} twice; give each reasoning-gym task once")
        if self.size < 1:
            raise ValueError(f"task.size={self.size}: must be >= 1 (problems in the training set)")
        if "{question}" not in self.prompt_format:
            raise ValueError(f"task.prompt_format={self.prompt_format!r} has no {{question}}; the problem would be lost")


def _rg_task(task: Any) -> ReasoningGymTask:
    """A task of the mix; a plain {name, weight, config} dict (a Python caller's) is converted."""
    if isinstance(task, ReasoningGymTask):
        return task
    if not isinstance(task, dict):
        raise ValueError(f"task.tasks: expected {{name, weight, config}} tables, got {task!r}")
    unknown = sorted(set(task) - {"name", "weight", "config"})
    if unknown or "name" not in task:
        raise ValueError(f"task.tasks {task.get('name', '?')!r}: "
                         + (f"unknown key {unknown[0]!r}" if unknown else "no name") + "; allowed keys: name, weight, config")
    return ReasoningGymTask(**task)
