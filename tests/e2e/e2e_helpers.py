"""Real processes for end-to-end tests: a run directory and the services the launcher would start."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from asyncrl.config.run import RunConfig
from launch.processes import Child, ProcessSpec, log_tail, spawn, stop
from tests.doubles.run_dir import launched_run_dir

ROOT = Path(__file__).resolve().parents[2]

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


def launch(run_dir: Path, *sets: str, resume: bool = False, wait: bool = True, config: Path | None = None,
           **popen: Any) -> subprocess.Popen:
    """`python -m launch` on `config` (None: the embedded default) with `sets`; waited for unless wait=False."""
    args = ["--resume", str(run_dir)] if resume else [*([str(config)] if config else []), "--run-dir", str(run_dir)]
    cmd = [sys.executable, "-m", "launch", *args, "--set", "launch.progress=false",
           "--set", "eval.every=0",  # the embedded default evaluates; a test that looks at it sets eval.every itself
           *[x for s in sets for x in ("--set", s)]]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)
    if wait:
        out, _ = proc.communicate(timeout=400)
        proc.output = out  # type: ignore[attr-defined]
    return proc


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def wait_for_step(run_dir: Path, step: int, timeout_s: float = 240, proc: subprocess.Popen | None = None) -> None:
    """Wait until the run reported `step` steps; on a timeout (or the launcher exiting first) the error carries
    the launcher's output and the tail of each service log, so a CI failure says what the run was doing."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= step:
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.2)
    raise TimeoutError(f"step {step} not reached in {timeout_s} s\n{what_the_run_said(run_dir, proc)}")


def what_the_run_said(run_dir: Path, proc: subprocess.Popen | None) -> str:
    parts = []
    if proc is not None:
        if proc.poll() is None:
            proc.kill()
        out, _ = proc.communicate(timeout=30)
        parts.append(f"--- launcher (rc {proc.returncode}) ---\n{(out or '')[-4000:]}")
    for log in sorted((run_dir / "logs").glob("*.log")) if (run_dir / "logs").is_dir() else []:
        parts.append(f"--- {log.name} ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:]))
    return "\n".join(parts)


def run_pid(run_dir: Path, name: str) -> int:
    return json.loads((run_dir / "run.json").read_text())["pids"][name]
