"""The run directory: its files, read and written by every process of a run, and picking one for a run.

    RUN_DIR/config.json    the resolved RunConfig (written by the launcher)
    RUN_DIR/run.json       {"endpoints": {service -> ZeroMQ endpoint}, "pids": {process -> pid}, ...}
                           (written by the launcher before it starts any service; how everyone finds the run)
    RUN_DIR/secret         the run's secret (asyncrl.net.credentials)
    RUN_DIR/logs/          one log per process
    RUN_DIR/metrics.jsonl  one line per learner step; RUN_DIR/tensorboard/ the same as events
    RUN_DIR/summary.json   the hub's final accounting (written at the end)

Picking the directory (the launcher, before anything starts):

    new run:  --run-dir DIR (or launch.run_dir, or runs/<timestamp>) must not hold a run yet
    --resume: DIR must hold a run (config.json) that has not reached learner.steps

Each refusal is a `RunDirError` whose message is the one line the launcher prints (exit 2).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from asyncrl.config.loader import from_dict, to_dict
from asyncrl.config.run import RunConfig
from asyncrl.durable import write_json_atomic


class RunDirError(ValueError):
    """The run directory cannot be used as asked; the message says what to do instead."""


# ---------------------------------------------------------------------------------- files


def write_json(path: Path, data: Any) -> None:
    """Atomic: temporary name, fsync, rename (asyncrl.durable)."""
    write_json_atomic(Path(path), data)


def save_config(run_dir: Path, cfg: RunConfig) -> None:
    write_json(Path(run_dir) / "config.json", to_dict(cfg))


def load_config(run_dir: str | Path) -> RunConfig:
    return from_dict(RunConfig, json.loads((Path(run_dir) / "config.json").read_text()))


def write_run_json(run_dir: str | Path, run: dict[str, Any]) -> None:
    write_json(Path(run_dir) / "run.json", run)


def read_run_json(run_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / "run.json").read_text())


def last_metrics(run_dir: Path) -> dict[str, Any]:
    """The last line of metrics.jsonl ({} before the first step)."""
    path = Path(run_dir) / "metrics.jsonl"
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            lines = f.read().decode(errors="replace").strip().splitlines()
        return json.loads(lines[-1]) if lines else {}
    except (OSError, json.JSONDecodeError, IndexError):
        return {}


# ---------------------------------------------------------------------------------- picking one


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
