"""Real processes for end-to-end tests: a run directory and the services the launcher would start."""

from __future__ import annotations

import json
from pathlib import Path

from asyncrl.config.run import RunConfig, load_run_config
from asyncrl.credentials import RunSecret
from asyncrl.rundir import save_config, write_json
from launch.processes import Child, ProcessSpec, log_tail, spawn, stop
from launch.ports import free_port

SMALL = [
    "batch.prompts_per_step=2", "batch.samples_per_prompt=4", "generator.max_running=16",
    "hub.lease_timeout_s=30", "reward.heartbeat_s=0.5", "generator.heartbeat_s=0.5",
]


def make_run(tmp: Path, overrides: list[str]) -> tuple[RunConfig, Path, dict[str, str]]:
    cfg = load_run_config(None, [*SMALL, *overrides])
    run_dir = tmp / "run"
    run_dir.mkdir()
    save_config(run_dir, cfg)
    RunSecret.ensure(run_dir)  # as the launcher does: before any service or client starts
    endpoints = {"replay": f"tcp://127.0.0.1:{free_port('127.0.0.1')}",
                 "weights": f"tcp://127.0.0.1:{free_port('127.0.0.1')}"}
    write_json(run_dir / "run.json", {"endpoints": endpoints, "pids": {}})
    return cfg, run_dir, endpoints


def start(run_dir: Path, endpoints: dict[str, str], names: list[str]) -> list[Child]:
    specs = {
        "replay": ProcessSpec(name="replay", module="services.replay",
                              args=["--run-dir", str(run_dir), "--endpoint", endpoints["replay"]]),
        "generator-0": ProcessSpec(name="generator-0", module="services.generator",
                                   args=["--run-dir", str(run_dir), "--name", "generator-0", "--device", "cpu"]),
        "reward-0": ProcessSpec(name="reward-0", module="services.reward",
                                args=["--run-dir", str(run_dir), "--name", "reward-0"]),
    }
    return [spawn(specs[n], run_dir / "logs") for n in names]


def shutdown(children: list[Child]) -> str:
    """Stop children; return their log tails (for assertion messages)."""
    stop(children, grace_s=15)
    return "\n".join(f"--- {c.spec.name} (exit {c.proc.returncode})\n{log_tail(c, 30)}" for c in children)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
