"""Config of the prompt source (the task the run trains on)."""

from __future__ import annotations

from dataclasses import dataclass

_OPS = "+-"
_NAMES = ("arithmetic", "jsonl", "dataset")
_PATH_HELP = {"jsonl": "a JSONL file of prompts",
              "dataset": "a .parquet or .jsonl file, or a Hugging Face datasets folder"}


@dataclass(kw_only=True, slots=True)
class TaskConfig:
    name: str = "arithmetic"
    """"arithmetic" (the embedded synthetic task), "jsonl" (prompt objects from `path`, the format of
    asyncrl.task.prompt_row) or "dataset" (a table at `path` whose columns `prompt_key`, `answer_key` hold
    prompt and answer)."""
    path: str = ""
    """jsonl: the prompt file. dataset: a .parquet file (needs pyarrow), a .jsonl file of objects, or a
    folder written by Hugging Face `datasets` save_to_disk (needs the `datasets` package)."""
    prompt_key: str = "prompt"
    """dataset: the column holding each prompt, a string or a list of chat messages {"role", "content"}."""
    answer_key: str = "answer"
    """dataset: the column holding the reference answer; "" for a dataset without answers."""
    split: str = "train"
    """dataset: the split to read when the `datasets` folder holds several."""
    chat_template: bool = False
    """jsonl, dataset: wrap each text prompt as one user message and apply the tokenizer's own chat
    template (with the generation prompt); prompts then travel as token ids."""
    max_new_tokens: int = 8
    """Response length cap (arithmetic answers take at most digits + 2 tokens with the sign and EOS)."""
    temperature: float = 1.0
    """Sampling temperature of rollouts."""
    seed: int = 0
    """Seed of the prompt generator (and of the JSONL shuffle)."""
    digits: int = 2
    """Arithmetic: operands have 1 .. `digits` digits (the difficulty dial)."""
    ops: str = "+-"
    """Arithmetic: operators to draw from, a subset of "+-"."""
    shuffle: bool = True
    """JSONL: shuffle the lines every pass (seeded by `seed`); false keeps file order."""
    repeat: bool = True
    """JSONL: cycle through the file forever; false stops after one pass."""

    def __post_init__(self) -> None:
        if self.name not in _NAMES:
            raise ValueError(f"task.name={self.name!r}: allowed values are {', '.join(map(repr, _NAMES))}")
        if self.name != "arithmetic" and not self.path:
            raise ValueError(f'task.name = "{self.name}" needs task.path: {_PATH_HELP[self.name]}')
        if self.name == "dataset" and not self.prompt_key:
            raise ValueError('task.prompt_key is empty: name the dataset column that holds the prompts')
        if self.name == "arithmetic" and self.chat_template:
            raise ValueError("task.chat_template = true needs a jsonl or dataset task: the arithmetic task's prompts "
                             "are written for the embedded tokenizer; set task.chat_template = false")
        if self.max_new_tokens < 1:
            raise ValueError(f"task.max_new_tokens={self.max_new_tokens}: must be >= 1")
        if not self.temperature >= 0.0:
            raise ValueError(f"task.temperature={self.temperature}: must be >= 0 (0 = greedy)")
        if not 1 <= self.digits <= 9:
            raise ValueError(f"task.digits={self.digits}: must be in 1..9 (operand length in digits)")
        if not self.ops or any(op not in _OPS for op in self.ops):
            raise ValueError(f'task.ops={self.ops!r}: give a non-empty subset of "{_OPS}"')
