"""configs/multiturn-cpu.toml through the launcher: episodes of several turns, the environment's reward,
episode figures in metrics.jsonl and the progress line, nothing lost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from e2e_helpers import metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]


def test_multi_turn_run_trains_on_episodes(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "launch", str(ROOT / "configs" / "multiturn-cpu.toml"),
                           "--run-dir", str(run_dir), "--set", "learner.steps=30", "--set", "launch.progress=true"],
                          cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ms = metrics(run_dir)
    assert [m["step"] for m in ms] == list(range(1, 31))
    assert all(1.0 < m["turns_mean"] <= 3.0 for m in ms[:5])  # the untrained model is often wrong: it retries
    assert all(m["episode_failed"] == {} and m["tool_calls"] == 0 and m["env_time_s"] >= 0 for m in ms)
    assert all(0.0 <= m["reward_mean"] <= 1.0 for m in ms)
    assert "episodes turns" in proc.stdout + proc.stderr
    acc = json.loads((run_dir / "summary.json").read_text())["accounting"]
    assert acc["lost"] == 0 and acc["failed"] == 0 and acc["trained"] == 30 * 64
