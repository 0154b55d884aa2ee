"""Preflight check of the task source: build it (and the held-out split) in the launcher, so a bad task
is one line and exit 2 before any process starts, not a crash of the feeder thread later.

The feeder builds the same source (asyncrl.task.source.make_prompt_source) once the hub runs; everything
that can go wrong there goes wrong here first: a missing reasoning-gym package, an unknown task name
(with close matches), options a reasoning-gym task rejects, an unreadable file, a held-out split that
leaves nothing to train on.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from asyncrl.config.loader import ConfigError
from asyncrl.models.config import resolve_model_path
from asyncrl.config.run import RunConfig


def check_task_source(cfg: RunConfig, heldout: int = 0) -> None:
    """The task source builds and yields a prompt; with `heldout` (eval.prompts when evaluation is on) the
    held-out prompts build too. Raises ConfigError naming the key."""
    from asyncrl.task.heldout import heldout_prompts
    from asyncrl.task.source import make_prompt_source

    task = cfg.task
    if task.eval_path and not Path(task.eval_path).expanduser().exists():
        raise ConfigError(f"task.eval_path={task.eval_path!r} does not exist: fix the path (relative paths start at "
                          f"the directory you launch from, {Path.cwd()})")
    tokenizer = resolve_model_path(cfg.model) if task.chat_template else None
    try:
        source = make_prompt_source(task, 1, tokenizer_path=tokenizer, heldout=heldout)
        if not list(itertools.islice(source, 1)):
            raise ValueError("the task yields no prompts")
        heldout_prompts(task, heldout, tokenizer)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e) if str(e).startswith(("task.", "eval.")) else f"task: {e}") from None
