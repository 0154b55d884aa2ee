"""Real processes for end-to-end tests: a run directory and the services the launcher would start."""

from __future__ import annotations

import json
from pathlib import Path

from asyncrl.config.run import RunConfig
from launch.processes import Child, ProcessSpec, log_tail, spawn, stop
from tests.doubles.run_dir import launched_run_dir

SMALL = [
    "batch.prompts_per_step=2", "batch.samples_per_prompt=4", "generator.max_running=16",
    "hub.lease_timeout_s=30", "reward.heartbeat_s=0.5", "generator.heartbeat_s=0.5",
]


def make_run(tmp: Path, overrides: list[str]) -> tuple[RunConfig, Path, dict[str, str]]:
    run_dir = tmp / "run"
    run_dir.mkdir()
    cfg, endpoints = launched_run_dir(run_dir, [*SMALL, *overrides])
    return cfg, run_dir, endpoints


def start(run_dir: Path, endpoints: dict[str, str], names: list[str]) -> list[Child]:
    specs = {
        "replay": ProcessSpec(name="replay", module="services.replay",
                              args=["--run-dir", str(run_dir), "--name", "replay"]),
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
