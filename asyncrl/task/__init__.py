"""Tasks: prompt sources (the embedded arithmetic task, JSONL files) and the embedded tiny model."""

from asyncrl.task.config import TaskConfig
from asyncrl.task.source import make_prompt_source, task_sampling

__all__ = ["TaskConfig", "make_prompt_source", "task_sampling"]
