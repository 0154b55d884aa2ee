"""configs/multiturn-cpu.toml through the launcher: episodes of several turns scored by the environment's
reward, episode figures in metrics.jsonl and the progress line, and a learner killed mid-run that resumes
without losing or repeating an episode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e_helpers import metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
SETS = ["learner.steps=8", "learner.checkpoint_every=3", "launch.progress=true"]


def launch(run_dir: Path, resume: bool = False) -> subprocess.Popen:
    where = ["--resume", str(run_dir)] if resume else [str(ROOT / "configs" / "multiturn-cpu.toml"), "--run-dir", str(run_dir)]
    return subprocess.Popen([sys.executable, "-m", "launch", *where, *[x for s in SETS for x in ("--set", s)]],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_multi_turn_run_trains_on_episodes_and_resumes_without_losing_one(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(run_dir)
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline and not ((run_dir / "metrics.jsonl").exists() and len(metrics(run_dir)) >= 4):
        time.sleep(0.2)
    os.killpg(json.loads((run_dir / "run.json").read_text())["pids"]["learner-0"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "learner-0 exited" in out, out
    assert "episodes turns" in out
    before = len(metrics(run_dir))
    resumed = launch(run_dir, resume=True)
    out, _ = resumed.communicate(timeout=200)
    assert resumed.returncode == 0, out
    ms = metrics(run_dir)
    steps = [m["step"] for m in ms]
    assert steps[before] <= 4 and sorted(set(steps)) == list(range(1, 9))
    assert all(1.0 < m["turns_mean"] <= 3.0 for m in ms[:4])  # the untrained model is often wrong: it retries
    assert all(m["episode_failed"] == {} and m["tool_calls"] == 0 and m["env_time_s"] >= 0 for m in ms)
    acc = json.loads((run_dir / "summary.json").read_text())["accounting"]
    per_step = {m["step"]: m["samples_trained"] for m in ms}  # a redone step: its last run
    assert acc["lost"] == 0 and acc["failed"] == 0 and acc["trained"] == sum(per_step.values()), (acc, per_step)
