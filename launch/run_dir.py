"""The run directory: config.json, run.json (endpoints + pids), logs/, metrics.jsonl, summary.json."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from asyncrl.config.loader import from_dict, to_dict
from asyncrl.config.run import RunConfig


def make_run_dir(cfg: RunConfig, run_dir: str | None, resume: str | None) -> Path:
    if resume:
        path = Path(resume)
        if not (path / "config.json").exists():
            raise SystemExit(f"--resume {resume}: no config.json there; is it a run directory?")
        return path
    path = Path(run_dir or cfg.launch.run_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    path.mkdir(parents=True, exist_ok=True)
    return path


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def write_json(path: Path, data: Any) -> None:
    """Atomic: temporary name, fsync, rename."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_config(run_dir: Path, cfg: RunConfig) -> None:
    write_json(run_dir / "config.json", to_dict(cfg))


def load_config(run_dir: str | Path) -> RunConfig:
    return from_dict(RunConfig, json.loads((Path(run_dir) / "config.json").read_text()))


def read_run_json(run_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / "run.json").read_text())
