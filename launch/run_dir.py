"""Where a run lives: pick (or reuse, on --resume) the run directory.

    new run:  --run-dir DIR (or launch.run_dir, or runs/<timestamp>) must not hold a run yet
    --resume: DIR must hold a run (config.json) that has not reached learner.steps

Each refusal is a `RunDirError` whose message is the one line the launcher prints (exit 2).
"""

from __future__ import annotations

import time
from pathlib import Path

from asyncrl.config.run import RunConfig
from launch.ports import free_port  # noqa: F401 - launch.run_dir.free_port predates launch.ports
from launch.progress import last_metrics


class RunDirError(ValueError):
    """The run directory cannot be used as asked; the message says what to do instead."""


def check_resumable(resume: str) -> Path:
    """--resume DIR: DIR holds a run (its config.json); checked before the config is read from it."""
    path = Path(resume)
    if not path.is_dir():
        raise RunDirError(f"--resume {resume}: no such directory; give the run directory of an earlier run")
    if not (path / "config.json").exists():
        raise RunDirError(f"--resume {resume}: no config.json there; is it a run directory?")
    return path


def finished_step(path: Path, cfg: RunConfig) -> int | None:
    """The last step when the run in `path` already ran cfg.learner.steps, else None."""
    step = int(last_metrics(path).get("step", 0))
    return step if (path / "summary.json").exists() and step >= cfg.learner.steps else None


def make_run_dir(cfg: RunConfig, run_dir: str | None, resume: str | None) -> Path:
    if resume:
        path = check_resumable(resume)
        step = finished_step(path, cfg)
        if step is not None:
            raise RunDirError(f"--resume {resume}: this run is finished (step {step}/{cfg.learner.steps}); "
                              f"to train longer add --set learner.steps=N with N > {step}")
        (path / "summary.json").unlink(missing_ok=True)  # the run is live again (clients check); the end rewrites it
        return path
    path = Path(run_dir or cfg.launch.run_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    if (path / "config.json").exists():
        raise RunDirError(f"--run-dir {path} already holds a run: continue it with --resume {path}, "
                          "or pick a new directory")
    path.mkdir(parents=True, exist_ok=True)
    return path
