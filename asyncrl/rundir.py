"""The run directory's files, read and written by every process of a run.

    RUN_DIR/config.json    the resolved RunConfig (written by the launcher)
    RUN_DIR/run.json       {"endpoints": {service -> ZeroMQ endpoint}, "pids": {process -> pid}}
    RUN_DIR/replay.endpoint the hub's endpoint, one line (written by the hub once bound)
    RUN_DIR/logs/          one log per process
    RUN_DIR/metrics.jsonl  one line per learner step; RUN_DIR/tensorboard/ the same as events
    RUN_DIR/summary.json   the hub's final accounting (written at the end)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asyncrl.config.loader import from_dict, to_dict
from asyncrl.config.run import RunConfig
from asyncrl.durable import write_atomic, write_json_atomic

ENDPOINT_FILE = "replay.endpoint"


def write_json(path: Path, data: Any) -> None:
    """Atomic: temporary name, fsync, rename (asyncrl.durable)."""
    write_json_atomic(Path(path), data)


def write_endpoint(run_dir: Path, endpoint: str) -> None:
    """Atomic, as write_json: a reader sees no file or the whole line."""
    write_atomic(Path(run_dir) / ENDPOINT_FILE, (endpoint + "\n").encode())


def save_config(run_dir: Path, cfg: RunConfig) -> None:
    write_json(Path(run_dir) / "config.json", to_dict(cfg))


def load_config(run_dir: str | Path) -> RunConfig:
    return from_dict(RunConfig, json.loads((Path(run_dir) / "config.json").read_text()))


def read_run_json(run_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / "run.json").read_text())
