"""Where a run lives: pick (or reuse, on --resume) the run directory; pick free ports."""

from __future__ import annotations

import socket
import time
from pathlib import Path

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
