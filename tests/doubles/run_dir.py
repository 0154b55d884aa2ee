"""A run directory as the launcher leaves it before it starts any service: config.json, secret, run.json."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from asyncrl.config.run import RunConfig, load_run_config
from asyncrl.net.credentials import RunSecret
from asyncrl.run.rundir import save_config, write_run_json
from launch.ports import free_port


def launched_run_dir(run_dir: Path, overrides: Sequence[str] = (), endpoints: dict[str, str] | None = None,
                     ) -> tuple[RunConfig, dict[str, str]]:
    """`endpoints` default: a free loopback port each for the hub ("replay") and the weight store."""
    cfg = load_run_config(None, list(overrides))
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(run_dir, cfg)
    RunSecret.ensure(run_dir)
    endpoints = endpoints or {name: f"tcp://127.0.0.1:{free_port('127.0.0.1')}" for name in ("replay", "weights")}
    write_run_json(run_dir, {"endpoints": endpoints, "pids": {}})
    return cfg, endpoints
